"""The oracle against hand-worked answers (it defines the contract, so it is checked by hand, not by code)."""

import torch

from conformance.core.example import Example, RankInputs
from conformance.oracle import expected_receipts, expected_received_tokens, expected_round_trip_bf16


def _inputs() -> tuple[Example, list[RankInputs]]:
    # 2 ranks, 4 experts (rank 0 owns 0-1, rank 1 owns 2-3), top-2.
    example = Example(tokens_per_rank=(2, 1), hidden=2, num_topk=2, num_experts=4)
    r0 = RankInputs(
        x=torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.bfloat16),
        topk_idx=torch.tensor([[3, 0], [-1, 1]]),
        topk_weights=torch.tensor([[0.5, 0.25], [0.75, 1.0]]),
    )
    r1 = RankInputs(
        x=torch.tensor([[5.0, 6.0]], dtype=torch.bfloat16),
        topk_idx=torch.tensor([[2, 3]]),
        topk_weights=torch.tensor([[0.125, 0.375]]),
    )
    return example, [r0, r1]


def test_receipts_by_hand() -> None:
    example, inputs = _inputs()
    rank0 = expected_receipts(example, inputs, 0)
    assert rank0.keys() == [(0, 0, 0), (1, 0, 1)]  # (local expert, src rank, src token)
    assert rank0.weight.tolist() == [0.25, 1.0]
    assert rank0.x.tolist() == [[1.0, 2.0], [3.0, 4.0]]
    rank1 = expected_receipts(example, inputs, 1)
    assert rank1.keys() == [(0, 1, 0), (1, 0, 0), (1, 1, 0)]  # expert 2 -> local 0, expert 3 -> local 1
    assert rank1.weight.tolist() == [0.125, 0.5, 0.375]


def test_received_tokens_and_round_trip_by_hand() -> None:
    example, inputs = _inputs()
    assert expected_received_tokens(example, inputs, 0) == [(0, 0), (0, 1)]
    assert expected_received_tokens(example, inputs, 1) == [(0, 0), (1, 0)]
    # token (0,0) reached both ranks, (0,1) only rank 0; (1,0) only rank 1.
    assert expected_round_trip_bf16(example, inputs, 0).tolist() == [[2.0, 4.0], [3.0, 4.0]]
    assert expected_round_trip_bf16(example, inputs, 1).tolist() == [[5.0, 6.0]]


def test_masked_everything_receives_nothing() -> None:
    example, inputs = _inputs()
    for r in inputs:
        r.topk_idx.fill_(-1)
    assert len(expected_receipts(example, inputs, 0)) == 0
    assert expected_round_trip_bf16(example, inputs, 0).abs().sum() == 0
