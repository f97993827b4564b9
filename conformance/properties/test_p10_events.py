"""P10 events: async + wait equals sync; ``previous_event`` orders the call after prior compute (dispatch, combine,
V1's ``get_dispatch_layout``); V2 refuses ``previous_event`` without ``allocate_on_comm_stream``; ``EventOverlap``
used as a context manager waits; a hook registered after the wait runs once, after it; ``release_handle=True``
(``current_stream_wait`` and ``with event(release_handle=True):``) lets the event go; V2's ``barrier`` (defaults,
and every keyword changed) returns on no rank before every rank has entered."""

from __future__ import annotations

from typing import Any

from conformance.assertions import (
    assert_bytes_equal,
    assert_refused_then_usable,
    assert_value_equal,
    assert_view_matches_oracle,
    assert_views_equal,
    per_backend,
)
from conformance.core.example import Example
from conformance.core.outcomes import NotChecked, Why
from conformance.oracle.recorded import expected_refusal
from conformance.properties import CheckContext, Property, register
from conformance.strategies import sized
from conformance.strategies.calls import small_examples
from conformance.tasks.events import event_results

REFUSAL = "v2_previous_event_without_comm_alloc"


def check(ctx: CheckContext, example: Example, per_rank: list[dict[str, Any]]) -> None:
    """For every backend and rank: async+wait == sync (dispatch; combine waited by ``with
    event(release_handle=True):``), a dispatch / combine / V1 layout with ``previous_event`` sees the bytes the
    prior compute wrote, a hook registered on the dispatch's event ran once after the wait and saw complete rows,
    ``release_handle`` let the event go, V2 rejects ``previous_event`` without ``allocate_on_comm_stream`` on every
    rank, staying usable, and every rank had entered V2's barrier when it returned."""
    __tracebackhide__ = True
    for backend, results in per_backend(ctx, per_rank):
        check_backend(ctx, example, backend, results)


def check_backend(ctx: CheckContext, example: Example, backend: str, results: list[dict[str, Any]]) -> None:
    """The checks of one backend (see :func:`check`)."""
    __tracebackhide__ = True
    for rank, got in enumerate(results):
        sync = assert_view_matches_oracle(ctx, example, rank, got["sync"])
        if sync is None:
            continue
        waited = ("async + register_hook_after_wait(hook) + current_stream_wait(release_handle=True)"
                  if "hook" in got else "async + event.current_stream_wait()")
        assert_views_equal(got["async_wait"], sync, rank=rank, what=waited)
        if "hook" in got:
            check_hook(got["hook"], got["async_wait"], rank, f"{got['async_wait'].call}, {waited}")
        assert_view_matches_oracle(ctx, example, rank, got["previous_event"],
                                   after="a compute that wrote x, waited through previous_event")
        if "layout" in got:
            call = (f"{backend} Buffer.get_dispatch_layout(topk_idx written by a compute, previous_event=capture(), "
                    f"async_finish=True, allocate_on_comm_stream=True) + current_stream_wait() on rank {rank}")
            for name, tensor in got["layout"].items():
                assert_bytes_equal(tensor, getattr(sync.layout, name), name=name, rank=rank, call=call,
                                   against="the synchronous layout")
        for run in got.get("barrier", ()):
            given = ", ".join(f"{k}={v}" for k, v in run["kwargs"].items())
            assert_value_equal("ranks that had entered the barrier", run["entered"], len(results),
                               call=f"{backend} ElasticBuffer.barrier({given}) on rank {rank} (the last rank entered "
                                    f"late; read after the barrier completed)", why="every rank")
        combine = got.get("combine")
        if isinstance(combine, NotChecked):
            ctx.not_checked(combine, example)
        elif "combine_sync" not in got:
            ctx.not_checked(NotChecked.part(
                backend, Why.CAPABILITY, "async combine waited on = synchronous combine: the backend does not "
                                         "declare the capability 'combine'"))
        else:
            call = (f"{backend} combine(expert outputs a compute is still writing, handle, topk_weights, async, "
                    f"previous_event=capture(), allocate_on_comm_stream=True) waited by `with "
                    f"event(release_handle=True):` on rank {rank}")
            if got["combine_with"][2] is None:
                call = f"{backend} combine(recv_x, handle, topk_weights, async) (waited inside) on rank {rank}"
            for index, name in enumerate(("combined_x", "combined_topk_weights")):
                assert_bytes_equal(got["combine_with"][index], got["combine_sync"][index], name=name, rank=rank,
                                   call=call, against="the synchronous combine")
            if got["combine_with"][2] is not None:
                assert_value_equal("event released (EventOverlap.event is None)", got["combine_with"][2], True,
                                   call=call, why="`with event(release_handle=True):` lets the event go on exit")
    if "refusal" in results[0]:
        expected_type, expected_message = expected_refusal(ctx.contract(backend), REFUSAL,
                                                           "v2_dispatch_previous_event_without_comm_alloc")
        assert_refused_then_usable(
            ctx, example, results, refused="refusal", after="after_refusal",
            call=f"{backend} ElasticBuffer.dispatch(..., previous_event=capture(), allocate_on_comm_stream=False)",
            what="the refused previous_event dispatch", expected_type=expected_type,
            expected_message=expected_message,
        )


def check_hook(seen: dict[str, Any], view: Any, rank: int, call: str) -> None:
    """A hook registered on an async dispatch's ``EventOverlap`` ran once, only at the wait, and saw the received
    rows complete; ``current_stream_wait(release_handle=True)`` let go of the event."""
    __tracebackhide__ = True
    assert_value_equal("hook runs before current_stream_wait", seen["runs_before_wait"], 0, call=call,
                       why="register_hook_after_wait only registers it")
    assert_value_equal("hook runs after current_stream_wait", seen["runs"], 1, call=call, why="once, after the wait")
    assert_bytes_equal(seen["x"], view.x, name="recv_x as the hook saw it", rank=rank, call=call,
                       against="recv_x after the wait (the hook runs after the event is waited on)")
    assert_value_equal("event released (EventOverlap.event is None)", seen["released"], True, call=call,
                       why="current_stream_wait(release_handle=True) lets the event go")


PROPERTY = register(Property(
    id="P10-events",
    title="async + wait = sync; previous_event orders communication (dispatch, combine, V1 layout); V2 refuses it "
          "without allocate_on_comm_stream=True; EventOverlap waits on exit, runs its hook after the wait, releases "
          "its event on request; V2 barrier orders every rank",
    strategy=sized(small_examples), task=event_results, check=check, needs=("events",), shapes="small",
))
test_events = PROPERTY.test
