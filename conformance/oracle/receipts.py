"""Expected per-expert receipts of dispatch."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from conformance.core.example import Example, RankInputs


@dataclass
class Receipts:
    """Per-expert receipts of one rank, one row per (local expert, source rank, source token).

    Rows are sorted by (expert, src_rank, src_token); the same shape is used for observed receipts so the
    two can be compared row by row.
    """

    expert: torch.Tensor  # [M] int64, local expert index
    src_rank: torch.Tensor  # [M] int64
    src_token: torch.Tensor  # [M] int64
    x: torch.Tensor  # [M, hidden] bfloat16
    weight: torch.Tensor  # [M] float32

    def __len__(self) -> int:
        return int(self.expert.numel())

    def keys(self) -> list[tuple[int, int, int]]:
        """The (expert, src_rank, src_token) key of every row, in row order."""
        return list(zip(self.expert.tolist(), self.src_rank.tolist(), self.src_token.tolist(), strict=True))


def _routed_slots(example: Example, rank_inputs: RankInputs, dst_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The (token, slot) pairs of one source rank whose expert lives on ``dst_rank``, in (token, slot) order."""
    idx = rank_inputs.topk_idx
    return ((idx >= 0) & (idx.div(example.experts_per_rank, rounding_mode="floor") == dst_rank)).nonzero(
        as_tuple=True)


def expected_receipts(example: Example, inputs: list[RankInputs], dst_rank: int) -> Receipts:
    """What ``dst_rank`` must receive: every (token, slot) routed to one of its local experts."""
    per_rank = example.experts_per_rank
    expert, src_rank, src_token, x, weight = [], [], [], [], []
    for source, rank_inputs in enumerate(inputs):
        token, slot = _routed_slots(example, rank_inputs, dst_rank)
        expert.append(rank_inputs.topk_idx[token, slot].long() - dst_rank * per_rank)
        src_rank.append(torch.full_like(token, source))
        src_token.append(token)
        x.append(rank_inputs.x[token])
        weight.append(rank_inputs.topk_weights[token, slot].to(torch.float32))
    if not inputs:
        return Receipts(*(torch.empty(0, dtype=torch.int64),) * 3, torch.empty(0, example.hidden,
                        dtype=torch.bfloat16), torch.empty(0, dtype=torch.float32))
    expert_t, rank_t, token_t = torch.cat(expert), torch.cat(src_rank), torch.cat(src_token)
    # rows sorted by (expert, src_rank, src_token): one key, every triple is distinct
    tokens = max((ri.topk_idx.shape[0] for ri in inputs), default=0) + 1
    order = torch.sort((expert_t * len(inputs) + rank_t) * tokens + token_t).indices
    return Receipts(expert=expert_t[order], src_rank=rank_t[order], src_token=token_t[order],
                    x=torch.cat(x)[order], weight=torch.cat(weight)[order])


def expected_received_tokens(example: Example, inputs: list[RankInputs], dst_rank: int) -> list[tuple[int, int]]:
    """The (src_rank, src_token) pairs ``dst_rank`` receives (once each), sorted."""
    tokens = []
    for src_rank, rank_inputs in enumerate(inputs):
        token, _ = _routed_slots(example, rank_inputs, dst_rank)
        tokens.extend((src_rank, t) for t in sorted(set(token.tolist())))
    return tokens
