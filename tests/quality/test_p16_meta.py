"""Meta-tests of P16-ll-round-trip: its planted defects are caught, it holds on the emulation, its strategy reaches its
corners."""

import pytest

from conformance.strategies.low_latency import ll_examples
from tests.helpers.meta import assert_caught, assert_holds, sample

PID = "P16-ll-round-trip"


@pytest.mark.parametrize("mutant", ['ll-hook-before-data', 'll-out-ignored', 'll-async-event-before-receive'])
def test_catches(emulated_session, mutant: str) -> None:
    example, message = assert_caught(emulated_session, PID, mutant, ll_examples(2), shrink=False)
    assert "expected" in message and "[" in message, message  # value, expectation and the call


def test_holds_on_the_emulation(emulated_session) -> None:
    assert_holds(emulated_session, PID, sample(ll_examples(2), 6))


def test_spares_an_allowed_receive_order(emulated_session) -> None:
    assert_holds(emulated_session, PID, sample(ll_examples(2), 4), mutant="ll-reverse-source-order")
