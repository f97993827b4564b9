"""Mutants of the FP8 and low-latency paths (caught by P15-P18, P23, P24) and the benign differences they allow (a
receive order, other wait-cost values)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from conformance.emulation import EventHandle, EventOverlap
from conformance.emulation.utils.event import defer, pending_work
from conformance.mutants.patching import seam, through
from conformance.mutants.registry import register


def _receive_deferred(event: Any) -> bool:
    """Whether ``event`` (an ``EventOverlap``) covers CPU work not yet run: an async low-latency call's receive
    (on CUDA nothing is deferred: the event is the stream's)."""
    handle = getattr(event, "event", None)
    return isinstance(handle, EventHandle) and pending_work() > 0 and not handle.query()


def _mask_of(buffer: Any) -> list[bool]:
    """A V1 buffer's shrink-mode mask now, as ``low_latency_query_mask_buffer`` reports it (all unmasked without a
    mask buffer: shrink mode off or no RDMA bytes)."""
    if not (buffer.enable_shrink and buffer.num_rdma_bytes > 0):
        return [False] * buffer.group_size
    status = torch.zeros(buffer.group_size, dtype=torch.int32)
    buffer.low_latency_query_mask_buffer(status)
    return [bool(v) for v in status.tolist()]


def _after_receive(out: tuple, action: Callable[[], None]) -> tuple:
    """What a low-latency call returned (its event and hook last), with ``action`` run after its receive phase:
    now, when the caller runs the hook, or (``async_finish`` on CPU) when the caller waits on the event."""
    hook, event = out[-1], out[-2]
    if hook is None:
        if _receive_deferred(event):  # async_finish on CPU: the receive runs when the event is waited on
            defer(action)
            return out[:-2] + (EventOverlap(EventHandle(torch.device("cpu"))), None)
        action()
        return out

    def late() -> None:
        hook()
        action()
    return out[:-1] + (late,)


@register("ll-wrong-scale-row", "harmful",
          "low-latency FP8 cast: each token is sent with the scales of the previous token (rolled by one row)")
def ll_wrong_scale_row() -> Iterator[None]:
    def cast(original: Any, x: torch.Tensor, round_scale: bool) -> tuple[torch.Tensor, torch.Tensor]:
        q, s = original(x, round_scale)
        return q, s.roll(1, dims=0)

    with seam("ll_fp8_cast", cast):
        yield


@register("ll-ue8m0-off-by-one", "harmful", "UE8M0 scale bytes one exponent too large")
def ll_ue8m0_off_by_one() -> Iterator[None]:
    with seam("ll_ue8m0_bytes", lambda original, scale_inv: original(scale_inv) + 1):
        yield


@register("ll-recv-count-off-by-one", "harmful", "low-latency recv_count of local expert 0 one too large")
def ll_recv_count_off_by_one() -> Iterator[None]:
    def after(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)

        def bump() -> None:
            out[1][0] += 1
        return _after_receive(out, bump)

    with seam("Buffer.low_latency_dispatch", after):
        yield


@register("ll-hook-before-data", "harmful", "a receive hook that returns without receiving (dispatch and combine)")
def ll_hook_before_data() -> Iterator[None]:
    def after(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        if out[-1] is None:
            return out
        return out[:-1] + ((lambda: None),)

    with contextlib.ExitStack() as stack:
        for name in ("low_latency_dispatch", "low_latency_combine"):
            stack.enter_context(seam(f"Buffer.{name}", after))
        yield


@register("ll-stats-not-accumulated", "harmful",
          "cumulative_local_expert_recv_stats overwritten with this call's counts instead of accumulated")
def ll_stats_not_accumulated() -> Iterator[None]:
    def after(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
        stats = kwargs.get("cumulative_local_expert_recv_stats")
        if stats is None:
            return original(self, *args, **kwargs)
        kwargs["cumulative_local_expert_recv_stats"] = scratch = torch.zeros_like(stats)
        return _after_receive(original(self, *args, **kwargs), lambda: stats.copy_(scratch))

    with seam("Buffer.low_latency_dispatch", after):
        yield


@register("ll-out-ignored", "harmful",
          "low_latency_combine(..., out=out) writes the result into a new tensor and returns that; out is untouched")
def ll_out_ignored() -> Iterator[None]:
    def after(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs.pop("out", None)
        if len(args) > 8:
            args = args[:8] + (None,) + args[9:]
        return original(self, *args, **kwargs)

    with seam("Buffer.low_latency_combine", after):
        yield


@register("ll-out-written-before-hook", "harmful",
          "low_latency_combine(..., out=out, return_recv_hook=True) clears out in the send phase, before the hook")
def ll_out_written_before_hook() -> Iterator[None]:
    def after(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        out = kwargs.get("out")
        if out is not None and result[2] is not None:
            out.zero_()
        return result

    with seam("Buffer.low_latency_combine", after):
        yield


def _wait_costs(charge: Any) -> Any:
    """The wait cost the kernels charge: ``charge(nominal)`` for a wait that found its data."""
    return seam("ll_nominal_wait_cycles", lambda original: charge(original()))


@register("ll-cost-stats-not-accumulated", "harmful",
          "dispatch/combine_wait_recv_cost_stats overwritten with this call's wait cycles instead of added to")
def ll_cost_stats_not_accumulated() -> Iterator[None]:
    def after(original: Any, self: Any, *args: Any, name: str = "", **kwargs: Any) -> Any:
        cost = kwargs.get(name)
        if cost is None:
            return original(self, *args, **kwargs)
        kwargs[name] = scratch = torch.zeros_like(cost)
        return _after_receive(original(self, *args, **kwargs), lambda: cost.copy_(scratch))

    with contextlib.ExitStack() as stack:
        for method, name in (("low_latency_dispatch", "dispatch_wait_recv_cost_stats"),
                             ("low_latency_combine", "combine_wait_recv_cost_stats")):
            stack.enter_context(seam(f"Buffer.{method}",
                                     lambda original, self, *a, _n=name, **kw: after(original, self, *a, name=_n,
                                                                                     **kw)))
        yield


@register("ll-wait-costs-doubled", "benign",
          "every wait that found its data is charged twice the cycles (other timing: the values are not a contract)")
def ll_wait_costs_doubled() -> Iterator[None]:
    with _wait_costs(lambda nominal: 2 * nominal):
        yield


@register("ll-masked-rank-waited-for", "harmful",
          "shrink mode: a receiver still waits for (and charges the wait cost of) the ranks it masked")
def ll_masked_rank_waited_for() -> Iterator[None]:
    def charged(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        masked = [r for r, m in enumerate(_mask_of(self)) if m]
        for name in ("dispatch_wait_recv_cost_stats", "combine_wait_recv_cost_stats"):
            if kwargs.get(name) is not None and masked:
                cost = kwargs[name]
                out = _after_receive(out, lambda cost=cost: cost.index_add_(
                    0, torch.tensor(masked), torch.full((len(masked),), through("ll_nominal_wait_cycles"),
                                                        dtype=cost.dtype)))
        return out

    with contextlib.ExitStack() as stack:
        for method in ("low_latency_dispatch", "low_latency_combine"):
            stack.enter_context(seam(f"Buffer.{method}", charged))
        yield


@register("ll-masked-rank-still-receives", "harmful",
          "shrink mode: dispatch ignores the mask buffer (masked ranks still send and receive tokens)")
def ll_masked_rank_still_receives() -> Iterator[None]:
    ignoring: list[bool] = []  # non-empty while a dispatch (or its hook) runs

    def ignored(run: Callable[[], Any]) -> Any:
        ignoring.append(True)
        try:
            return run()
        finally:
            ignoring.pop()

    def masked(original: Any, state: Any) -> list[bool]:
        return [False] * state.num_ranks if ignoring else original(state)

    def unmasked(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
        out = ignored(lambda: original(self, *args, **kwargs))
        if out[-1] is None:
            return out
        hook = out[-1]
        return out[:-1] + ((lambda: ignored(hook)),)

    with seam("Buffer.low_latency_dispatch", unmasked), seam("ll_masked", masked):
        yield


@register("ll-masked-rank-still-contributes", "harmful",
          "shrink mode: combine adds the slots of experts on masked ranks (the rows they never sent)")
def ll_masked_rank_still_contributes() -> Iterator[None]:
    def reduce(original: Any, *args: Any) -> torch.Tensor:
        args = list(args)
        args[7] = torch.zeros_like(args[7])  # skip: no rank masked
        return original(*args)

    with seam("ll_combine_reduce", reduce):
        yield


@register("ll-query-wrong-mask", "harmful",
          "low_latency_query_mask_buffer writes the mask shifted by one rank (rank r reports rank r + 1's status)")
def ll_query_wrong_mask() -> Iterator[None]:
    def after(original: Any, self: Any, mask_status: torch.Tensor) -> None:
        original(self, mask_status)
        flat = mask_status.view(-1)
        flat.copy_(flat.roll(-1))

    with seam("Buffer.low_latency_query_mask_buffer", after):
        yield


@register("ll-clean-does-not-clean", "harmful",
          "clean_low_latency_buffer synchronises but zeroes nothing (stale signalling words stay)")
def ll_clean_does_not_clean() -> Iterator[None]:
    with seam("ll_clean_signals", lambda original, state, lay: None):
        yield


@register("ll-clean-zeroes-everything", "harmful",
          "clean_low_latency_buffer zeroes the whole RDMA buffer (staged zero-copy rows included)")
def ll_clean_zeroes_everything() -> Iterator[None]:
    def clean(original: Any, state: Any, lay: Any) -> None:
        original(state, lay)
        state.bytes.zero_()

    with seam("ll_clean_signals", clean):
        yield


@register("ll-clean-flips-buffer-index", "harmful",
          "clean_low_latency_buffer also flips the double-buffer index (the next call uses the other buffer)")
def ll_clean_flips_buffer_index() -> Iterator[None]:
    def clean(original: Any, state: Any, lay: Any) -> None:
        original(state, lay)
        state.flip()

    with seam("ll_clean_signals", clean):
        yield


@register("ll-local-buffer-offset-in-elements", "harmful",
          "get_local_buffer_tensor counts offset in elements of dtype instead of bytes (a view past the one asked for)")
def ll_local_buffer_offset_in_elements() -> Iterator[None]:
    def scaled(original: Any, self: Any, dtype: torch.dtype, size: Any = None, offset: int = 0,
               use_rdma_buffer: bool = False) -> torch.Tensor:
        return original(self, dtype, size, offset * dtype.itemsize, use_rdma_buffer)

    with seam("Buffer.get_local_buffer_tensor", scaled):
        yield


@register("ll-async-event-missing", "harmful",
          "low-latency dispatch and combine with async_finish=True return an EventOverlap without an event")
def ll_async_event_missing() -> Iterator[None]:
    def eventless(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        if not kwargs.get("async_finish"):
            return out
        at = len(out) - 2  # (..., event, hook)
        return out[:at] + (type(out[at])(None),) + out[at + 1:]

    with contextlib.ExitStack() as stack:
        for method in ("low_latency_dispatch", "low_latency_combine"):
            stack.enter_context(seam(f"Buffer.{method}", eventless))
        yield


@register("fp8-scales-not-moved", "harmful",
          "V1 FP8 dispatch delivers the received tokens' scale rows in the sender's row order (not moved with them)")
def fp8_scales_not_moved() -> Iterator[None]:
    def after(original: Any, *args: Any, **kwargs: Any) -> Any:
        recv = original(*args, **kwargs)
        scales = recv.fields.get("x_scales")  # V1's FP8 scales (V2's are "sf")
        if scales is not None and scales.shape[0] > 1:
            recv.fields["x_scales"] = scales.flip(0)
        return recv

    with seam("exchange", after):
        yield


@register("ll-reverse-source-order", "benign",
          "low-latency dispatch packs source ranks in descending order (layout_range, src_info and rows consistent)")
def ll_reverse_source_order() -> Iterator[None]:
    def after(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        recv_x, recv_count, handle, event, hook = out

        def reorder() -> None:
            src_info, layout_range = handle[0], handle[1]
            x, scales = recv_x if isinstance(recv_x, tuple) else (recv_x, None)
            for e in range(layout_range.shape[0]):
                blocks = [(int(v) >> 32, int(v) & 0xFFFFFFFF) for v in layout_range[e].tolist()]
                rows = torch.cat([torch.arange(b, b + n) for b, n in reversed(blocks)] or [torch.empty(0)]).long()
                n_all = rows.numel()
                x[e, :n_all] = x[e, rows].clone()
                src_info[e, :n_all] = src_info[e, rows].clone()
                if scales is not None:
                    scales[e, :n_all] = scales[e, rows].clone()
                begin = 0
                for s in reversed(range(len(blocks))):
                    layout_range[e, s] = (begin << 32) | blocks[s][1]
                    begin += blocks[s][1]

        return _after_receive(out, reorder)

    with seam("Buffer.low_latency_dispatch", after):
        yield


@register("ll-async-event-before-receive", "harmful",
          "low-latency dispatch/combine with async_finish=True record their event before the receive phase is "
          "queued: waiting on it leaves the outputs unwritten (P15, P16)")
def ll_async_event_before_receive() -> Iterator[None]:
    def deliver(original: Any, receive: Any, return_recv_hook: bool, async_finish: bool,
                device: torch.device) -> Any:
        if async_finish and not return_recv_hook and device.type == "cpu":
            event = EventOverlap(EventHandle(device))  # recorded too early
            defer(receive)
            return event
        return original(receive, return_recv_hook, async_finish, device)

    with seam("ll_deliver", deliver):
        yield
