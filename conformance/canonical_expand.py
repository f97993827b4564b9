"""Canonical views of a V2 ``do_expand=True`` dispatch: segments, slot pointers, and the fold back.

In expand mode ``ElasticBuffer.dispatch`` returns one ``recv_x`` row per (received token, local expert
slot): expert ``e``'s rows are contiguous and start at the aligned sum of the experts before it, the gap
up to the next aligned start is padding (its bytes are not part of the contract).  ``recv_src_metadata``
has one row per received token: column 0 is the source's global index, columns ``2 + k`` point at the
expanded row of top-k slot ``k`` (``-1`` if that slot's expert is not on this rank).  Weights are 1-D,
one per expanded row.  :func:`fold_expanded` turns that back into the per-expert receipts a non-expand
dispatch gives (:func:`conformance.canonical.receipts_from_view`), using the segments of the aligned
counts only, so a row is attributed to the expert whose segment holds it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from conformance.backends.views import DispatchView
from conformance.oracle import Receipts


@dataclass(frozen=True)
class Segments:
    """Where each local expert's rows live in an expanded ``recv_x``."""

    aligned: list[int]  # num_recv_tokens_per_expert_list (aligned counts)
    raw: list[int]  # num_unaligned_recv_tokens_per_expert

    @property
    def starts(self) -> list[int]:
        """First row of each expert: the aligned sum of the experts before it."""
        out, total = [], 0
        for count in self.aligned:
            out.append(total)
            total += count
        return out

    @property
    def total_rows(self) -> int:
        """Rows an expanded ``recv_x`` has: the sum of the aligned counts."""
        return sum(self.aligned)

    def live(self, expert: int) -> range:
        """The rows expert ``expert``'s received slots must occupy: ``[start, start + raw count)``."""
        start = self.starts[expert]
        return range(start, start + self.raw[expert])

    def expert_of_row(self, row: int) -> int:
        """The expert whose aligned segment holds ``row`` (``-1`` if none does)."""
        for expert, start in enumerate(self.starts):
            if start <= row < start + self.aligned[expert]:
                return expert
        return -1


def segments_of(view: DispatchView) -> Segments:
    """The expert segments an expanded view declares (from its aligned and raw count fields)."""
    raw = view.extras["num_unaligned_recv_tokens_per_expert"]
    return Segments(aligned=[int(c) for c in view.num_recv_tokens_per_expert], raw=[int(c) for c in raw.tolist()])


def slot_pointers(view: DispatchView) -> torch.Tensor:
    """``recv_src_metadata[:, 2:]`` as int64: the expanded row of each (received token, top-k slot), or -1."""
    return view.extras["recv_src_metadata"][:, 2:].to(torch.int64)


def padding_rows(view: DispatchView) -> torch.Tensor:
    """Bool mask over the expanded rows: ``True`` for rows no slot pointer names (alignment padding)."""
    used = torch.zeros(view.x.shape[0], dtype=torch.bool)
    pointers = slot_pointers(view)
    live = pointers[(pointers >= 0) & (pointers < view.x.shape[0])]
    used[live] = True
    return ~used


def fold_expanded(view: DispatchView) -> Receipts:
    """Per-expert receipts of an expanded view, sorted by (expert, src_rank, src_token) like the oracle's.

    Every slot pointer contributes one row: the expert is the segment holding the pointed row (``-1`` when
    the pointer lies outside every segment or outside ``recv_x``), the bytes and the weight are that row's.
    """
    pointers = slot_pointers(view)
    segments = segments_of(view)
    num_rows = view.x.shape[0]
    entries: list[tuple[int, int, int, int]] = []  # (expert, src_rank, src_token, row)
    for token, slot in torch.nonzero(pointers >= 0).tolist():
        row = int(pointers[token, slot])
        expert = segments.expert_of_row(row) if row < num_rows else -1
        entries.append((expert, int(view.src_rank[token]), int(view.src_token[token]), row))
    entries.sort(key=lambda e: e[:3])
    rows = torch.tensor([e[3] for e in entries], dtype=torch.int64)
    in_range = rows.clamp(max=max(num_rows - 1, 0)) if num_rows else rows
    hidden = view.x.shape[1] if view.x.dim() == 2 else 0
    x = view.x[in_range] if num_rows else torch.empty(len(entries), hidden, dtype=view.x.dtype)
    weights = view.topk_weights.reshape(-1)
    weight = weights[in_range].to(torch.float32) if num_rows else torch.empty(len(entries), dtype=torch.float32)
    return Receipts(
        expert=torch.tensor([e[0] for e in entries], dtype=torch.int64),
        src_rank=torch.tensor([e[1] for e in entries], dtype=torch.int64),
        src_token=torch.tensor([e[2] for e in entries], dtype=torch.int64),
        x=x,
        weight=weight,
    )
