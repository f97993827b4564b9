"""Canonical views: a backend's dispatch results put in the oracle's shape, so that order never matters.

Properties compare canonical views, never raw buffer order (order is not part of the contract unless
``deterministic=True``).  :func:`receipts_from_view` turns a (non-expand) dispatch view into per-expert
receipts sorted like the oracle's; :func:`fold_expanded` does the same for a V2 ``do_expand=True`` view.

Expand mode: ``ElasticBuffer.dispatch`` returns one ``recv_x`` row per (received token, local expert slot):
expert ``e``'s rows are contiguous and start at the aligned sum of the experts before it, the gap up to the
next aligned start is padding (its bytes are not part of the contract).  ``recv_src_metadata`` has one row
per received token: column 0 is the source's global index, columns ``2 + k`` point at the expanded row of
top-k slot ``k`` (``-1`` if that slot's expert is not on this rank).  Weights are 1-D, one per expanded row.
The fold uses the segments of the aligned counts only, so a row is attributed to the expert whose segment
holds it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from conformance.core.spec import BackendSpec
from conformance.core.views import DispatchView, v2_layout
from conformance.oracle import Receipts

Token = tuple[int, int]  # (source rank, source token)


def api_of(view: DispatchView) -> str:
    """``v1`` or ``v2``: the API contract a view's backend follows."""
    return view.api or BackendSpec.parse(view.backend).api


def token_rows(view: DispatchView) -> dict[Token, int]:
    """Map each received (source rank, source token) to its row in the view (last row if repeated)."""
    return {tok: row for row, tok in enumerate(zip(view.src_rank.tolist(), view.src_token.tolist(), strict=True))}


def source_order(src_rank: torch.Tensor, src_token: torch.Tensor) -> torch.Tensor:
    """Row indices sorting by (source rank, source token) (stable)."""
    key = src_rank * (int(src_token.max()) + 1 if src_token.numel() else 1) + src_token
    return torch.sort(key, stable=True).indices


def receipts_from_view(view: DispatchView) -> Receipts:
    """One row per (received token, slot with a local expert), sorted by (expert, src_rank, src_token)."""
    rows, slots = (view.topk_idx >= 0).nonzero(as_tuple=True)
    expert = view.topk_idx[rows, slots]
    src_rank, src_token = view.src_rank[rows], view.src_token[rows]
    order = _lexsort(expert, src_rank, src_token)
    return Receipts(
        expert=expert[order],
        src_rank=src_rank[order],
        src_token=src_token[order],
        x=view.x[rows[order]],
        weight=view.topk_weights[rows, slots][order].to(torch.float32),
    )


def _lexsort(*keys: torch.Tensor) -> torch.Tensor:
    """Indices sorting by the first key, then the second, ... (stable)."""
    order = torch.arange(keys[0].numel())
    for key in reversed(keys):
        order = order[torch.sort(key[order], stable=True).indices]
    return order


#: Layout fields whose rows follow the received rows (permuted with them); only their stable columns compare.
ROW_FIELDS = {"recv_src_metadata"}


def comparable_fields(view: DispatchView, canonical: bool) -> dict[str, Any]:
    """Every field of a (non-expand) view that repeated identical dispatches must reproduce bit for bit.

    ``canonical=False`` keeps the raw row order (order is part of the result); ``canonical=True`` sorts the
    rows by source first (order is not).  Of ``recv_src_metadata`` only columns 0 and 1 are kept: in
    non-expand mode the real V2 leaves stale memory in columns 2.. (fixtures/deepep-real, DIVERGENCES.md).
    """
    order = source_order(view.src_rank, view.src_token) if canonical else torch.arange(view.src_rank.numel())
    fields: dict[str, Any] = {
        "source order (src_rank)": view.src_rank[order],
        "source order (src_token)": view.src_token[order],
        "recv_x": view.x[order],
        "recv_topk_idx": view.topk_idx[order],
        "recv_topk_weights": view.topk_weights[order],
        "num_recv_tokens_per_expert_list": torch.tensor([int(c) for c in view.num_recv_tokens_per_expert]),
    }
    for key, value in sorted(view.layout.fields().items() if view.layout is not None else ()):
        fields[f"handle/layout {key}"] = value[order, :2] if key in ROW_FIELDS else value
    return fields


# -------------------------------------------------------------------------------------- V2 expand mode


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
    raw = v2_layout(view).num_unaligned_recv_tokens_per_expert
    return Segments(aligned=[int(c) for c in view.num_recv_tokens_per_expert], raw=[int(c) for c in raw.tolist()])


def slot_pointers(view: DispatchView) -> torch.Tensor:
    """``recv_src_metadata[:, 2:]`` as int64: the expanded row of each (received token, top-k slot), or -1."""
    return v2_layout(view).recv_src_metadata[:, 2:].to(torch.int64)


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
