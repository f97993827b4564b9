"""Meta-tests of P17-ll-hooks-stats: its planted defects are caught, it holds on the emulation, its strategy reaches its
corners."""

import pytest

from conformance.strategies.low_latency import ll_examples
from tests.helpers.meta import assert_caught, assert_holds, sample

PID = "P17-ll-hooks-stats"


@pytest.mark.parametrize("mutant", ['ll-hook-before-data', 'll-stats-not-accumulated', 'll-out-written-before-hook',
                                    'll-cost-stats-not-accumulated', 'll-async-event-missing'])
def test_catches(emulated_session, mutant: str) -> None:
    example, message = assert_caught(emulated_session, PID, mutant, ll_examples(2), shrink=False)
    assert "expected" in message and "[" in message, message  # value, expectation and the call


def test_holds_on_the_emulation(emulated_session) -> None:
    assert_holds(emulated_session, PID, sample(ll_examples(2), 6))


def test_spares_an_allowed_receive_order(emulated_session) -> None:
    assert_holds(emulated_session, PID, sample(ll_examples(2), 4), mutant="ll-reverse-source-order")


def test_spares_other_wait_costs(emulated_session) -> None:
    assert_holds(emulated_session, PID, sample(ll_examples(2), 4), mutant="ll-wait-costs-doubled")
