"""Rank tasks for P10 (events): async + wait vs sync, ``previous_event`` ordering, the V2 refusal, ``with``.

"Prior compute" is modelled per device: on CUDA, a long ``torch.cuda._sleep`` then a copy on the current
stream (a dispatch that did not wait would read the payload before the copy lands); on CPU, the
emulation's deferred-work queue (``conformance.emulation.utils.event.defer``), completed only by waiting
on an event captured after it.  Either way the tensor holds stale bytes until the compute is waited on.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from conformance.core.example import Example, RankInputs
from conformance.core.views import DispatchOptions, DispatchView, Raised, Unsupported
from conformance.emulation.utils import event as emulated_event
from conformance.tasks.env import RankEnv, rank_task

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


def _combine_with_block(adapter: Any, raw: dict[str, Any], async_flag: bool) -> tuple[torch.Tensor, Any]:
    """Combine the received rows back (identity experts); async results are waited on by ``with event:`` (a
    plug-in waits the way its own code does, inside its combine)."""
    x, weights = raw["recv_x"], raw["recv_topk_weights"]
    if adapter.spec.plugin:
        combined, combined_w = adapter.combine(raw, x, topk_weights=weights if adapter.spec.has("combine_weights")
                                               else None, async_finish=async_flag)
        return combined.cpu().clone(), None if combined_w is None else combined_w.cpu().clone()
    if adapter.api == "v1":
        combined, combined_w, event = adapter.buffer.combine(x, raw["handle"], topk_weights=weights,
                                                             async_finish=async_flag)
    else:
        combined, combined_w, event = raw["buffer"].combine(x, raw["handle"], topk_weights=weights,
                                                            async_with_compute_stream=async_flag)
    if async_flag:
        with event:
            pass
    return combined.cpu().clone(), None if combined_w is None else combined_w.cpu().clone()


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
    """Per backend: the sync, async+wait and previous_event dispatch views, sync vs ``with``-waited async
    combine, and for V2 the refusal of ``previous_event`` without ``allocate_on_comm_stream`` plus the
    dispatch right after it."""
    example, inputs, rank, device = env.example, env.inputs, env.rank, env.device
    assert example is not None

    def dispatches(adapter: Any) -> dict[str, Any]:
        result: dict[str, Any] = {
            "sync": adapter.dispatch(inputs, example, DispatchOptions(), rank)[0],
            "async_wait": frozen(adapter.dispatch(inputs, example, DispatchOptions(async_finish=True), rank)[0]),
        }
        finish_all(device)
        result["previous_event"] = _dispatch_after_compute(adapter, inputs, example, rank)
        finish_all(device)
        if adapter.api == "v2" and not adapter.spec.plugin:
            result["refusal"] = _v2_refusal(adapter, inputs, example)
            result["after_refusal"] = adapter.dispatch(inputs, example, DispatchOptions(), rank)[0]
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
            if isinstance(result, Unsupported):
                out[name]["combine"] = result
            else:
                out[name].update(result)
    finally:
        finish_all(device)
    return out
