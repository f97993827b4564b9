"""Meta-tests of P2: it catches wrong counts, wrong alignment rounding and wrong prefix sums, holds on the
emulation (one and two nodes, and with V2's receive order shuffled), and its strategy reaches the edges of
alignments 1, 16 and 128."""

import pytest
import torch

from conformance.core.example import Example, build_all_inputs
from conformance.oracle import expected_raw_counts
from conformance.strategies.layout import alignment_examples
from tests.helpers.meta import assert_caught, assert_holds, assert_reaches, sample

P2 = "P2-counts"


def raw_counts(example: Example) -> list[int]:
    """Every rank's raw per-expert counts (the oracle's), flattened."""
    inputs = build_all_inputs(example)
    return [c for rank in range(example.world_size) for c in expected_raw_counts(example, inputs, rank)]


def test_p2_catches_a_count_off_by_one(emulated_session) -> None:
    _, message = assert_caught(emulated_session, P2, "count-off-by-one", alignment_examples(2), shrink=False)
    assert "expected" in message and "ElasticBuffer.dispatch(" in message


def test_p2_catches_alignment_rounded_down(emulated_session) -> None:
    example, message = assert_caught(emulated_session, P2, "alignment-rounds-down", alignment_examples(2),
                                     shrink=False)
    assert example.expert_alignment > 1
    assert "num_recv_tokens_per_expert_list[rank" in message and "rounded up to expert_alignment" in message


def test_p2_catches_an_exclusive_prefix_sum(emulated_session) -> None:
    _, message = assert_caught(emulated_session, P2, "psum-exclusive", alignment_examples(2), shrink=False)
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

    assert_reaches(alignment_examples(2), reaches, 2000)


def test_p2_strategy_reaches_alignment_one_and_empty_experts() -> None:
    assert_reaches(alignment_examples(2), lambda ex: ex.expert_alignment == 1 and any(c > 1 for c in raw_counts(ex)),
                   2000)
    assert_reaches(alignment_examples(2), lambda ex: ex.expert_alignment > 1 and 0 in raw_counts(ex), 2000)


def test_p2_oracle_matches_the_real_recordings() -> None:
    """The oracle's counts, V2 prefix sums (both modes) and V1 layout equal what the real DeepEP 2.1.0
    returned on 2 x H200 (fixtures/deepep-real), for every recorded case and rank."""
    from conformance.core.example import RankInputs
    from conformance.oracle import (
        expected_aligned_counts,
        expected_layout,
        expected_psum_per_expert,
        expected_tokens_per_source_rank,
    )
    from tests.conftest import ROOT

    ranks = [torch.load(ROOT / f"fixtures/deepep-real/rank{r}.pt", weights_only=True) for r in (0, 1)]
    checked = 0
    for name, case in ranks[0]["cases"].items():
        meta = case["case"]
        example = Example(tokens_per_rank=tuple(meta["tokens_per_rank"]), hidden=meta["hidden"],
                          num_topk=meta["num_topk"], num_experts=meta["num_experts"],
                          expert_alignment=meta["expert_alignment"])
        inputs = [RankInputs(r["cases"][name]["x"], r["cases"][name]["topk_idx"], r["cases"][name]["topk_weights"])
                  for r in ranks]
        for rank, recorded in enumerate(r["cases"][name] for r in ranks):
            v1 = recorded["v1"]
            assert v1["num_recv_tokens_per_expert_list"] == expected_aligned_counts(example, inputs, rank), name
            layout = expected_layout(example, inputs[rank])
            assert v1["layout"]["num_tokens_per_rank"].tolist() == layout["num_tokens_per_rank"], name
            assert v1["layout"]["num_tokens_per_expert"].tolist() == layout["num_tokens_per_expert"], name
            assert v1["layout"]["is_token_in_rank"].tolist() == layout["is_token_in_rank"], name
            for key, expand in (("v2", False), ("v2_expand", True)):
                if "error" in recorded[key]:
                    continue
                handle = recorded[key]["handle"]
                assert handle["psum_num_recv_tokens_per_expert"].tolist() == expected_psum_per_expert(
                    example, inputs, rank, do_expand=expand), (name, key)
                per_source = expected_tokens_per_source_rank(example, inputs, rank)
                psum = handle["psum_num_recv_tokens_per_scaleup_rank"].tolist()
                assert psum == [sum(per_source[: i + 1]) for i in range(len(per_source))], (name, key)
                checked += 1
    assert checked >= 15
