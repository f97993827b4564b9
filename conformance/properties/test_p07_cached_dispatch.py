"""P7: a cached dispatch returns the first dispatch's bytes, and another payload's rows of the same sources."""

from conformance.properties.support import property_test
from conformance.strategies_combine import active_cached_dispatch_examples

test_cached_dispatch = property_test("P7-cached-dispatch", active_cached_dispatch_examples())
