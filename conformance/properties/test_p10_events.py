"""P10 events: async + wait equals sync; ``previous_event`` orders the call after prior compute; V2 refuses
``previous_event`` without ``allocate_on_comm_stream``; ``EventOverlap`` used as a context manager waits."""

from __future__ import annotations

from typing import Any

from conformance.assertions import (
    assert_bytes_equal,
    assert_refused_then_usable,
    assert_view_matches_oracle,
    assert_views_equal,
    per_backend,
)
from conformance.core.example import Example
from conformance.core.views import Unsupported
from conformance.oracle.recorded import recorded_errors
from conformance.properties import CheckContext, Property, register
from conformance.strategies import sized
from conformance.strategies.calls import small_examples
from conformance.tasks.events import event_results

REFUSAL = "v2_previous_event_without_comm_alloc"


def check(ctx: CheckContext, example: Example, per_rank: list[dict[str, Any]]) -> None:
    """For every backend and rank: async+wait == sync (dispatch, and combine waited by ``with event:``),
    a dispatch with ``previous_event`` sees the bytes the prior compute wrote (the oracle's), and V2
    rejects ``previous_event`` without ``allocate_on_comm_stream`` on every rank, staying usable."""
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
        assert_views_equal(got["async_wait"], sync, rank=rank, what="async + event.current_stream_wait()")
        assert_view_matches_oracle(ctx, example, rank, got["previous_event"],
                                   after="a compute that wrote x, waited through previous_event")
        combine = got.get("combine")
        if isinstance(combine, Unsupported):
            ctx.record_unsupported(combine, example)
        elif "combine_sync" not in got:
            ctx.record_not_checked(backend, "async combine waited on = synchronous combine: the backend does not "
                                            "declare the capability 'combine'")
        else:
            call = f"{backend} combine(recv_x, handle, topk_weights, async) waited by `with event:` on rank {rank}"
            for index, name in enumerate(("combined_x", "combined_topk_weights")):
                assert_bytes_equal(got["combine_with"][index], got["combine_sync"][index], name=name, rank=rank,
                                   call=call, against="the synchronous combine")
    if "refusal" in results[0]:
        expected_type, expected_message = recorded_errors()[REFUSAL]
        assert_refused_then_usable(
            ctx, example, results, refused="refusal", after="after_refusal",
            call=f"{backend} ElasticBuffer.dispatch(..., previous_event=capture(), allocate_on_comm_stream=False)",
            what="the refused previous_event dispatch", expected_type=expected_type,
            expected_message=expected_message,
        )


PROPERTY = register(Property(
    id="P10-events",
    title="async + wait = sync; previous_event orders communication; V2 refuses it without "
          "allocate_on_comm_stream=True; EventOverlap waits on exit",
    strategy=sized(small_examples), task=event_results, check=check, needs=("events",),
))
test_events = PROPERTY.test
