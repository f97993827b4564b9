"""Mutants of the runtime contract (P10 events, P11 QP cap, P12 bad input, P14 API surface).

Each patches the emulation the way a real library bug would behave: an event recorded too early, an
ignored ``previous_event`` (also only by the layout, or only by the internode combine), a context manager that
forgets to wait, an event kept although its release was asked for, a hook run before the wait, a barrier that
does not wait, a QP check that clamps instead of
refusing, an over-full batch silently truncated, a refusal that leaves stale rows behind, combine
recomputing its SM count, an explicit QP count or buffer size ignored, an SM-count argument dropped, a
renamed keyword argument.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

import torch

from conformance.emulation import EventHandle, EventOverlap
from conformance.emulation.utils.event import defer
from conformance.mutants.patching import rebinding, renamed_export, resigned, seam
from conformance.mutants.registry import register


@register("async-result-before-ready", "harmful",
          "async dispatch/combine record their event before the copy-out is queued: waiting leaves stale rows")
def async_result_before_ready() -> Iterator[None]:
    def complete_later(original: Any, fills: list[tuple[torch.Tensor, torch.Tensor]]) -> EventHandle:
        event = EventHandle(torch.device("cpu"))  # recorded too early
        defer(lambda: [dst.copy_(src) for dst, src in fills])
        return event

    with seam("async_complete_later", complete_later):
        yield


@register("previous-event-ignored", "harmful",
          "dispatch does not wait for previous_event (V1 always, V2 when allocate_on_comm_stream=True)")
def previous_event_ignored() -> Iterator[None]:
    def drop_v2(self: Any, arguments: dict[str, Any]) -> None:
        if arguments["allocate_on_comm_stream"]:  # the refusal check itself still works
            arguments["previous_event"] = None

    # V1: the argument checks still see the event (allocate_on_comm_stream needs it), but nothing waits on it.
    with seam("v1_wait_previous_event", lambda original, previous_event: None), \
            rebinding("ElasticBuffer.dispatch", drop_v2):
        yield


@register("event-overlap-exit-no-wait", "harmful", "`with event_overlap:` does not wait on exit")
def event_overlap_exit_no_wait() -> Iterator[None]:
    def exit_without_wait(original: Any, self: EventOverlap, exc_type: Any, exc_val: Any, exc_tb: Any) -> None:
        self(release_handle=False)  # the block's release_handle is reset, as the real exit does; nothing is waited

    with seam("EventOverlap.__exit__", exit_without_wait):
        yield


@register("release-handle-ignored", "harmful",
          "EventOverlap.current_stream_wait(release_handle=True) keeps its event (the tensors recorded in it stay "
          "alive; also through `with event(release_handle=True):`)")
def release_handle_ignored() -> Iterator[None]:
    def keep(original: Any, self: EventOverlap, release_handle: bool = False) -> Any:
        return original(self, False)

    with seam("EventOverlap.current_stream_wait", keep):
        yield


@register("event-call-drops-release-handle", "harmful",
          "EventOverlap.__call__(release_handle=True) returns the overlap without configuring the release: `with "
          "event(release_handle=True):` keeps the event")
def event_call_drops_release_handle() -> Iterator[None]:
    def call(original: Any, self: EventOverlap, release_handle: bool = False) -> EventOverlap:
        return self

    with seam("EventOverlap.__call__", call):
        yield


@register("hook-before-event-wait", "harmful",
          "EventOverlap.current_stream_wait runs the hook registered by register_hook_after_wait before it waits "
          "on the event (the hook sees an async call's outputs unwritten)")
def hook_before_event_wait() -> Iterator[None]:
    def hook_first(original: Any, self: EventOverlap, release_handle: bool = False) -> Any:
        if self.hook_after_wait is not None:
            hook, self.hook_after_wait = self.hook_after_wait, None
            hook()
        return original(self, release_handle)

    with seam("EventOverlap.current_stream_wait", hook_first):
        yield


@register("layout-ignores-previous-event", "harmful",
          "V1 get_dispatch_layout does not wait for previous_event (it reads a topk_idx a compute is still writing)")
def layout_ignores_previous_event() -> Iterator[None]:
    with _not_waiting_previous_event("Buffer.get_dispatch_layout"):
        yield


@contextlib.contextmanager
def _not_waiting_previous_event(name: str) -> Iterator[None]:
    """Entry point ``name`` runs with V1's wait on ``previous_event`` skipped (its argument checks still see the
    event): seam ``v1_wait_previous_event`` waits for nothing while the call runs."""
    inside: list[bool] = []

    def call(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
        inside.append(True)
        try:
            return original(self, *args, **kwargs)
        finally:
            inside.pop()

    def wait(original: Any, previous_event: Any) -> None:
        if not inside:
            original(previous_event)

    with seam(name, call), seam("v1_wait_previous_event", wait):
        yield


@register("internode-combine-ignores-previous-event", "harmful",
          "V1 internode_combine does not wait for previous_event (the argument checks still see it): a combine on "
          "several nodes reads expert outputs a compute is still writing", min_nodes=2)
def internode_combine_ignores_previous_event() -> Iterator[None]:
    with _not_waiting_previous_event("Buffer.internode_combine"):
        yield


@register("barrier-returns-early-unless-sequential", "harmful",
          "ElasticBuffer.barrier(sequential=False) returns before the peers have entered it (the parallel "
          "scale-out/scale-up barriers do not wait)")
def barrier_returns_early_unless_sequential() -> Iterator[None]:
    def barrier(original: Any, self: Any, use_comm_stream: bool = True, with_cpu_sync: bool = False,
                sequential: bool = True) -> None:
        if sequential:
            original(self, use_comm_stream, with_cpu_sync, sequential)

    with seam("ElasticBuffer.barrier", barrier):
        yield


@register("qp-cap-exceeded-silently", "harmful",
          "V2 dispatch clamps num_qps to num_allocated_qps instead of raising 'Allocated QPs are not enough'")
def qp_cap_exceeded_silently() -> Iterator[None]:
    def clamp(self: Any, arguments: dict[str, Any]) -> None:
        arguments["num_qps"] = min(arguments["num_qps"], self.num_allocated_qps)

    with rebinding("ElasticBuffer.dispatch", clamp):
        yield


@register("too-many-tokens-truncated", "harmful",
          "V2 dispatch accepts more tokens than num_max_tokens_per_rank and drops the extra rows")
def too_many_tokens_truncated() -> Iterator[None]:
    def truncate(self: Any, arguments: dict[str, Any]) -> None:
        limit = arguments["num_max_tokens_per_rank"] or self.num_max_tokens_per_rank
        if arguments["handle"] is None and not isinstance(arguments["x"], tuple) and arguments["x"].shape[0] > limit:
            for key in ("x", "topk_idx", "topk_weights"):
                if arguments[key] is not None:
                    arguments[key] = arguments[key][:limit]

    with rebinding("ElasticBuffer.dispatch", truncate):
        yield


@register("refusal-corrupts-buffer", "harmful",
          "after a rejected call, the next dispatch on that buffer returns a stale first row")
def refusal_corrupts_buffer() -> Iterator[None]:
    dirty: set[int] = set()

    def tracking(name: str, corrupt: bool) -> Any:
        def wrapper(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                result = original(self, *args, **kwargs)
            except Exception:
                dirty.add(id(self))
                raise
            if corrupt and id(self) in dirty and isinstance(result[0], torch.Tensor) and result[0].shape[0]:
                dirty.discard(id(self))
                result[0][0].view(torch.uint8).bitwise_xor_(0x5A)  # leftovers of the rejected call
            return result

        return seam(name, wrapper)

    with (tracking("Buffer.get_dispatch_layout", False), tracking("Buffer.dispatch", True),
          tracking("ElasticBuffer.dispatch", True), tracking("ElasticBuffer.combine", False)):
        yield


@register("combine-ignores-handle-num-sms", "harmful",
          "V2 combine with num_sms=0 recomputes the theoretical SM count instead of reusing handle.num_sms")
def combine_ignores_handle_num_sms() -> Iterator[None]:
    def recompute(self: Any, arguments: dict[str, Any]) -> None:
        if arguments["num_sms"] == 0:
            handle = arguments["handle"]
            arguments["num_sms"] = self.get_theoretical_num_sms(handle.num_experts, handle.topk_idx.shape[1])

    with rebinding("ElasticBuffer.combine", recompute):
        yield


@register("explicit-qp-count-ignored", "harmful",
          "ElasticBuffer(num_allocated_qps=N) allocates the automatic QP count instead of the N asked for")
def explicit_qp_count_ignored() -> Iterator[None]:
    def automatic(self: Any, arguments: dict[str, Any]) -> None:
        arguments["num_allocated_qps"] = 0

    with rebinding("ElasticBuffer.__init__", automatic):
        yield


@register("explicit-num-bytes-ignored", "harmful",
          "ElasticBuffer(num_bytes=N) (without CPU bytes) sizes the buffer from the MoE settings instead of N")
def explicit_num_bytes_ignored() -> Iterator[None]:
    def from_settings(self: Any, arguments: dict[str, Any]) -> None:
        if arguments["num_cpu_bytes"] == 0:
            arguments["num_bytes"] = None

    with rebinding("ElasticBuffer.__init__", from_settings):
        yield


@register("theoretical-sms-ignores-write-bandwidth", "harmful",
          "ElasticBuffer.get_theoretical_num_sms drops its sm_write_gbs argument (the default 50 GB/s is used)")
def theoretical_sms_ignores_write_bandwidth() -> Iterator[None]:
    def default_write(self: Any, arguments: dict[str, Any]) -> None:
        arguments["sm_write_gbs"] = 50

    with rebinding("ElasticBuffer.get_theoretical_num_sms", default_write):
        yield


@register("renamed-dispatch-kwarg", "harmful",
          "ElasticBuffer.dispatch renames num_max_tokens_per_rank to max_tokens_per_rank (API surface)")
def renamed_dispatch_kwarg() -> Iterator[None]:
    def rename(params: list[inspect.Parameter]) -> list[inspect.Parameter]:
        return [p.replace(name="max_tokens_per_rank") if p.name == "num_max_tokens_per_rank" else p for p in params]

    with resigned("ElasticBuffer.dispatch", rename, {"max_tokens_per_rank": "num_max_tokens_per_rank"}):
        yield


@register("added-optional-combine-kwarg", "benign",
          "ElasticBuffer.combine gains an optional keyword (do_zero_padding=False): reported, not a failure")
def added_optional_combine_kwarg() -> Iterator[None]:
    def add(params: list[inspect.Parameter]) -> list[inspect.Parameter]:
        return params + [inspect.Parameter("do_zero_padding", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=False)]

    with resigned("ElasticBuffer.combine", add, {}):
        yield


@register("renamed-elastic-buffer", "harmful",
          "deep_ep renames ElasticBuffer to EPBuffer (as V2.5 does): the old name no longer imports (API surface)")
def renamed_elastic_buffer() -> Iterator[None]:
    with renamed_export("ElasticBuffer", "EPBuffer"):
        yield


@register("v2-cached-dispatch-fixed", "benign",
          "a DeepEP that fixed the cached-dispatch TypeError (num_experts taken from the handle first): nothing fails, "
          "and the known defect v2-cached-dispatch-without-num-experts is reported fixed")
def v2_cached_dispatch_fixed() -> Iterator[None]:
    def from_handle(self: Any, arguments: dict[str, Any]) -> None:
        if arguments["handle"] is not None and arguments["num_experts"] is None:
            arguments["num_experts"] = arguments["handle"].num_experts

    with rebinding("ElasticBuffer.dispatch", from_handle):
        yield
