"""Meta-tests of P19-worst-case: its planted defects are caught, it holds on the emulation, its strategy reaches its
corners."""

import pytest

from conformance.strategies.low_latency import fp8_examples
from tests.helpers.meta import assert_caught, assert_holds, sample

PID = "P19-worst-case"


@pytest.mark.parametrize("mutant", ['fp8-scales-not-moved'])
def test_catches(emulated_session, mutant: str) -> None:
    example, message = assert_caught(emulated_session, PID, mutant, fp8_examples(2), shrink=False)
    assert "expected" in message and "[" in message, message  # value, expectation and the call


def test_holds_on_the_emulation(emulated_session) -> None:
    assert_holds(emulated_session, PID, sample(fp8_examples(2), 6))
