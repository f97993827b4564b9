"""P5: combine sums the expert outputs over receiving ranks (plus bias), and returns the owners' weights."""

from conformance.properties.support import property_test
from conformance.strategies_combine import active_combine_cases

test_combine = property_test("P5-combine", active_combine_cases())
