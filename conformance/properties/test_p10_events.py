"""P10: async + wait equals sync, previous_event orders after prior compute, V2 refusal, ``with`` waits."""

from conformance.properties.support import property_test
from conformance.strategies_errors import event_examples

test_events = property_test("P10-events", event_examples())
