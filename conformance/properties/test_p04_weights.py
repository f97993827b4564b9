"""P4: weights at local slots equal the sender's; at -1 slots V1 writes 0 and V2 keeps the weight (a divergence)."""

from conformance.properties.support import property_test
from conformance.strategies_layout import active_layout_examples

test_weights = property_test("P4-weights", active_layout_examples())
