"""P9: gradients through FusedDispatch / FusedCombine agree with the oracle, the direct calls and across backends."""

from conformance.properties.support import property_test
from conformance.strategies_combine import active_gradient_examples

test_gradients = property_test("P9-gradients", active_gradient_examples())
