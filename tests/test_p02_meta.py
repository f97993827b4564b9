"""Meta-tests of P2: it catches wrong counts, wrong alignment rounding and wrong prefix sums, holds on the
emulation (one and two nodes, and with V2's receive order shuffled), and its strategy reaches the edges of
alignments 1, 16 and 128."""

import pytest
from hypothesis import HealthCheck, find, settings

from conformance.example import Example, build_all_inputs
from conformance.oracle import expected_raw_counts
from conformance.strategies_layout import alignment_examples
from tests.meta import assert_caught, assert_holds, sample

P2 = "P2-counts"
COVERAGE = settings(max_examples=2000, database=None, deadline=None, suppress_health_check=list(HealthCheck))


def raw_counts(example: Example) -> list[int]:
    """Every rank's raw per-expert counts (the oracle's), flattened."""
    inputs = build_all_inputs(example)
    return [c for rank in range(example.world_size) for c in expected_raw_counts(example, inputs, rank)]


def test_p2_catches_a_count_off_by_one(emulated_session) -> None:
    _, message = assert_caught(emulated_session, P2, "count-off-by-one", alignment_examples(2))
    assert "expected" in message and "ElasticBuffer.dispatch(" in message


def test_p2_catches_alignment_rounded_down(emulated_session) -> None:
    example, message = assert_caught(emulated_session, P2, "alignment-rounds-down", alignment_examples(2))
    assert example.expert_alignment > 1
    assert "num_recv_tokens_per_expert_list[rank" in message and "rounded up to expert_alignment" in message


def test_p2_catches_an_exclusive_prefix_sum(emulated_session) -> None:
    _, message = assert_caught(emulated_session, P2, "psum-exclusive", alignment_examples(2))
    assert "psum_num_recv_tokens_per_expert[rank" in message and "inclusive prefix sum" in message


def test_p2_holds_on_the_emulation_including_two_nodes(emulated_session, two_node_session) -> None:
    assert_holds(emulated_session, P2, sample(alignment_examples(2), 12))
    assert_holds(two_node_session, P2, sample(alignment_examples(4), 5))


def test_p2_spares_a_shuffled_v2_receive_order(emulated_session) -> None:
    assert_holds(emulated_session, P2, sample(alignment_examples(2), 5), mutant="v2-shuffled-receive-order")


@pytest.mark.parametrize("alignment", [16, 128])
@pytest.mark.parametrize("edge", ["just below", "just above", "at"])
def test_p2_strategy_reaches_counts_around_alignment_multiples(alignment: int, edge: str) -> None:
    wanted = {"just below": alignment - 1, "just above": 1, "at": 0}[edge]

    def reaches(example: Example) -> bool:
        return example.expert_alignment == alignment and any(
            c > alignment and c % alignment == wanted for c in raw_counts(example)
        )

    find(alignment_examples(2), reaches, settings=COVERAGE)


def test_p2_strategy_reaches_alignment_one_and_empty_experts() -> None:
    find(alignment_examples(2), lambda ex: ex.expert_alignment == 1 and any(c > 1 for c in raw_counts(ex)),
         settings=COVERAGE)
    find(alignment_examples(2), lambda ex: ex.expert_alignment > 1 and 0 in raw_counts(ex), settings=COVERAGE)
