"""Rank tasks of the V2 option properties: P20 dispatch options (``do_handle_copy``, ``do_zero_padding``,
``cumulative_local_expert_recv_stats``), P21 buffer options (``allow_multiple_reduction``,
``prefer_overlap_with_compute``, ``get_buffer_size_hint``), P22 ``previous_event_before_epilogue``.

Options reach the backends through the adapter contract (``DispatchOptions`` fields, ``dispatch(stats=...,
before_epilogue=...)``, ``combine(before_epilogue=...)``, ``capture()``); each task runs only on the V2 backends that
declare the property's capability.  Results are CPU copies, keyed by backend name.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from conformance.backends.contract import NotSupported, Raw
from conformance.core.cases import BufferOptionsCase
from conformance.core.example import RankInputs, bias_argument, build_biases, second_payload
from conformance.core.views import DispatchOptions, DispatchView, Raised, v2_layout
from conformance.tasks.combine import reduction_group
from conformance.tasks.env import RankEnv, rank_task
from conformance.tasks.events import finish_all, side_compute, stale_copy


@dataclass
class HandleCopyRun:
    """A dispatch with ``do_handle_copy``, then an identity-expert combine with weights through its handle; for
    ``True`` the caller's ``topk_idx`` is changed in place right after the dispatch, and a cached dispatch of
    :func:`second_payload` goes through the handle too."""

    view: DispatchView
    cached: torch.Tensor | None  # [N, hidden]: the cached dispatch of the second payload (row order of ``view``)
    combined_x: torch.Tensor  # [T, hidden]
    combined_topk_weights: torch.Tensor | None
    reduction_group: int | None
    caller_changed: bool  # whether the caller overwrote its topk_idx (with -1) right after the dispatch


def _handle_copy_run(env: RankEnv, adapter: Any, do_handle_copy: bool, stats: torch.Tensor) -> HandleCopyRun:
    assert env.example is not None
    inputs = env.inputs
    topk_idx = inputs.topk_idx.clone()  # the caller's own tensor
    options = DispatchOptions(do_handle_copy=do_handle_copy)
    view, raw = adapter.dispatch(RankInputs(inputs.x, topk_idx, inputs.topk_weights), env.example, options, env.rank,
                                 stats=stats)
    cached = None
    if do_handle_copy:
        topk_idx.fill_(-1)  # the caller reuses its tensor: the handle must not see it
        cached = adapter.cached_dispatch(raw, second_payload(env.example, env.rank).to(env.device)).cpu()
    combined_x, combined_w = adapter.combine(raw, raw.recv_x, topk_weights=raw.recv_topk_weights)
    return HandleCopyRun(view, cached, combined_x.cpu(), None if combined_w is None else combined_w.cpu(),
                         reduction_group(adapter, raw), do_handle_copy)


@rank_task
def dispatch_option_runs(env: RankEnv) -> dict[str, Any]:
    """Per V2 backend with ``dispatch_options``: ``copy`` / ``no_copy`` (:class:`HandleCopyRun` with
    ``do_handle_copy`` True / False; a run the backend refuses as :class:`NotSupported` before calling, e.g. DeepEP
    2.5.0's ``do_handle_copy=True``, is the reason instead), ``zero_padding`` (the view of an expand-mode dispatch
    with ``do_zero_padding=True``), with ``worst_case`` also ``zero_padding_no_sync`` (the same with
    ``do_cpu_sync=False``), and ``stats``: ``cumulative_local_expert_recv_stats`` after each of the dispatches made
    (one tensor passed to all)."""
    assert env.example is not None
    example = env.example

    def run(adapter: Any) -> dict[str, Any]:
        stats = torch.zeros(example.experts_per_rank, dtype=torch.int32, device=env.device)
        after: list[torch.Tensor] = []
        out: dict[str, Any] = {}
        for key, flag in (("copy", True), ("no_copy", False)):
            before = stats.clone()
            try:
                out[key] = _handle_copy_run(env, adapter, flag, stats)
            except NotSupported as refused:  # the backend does not take this value: that run is not checked
                out[key] = str(refused)
                stats.copy_(before)  # (a call it made before refusing counts for no run)
                continue
            after.append(stats.cpu().clone())
        variants = [("zero_padding", DispatchOptions(do_expand=True, do_zero_padding=True))]
        if adapter.spec.has("worst_case"):
            variants.append(("zero_padding_no_sync", DispatchOptions(do_expand=True, do_zero_padding=True,
                                                                     do_cpu_sync=False)))
        for key, options in variants:
            out[key] = adapter.dispatch(env.inputs, example, options, env.rank, stats=stats)[0]
            after.append(stats.cpu().clone())
        out["stats"] = after
        return out

    return env.each_backend("dispatch", run, api="v2", capability="dispatch_options")


@dataclass
class BufferOptionsResult:
    """P21: the combine of one dispatch on a buffer built with the case's options."""

    call: str
    combined_x: torch.Tensor  # [T, hidden] bf16
    combined_topk_weights: torch.Tensor | None  # with ``combine_weights`` only
    reduction_group: int | None  # what the backend says its tree is (``Backend.reduction_group``)
    num_bytes: int | None  # the buffer's size (built from the MoE settings)
    #: get_buffer_size_hint by (shape, use_fp8_dispatch, allow_hybrid_mode, allow_multiple_reduction), shape
    #: "example" or "sized" (the case's size_* shape); None: the backend offers no hint
    size_hints: dict[tuple[str, bool, bool, bool], int] | None
    num_sms: int | None


