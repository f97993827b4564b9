"""V1 low-latency calls the way decoding stacks make them: one low-latency ``Buffer`` per (tokens, hidden,
experts), the four casts of ``tests/legacy/test_low_latency.py`` (bf16; FP8; FP8 with power-of-two scales; FP8
with packed UE8M0 scales), receive hooks on every other call, one call ``async_finish=True`` (read after its
event), one statistics tensor across the calls, then the combines (plain, with a receive hook, LogFMT-10, async,
zero-copy) of the bf16 dispatch."""

from __future__ import annotations

from typing import Any

import torch

from conformance.core.example import Example, RankInputs

#: ``(use_fp8, round_scale, use_ue8m0, return_recv_hook)`` of each dispatch, in call order.
DISPATCH_CALLS = ((False, False, False, False), (True, False, False, True), (True, True, False, False),
                  (True, True, True, True))
#: The dispatch (index in :data:`DISPATCH_CALLS`) made with ``async_finish=True`` (no hook: the library refuses
#: both), its results read after ``event.current_stream_wait()``.
ASYNC_DISPATCH = 2


def ll_buffer(adapter: Any, example: Example, world_size: int) -> Any:
    """The low-latency buffer of ``adapter`` for ``example`` (RDMA bytes from the library's own size hint, one
    QP per local expert as the library's test builds it)."""
    key = (example.num_max_tokens_per_rank, example.hidden, example.num_experts)
    buffers = adapter.__dict__.setdefault("_ll_buffers", {})
    if key not in buffers:
        for old in buffers.values():
            old.destroy()
        buffers.clear()
        Buffer = adapter.module.Buffer  # noqa: N806 - the library's class
        num_rdma_bytes = Buffer.get_low_latency_rdma_size_hint(example.num_max_tokens_per_rank, example.hidden,
                                                               world_size, example.num_experts)
        buffers[key] = Buffer(adapter.group, 0, num_rdma_bytes, low_latency_mode=True,
                              num_qps_per_rank=example.num_experts // world_size, explicitly_destroy=True)
    return buffers[key]


def destroy_ll(adapter: Any) -> None:
    for buffer in adapter.__dict__.get("_ll_buffers", {}).values():
        buffer.destroy()
    adapter.__dict__.get("_ll_buffers", {}).clear()


def describe(example: Example, rank: int, use_fp8: bool, round_scale: bool, use_ue8m0: bool, hook: bool,
             async_finish: bool = False) -> str:
    t = example.tokens_per_rank[rank]
    return (f"Buffer.low_latency_dispatch(x[{t},{example.hidden}] bf16, topk_idx[{t},{example.num_topk}], "
            f"num_max_dispatch_tokens_per_rank={example.num_max_tokens_per_rank}, num_experts={example.num_experts}, "
            f"use_fp8={use_fp8}, round_scale={round_scale}, use_ue8m0={use_ue8m0}, return_recv_hook={hook}, "
            f"cumulative_local_expert_recv_stats=stats"
            + (", async_finish=True) + event.current_stream_wait()" if async_finish else ")") + f" on rank {rank}")


def run(adapter: Any, inputs: RankInputs, example: Example, rank: int, world_size: int) -> dict[str, Any]:
    """Every low-latency call of one example; CPU copies of what each returned (see the module docstring)."""
    buffer = ll_buffer(adapter, example, world_size)
    t_max, num_experts = example.num_max_tokens_per_rank, example.num_experts
    stats = torch.zeros(num_experts // world_size, dtype=torch.int32, device=inputs.x.device)
    dispatches = []
    bf16 = None
    for index, (use_fp8, round_scale, use_ue8m0, hook_on) in enumerate(DISPATCH_CALLS):
        async_finish = index == ASYNC_DISPATCH
        recv_x, recv_count, handle, event, hook = buffer.low_latency_dispatch(
            inputs.x, inputs.topk_idx, t_max, num_experts, cumulative_local_expert_recv_stats=stats,
            use_fp8=use_fp8, round_scale=round_scale, use_ue8m0=use_ue8m0, async_finish=async_finish,
            return_recv_hook=hook_on)
        if async_finish:
            event.current_stream_wait()
        stats_before_hook = stats.cpu().clone()
        if hook_on:
            hook()
        x, scales = recv_x if use_fp8 else (recv_x, None)
        dispatches.append({
            "call": describe(example, rank, use_fp8, round_scale, use_ue8m0, hook_on, async_finish),
            "options": (use_fp8, round_scale, use_ue8m0, hook_on), "async_finish": async_finish,
            "hook_is_none": hook is None,
            "x": _bytes(x), "x_dtype": str(x.dtype), "scales": None if scales is None else scales.cpu().contiguous(),
            "scales_stride": None if scales is None else tuple(scales.stride()),
            "scales_dtype": None if scales is None else str(scales.dtype),
            "recv_count": recv_count.cpu(), "src_info": handle[0].cpu(), "layout_range": handle[1].cpu(),
            "stats_before_hook": stats_before_hook, "stats_after": stats.cpu().clone(),
        })
        if not use_fp8:
            bf16 = (recv_x, handle)
    assert bf16 is not None
    recv_x, handle = bf16
    combines = {}
    w = inputs.topk_weights
    combines["plain"] = buffer.low_latency_combine(recv_x, inputs.topk_idx, w, handle)[0].cpu()
    out, _, hook = buffer.low_latency_combine(recv_x, inputs.topk_idx, w, handle, return_recv_hook=True)
    hook()
    combines["hook"] = out.cpu()
    combines["logfmt"] = buffer.low_latency_combine(recv_x, inputs.topk_idx, w, handle, use_logfmt=True)[0].cpu()
    out, event, _ = buffer.low_latency_combine(recv_x, inputs.topk_idx, w, handle, async_finish=True)
    event.current_stream_wait()
    combines["async"] = out.cpu()
    staging = buffer.get_next_low_latency_combine_buffer(handle)
    staging.copy_(recv_x)
    combines["zero_copy"] = buffer.low_latency_combine(torch.zeros_like(recv_x), inputs.topk_idx, w, handle,
                                                       zero_copy=True)[0].cpu()
    return {"dispatches": dispatches, "stats": stats.cpu(), "combines": combines, "world_size": world_size,
            "combine_call": f"Buffer.low_latency_combine(recv_x of the bf16 dispatch, topk_idx, topk_weights, "
                            f"handle) on rank {rank}"}


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """A CPU copy that crosses process boundaries: float8 tensors travel as their uint8 bytes (torch cannot
    unpickle float8 storages)."""
    t = t.cpu()
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t
