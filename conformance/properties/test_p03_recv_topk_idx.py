"""P3: recv_topk_idx holds the local expert index or -1, slot by slot, equal across backends."""

from conformance.properties.support import property_test
from conformance.strategies_layout import active_layout_examples

test_recv_topk_idx = property_test("P3-recv-topk-idx", active_layout_examples())