#: Every option of ``get_buffer_size_hint``: (use_fp8_dispatch, allow_hybrid_mode, allow_multiple_reduction).
HINT_OPTIONS = tuple((fp8, hybrid, amr) for fp8 in (False, True) for hybrid in (True, False) for amr in (True, False))


def size_hints(adapter: Any, case: BufferOptionsCase) -> dict[tuple[str, bool, bool, bool], int] | None:
    """``get_buffer_size_hint`` of the example's shape and of the case's sizing shape, with every option (the
    backend's ``shape_hint``; ``None`` where it has none)."""
    if not hasattr(adapter, "shape_hint"):
        return None
    example = case.example
    shapes = {"example": (example.num_max_tokens_per_rank, example.hidden, example.num_topk),
              "sized": (case.size_tokens, case.size_hidden, case.size_topk)}
    return {(name, fp8, hybrid, amr): adapter.shape_hint(*shape, use_fp8_dispatch=fp8, allow_hybrid_mode=hybrid,
                                                         allow_multiple_reduction=amr)
            for name, shape in shapes.items() for fp8, hybrid, amr in HINT_OPTIONS}


def _expert_outputs(view: DispatchView, raw: Raw, rank: int, experts_per_rank: int, do_expand: bool
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The test's experts: without expand, every received row and weight times ``1 + rank`` (P5's); in expand mode,
    each expert ``e`` (global index) returns its rows and their 1-D weights times ``33 + 2 e`` (the oracle's
    ``expanded_expert_scale``; padding rows are returned as received)."""
    recv_x, recv_w = raw.recv_x, raw.recv_topk_weights
    if not do_expand:
        scale = torch.tensor(float(1 + rank), dtype=torch.float32, device=recv_x.device)
        return (recv_x.float() * scale).to(torch.bfloat16), recv_w.float() * scale
    out = recv_x.clone()
    out_w = None if recv_w is None else recv_w.float().clone()
    layout = v2_layout(view)
    ends = layout.psum_num_recv_tokens_per_expert.tolist()  # aligned start + raw count, per local expert
    counts = layout.num_unaligned_recv_tokens_per_expert.tolist()
    for local, (end, count) in enumerate(zip(ends, counts, strict=True)):
        scale = 33 + 2 * (rank * experts_per_rank + local)  # an integer: exact in float32
        rows = slice(int(end) - int(count), int(end))
        out[rows] = (recv_x[rows].float() * scale).to(torch.bfloat16)
        if out_w is not None:
            out_w[rows] = recv_w[rows].float() * scale
    return out, out_w


@rank_task
def buffer_option_combine(env: RankEnv) -> dict[str, Any]:
    """Per V2 backend with ``buffer_options``, keyed by ``(allow_multiple_reduction, do_expand)`` (both flags; expand
    mode with the capability ``expand``): dispatch on a buffer built with that and the case's
    ``prefer_overlap_with_compute``, the test's experts (:func:`_expert_outputs`), combine with the case's biases and
    the experts' weights (``[rows, num_topk]`` without expand, 1-D ``[rows]`` in expand mode with
    ``allow_multiple_reduction``: without it an expand-mode combine takes no weights)."""
    case: BufferOptionsCase = env.case
    example = case.example
    biases = [b.to(env.device) for b in build_biases(example, env.rank, case.num_bias)]

    def one(adapter: Any, allow_multiple_reduction: bool, do_expand: bool, hints: dict | None) -> BufferOptionsResult:
        options = DispatchOptions(do_expand=do_expand, allow_multiple_reduction=allow_multiple_reduction,
                                  prefer_overlap_with_compute=case.prefer_overlap_with_compute)
        view, raw = adapter.dispatch(env.inputs, example, options, env.rank)
        expert_x, expert_w = _expert_outputs(view, raw, env.rank, example.experts_per_rank, do_expand)
        # expand mode without allow_multiple_reduction sends every slot's row and takes no weights (the real kernel
        # traps: EP_DEVICE_ASSERT(topk_weights == nullptr), combine.cuh:68): weights only where the contract has them
        with_weights = expert_w is not None and adapter.spec.has("combine_weights") and (
            allow_multiple_reduction or not do_expand)
        x, w = adapter.combine(raw, expert_x, topk_weights=expert_w if with_weights else None,
                               bias=bias_argument(biases))
        return BufferOptionsResult(f"{view.call}, then {adapter.describe_combine(example, env.rank)}", x.cpu(),
                                   None if w is None else w.cpu(), reduction_group(adapter, raw),
                                   getattr(view.layout, "num_bytes", None), hints,
                                   getattr(view.layout, "num_sms", None))

    def run(adapter: Any) -> dict[tuple[bool, bool], BufferOptionsResult]:
        hints = size_hints(adapter, case)
        return {(amr, expand): one(adapter, amr, expand, hints) for amr in (True, False) for expand in (False, True)
                if not expand or adapter.spec.has("expand")}

    return env.each_backend("combine", run, api="v2", capability="buffer_options")


@dataclass
class EpilogueRun:
    """P22, one of sync / async: a dispatch and a combine, each with a ``previous_event_before_epilogue`` covering a
    compute started on another stream right before the call (and not waited for by anything else)."""

    dispatch: DispatchView
    marker: torch.Tensor  # what the dispatch's compute wrote, read right after the call
    combined_x: torch.Tensor  # combine (identity experts) with the bias the combine's compute wrote
    reduction_group: int | None


def _epilogue_run(env: RankEnv, adapter: Any, async_finish: bool) -> tuple[EpilogueRun, dict[str, Any]]:
    assert env.example is not None
    example = env.example
    value = second_payload(example, env.rank).to(env.device)
    marker = stale_copy(value)
    event = side_compute(marker, value, adapter.capture)
    view, raw = adapter.dispatch(env.inputs, example, DispatchOptions(async_finish=async_finish), env.rank,
                                 before_epilogue=event)
    seen = marker.cpu().clone()  # the dispatch is complete, so is the compute its epilogue waited for
    real_bias = build_biases(example, env.rank, 1)[0].to(env.device)
    bias = stale_copy(real_bias)
    event = side_compute(bias, real_bias, adapter.capture)
    combined, _ = adapter.combine(raw, raw.recv_x, bias=bias, async_finish=async_finish, before_epilogue=event)
    combined = combined.cpu().clone()
    finish_all(env.device)
    return EpilogueRun(dataclasses.replace(view, x=view.x.clone()), seen, combined, reduction_group(adapter, raw)), raw


def _refused(call: Any) -> Raised:
    try:
        call()
    except Exception as exc:  # the expected refusal; any type is returned for the controller to judge
        return Raised.of(exc)
    return Raised.of(None)


def _wrong_event_dispatch(env: RankEnv, adapter: Any) -> Raised:
    """Built-in backends: dispatch with an ``EventOverlap`` (not an ``EventHandle``) as
    ``previous_event_before_epilogue`` (refusal row ``v2_dispatch_event_type``)."""
    assert env.example is not None
    example, inputs = env.example, env.inputs
    buffer = adapter.buffer(example)
    wrong = adapter.module.EventOverlap(buffer.capture())
    return _refused(lambda: buffer.dispatch(
        inputs.x, topk_idx=inputs.topk_idx, topk_weights=inputs.topk_weights, num_experts=example.num_experts,
        num_max_tokens_per_rank=example.num_max_tokens_per_rank, expert_alignment=example.expert_alignment,
        previous_event_before_epilogue=wrong))


def _wrong_event_combine(adapter: Any, raw: Raw) -> Raised:
    """Built-in backends: combine with an ``EventOverlap`` as ``previous_event_before_epilogue`` (refusal row
    ``v2_combine_event_type``)."""
    wrong = adapter.module.EventOverlap(raw.buffer.capture())
    return _refused(lambda: raw.buffer.combine(raw.recv_x, raw.handle, previous_event_before_epilogue=wrong))


@rank_task
def epilogue_event_runs(env: RankEnv) -> dict[str, Any]:
    """Per V2 backend with ``epilogue_events``: ``sync`` and ``async`` (:class:`EpilogueRun`); the built-in adapters
    also make a dispatch with a wrong event type before the sync run (``dispatch_refused``) and a combine with one
    before the async run (``combine_refused``), so each refusal is followed by valid calls whose results are checked."""

    def run(adapter: Any) -> dict[str, Any]:
        builtin = not adapter.spec.plugin
        out: dict[str, Any] = {"dispatch_refused": _wrong_event_dispatch(env, adapter)} if builtin else {}
        out["sync"], raw = _epilogue_run(env, adapter, False)
        if builtin:
            out["combine_refused"] = _wrong_event_combine(adapter, raw)
        out["async"], _ = _epilogue_run(env, adapter, True)
        return out

    try:
        return env.each_backend("combine", run, api="v2", capability="epilogue_events")
    finally:
        finish_all(env.device)
