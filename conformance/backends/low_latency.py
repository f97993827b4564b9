"""V1 low-latency calls the way decoding stacks make them: one low-latency ``Buffer`` per (tokens, hidden,
experts), the four casts of ``tests/legacy/test_low_latency.py`` (bf16; FP8; FP8 with power-of-two scales; FP8
with packed UE8M0 scales), receive hooks on every other call, ``async_finish`` (then a wait on the event) on one
call without, one statistics tensor and one wait-cost tensor across the calls, then the combines (plain,
``async_finish``, with a receive hook into ``out=``, LogFMT-10, zero-copy) of the bf16 dispatch.  Also the
shrink-mode calls (:func:`run_shrink`: masks, then dispatch/combine with masked ranks) and the buffer cleaning
(:func:`run_clean`: garbage over the RDMA buffer, ``clean_low_latency_buffer``, calls after)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from conformance.backends.internals import LibraryInternals
from conformance.core.cases import CleanCase, ShrinkCase
from conformance.core.example import Example, RankInputs

#: ``(use_fp8, round_scale, use_ue8m0, return_recv_hook, async_finish)`` of each dispatch, in call order (a hook and
#: ``async_finish`` exclude each other, csrc/legacy/buffer.hpp:1511).
DISPATCH_CALLS = ((False, False, False, False, False), (True, False, False, True, False),
                  (True, True, False, False, True), (True, True, True, True, False))
#: Where the wait-cost statistics start (a running counter, as a serving stack keeps them): far above any one
#: call's cycles, so that a counter overwritten instead of accumulated falls below it.
COST_BASE = 1 << 40
#: Bytes of the RDMA buffer returned after a clean (the signalling buffers lie at its start).
PREFIX_BYTES = 4096


def ll_buffer(adapter: Any, example: Example, world_size: int, shrink: bool = False) -> Any:
    """The low-latency buffer of ``adapter`` for ``example`` (RDMA bytes from the library's own size hint, one
    QP per local expert as the library's test builds it; ``enable_shrink`` with ``shrink``).  One at a time: the
    previous one is destroyed when the shape changes."""
    key = (example.num_max_tokens_per_rank, example.hidden, example.num_experts, shrink)
    buffers = adapter.__dict__.setdefault("_ll_buffers", {})
    if key not in buffers:
        for old in buffers.values():
            old.destroy()
        buffers.clear()
        Buffer = adapter.module.Buffer  # noqa: N806 - the library's class
        num_rdma_bytes = Buffer.get_low_latency_rdma_size_hint(example.num_max_tokens_per_rank, example.hidden,
                                                               world_size, example.num_experts)
        buffers[key] = Buffer(adapter.group, 0, num_rdma_bytes, low_latency_mode=True,
                              num_qps_per_rank=example.num_experts // world_size, explicitly_destroy=True,
                              enable_shrink=shrink)
    return buffers[key]


def destroy_ll(adapter: Any) -> None:
    for buffer in adapter.__dict__.get("_ll_buffers", {}).values():
        buffer.destroy()
    adapter.__dict__.get("_ll_buffers", {}).clear()


def describe(example: Example, rank: int, use_fp8: bool, round_scale: bool, use_ue8m0: bool, hook: bool,
             extra: str = "cumulative_local_expert_recv_stats=stats, dispatch_wait_recv_cost_stats=cost",
             async_finish: bool = False) -> str:
    t = example.tokens_per_rank[rank]
    waited = ", async_finish=True, then event.current_stream_wait()" if async_finish else ""
    return (f"Buffer.low_latency_dispatch(x[{t},{example.hidden}] bf16, topk_idx[{t},{example.num_topk}], "
            f"num_max_dispatch_tokens_per_rank={example.num_max_tokens_per_rank}, num_experts={example.num_experts}, "
            f"use_fp8={use_fp8}, round_scale={round_scale}, use_ue8m0={use_ue8m0}, return_recv_hook={hook}, "
            f"{extra}{waited}) on rank {rank}")


def dispatch_record(recv_x: Any, recv_count: torch.Tensor, handle: tuple, use_fp8: bool) -> dict[str, Any]:
    """CPU copies of what a low-latency dispatch returned (after its receive phase; the handle's ``src_info`` and
    ``layout_range`` through the internals seam: the low-latency capabilities are the built-in backends')."""
    x, scales = recv_x if use_fp8 else (recv_x, None)
    src_info, layout_range = LibraryInternals.v1_ll_layout(handle)
    return {"x": _bytes(x), "x_dtype": str(x.dtype), "scales": None if scales is None else scales.cpu().contiguous(),
            "scales_stride": None if scales is None else tuple(scales.stride()),
            "scales_dtype": None if scales is None else str(scales.dtype),
            "recv_count": recv_count.cpu(), "src_info": src_info.cpu(), "layout_range": layout_range.cpu()}


def run(adapter: Any, inputs: RankInputs, example: Example, rank: int, world_size: int) -> dict[str, Any]:
    """Every low-latency call of one example; CPU copies of what each returned (see the module docstring)."""
    buffer = ll_buffer(adapter, example, world_size)
    t_max, num_experts = example.num_max_tokens_per_rank, example.num_experts
    device = inputs.x.device
    stats = torch.zeros(num_experts // world_size, dtype=torch.int32, device=device)
    cost = torch.full((world_size,), COST_BASE, dtype=torch.int64, device=device)
    dispatches = []
    bf16 = None
    for use_fp8, round_scale, use_ue8m0, hook_on, async_on in DISPATCH_CALLS:
        recv_x, recv_count, handle, event, hook = buffer.low_latency_dispatch(
            inputs.x, inputs.topk_idx, t_max, num_experts, cumulative_local_expert_recv_stats=stats,
            dispatch_wait_recv_cost_stats=cost, use_fp8=use_fp8, round_scale=round_scale, use_ue8m0=use_ue8m0,
            async_finish=async_on, return_recv_hook=hook_on)
        event_is_none = event.event is None
        if async_on and not event_is_none:
            event.current_stream_wait()
        stats_before_hook, cost_before_hook = stats.cpu().clone(), cost.cpu().clone()
        if hook_on:
            hook()
        dispatches.append({
            **dispatch_record(recv_x, recv_count, handle, use_fp8),
            "call": describe(example, rank, use_fp8, round_scale, use_ue8m0, hook_on, async_finish=async_on),
            "options": (use_fp8, round_scale, use_ue8m0, hook_on), "hook_is_none": hook is None,
            "async_finish": async_on, "event_is_none": event_is_none,
            "stats_before_hook": stats_before_hook, "stats_after": stats.cpu().clone(),
            "cost_before_hook": cost_before_hook, "cost_after": cost.cpu().clone(),
        })
        if not use_fp8:
            bf16 = (recv_x, handle)
    assert bf16 is not None
    recv_x, handle = bf16
    combines: dict[str, torch.Tensor] = {}
    combine_events: dict[str, bool] = {}  # name -> whether its event was None
    combine_costs: list[tuple[str, torch.Tensor, torch.Tensor]] = []
    w = inputs.topk_weights
    combine_cost = torch.full((world_size,), COST_BASE, dtype=torch.int64, device=device)
    # the hook combine writes into a caller's out= tensor: untouched until the hook runs, then returned
    pattern = torch.full((inputs.x.shape[0], example.hidden), -3.0, dtype=torch.bfloat16, device=device)
    target = pattern.clone()
    out_hook: dict[str, Any] = {"pattern": pattern.cpu()}

    def combine(name: str, x: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        out, event, hook = buffer.low_latency_combine(x, inputs.topk_idx, w, handle,
                                                      combine_wait_recv_cost_stats=combine_cost, **kwargs)
        combine_events[name] = event.event is None
        if kwargs.get("async_finish") and event.event is not None:
            event.current_stream_wait()
        before_hook = combine_cost.cpu().clone()
        if kwargs.get("out") is not None:
            out_hook["before_hook"] = kwargs["out"].cpu().clone()
        if hook is not None:
            hook()
        combines[name] = out.cpu()
        combine_costs.append((name, before_hook, combine_cost.cpu().clone()))
        return out

    combine("plain", recv_x)
    combine("async", recv_x, async_finish=True)
    returned = combine("hook", recv_x, return_recv_hook=True, out=target)
    out_returned = returned.data_ptr() == target.data_ptr() and tuple(returned.shape) == tuple(target.shape)
    out_hook["after"] = target.cpu()
    combine("logfmt", recv_x, use_logfmt=True)
    buffer.get_next_low_latency_combine_buffer(handle).copy_(recv_x)
    combine("zero_copy", torch.zeros_like(recv_x), zero_copy=True)
    return {"dispatches": dispatches, "stats": stats.cpu(), "combines": combines, "world_size": world_size,
            "combine_costs": combine_costs, "combine_events": combine_events, "out_returned": out_returned,
            "out_hook": out_hook,
            "combine_call": f"Buffer.low_latency_combine(recv_x of the bf16 dispatch, topk_idx, topk_weights, "
                            f"handle, combine_wait_recv_cost_stats=cost) on rank {rank}"}


def run_shrink(adapter: Any, inputs: RankInputs, case: ShrinkCase, rank: int, world_size: int) -> dict[str, Any]:
    """Shrink mode on a ``Buffer(..., enable_shrink=True)``: every rank unmasks all ranks (``mask`` left at its
    default ``False``), then a rank of ``case.masked`` masks every rank (it has failed: it neither sends nor waits)
    and the others mask ``case.masked`` (and mask ``case.toggled`` and unmask it again); a bf16 dispatch and the
    combine of its rows with masked ranks; ``clean_low_latency_buffer``; ``low_latency_clean_mask_buffer``; a
    dispatch and combine with every rank back.  The mask is queried after every step."""
    example = case.example
    buffer = ll_buffer(adapter, example, world_size, shrink=True)
    t_max, num_experts, device = example.num_max_tokens_per_rank, example.num_experts, inputs.x.device
    status = torch.full((world_size,), -7, dtype=torch.int32, device=device)
    queries: dict[str, list[int]] = {}

    def query(step: str) -> None:
        buffer.low_latency_query_mask_buffer(status)
        queries[step] = status.cpu().tolist()

    for r in range(world_size):
        buffer.low_latency_update_mask_buffer(r)
    query("unmasked")
    for r in (range(world_size) if rank in case.masked else case.masked):
        buffer.low_latency_update_mask_buffer(r, True)
    if rank not in case.masked and case.toggled is not None:
        buffer.low_latency_update_mask_buffer(case.toggled, mask=True)
        buffer.low_latency_update_mask_buffer(case.toggled, mask=False)
    query("masked")
    masked_run = _round_trip(buffer, inputs, example, rank, world_size, case.hook)
    query("after calls")
    buffer.clean_low_latency_buffer(t_max, example.hidden, num_experts)
    query("after clean_low_latency_buffer")
    buffer.low_latency_clean_mask_buffer()
    query("after low_latency_clean_mask_buffer")
    return {"queries": queries, "masked_run": masked_run, "world_size": world_size,
            "unmasked_run": _round_trip(buffer, inputs, example, rank, world_size, case.hook)}


def run_clean(adapter: Any, inputs: RankInputs, case: CleanCase, rank: int, world_size: int) -> dict[str, Any]:
    """``clean_low_latency_buffer`` on a dirty buffer: garbage bytes (never 0; a random block, repeated) over the
    whole RDMA buffer (``get_local_buffer_tensor(torch.uint8, use_rdma_buffer=True)``), a clean, a dispatch; the
    bf16 rows staged for a zero-copy combine, a second clean, the zero-copy combine and a plain one.  After each
    clean: the byte ranges it changed (merged), the buffer's first :data:`PREFIX_BYTES` bytes, and the second
    signalling buffer through ``get_local_buffer_tensor(torch.int32, size, offset, use_rdma_buffer=True)``."""
    example = case.example
    buffer = ll_buffer(adapter, example, world_size)
    t_max, num_experts, hidden = example.num_max_tokens_per_rank, example.num_experts, example.hidden
    raw = buffer.get_local_buffer_tensor(torch.uint8, use_rdma_buffer=True)
    gen = torch.Generator().manual_seed(case.dirt_seed * 7919 + rank)
    block = torch.randint(1, 256, (PREFIX_BYTES,), generator=gen, dtype=torch.uint8).to(raw.device)
    raw.view(-1)[:raw.numel() // PREFIX_BYTES * PREFIX_BYTES].view(-1, PREFIX_BYTES).copy_(block)  # tiled
    raw[raw.numel() // PREFIX_BYTES * PREFIX_BYTES:] = block[:raw.numel() % PREFIX_BYTES]
    cleans = [_clean(buffer, raw, t_max, hidden, num_experts, adapter.group)]
    recv_x, recv_count, handle, _, hook = buffer.low_latency_dispatch(
        inputs.x, inputs.topk_idx, t_max, num_experts, use_fp8=False, return_recv_hook=case.hook)
    if hook is not None:
        hook()
    dispatch = {**dispatch_record(recv_x, recv_count, handle, False), "options": (False, False, False, case.hook),
                "call": describe(example, rank, False, False, False, case.hook, "after clean_low_latency_buffer on "
                                 "an RDMA buffer full of garbage")}
    buffer.get_next_low_latency_combine_buffer(handle).copy_(recv_x)
    cleans.append(_clean(buffer, raw, t_max, hidden, num_experts, adapter.group))
    w = inputs.topk_weights
    zero_copy = buffer.low_latency_combine(torch.zeros_like(recv_x), inputs.topk_idx, w, handle, zero_copy=True)[0]
    plain = buffer.low_latency_combine(recv_x, inputs.topk_idx, w, handle)[0]
    return {"cleans": cleans, "dispatch": dispatch, "zero_copy": zero_copy.cpu(), "plain": plain.cpu(),
            "num_rdma_bytes": int(raw.numel()),
            "combine_call": f"Buffer.low_latency_combine(zeros, topk_idx, topk_weights, handle, zero_copy=True) "
                            f"after get_next_low_latency_combine_buffer(handle).copy_(recv_x) and "
                            f"clean_low_latency_buffer on rank {rank}"}


def _clean(buffer: Any, raw: torch.Tensor, t_max: int, hidden: int, num_experts: int,
           group: Any = None) -> dict[str, Any]:
    """A ``clean_low_latency_buffer`` and what it did to the RDMA bytes.  Every rank has read its bytes before any
    goes on (a barrier of ``group``): a peer's next dispatch or combine writes its signal into this rank's
    signalling buffer (on a GPU that race was seen: a peer's count word ``-1`` read as an uncleaned byte)."""
    before = raw.clone()
    buffer.clean_low_latency_buffer(t_max, hidden, num_experts)
    words = raw.numel() // 8 * 8  # compared 8 bytes at a time first (the buffer is large, the changes few)
    moved = torch.nonzero(raw[:words].view(torch.int64) != before[:words].view(torch.int64)).flatten()
    candidates = torch.cat([(moved.unsqueeze(1) * 8 + torch.arange(8, device=raw.device)).flatten(),
                            torch.arange(words, raw.numel(), device=raw.device)])
    changed = candidates[raw[candidates] != before[candidates]]
    # the second signalling buffer's words read through a view of their own: byte offset align_up(4 * experts, 128)
    # (LowLatencyLayout, csrc/legacy/config.hpp:165-175), num_experts int32 elements
    offset = -(-num_experts * 4 // 128) * 128
    words = buffer.get_local_buffer_tensor(torch.int32, torch.Size([num_experts]), offset=offset, use_rdma_buffer=True)
    record = {"changed": _ranges(changed.cpu()), "changed_nonzero": int((raw[changed] != 0).sum()),
              "prefix": raw[:PREFIX_BYTES].cpu().clone(), "words_at": offset, "words": words.cpu().clone(),
              "call": f"clean_low_latency_buffer({t_max}, {hidden}, {num_experts})"}
    if group is not None:
        dist.barrier(group=group)
    return record


def _round_trip(buffer: Any, inputs: RankInputs, example: Example, rank: int, world_size: int,
                hook_on: bool) -> dict[str, Any]:
    """A bf16 low-latency dispatch (statistics and wait costs passed) and the combine of its rows."""
    device = inputs.x.device
    t_max, num_experts = example.num_max_tokens_per_rank, example.num_experts
    stats = torch.zeros(num_experts // world_size, dtype=torch.int32, device=device)
    cost = torch.full((world_size,), COST_BASE, dtype=torch.int64, device=device)
    combine_cost = cost.clone()
    recv_x, recv_count, handle, _, hook = buffer.low_latency_dispatch(
        inputs.x, inputs.topk_idx, t_max, num_experts, cumulative_local_expert_recv_stats=stats,
        dispatch_wait_recv_cost_stats=cost, use_fp8=False, return_recv_hook=hook_on)
    if hook is not None:
        hook()
    record = {**dispatch_record(recv_x, recv_count, handle, False), "options": (False, False, False, hook_on),
              "call": describe(example, rank, False, False, False, hook_on), "stats": stats.cpu(),
              "cost": cost.cpu()}
    combined, _, hook = buffer.low_latency_combine(recv_x, inputs.topk_idx, inputs.topk_weights, handle,
                                                   return_recv_hook=hook_on,
                                                   combine_wait_recv_cost_stats=combine_cost)
    if hook is not None:
        hook()
    record.update(combined=combined.cpu(), combine_cost=combine_cost.cpu(),
                  combine_call=f"Buffer.low_latency_combine(recv_x, topk_idx, topk_weights, handle, "
                               f"return_recv_hook={hook_on}, combine_wait_recv_cost_stats=cost) on rank {rank}")
    return record


def _ranges(indices: torch.Tensor, limit: int = 64) -> list[tuple[int, int]]:
    """Sorted indices as merged ``[begin, end)`` ranges (the first ``limit`` of them)."""
    if not indices.numel():
        return []
    breaks = torch.nonzero(torch.diff(indices) != 1).flatten()
    starts = torch.cat([indices[:1], indices[breaks + 1]])[:limit]
    ends = (torch.cat([indices[breaks], indices[-1:]]) + 1)[:limit]
    return list(zip(starts.tolist(), ends.tolist(), strict=True))


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """A CPU copy that crosses process boundaries: float8 tensors travel as their uint8 bytes (torch cannot
    unpickle float8 storages)."""
    t = t.cpu()
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t
