"""P1: per-expert payloads are byte-exact against the oracle and across backends."""

from conformance.properties.support import property_test
from conformance.strategies import active_examples

test_per_expert_payloads = property_test("P1-per-expert-payloads", active_examples())
