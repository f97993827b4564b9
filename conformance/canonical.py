"""Turn a backend's dispatch view into per-expert receipts, the shape the oracle produces."""

from __future__ import annotations

import torch

from conformance.backends.views import DispatchView
from conformance.oracle import Receipts


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
