"""Rank tasks for P10 (events): async + wait vs sync (a hook registered after the wait, the event released),
``previous_event`` ordering (dispatch, combine, V1's layout), the V2 refusal, ``with event(release_handle=True)``,
and V2's ``barrier``.

"Prior compute" is modelled per device: on CUDA, a long ``torch.cuda._sleep`` then a copy on the current
stream (a dispatch that did not wait would read the payload before the copy lands); on CPU, the
emulation's deferred-work queue (``conformance.emulation.utils.event.defer``), completed only by waiting
on an event captured after it.  Either way the tensor holds stale bytes until the compute is waited on.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch

from conformance.backends.contract import Raw
from conformance.core.example import Example, RankInputs
from conformance.core.outcomes import NotChecked
from conformance.core.views import DispatchOptions, DispatchView, Raised
from conformance.emulation.utils import event as emulated_event
from conformance.tasks.env import RankEnv, rank_task
from conformance.world.rank import context, store

#: GPU cycles the "prior compute" spins before writing the payload (~tens of ms on an H200).
SLEEP_CYCLES = 50_000_000


def stale_copy(x: torch.Tensor) -> torch.Tensor:
    """A tensor of ``x``'s shape whose every byte differs from ``x`` (its bitwise complement)."""
    return torch.bitwise_not(x.contiguous().view(torch.uint8)).view(x.dtype).view(x.shape)


def start_compute(target: torch.Tensor, value: torch.Tensor) -> None:
    """Start a "compute" that writes ``value`` into ``target``, without waiting for it."""
    if target.is_cuda:
        torch.cuda._sleep(SLEEP_CYCLES)
        target.copy_(value)
    else:
        emulated_event.defer(lambda: target.copy_(value))


def side_compute(target: torch.Tensor, value: torch.Tensor, capture: Any) -> Any:
    """Start a "compute" that writes ``value`` into ``target`` on another stream, and return ``capture()`` taken
    there: an event covering it that the current stream does not wait for by itself (on CUDA a side stream, on CPU
    the emulation's deferred work, which no call completes unless it waits on that event)."""
    if target.is_cuda:
        side = torch.cuda.Stream(device=target.device)
        side.wait_stream(torch.cuda.current_stream(target.device))
        with torch.cuda.stream(side):
            torch.cuda._sleep(SLEEP_CYCLES)
            target.copy_(value)
            event = capture()
        target.record_stream(side)
        value.record_stream(side)
        return event
    emulated_event.defer(lambda: target.copy_(value))
    return capture()


