"""P2: per-expert counts with alignment rounding, V2 prefix sums and V1 layout outputs match the oracle."""

from conformance.properties.support import property_test
from conformance.strategies_layout import active_alignment_examples

test_counts = property_test("P2-counts", active_alignment_examples())
