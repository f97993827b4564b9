"""Mutants of the FP8 and low-latency paths (caught by P15-P18) and one benign receive order they allow."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from conformance.emulation import _low_latency
from conformance.emulation._low_latency import LowLatencyMixin
from conformance.emulation.legacy import Buffer
from conformance.emulation.utils.event import EventHandle, EventOverlap, defer
from conformance.mutants.patching import wrap_method
from conformance.mutants.registry import register


@contextlib.contextmanager
def _patch_function(name: str, replacement: Any) -> Iterator[None]:
    original = getattr(_low_latency, name)
    setattr(_low_latency, name, replacement(original))
    try:
        yield
    finally:
        setattr(_low_latency, name, original)


@register("ll-wrong-scale-row", "harmful",
          "low-latency FP8 cast: each token is sent with the scales of the previous token (rolled by one row)")
def ll_wrong_scale_row() -> Iterator[None]:
    def replacement(original: Any) -> Any:
        def cast(x: torch.Tensor, round_scale: bool) -> tuple[torch.Tensor, torch.Tensor]:
            q, s = original(x, round_scale)
            return q, s.roll(1, dims=0)
        return cast

    with _patch_function("fp8_cast", replacement):
        yield


@register("ll-ue8m0-off-by-one", "harmful", "UE8M0 scale bytes one exponent too large")
def ll_ue8m0_off_by_one() -> Iterator[None]:
    def replacement(original: Any) -> Any:
        return lambda scale_inv: original(scale_inv) + 1

    with _patch_function("ue8m0_bytes", replacement):
        yield


@register("ll-recv-count-off-by-one", "harmful", "low-latency recv_count of local expert 0 one too large")
def ll_recv_count_off_by_one() -> Iterator[None]:
    def after(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        hook = out[4]
        if hook is None:
            out[1][0] += 1
            return out

        def late() -> None:
            hook()
            out[1][0] += 1
        return out[:4] + (late,)

    with wrap_method(LowLatencyMixin, "low_latency_dispatch", after):
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
            stack.enter_context(wrap_method(LowLatencyMixin, name, after))
        yield


@register("ll-stats-not-accumulated", "harmful",
          "cumulative_local_expert_recv_stats overwritten with this call's counts instead of accumulated")
def ll_stats_not_accumulated() -> Iterator[None]:
    def after(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
        stats = kwargs.get("cumulative_local_expert_recv_stats")
        if stats is None:
            return original(self, *args, **kwargs)
        kwargs["cumulative_local_expert_recv_stats"] = scratch = torch.zeros_like(stats)
        out = original(self, *args, **kwargs)

        def land() -> None:
            stats.copy_(scratch)
        if out[4] is None:
            land()
            return out
        hook = out[4]

        def late() -> None:
            hook()
            land()
        return out[:4] + (late,)

    with wrap_method(LowLatencyMixin, "low_latency_dispatch", after):
        yield


@register("fp8-scales-not-moved", "harmful",
          "V1 FP8 dispatch delivers the received tokens' scale rows in the sender's row order (not moved with them)")
def fp8_scales_not_moved() -> Iterator[None]:
    def after(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
        recv = original(self, *args, **kwargs)
        scales = recv.fields.get("x_scales")
        if scales is not None and scales.shape[0] > 1:
            recv.fields["x_scales"] = scales.flip(0)
        return recv

    with wrap_method(Buffer, "_exchange", after):
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

        if hook is None and event.event is not None and recv_count.device.type == "cpu":  # async: after the receive
            defer(reorder)
            return recv_x, recv_count, handle, EventOverlap(EventHandle(recv_count.device)), hook
        if hook is None:
            reorder()
            return out

        def late() -> None:
            hook()
            reorder()
        return recv_x, recv_count, handle, event, late

    with wrap_method(LowLatencyMixin, "low_latency_dispatch", after):
        yield


@register("ll-async-event-before-receive", "harmful",
          "low-latency dispatch/combine with async_finish=True record their event before the receive phase is "
          "queued: waiting on it leaves the outputs unwritten (P15, P16)")
def ll_async_event_before_receive() -> Iterator[None]:
    def replacement(original: Any) -> Any:
        def deliver(receive: Any, return_recv_hook: bool, async_finish: bool, device: torch.device) -> Any:
            if async_finish and not return_recv_hook and device.type == "cpu":
                event = EventOverlap(EventHandle(device))  # recorded too early
                defer(receive)
                return event
            return original(receive, return_recv_hook, async_finish, device)
        return deliver

    with _patch_function("_deliver", replacement):
        yield
