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


def expected_receipts(example: Example, inputs: list[RankInputs], dst_rank: int) -> Receipts:
    """What ``dst_rank`` must receive: every (token, slot) routed to one of its local experts."""
    per_rank = example.experts_per_rank
    rows: list[tuple[int, int, int, torch.Tensor, float]] = []
    for src_rank, rank_inputs in enumerate(inputs):
        for token in range(rank_inputs.topk_idx.shape[0]):
            for slot in range(example.num_topk):
                expert = int(rank_inputs.topk_idx[token, slot])
                if expert >= 0 and expert // per_rank == dst_rank:
                    weight = float(rank_inputs.topk_weights[token, slot])
                    rows.append((expert - dst_rank * per_rank, src_rank, token, rank_inputs.x[token], weight))
    rows.sort(key=lambda row: row[:3])
    hidden = example.hidden
    return Receipts(
        expert=torch.tensor([r[0] for r in rows], dtype=torch.int64),
        src_rank=torch.tensor([r[1] for r in rows], dtype=torch.int64),
        src_token=torch.tensor([r[2] for r in rows], dtype=torch.int64),
        x=torch.stack([r[3] for r in rows]) if rows else torch.empty(0, hidden, dtype=torch.bfloat16),
        weight=torch.tensor([r[4] for r in rows], dtype=torch.float32),
    )


def expected_received_tokens(example: Example, inputs: list[RankInputs], dst_rank: int) -> list[tuple[int, int]]:
    """The (src_rank, src_token) pairs ``dst_rank`` receives (once each), sorted."""
    per_rank = example.experts_per_rank
    tokens = []
    for src_rank, rank_inputs in enumerate(inputs):
        for token in range(rank_inputs.topk_idx.shape[0]):
            experts = [int(e) for e in rank_inputs.topk_idx[token].tolist()]
            if any(e >= 0 and e // per_rank == dst_rank for e in experts):
                tokens.append((src_rank, token))
    return tokens
