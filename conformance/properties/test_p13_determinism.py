"""P13 determinism: V2 with ``deterministic=True`` returns exactly V1's rows in V1's order; repeated identical
dispatches are bitwise identical (raw row order for V1 and deterministic V2, canonical views for V2's
default mode, whose receive order is not part of the contract)."""

from __future__ import annotations

from typing import Any

import torch

from conformance.assertions import (
    assert_fields_identical,
    bytes_equal,
    describe_weight,
    hex_row,
    weight_bits,
)
from conformance.canonical import api_of, comparable_fields
from conformance.core.example import Example
from conformance.core.outcomes import NotChecked
from conformance.core.views import DispatchView
from conformance.properties import CheckContext, Property, register
from conformance.strategies import sized
from conformance.strategies.layout import layout_examples
from conformance.tasks.dispatch import RepeatedRuns, repeated_views

#: V1's receive order (recorded, DeepEP 2.1.0): by source rank, then source token.
V1_ORDER = "V1's order: (source rank, source token)"


def assert_same_rows(det: DispatchView, ref: DispatchView | None, *, rank: int) -> None:
    """The deterministic V2 view has ``ref``'s rows in ``ref``'s order (``ref`` a V1 view), byte for byte:
    ``recv_x``, ``recv_topk_idx``, and ``recv_topk_weights`` where ``recv_topk_idx >= 0``.  Without a V1
    backend, the order is checked against V1's recorded order (source rank, source token)."""
    __tracebackhide__ = True
    got = list(zip(det.src_rank.tolist(), det.src_token.tolist(), strict=True))
    if ref is None:
        want, against = sorted(got), V1_ORDER
    else:
        want, against = list(zip(ref.src_rank.tolist(), ref.src_token.tolist(), strict=True)), ref.backend
    if got != want:
        if len(got) != len(want):
            raise AssertionError(f"recv_x[rank {rank}] has {len(got)} rows, {against} has {len(want)} [{det.call}]")
        row = next(i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g != w)
        raise AssertionError(
            f"row {row} of recv_x[rank {rank}] comes from src {got[row]}, {against} has src {want[row]} there: "
            f"deterministic=True must give exactly V1's receive order; rows {row}..{row + 3}: "
            f"{got[row:row + 4]} vs {want[row:row + 4]} [{det.call}]"
        )
    if ref is None:
        return
    for row in range(len(got)):
        where = f"[rank {rank}, row {row}, src {got[row]}]"
        if not bytes_equal(det.x[row], ref.x[row]):
            columns = (det.x[row].view(torch.int16) != ref.x[row].view(torch.int16)).nonzero().flatten().tolist()
            raise AssertionError(
                f"recv_x{where} bytes differ from {ref.backend}: got {hex_row(det.x[row], columns[:3])}; "
                f"expected {hex_row(ref.x[row], columns[:3])} [{det.call}]"
            )
        if det.topk_idx[row].tolist() != ref.topk_idx[row].tolist():
            raise AssertionError(
                f"recv_topk_idx{where} = {det.topk_idx[row].tolist()}, {ref.backend} has "
                f"{ref.topk_idx[row].tolist()} [{det.call}]"
            )
        for slot, idx in enumerate(det.topk_idx[row].tolist()):
            a, b = det.topk_weights[row, slot], ref.topk_weights[row, slot]
            if idx >= 0 and weight_bits(a) != weight_bits(b):
                raise AssertionError(
                    f"recv_topk_weights{where[:-1]}, slot {slot}] = {describe_weight(a)}, {ref.backend} has "
                    f"{describe_weight(b)} [{det.call}]"
                )


def assert_repeatable(runs: list[DispatchView], *, deterministic: bool, rank: int) -> None:
    """Repeated identical dispatches agree bit for bit (in raw order unless V2's default mode)."""
    __tracebackhide__ = True
    ordered = api_of(runs[0]) == "v1" or deterministic
    what = (
        "repeated identical dispatches (raw row order)"
        if ordered
        else "repeated identical dispatches (rows by source: V2's default receive order is not part of the contract)"
    )
    first = comparable_fields(runs[0], canonical=not ordered)
    for later in runs[1:]:
        assert_fields_identical(first, comparable_fields(later, canonical=not ordered), rank=rank, call=later.call,
                                what=what)


def check(ctx: CheckContext, example: Example, per_rank: list[dict[str, Any]]) -> None:
    """V2 ``deterministic=True`` equals V1's rows and order; repeated runs are bitwise identical per backend."""
    __tracebackhide__ = True
    for rank, per_backend in enumerate(per_rank):
        v1_views: list[DispatchView] = []
        det_views: list[DispatchView] = []
        for runs in per_backend.values():
            if isinstance(runs, NotChecked):
                ctx.not_checked(runs, example)
                continue
            assert isinstance(runs, RepeatedRuns)
            ctx.checking((runs.default[0].backend,))
            assert_repeatable(runs.default, deterministic=False, rank=rank)
            if api_of(runs.default[0]) == "v1":
                v1_views.append(runs.default[0])
            if isinstance(runs.deterministic, NotChecked):
                ctx.not_checked(runs.deterministic, example)
            elif runs.deterministic is not None:
                assert_repeatable(runs.deterministic, deterministic=True, rank=rank)
                det_views.append(runs.deterministic[0])
        for det in det_views:
            for ref in v1_views or [None]:
                ctx.checking((ref.backend, det.backend) if ref is not None else (det.backend,))
                assert_same_rows(det, ref, rank=rank)
    ctx.checking(None)


PROPERTY = register(Property(
    id="P13-determinism",
    title="V2 deterministic=True equals V1's order; repeated runs are bitwise identical",
    strategy=sized(layout_examples), task=repeated_views, check=check,
))
test_determinism = PROPERTY.test
