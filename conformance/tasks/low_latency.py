"""Rank tasks of the FP8 and low-latency properties: every low-latency call of an example (V1), the normal-mode
round trip it is compared with, the shrink-mode and buffer-cleaning calls (V1), and FP8 ``(x, scales)`` dispatches
of both APIs, also host-sync free."""

from __future__ import annotations

from typing import Any

import torch

from conformance.core.example import fp8_payload
from conformance.core.views import DispatchOptions
from conformance.tasks.env import RankEnv, rank_task


@rank_task
def low_latency_runs(env: RankEnv) -> dict[str, Any]:
    """Per V1 backend with ``low_latency``: what every low-latency call returned, plus ``normal``: the same
    identity experts through normal mode (each rank scales its received rows by the sum of their local weights,
    rounded to bf16, then ``Buffer.combine``)."""

    def run(adapter: Any) -> dict[str, Any]:
        assert env.example is not None
        out = adapter.low_latency(env.inputs, env.example, env.rank, env.world_size)
        view, raw = adapter.dispatch(env.inputs, env.example, DispatchOptions(), env.rank)
        weights = raw.recv_topk_weights.to(torch.float32).sum(dim=1, keepdim=True)
        expert_out = (raw.recv_x.to(torch.float32) * weights).to(torch.bfloat16)
        out["normal"] = adapter.combine(raw, expert_out)[0].cpu()
        return out

    # the normal-mode round trip it is compared with has the normal mode's limits (a world size without a config)
    return env.each_backend("low_latency_dispatch", run, api="v1", capability="low_latency",
                            also=("dispatch", "combine"))


@rank_task
def shrink_runs(env: RankEnv) -> dict[str, Any]:
    """Per V1 backend with ``shrink``: the mask queries and the calls of a shrink-mode case (``ShrinkCase``)."""
    return env.each_backend("low_latency_dispatch", lambda adapter: adapter.low_latency_shrink(
        env.inputs, env.case, env.rank, env.world_size), api="v1", capability="shrink")


@rank_task
def clean_runs(env: RankEnv) -> dict[str, Any]:
    """Per V1 backend with ``ll_buffer``: the cleans of a dirty buffer and the calls after them (``CleanCase``)."""
    return env.each_backend("clean_low_latency_buffer", lambda adapter: adapter.low_latency_clean(
        env.inputs, env.case, env.rank, env.world_size), api="v1", capability="ll_buffer")


@rank_task
def fp8_runs(env: RankEnv) -> dict[str, Any]:
    """Per backend with ``fp8``: FP8 dispatches of :func:`~conformance.core.example.fp8_payload` keyed by the
    call's variant: V1 ``plain`` and (``worst_case``) ``num_worst_tokens``; V2 ``plain``, ``col_major``
    (``use_tma_aligned_col_major_sf``), ``fp8_buffer`` (on a buffer built with ``use_fp8_dispatch=True``, with
    ``get_buffer_size_hint(use_fp8_dispatch=True)``) and (``worst_case``) ``no_cpu_sync`` (``do_cpu_sync=False``)."""
    assert env.example is not None
    x, scales = fp8_payload(env.example, env.rank)
    x, scales = x.to(env.device), scales.to(env.device)
    worst = env.world_size * env.example.num_max_tokens_per_rank

    def run(adapter: Any) -> dict[str, Any]:
        assert env.example is not None
        spec_has = adapter.spec.has
        if adapter.api == "v1":
            out = {"plain": adapter.fp8_dispatch(env.inputs, env.example, x, scales)}
            if spec_has("worst_case") and getattr(adapter, "internode", False):
                # The library refuses num_worst_tokens on its internode path (refusal row v1_internode_worst_tokens,
                # which P12 checks): nothing to compare here.
                out["worst_refused"] = ("V1 num_worst_tokens on the internode path: Buffer.dispatch refuses it "
                                        "(Internode dispatch does not support `num_worst_tokens > 0`)")
            elif spec_has("worst_case"):
                out["num_worst_tokens"] = adapter.fp8_dispatch(env.inputs, env.example, x, scales,
                                                               num_worst_tokens=worst)
                out["num_worst_tokens"]["worst"] = worst
            return out
        out = {"plain": adapter.fp8_dispatch(env.inputs, env.example, x, scales),
               "col_major": adapter.fp8_dispatch(env.inputs, env.example, x, scales, col_major=True)}
        if hasattr(adapter, "size_hint"):  # a buffer built for FP8 dispatches, and the hint for it
            out["fp8_buffer"] = adapter.fp8_dispatch(env.inputs, env.example, x, scales, fp8_buffer=True)
            out["fp8_buffer"]["size_hint"] = adapter.size_hint(env.example, use_fp8_dispatch=True)
        if spec_has("worst_case"):
            out["no_cpu_sync"] = adapter.fp8_dispatch(env.inputs, env.example, x, scales, do_cpu_sync=False)
            out["no_cpu_sync"]["worst"] = worst
        return out

    return env.each_backend("dispatch", run, capability="fp8")
