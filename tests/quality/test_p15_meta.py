"""Meta-tests of P15-ll-dispatch: its planted defects are caught, it holds on the emulation, its strategy reaches its
corners."""

import pytest

from conformance.strategies.low_latency import ll_examples
from tests.helpers.meta import assert_caught, assert_holds, sample

PID = "P15-ll-dispatch"


@pytest.mark.parametrize("mutant", ['ll-wrong-scale-row', 'll-ue8m0-off-by-one', 'll-recv-count-off-by-one',
                                    'll-async-event-before-receive'])
def test_catches(emulated_session, mutant: str) -> None:
    example, message = assert_caught(emulated_session, PID, mutant, ll_examples(2), shrink=False)
    assert "expected" in message and "[" in message, message  # value, expectation and the call


def test_holds_on_the_emulation(emulated_session) -> None:
    assert_holds(emulated_session, PID, sample(ll_examples(2), 6))


def test_spares_an_allowed_receive_order(emulated_session) -> None:
    assert_holds(emulated_session, PID, sample(ll_examples(2), 4), mutant="ll-reverse-source-order")


def test_strategy_reaches_its_corners() -> None:
    drawn = sample(ll_examples(2), 40)
    assert {ex.hidden for ex in drawn} >= {2048, 4096}
    assert any(0 in ex.tokens_per_rank for ex in drawn) and any(ex.mask_ratio > 0 for ex in drawn)
    assert all((2 * ex.num_max_tokens_per_rank) % 4 == 0 and ex.payload != "special" for ex in drawn)
