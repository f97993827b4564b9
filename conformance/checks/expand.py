"""The shapes of an expand-mode dispatch (P8, P20): one ``recv_x`` row per aligned slot, 1-D weights.

Shared by several properties: a property module imports the checks it shares from here, never another
property module (moved from ``conformance/properties/test_p08_expand_layout.py``)."""

from __future__ import annotations

from conformance.canonical import Segments
from conformance.core.views import DispatchView


def check_expand_shapes(view: DispatchView, segments: Segments, *, rank: int) -> None:
    """``recv_x`` has one row per aligned slot of every expert; weights are 1-D, one per row."""
    __tracebackhide__ = True
    rows = view.x.shape[0]
    if rows != segments.total_rows:
        raise AssertionError(
            f"recv_x.shape[0][rank {rank}] = {rows}, expected {segments.total_rows} (sum of the aligned counts "
            f"{segments.aligned}: one row per (token, local expert) plus alignment padding) [{view.call}]"
        )
    if view.topk_weights.dim() != 1 or view.topk_weights.shape[0] != rows:
        raise AssertionError(
            f"recv_topk_weights[rank {rank}] has shape {tuple(view.topk_weights.shape)}, expected ({rows},): "
            f"expand mode gives one weight per expanded row [{view.call}]"
        )
