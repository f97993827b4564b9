"""P6: combine(dispatch(x)) with identity experts = x times the number of ranks the token reached."""

from conformance.properties.support import property_test
from conformance.strategies_combine import active_round_trip_examples

test_round_trip = property_test("P6-round-trip", active_round_trip_examples())
