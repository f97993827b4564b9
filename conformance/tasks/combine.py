"""Rank tasks around combine: dispatch + combine, round trip, cached dispatch, gradients through autograd.

Every task dispatches this rank's inputs through every backend first (operation ``dispatch``), then runs
the combine side (operation ``combine``), so that a known combine limit (V2 rejects hidden=128) turns into
an :class:`Unsupported` result for that backend only, and a dispatch failure is never mistaken for it.
Results are CPU tensors, keyed by backend name.

The extra inputs the tasks need (biases, a second payload, upstream gradients) are built here from the
example's seed, so that the controller can rebuild exactly the same tensors for the oracle.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from conformance.backends.autograd import FusedCombine, FusedDispatch
from conformance.backends.views import DispatchOptions, DispatchView, Unsupported
from conformance.example import Example, RankInputs, build_rank_inputs
from conformance.mutation import activate
from conformance.tasks.settings import TaskSettings, backend_calls
from conformance.world.rank import context

# ------------------------------------------------------------------------------------------ extra inputs


def _generator(example: Example, *parts: int) -> torch.Generator:
    gen = torch.Generator()
    seed = example.seed
    for part in parts:
        seed = (seed * 1_000_003 + part) % (2**63)
    gen.manual_seed(seed)
    return gen


def _values(example: Example, shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """Small integers (exactly summable) for integer payloads, standard normals otherwise."""
    if example.payload == "integers":
        return torch.randint(-8, 9, shape, generator=gen).to(dtype)
    return torch.randn(shape, generator=gen).to(dtype)


def build_biases(example: Example, rank: int, num_bias: int) -> list[torch.Tensor]:
    """The ``num_bias`` (0, 1 or 2) bf16 ``[tokens, hidden]`` bias tensors ``rank`` passes to combine."""
    shape = (example.tokens_per_rank[rank], example.hidden)
    return [_values(example, shape, torch.bfloat16, _generator(example, 101, rank, i)) for i in range(num_bias)]


def bias_argument(biases: list[torch.Tensor]) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None:
    """The ``bias=`` argument both APIs take: ``None``, one tensor, or a 2-tuple."""
    if not biases:
        return None
    return biases[0] if len(biases) == 1 else (biases[0], biases[1])


def second_payload(example: Example, rank: int) -> torch.Tensor:
    """Another payload of the same shape and kind (the example's payload with the next seed)."""
    other = dataclasses.replace(example, seed=(example.seed + 1) % 2**32)
    return build_rank_inputs(other, rank).x


def upstream_row_grads(example: Example, dst_rank: int, src_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Upstream gradients ``dst_rank`` holds for the rows it received from ``src_rank``, indexed by source token:
    bf16 ``[tokens of src_rank, hidden]`` for ``recv_x`` and float32 ``[tokens, num_topk]`` for the weights
    (before masking: only slots with a local expert carry a weight gradient, see :func:`mask_weight_grads`)."""
    num_tokens = example.tokens_per_rank[src_rank]
    gx = _values(example, (num_tokens, example.hidden), torch.bfloat16, _generator(example, 202, dst_rank, src_rank))
    gw = _values(example, (num_tokens, example.num_topk), torch.float32, _generator(example, 303, dst_rank, src_rank))
    return gx, gw


def mask_weight_grads(
    example: Example, dst_rank: int, topk_idx_row: torch.Tensor, grads: torch.Tensor
) -> torch.Tensor:
    """Zero the weight gradients of slots whose expert is not on ``dst_rank`` (global ``topk_idx_row``).

    An expert layer only reads the weights of its local slots, so the upstream gradient of the others is
    zero in real training.  (With non-zero gradients there, V1 sums them over ranks while V2 reads only the
    owner's: the APIs would disagree, see the P9 docstring.)
    """
    per_rank = example.experts_per_rank
    local = (topk_idx_row >= 0) & (torch.div(topk_idx_row, per_rank, rounding_mode="floor") == dst_rank)
    return torch.where(local, grads, torch.zeros_like(grads))


def upstream_combined_grad(example: Example, rank: int) -> torch.Tensor:
    """The upstream gradient of ``combined_x`` on ``rank`` (bf16 ``[tokens, hidden]``)."""
    shape = (example.tokens_per_rank[rank], example.hidden)
    return _values(example, shape, torch.bfloat16, _generator(example, 404, rank))


# ----------------------------------------------------------------------------------------------- results


@dataclass
class CombineResult:
    """``combine`` of one backend on one rank (token order of this rank's inputs)."""

    call: str
    combined_x: torch.Tensor  # [T, hidden] bf16
    combined_topk_weights: torch.Tensor | None  # [T, num_topk] float32


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
    direct_x: torch.Tensor  # combine(row grads) called directly
    direct_weights: torch.Tensor
    grad_rows: torch.Tensor  # [N, hidden] bf16: grad of the expert outputs through FusedCombine
    direct_rows: torch.Tensor  # cached dispatch of the upstream grad called directly
    unmasked_weights: torch.Tensor | None = None  # combine of weight grads NOT zeroed at non-local slots


# ------------------------------------------------------------------------------------------------- tasks


def _dispatch_then(
    settings: TaskSettings,
    example: Example,
    dispatch: Callable[[Any], Any],
    then: Callable[[Any, Any], Any],
) -> dict[str, Any]:
    """Run ``dispatch(adapter)`` for every backend (operation ``dispatch``), then ``then(adapter, what dispatch
    returned)`` for every backend (operation ``combine``)."""
    dispatched = dict(backend_calls(settings, example, "dispatch", dispatch))

    def second(adapter: Any) -> Any:
        first = dispatched[adapter.spec.name]
        return first if isinstance(first, Unsupported) else then(adapter, first)

    return dict(backend_calls(settings, example, "combine", second))


def _plain_dispatch(example: Example, inputs: RankInputs, rank: int) -> Callable[[Any], Any]:
    return lambda adapter: adapter.dispatch(inputs, example, DispatchOptions(), rank)


def combine_outputs(settings: TaskSettings, example: Example, num_bias: int) -> dict[str, CombineResult | Unsupported]:
    """Dispatch, let the expert on this rank scale every received row and weight by ``1 + rank``
    (``bf16(row * (1 + rank))`` computed in float32; weights as float32 products), combine with
    ``num_bias`` bias tensors."""
    ctx = context()
    device = ctx.torch_device()
    inputs = build_rank_inputs(example, ctx.rank).to(device)
    biases = [b.to(device) for b in build_biases(example, ctx.rank, num_bias)]
    scale = float(1 + ctx.rank)

    def then(adapter: Any, dispatched: tuple[DispatchView, dict[str, Any]]) -> CombineResult:
        _, raw = dispatched
        expert_x = (raw["recv_x"].float() * scale).to(torch.bfloat16)
        expert_w = raw["recv_topk_weights"].float() * torch.tensor(scale, dtype=torch.float32, device=device)
        x, w = adapter.combine(raw, expert_x, topk_weights=expert_w, bias=bias_argument(biases))
        return CombineResult(adapter.describe_combine(example, ctx.rank), x.cpu(), None if w is None else w.cpu())

    with activate(settings.mutant):
        return _dispatch_then(settings, example, _plain_dispatch(example, inputs, ctx.rank), then)


def round_trip(settings: TaskSettings, example: Example) -> dict[str, CombineResult | Unsupported]:
    """combine(dispatch(x)) with identity experts (the received rows are combined unchanged), no weights."""
    ctx = context()
    inputs = build_rank_inputs(example, ctx.rank).to(ctx.torch_device())

    def then(adapter: Any, dispatched: tuple[DispatchView, dict[str, Any]]) -> CombineResult:
        _, raw = dispatched
        x, _ = adapter.combine(raw, raw["recv_x"])
        return CombineResult(adapter.describe_combine(example, ctx.rank), x.cpu(), None)

    with activate(settings.mutant):
        return _dispatch_then(settings, example, _plain_dispatch(example, inputs, ctx.rank), then)


def cached_dispatch(settings: TaskSettings, example: Example) -> dict[str, CachedResult | Unsupported]:
    """Dispatch, then cached-dispatch the same payload and :func:`second_payload` through the handle."""
    ctx = context()
    device = ctx.torch_device()
    inputs = build_rank_inputs(example, ctx.rank).to(device)
    other = second_payload(example, ctx.rank).to(device)
    rank = ctx.rank

    def run(adapter: Any) -> CachedResult:
        view, raw = adapter.dispatch(inputs, example, DispatchOptions(), rank)
        same = adapter.cached_dispatch(raw, inputs.x).cpu()
        again = adapter.cached_dispatch(raw, other).cpu()
        call = f"{view.call}, then cached dispatch(x, handle=handle) [{type(adapter).__name__}.cached_dispatch]"
        return CachedResult(call, view.src_rank, view.src_token, view.x, same, again)

    with activate(settings.mutant):
        return dict(backend_calls(settings, example, "dispatch", run))


class _KeepView:
    """Forwards to an adapter and keeps the view of its last dispatch (``FusedDispatch`` drops it)."""

    def __init__(self, adapter: Any) -> None:
        self.adapter = adapter
        self.view: DispatchView | None = None

    def dispatch(self, *args: Any, **kwargs: Any) -> tuple[DispatchView, dict[str, Any]]:
        self.view, raw = self.adapter.dispatch(*args, **kwargs)
        return self.view, raw

    def __getattr__(self, name: str) -> Any:
        return getattr(self.adapter, name)


def gradients(settings: TaskSettings, example: Example) -> dict[str, GradResult | Unsupported]:
    """Backward through ``FusedDispatch`` (upstream grads of ``recv_x`` / ``recv_topk_weights`` per received row,
    from :func:`upstream_row_grads`, weight grads masked to local slots) and through ``FusedCombine`` (upstream
    grad from :func:`upstream_combined_grad`); plus the direct combine / cached dispatch they must equal."""
    ctx = context()
    device = ctx.torch_device()
    rank = ctx.rank
    inputs = build_rank_inputs(example, rank).to(device)
    tables = [upstream_row_grads(example, rank, src) for src in range(ctx.world_size)]
    source_idx = [build_rank_inputs(example, src).topk_idx for src in range(ctx.world_size)]
    upstream_y = upstream_combined_grad(example, rank).to(device)

    def forward(adapter: Any) -> dict[str, Any]:
        keep = _KeepView(adapter)
        x = inputs.x.clone().requires_grad_(True)
        w = inputs.topk_weights.clone().requires_grad_(True)
        state: dict[str, Any] = {}
        recv_x, recv_w = FusedDispatch.apply(x, w, keep, inputs.topk_idx, example, rank, state)
        return {"keep": keep, "x": x, "w": w, "recv_x": recv_x, "recv_w": recv_w, "raw": state["raw"]}

    def backward(adapter: Any, fwd: dict[str, Any]) -> GradResult:
        keep, view, raw = fwd["keep"], fwd["keep"].view, fwd["raw"]
        rows = list(zip(view.src_rank.tolist(), view.src_token.tolist(), strict=True))
        gx = torch.stack([tables[s][0][t] for s, t in rows]) if rows else torch.zeros(0, example.hidden).bfloat16()
        gw = (
            torch.stack([mask_weight_grads(example, rank, source_idx[s][t], tables[s][1][t]) for s, t in rows])
            if rows
            else torch.zeros(0, example.num_topk)
        )
        gx, gw = gx.to(device).contiguous(), gw.to(device).contiguous()
        torch.autograd.backward([fwd["recv_x"], fwd["recv_w"]], [gx, gw])
        direct_x, direct_w = adapter.combine(raw, gx, topk_weights=gw)
        unmasked = torch.stack([tables[s][1][t] for s, t in rows]) if rows else torch.zeros(0, example.num_topk)
        unmasked_w = adapter.combine(raw, gx, topk_weights=unmasked.to(device).contiguous())[1]

        expert_out = raw["recv_x"].detach().clone().requires_grad_(True)
        FusedCombine.apply(expert_out, keep, raw).backward(upstream_y)
        direct_rows = adapter.cached_dispatch(raw, upstream_y.contiguous())
        call = (
            f"FusedDispatch/FusedCombine over {view.call}; backward = {adapter.describe_combine(example, rank)} "
            f"/ cached dispatch"
        )
        return GradResult(
            call, view.src_rank, view.src_token, fwd["x"].grad.cpu(), fwd["w"].grad.cpu(), direct_x.cpu(),
            direct_w.cpu(), expert_out.grad.cpu(), direct_rows.cpu(), unmasked_w.cpu(),
        )

    with activate(settings.mutant):
        return _dispatch_then(settings, example, forward, backward)