def finish_all(device: torch.device) -> None:
    """Complete every outstanding piece of work (between sub-checks and at the end of a task)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    else:
        emulated_event.synchronize()


def frozen(view: DispatchView) -> DispatchView:
    """``view`` with its tensors copied now (what was read at this point, not what lands later)."""
    return dataclasses.replace(view, x=view.x.clone(), topk_idx=view.topk_idx.clone(),
                               topk_weights=view.topk_weights.clone())


def _dispatch_after_compute(adapter: Any, inputs: RankInputs, example: Example, rank: int) -> DispatchView:
    """Dispatch with ``previous_event`` (async, allocate_on_comm_stream) right after a compute wrote x."""
    x = stale_copy(inputs.x)
    start_compute(x, inputs.x)
    delayed = RankInputs(x, inputs.topk_idx, inputs.topk_weights)
    return frozen(adapter.dispatch(delayed, example, DispatchOptions(async_finish=True, previous_event=True), rank)[0])


def _combine_with_block(adapter: Any, raw: Raw, async_flag: bool) -> tuple[torch.Tensor, Any, Any]:
    """Combine the received rows back (identity experts): ``(combined_x, combined_topk_weights, released)``.

    Async, the expert outputs are written by a compute still running when the combine is called, which waits for
    it through ``previous_event`` (``allocate_on_comm_stream=True``), and the results are waited on by ``with
    event(release_handle=True):`` (``released``: the ``EventOverlap`` let go of its event on exit).  A plug-in waits
    the way its own code does, inside its combine (``released`` None)."""
    x, weights = raw.recv_x, raw.recv_topk_weights
    if adapter.spec.plugin:
        combined, combined_w = adapter.combine(raw, x, topk_weights=weights if adapter.spec.has("combine_weights")
                                               else None, async_finish=async_flag)
        return combined.cpu().clone(), None if combined_w is None else combined_w.cpu().clone(), None
    buffer = adapter.buffer if adapter.api == "v1" else raw.buffer
    ordered: dict[str, Any] = {}
    if async_flag:
        x = stale_copy(raw.recv_x)
        start_compute(x, raw.recv_x)
        ordered = {"previous_event": buffer.capture(), "allocate_on_comm_stream": True}
    if adapter.api == "v1":
        combined, combined_w, event = buffer.combine(x, raw.handle, topk_weights=weights, async_finish=async_flag,
                                                     **ordered)
    else:
        combined, combined_w, event = buffer.combine(x, raw.handle, topk_weights=weights,
                                                     async_with_compute_stream=async_flag, **ordered)
    released = None
    if async_flag:
        with event(release_handle=True):
            pass
        released = event.event is None
    return combined.cpu().clone(), None if combined_w is None else combined_w.cpu().clone(), released


def hooked_release_wait(seen: dict[str, Any]) -> Any:
    """A ``wait(event, recv_x)`` for the adapters: register a hook that copies ``recv_x`` when it runs, then
    ``event.current_stream_wait(release_handle=True)``; ``seen`` gets the hook's runs before the wait and after
    it, the copy, and whether the event was let go of (``released``)."""

    def wait(event: Any, recv_x: Any) -> None:
        seen["runs"] = 0

        def hook() -> None:
            seen["runs"] += 1
            seen["x"] = recv_x.cpu().clone()

        event.register_hook_after_wait(hook)
        seen["runs_before_wait"] = seen["runs"]
        event.current_stream_wait(release_handle=True)
        seen["released"] = event.event is None

    return wait


def _v1_layout_after_compute(adapter: Any, inputs: RankInputs, example: Example) -> dict[str, torch.Tensor]:
    """V1 ``get_dispatch_layout`` of a ``topk_idx`` a compute is still writing, ordered after it by
    ``previous_event`` (``async_finish=True, allocate_on_comm_stream=True``), waited on: the layout tensors."""
    buffer = adapter.buffer
    topk_idx = stale_copy(inputs.topk_idx)
    start_compute(topk_idx, inputs.topk_idx)
    per_rank, _, per_expert, in_rank, event = buffer.get_dispatch_layout(
        topk_idx, example.num_experts, previous_event=buffer.capture(), async_finish=True,
        allocate_on_comm_stream=True)
    event.current_stream_wait()
    return {"num_tokens_per_rank": per_rank.cpu(), "num_tokens_per_expert": per_expert.cpu(),
            "is_token_in_rank": in_rank.cpu()}


#: ``ElasticBuffer.barrier`` calls: the defaults, and every keyword away from its default.
BARRIER_CALLS: tuple[dict[str, bool], ...] = ({}, {"use_comm_stream": False, "with_cpu_sync": True,
                                                   "sequential": False})
#: Seconds the last rank waits before it enters each barrier (the others must not leave before it enters).
BARRIER_LATE_S = 0.02
_barriers = [0]


def _barrier_runs(adapter: Any, buffer: Any, device: torch.device) -> list[dict[str, Any]]:
    """Each call of :data:`BARRIER_CALLS`: every rank adds one to a fresh key of the world's store right before
    it enters (the last rank late), and reads the key after the barrier has completed (on a GPU: after a device
    synchronisation, so also without ``with_cpu_sync``): how many ranks had entered."""
    ctx, kv = context(), store()
    out = []
    for kwargs in BARRIER_CALLS:
        _barriers[0] += 1
        key = f"conformance/p10-barrier/{_barriers[0]}"
        if ctx.rank == ctx.world_size - 1:
            time.sleep(BARRIER_LATE_S)
        kv.add(key, 1)
        buffer.barrier(**adapter.call_kwargs("barrier", kwargs))  # the keywords of the backend's DeepEP version
        if device.type == "cuda":
            torch.cuda.synchronize()
        out.append({"kwargs": kwargs, "entered": int(kv.add(key, 0))})
    return out


def _v2_refusal(adapter: Any, inputs: RankInputs, example: Example) -> Raised:
    """V2 dispatch with ``previous_event`` but without ``allocate_on_comm_stream``: must raise."""
    buffer = adapter.buffer(example)
    try:
        buffer.dispatch(inputs.x, topk_idx=inputs.topk_idx, topk_weights=inputs.topk_weights,
                        num_experts=example.num_experts, num_max_tokens_per_rank=example.num_max_tokens_per_rank,
                        expert_alignment=example.expert_alignment, previous_event=buffer.capture(),
                        allocate_on_comm_stream=False)
    except Exception as exc:  # the expected refusal; any type is returned for the controller to judge
        return Raised.of(exc)
    return Raised.of(None)


@rank_task
def event_results(env: RankEnv) -> dict[str, dict[str, Any]]:
    """Per backend: the sync, async+wait (built-ins: a hook registered, then ``current_stream_wait(release_handle=
    True)``) and previous_event dispatch views, sync vs async combine (built-ins: of expert outputs a compute is
    still writing, ordered by ``previous_event``, waited by ``with event(release_handle=True)``), for V1 the layout
    ordered after a compute, for V2 the refusal of ``previous_event`` without ``allocate_on_comm_stream`` plus the
    dispatch right after it and the barriers."""
    example, inputs, rank, device = env.example, env.inputs, env.rank, env.device
    assert example is not None

    def dispatches(adapter: Any) -> dict[str, Any]:
        built_in, seen = not adapter.spec.plugin, {}
        waiting = {"wait": hooked_release_wait(seen)} if built_in else {}
        result: dict[str, Any] = {
            "sync": adapter.dispatch(inputs, example, DispatchOptions(), rank)[0],
            "async_wait": frozen(adapter.dispatch(inputs, example, DispatchOptions(async_finish=True), rank,
                                                  **waiting)[0]),
        }
        if built_in:
            result["hook"] = seen
        finish_all(device)
        result["previous_event"] = _dispatch_after_compute(adapter, inputs, example, rank)
        finish_all(device)
        if adapter.api == "v1" and built_in:
            result["layout"] = _v1_layout_after_compute(adapter, inputs, example)
            finish_all(device)
        if adapter.api == "v2" and built_in:
            result["refusal"] = _v2_refusal(adapter, inputs, example)
            result["after_refusal"] = adapter.dispatch(inputs, example, DispatchOptions(), rank)[0]
            result["barrier"] = _barrier_runs(adapter, adapter.buffer(example), device)
        return result

    def combines(adapter: Any) -> dict[str, Any]:
        raw = adapter.dispatch(inputs, example, DispatchOptions(), rank)[1]
        sync = _combine_with_block(adapter, raw, False)
        waited = _combine_with_block(adapter, raw, True)
        finish_all(device)
        return {"combine_sync": sync, "combine_with": waited}

    out: dict[str, dict[str, Any]] = {}
    try:
        for name, result in env.each_backend("dispatch", dispatches).items():
            out[name] = result if isinstance(result, dict) else {"sync": result}
        for name, result in env.each_backend("combine", combines, capability="combine").items():
            if isinstance(result, NotChecked):
                out[name]["combine"] = result
            else:
                out[name].update(result)
    finally:
        finish_all(device)
    return out
