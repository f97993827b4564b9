"""Meta-tests of P24-ll-clean: its planted defects are caught, it holds on the emulation (also with two nodes), its
strategy reaches its corners."""

import pytest

from conformance.core.cases import CleanCase
from conformance.core.example import Example
from conformance.strategies.low_latency import clean_cases
from tests.helpers.meta import assert_caught, assert_holds, sample

PID = "P24-ll-clean"


@pytest.mark.parametrize("mutant, says", [
    ("ll-clean-does-not-clean", "expected 0"),
    ("ll-clean-zeroes-everything", "expected only bytes of the signalling buffers"),
    ("ll-clean-flips-buffer-index", "combined_x"),
    ("ll-local-buffer-offset-in-elements", "get_local_buffer_tensor(torch.int32"),
])
def test_catches(emulated_session, mutant: str, says: str) -> None:
    _, message = assert_caught(emulated_session, PID, mutant, clean_cases(2), shrink=False)
    assert says in message and "[" in message, message


def test_a_clean_that_does_not_clean_lets_a_stale_count_into_the_next_dispatch(emulated_session) -> None:
    """Past the byte check (switched off here): the dispatch after the clean reads the garbage as counts, what a
    user of the buffer sees."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("conformance.properties.test_p24_ll_clean.check_clean", lambda *args: None)
        _, message = assert_caught(emulated_session, PID, "ll-clean-does-not-clean", clean_cases(2), shrink=False)
    assert "recv_count" in message or "layout_range" in message, message


def test_holds_on_the_emulation(emulated_session, two_node_session) -> None:
    assert_holds(emulated_session, PID, sample(clean_cases(2), 6))
    assert_holds(two_node_session, PID, sample(clean_cases(4), 3))
    # 32 experts: the two signalling buffers touch ([0, 128) and [128, 256)), the clean changes one merged range
    adjacent = CleanCase(Example((0, 0, 0, 0), hidden=2048, num_topk=1, num_experts=32, payload="integers",
                                 num_max_tokens_per_rank=4))
    assert_holds(two_node_session, PID, [adjacent])


def test_strategy_reaches_its_corners() -> None:
    drawn = sample(clean_cases(2), 40)
    assert {case.hook for case in drawn} == {False, True} and len({case.dirt_seed for case in drawn}) > 10
    assert len({case.example.num_experts for case in drawn}) > 4 and {case.example.num_max_tokens_per_rank
                                                                      for case in drawn} == {4, 8, 16}
    assert any(0 in case.example.tokens_per_rank for case in drawn)
    assert any(case.example.num_experts * 4 % 128 == 0 for case in sample(clean_cases(4), 60))  # adjacent buffers
