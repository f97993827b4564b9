"""P13: V2 deterministic=True equals V1's rows and order; repeated dispatches are bitwise identical."""

from conformance.properties.support import property_test
from conformance.strategies_layout import active_layout_examples

test_determinism = property_test("P13-determinism", active_layout_examples())
