"""P8: V2 expand layout (contiguous per expert, alignment padding, prefix sums, slot pointers, fold back)."""

from conformance.properties.support import property_test
from conformance.strategies_layout import active_alignment_examples

test_expand_layout = property_test("P8-expand-layout", active_alignment_examples())
