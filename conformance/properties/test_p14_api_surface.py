"""P14: import probe and method signatures against the DeepEP 2.1.0 snapshot (once per session)."""

from conformance.properties.support import property_test
from conformance.strategies_errors import api_surface_cases

test_api_surface = property_test("P14-api-surface", api_surface_cases())
