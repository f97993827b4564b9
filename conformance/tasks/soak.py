"""Rank task for P31 (soak mode): the same dispatch and round trip repeated many times on the same buffers.

Each repetition is compared on the rank, bitwise, with the first one (rows in source order, so that V2's arrival
order, which is not part of the contract, is not taken for corruption); only the first repetition and the rows
of later ones that differ from it travel back, so a soak of thousands of tokens costs no more transfer than one
dispatch when nothing is wrong.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from conformance.core.cases import SoakCase
from conformance.core.outcomes import NotChecked
from conformance.core.views import DispatchOptions, DispatchView
from conformance.tasks.env import RankEnv, rank_task


@dataclass
class SoakResult:
    """One backend's soak on one rank."""

    call: str
    first: DispatchView  # the first repetition's dispatch view (rows in the library's order)
    combined: torch.Tensor  # the first repetition's round trip (identity experts)
    repetitions: int
    rows: int  # received rows per repetition
    #: repetition -> [(row in source order, its x bytes as int16)] for the rows differing from the first
    dispatch_diffs: dict[int, list[tuple[int, torch.Tensor]]] = field(default_factory=dict)
    #: repetition -> [(token, combined row)] for the round-trip rows differing from the first
    combine_diffs: dict[int, list[tuple[int, torch.Tensor]]] = field(default_factory=dict)
    wall_s: float = 0.0


def _source_order(view: DispatchView) -> torch.Tensor:
    """Row indices sorting the view's rows by (source rank, source token)."""
    stride = int(view.src_token.max()) + 1 if view.src_token.numel() else 1
    return torch.sort(view.src_rank * stride + view.src_token, stable=True).indices


def _differing(first: torch.Tensor, other: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
    a = first.contiguous().view(torch.int16).reshape(first.shape[0], -1)
    b = other.contiguous().view(torch.int16).reshape(other.shape[0], -1)
    if a.shape != b.shape:
        return [(-1, other.clone())]  # a different row count: every row counts as corrupted (the controller says so)
    rows = (a != b).any(dim=1).nonzero().flatten().tolist()
    return [(r, other[r].clone()) for r in rows]


@rank_task
def soak_repeats(env: RankEnv) -> dict[str, SoakResult | NotChecked]:
    """Per backend: ``repetitions`` x (dispatch, combine of the received rows unchanged)."""
    case: SoakCase = env.case

    def soak(adapter: Any) -> SoakResult:
        started = time.monotonic()
        first_x: torch.Tensor | None = None
        first_combined: torch.Tensor | None = None
        result: SoakResult | None = None
        for repetition in range(case.repetitions):
            view, raw = adapter.dispatch(env.inputs, case.example, DispatchOptions(), env.rank)
            combined = adapter.combine(raw, raw.recv_x)[0].cpu()
            ordered = view.x[_source_order(view)]
            if result is None:
                first_x, first_combined = ordered, combined
                result = SoakResult(view.call, view, combined, case.repetitions, int(view.x.shape[0]))
                continue
            assert first_x is not None and first_combined is not None
            if diffs := _differing(first_x, ordered):
                result.dispatch_diffs[repetition] = diffs
            if diffs := _differing(first_combined, combined):
                result.combine_diffs[repetition] = diffs
        assert result is not None
        result.wall_s = time.monotonic() - started
        return result

    return env.each_backend("dispatch", soak, capability="combine")
