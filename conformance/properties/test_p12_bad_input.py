"""P12: bad input raises on every rank, nothing hangs, the next valid call is still correct."""

from conformance.properties.support import property_test
from conformance.strategies_errors import active_bad_input_cases

test_bad_input = property_test("P12-bad-input", active_bad_input_cases())
