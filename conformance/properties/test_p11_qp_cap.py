"""P11: automatic QP cap, over-asking refused cleanly, combine reuses the SM count, pinned max tokens."""

from conformance.properties.support import property_test
from conformance.strategies_errors import active_qp_cases

test_qp_cap = property_test("P11-qp-cap", active_qp_cases())
