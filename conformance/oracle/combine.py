"""Expected results of combine (the reverse of dispatch, reducing over receiving ranks)."""

from __future__ import annotations

import torch

from conformance.example import Example, RankInputs


def _receiving_ranks(example: Example, topk_row: list[int]) -> list[int]:
    return sorted({e // example.experts_per_rank for e in topk_row if e >= 0})


def expected_combine(
    example: Example,
    inputs: list[RankInputs],
    src_rank: int,
    expert_outputs: dict[tuple[int, int, int], torch.Tensor],
    bias: list[torch.Tensor] | None = None,
) -> torch.Tensor:
    """``combined_x`` of ``src_rank`` as float32, before the final rounding to bf16.

    ``expert_outputs[(dst_rank, src_rank, token)]`` is the row that ``dst_rank`` returns for that token.
    Each token is the float32 sum of the rows returned by the ranks it reached, plus the bias tensors.
    """
    rank_inputs = inputs[src_rank]
    out = torch.zeros(rank_inputs.x.shape, dtype=torch.float32)
    for token in range(rank_inputs.x.shape[0]):
        for dst_rank in _receiving_ranks(example, rank_inputs.topk_idx[token].tolist()):
            out[token] += expert_outputs[(dst_rank, src_rank, token)].float()
    for b in bias or []:
        out += b.float()
    return out


def expected_round_trip(example: Example, inputs: list[RankInputs], src_rank: int) -> torch.Tensor:
    """combine(dispatch(x)) with identity experts: x times the number of ranks the token reached (float32)."""
    rank_inputs = inputs[src_rank]
    reached = torch.tensor(
        [len(_receiving_ranks(example, row)) for row in rank_inputs.topk_idx.tolist()], dtype=torch.float32
    )
    return rank_inputs.x.float() * reached.unsqueeze(1)
