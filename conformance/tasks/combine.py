"""Rank tasks around combine: dispatch + combine, round trip, cached dispatch, gradients through autograd.

Every task dispatches this rank's inputs through every backend first (operation ``dispatch``), then runs
the combine side (operation ``combine``), so that a known combine limit (V2 rejects hidden=128) turns into
a :class:`NotChecked` result for that backend only, and a dispatch failure is never mistaken for it.
Results are CPU tensors, keyed by backend name.  The extra inputs (biases, a second payload, upstream
gradients) come from :mod:`conformance.core.example`, where the oracle builds the same tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from conformance.backends.contract import Raw
from conformance.core.cases import CombineCase
from conformance.core.example import (
    bias_argument,
    build_biases,
    build_rank_inputs,
    mask_weight_grads,
    second_payload,
    upstream_combined_grad,
    upstream_row_grads,
)
from conformance.core.outcomes import NotChecked, Why
from conformance.core.views import DispatchOptions, DispatchView
from conformance.tasks.env import RankEnv, rank_task

# ----------------------------------------------------------------------------------------------- results


@dataclass
class CombineResult:
    """``combine`` of one backend on one rank (token order of this rank's inputs)."""

    call: str
    combined_x: torch.Tensor  # [T, hidden] bf16
    combined_topk_weights: torch.Tensor | None  # [T, num_topk] float32
    not_checked: NotChecked | None = None  # a part the backend cannot take (e.g. no combine_weights): not passed
    reduction_group: int | None = None  # the backend's reduction tree (see reduction_group below); None: unknown
    num_channels: int | None = None  # V1: the channels of the dispatch's handle (its config's num_sms // 2)


@dataclass
class CachedResult:
    """A dispatch and two cached dispatches through its handle (same payload, then another one)."""

    call: str
    src_rank: torch.Tensor  # [N] int64, row order of the first dispatch
    src_token: torch.Tensor  # [N] int64
    recv_x: torch.Tensor  # [N, hidden] bf16, first dispatch
    cached_same: torch.Tensor  # cached dispatch of the same payload
    cached_other: torch.Tensor  # cached dispatch of :func:`second_payload`


@dataclass
class GradResult:
    """Gradients through ``FusedDispatch`` / ``FusedCombine`` and the direct calls they must equal."""

    call: str
    src_rank: torch.Tensor  # [N] int64, received rows
    src_token: torch.Tensor  # [N] int64
    grad_x: torch.Tensor  # [T, hidden] bf16: x.grad through FusedDispatch
    grad_weights: torch.Tensor  # [T, num_topk] float32: topk_weights.grad through FusedDispatch
    direct_x: torch.Tensor | None  # combine(row grads) called directly (None: the backend cannot combine)
    direct_weights: torch.Tensor | None  # (None: the backend's combine takes no topk_weights)
    grad_rows: torch.Tensor  # [N, hidden] bf16: grad of the expert outputs through FusedCombine
    direct_rows: torch.Tensor | None  # cached dispatch of the upstream grad called directly
    unmasked_weights: torch.Tensor | None = None  # combine of weight grads NOT zeroed at non-local slots
    not_checked: list[NotChecked] = field(default_factory=list)  # comparisons its capabilities do not allow
    reduction_group: int | None = None  # the backend's reduction tree for x.grad (a combine)
    api: str = ""  # the API the backend follows (the unmasked weight gradients differ between APIs by design)


# ------------------------------------------------------------------------------------------------- tasks


def reduction_group(adapter: Any, raw: Raw) -> int | None:
    """How many consecutive ranks' contributions the backend's combine sums and rounds before its last level
    (``Backend.reduction_group``, optional: ``None`` where the backend does not say)."""
    method = getattr(adapter, "reduction_group", None)
    group = None if method is None else method(raw)
    return None if group is None else int(group)


def _dispatched(env: RankEnv, options: DispatchOptions = DispatchOptions()) -> dict[str, Any]:
    """Every backend's plain dispatch: ``(view, raw)`` (raw keeps the handle for the combine side)."""
    assert env.example is not None
    return env.each_backend("dispatch", lambda adapter: adapter.dispatch(env.inputs, env.example, options, env.rank))


@rank_task
def combine_outputs(env: RankEnv) -> dict[str, CombineResult | NotChecked]:
    """Dispatch, let the expert on this rank scale every received row and weight by ``1 + rank``
    (``bf16(row * (1 + rank))`` computed in float32; weights as float32 products), combine with the case's
    ``num_bias`` bias tensors (V1: with the case's configs, see :attr:`CombineCase.v1_num_sms`)."""
    case: CombineCase = env.case
    example = case.example
    biases = [b.to(env.device) for b in build_biases(example, env.rank, case.num_bias)]
    scale = float(1 + env.rank)

    def then(adapter: Any, dispatched: tuple[DispatchView, dict[str, Any]]) -> CombineResult:
        view, raw = dispatched
        expert_x = (raw.recv_x.float() * scale).to(torch.bfloat16)
        expert_w = raw.recv_topk_weights.float() * torch.tensor(scale, dtype=torch.float32, device=env.device)
        with_weights = adapter.spec.has("combine_weights")
        x, w = adapter.combine(raw, expert_x, topk_weights=expert_w if with_weights else None,
                               bias=bias_argument(biases))
        call = adapter.describe_combine(example, env.rank)
        if raw.v1_num_sms:
            call += f" [config: the table's with num_sms={case.v1_num_sms}], after {view.call}"
        return CombineResult(call, x.cpu(), None if w is None else w.cpu(),
                             None if with_weights else NotChecked.part(
                                 adapter.spec.name, Why.CAPABILITY, "combined_topk_weights: the backend does not "
                                 "declare the capability 'combine_weights' (combine was called without topk_weights)"),
                             reduction_group(adapter, raw), getattr(view.layout, "num_channels", None))

    return env.then_each_backend(_dispatched(env, DispatchOptions(v1_num_sms=case.v1_num_sms)), "combine", then)


@rank_task
def round_trip(env: RankEnv) -> dict[str, CombineResult | NotChecked]:
    """combine(dispatch(x)) with identity experts (the received rows are combined unchanged), no weights."""

    def then(adapter: Any, dispatched: tuple[DispatchView, dict[str, Any]]) -> CombineResult:
        _, raw = dispatched
        x, _ = adapter.combine(raw, raw.recv_x)
        return CombineResult(adapter.describe_combine(env.example, env.rank), x.cpu(), None,
                             reduction_group=reduction_group(adapter, raw))

    return env.then_each_backend(_dispatched(env), "combine", then)


@rank_task
def cached_dispatch(env: RankEnv) -> dict[str, CachedResult | NotChecked]:
    """Dispatch, then cached-dispatch the same payload and :func:`second_payload` through the handle."""
    assert env.example is not None
    other = second_payload(env.example, env.rank).to(env.device)

    def run(adapter: Any) -> CachedResult:
        view, raw = adapter.dispatch(env.inputs, env.example, DispatchOptions(), env.rank)
        same = adapter.cached_dispatch(raw, env.inputs.x).cpu()
        again = adapter.cached_dispatch(raw, other).cpu()
        call = f"{view.call}, then cached dispatch(x, handle=handle) [{type(adapter).__name__}.cached_dispatch]"
        return CachedResult(call, view.src_rank, view.src_token, view.x, same, again)

    # A wrapper's cached dispatch may make a combine first (Megatron's is the backward of fused_combine): the
    # combine's known limits (its refusal only) apply to it too.
    return env.each_backend("dispatch", run, also=("combine",))


@rank_task
def gradients(env: RankEnv) -> dict[str, GradResult | NotChecked]:
    """Backward through ``FusedDispatch`` (upstream grads of ``recv_x`` / ``recv_topk_weights`` per received row,
    from ``upstream_row_grads``, weight grads masked to local slots) and through ``FusedCombine`` (upstream
    grad from ``upstream_combined_grad``); plus the direct combine / cached dispatch they must equal."""
    example, rank, device, inputs = env.example, env.rank, env.device, env.inputs
    assert example is not None
    tables = [upstream_row_grads(example, rank, src) for src in range(env.world_size)]
    source_idx = [build_rank_inputs(example, src).topk_idx for src in range(env.world_size)]
    upstream_y = upstream_combined_grad(example, rank).to(device)

    def forward(adapter: Any) -> dict[str, Any]:
        x = inputs.x.clone().requires_grad_(True)
        w = inputs.topk_weights.clone().requires_grad_(True)
        recv_x, recv_w, raw, view = adapter.fused_dispatch(inputs, example, rank, x, w)
        return {"view": view, "x": x, "w": w, "recv_x": recv_x, "recv_w": recv_w, "raw": raw}

    def row_grads(view: DispatchView, masked: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """The upstream gradients of ``view``'s received rows (weights masked to local slots, or not)."""
        rows = list(zip(view.src_rank.tolist(), view.src_token.tolist(), strict=True))
        if not rows:
            return torch.zeros(0, example.hidden).bfloat16().to(device), torch.zeros(0, example.num_topk).to(device)
        gx = torch.stack([tables[s][0][t] for s, t in rows])
        gw = torch.stack([mask_weight_grads(example, rank, source_idx[s][t], tables[s][1][t]) if masked
                          else tables[s][1][t] for s, t in rows])
        return gx.to(device).contiguous(), gw.to(device).contiguous()

    def unmasked_weight_grads(adapter: Any) -> torch.Tensor:
        """``topk_weights.grad`` of the backend's own autograd for weight gradients that are *not* zero at slots
        whose expert is on another rank (a backend without ``combine_weights``: its backward is the only combine of
        weights it offers); the rows come from a second dispatch, in its own order."""
        x = inputs.x.clone().requires_grad_(True)
        w = inputs.topk_weights.clone().requires_grad_(True)
        recv_x, recv_w, _, again = adapter.fused_dispatch(inputs, example, rank, x, w)
        torch.autograd.backward([recv_x, recv_w], list(row_grads(again, masked=False)))
        return w.grad.detach()

    def backward(adapter: Any, fwd: dict[str, Any]) -> GradResult:
        view, raw, spec = fwd["view"], fwd["raw"], adapter.spec
        rows = list(zip(view.src_rank.tolist(), view.src_token.tolist(), strict=True))
        gx = torch.stack([tables[s][0][t] for s, t in rows]) if rows else torch.zeros(0, example.hidden).bfloat16()
        gw = (
            torch.stack([mask_weight_grads(example, rank, source_idx[s][t], tables[s][1][t]) for s, t in rows])
            if rows
            else torch.zeros(0, example.num_topk)
        )
        gx, gw = gx.to(device).contiguous(), gw.to(device).contiguous()
        torch.autograd.backward([fwd["recv_x"], fwd["recv_w"]], [gx, gw])
        not_checked: list[NotChecked] = []
        direct_w = unmasked_w = None
        if spec.has("combine_weights"):
            direct_x, direct_w = adapter.combine(raw, gx, topk_weights=gw)
            unmasked = torch.stack([tables[s][1][t] for s, t in rows]) if rows else torch.zeros(0, example.num_topk)
            unmasked_w = adapter.combine(raw, gx, topk_weights=unmasked.to(device).contiguous())[1]
        elif spec.has("combine"):
            direct_x = adapter.combine(raw, gx)[0]
            not_checked.append(NotChecked.part(
                spec.name, Why.CAPABILITY, "topk_weights.grad against a direct combine of the weight gradients: the "
                                           "backend does not declare the capability 'combine_weights'"))
            unmasked_w = unmasked_weight_grads(adapter)
        else:
            direct_x = None
            not_checked.append(NotChecked.part(spec.name, Why.CAPABILITY, "x.grad against a direct combine: the "
                                               "backend does not declare the capability 'combine'"))

        expert_out = raw.recv_x.detach().clone().requires_grad_(True)
        adapter.fused_combine(raw, expert_out).backward(upstream_y)
        if spec.has("cached_dispatch"):
            direct_rows = adapter.cached_dispatch(raw, upstream_y.contiguous()).cpu()
        else:
            direct_rows = None
            not_checked.append(NotChecked.part(
                spec.name, Why.CAPABILITY, "expert_output.grad against a direct cached dispatch: the backend does not "
                                           "declare the capability 'cached_dispatch'"))
        call = (
            f"{'own autograd of ' + spec.name if spec.plugin else 'FusedDispatch/FusedCombine'} over {view.call}; "
            f"backward = {adapter.describe_combine(example, rank)} / cached dispatch"
        )
        return GradResult(
            call, view.src_rank, view.src_token, fwd["x"].grad.cpu(), fwd["w"].grad.cpu(),
            None if direct_x is None else direct_x.cpu(), None if direct_w is None else direct_w.cpu(),
            expert_out.grad.cpu(), direct_rows, None if unmasked_w is None else unmasked_w.cpu(), not_checked,
            reduction_group(adapter, raw), adapter.api,
        )

    return env.then_each_backend(env.each_backend("dispatch", forward), "combine", backward)
