"""P10 events: async + wait equals sync; ``previous_event`` orders the call after prior compute; V2 refuses
``previous_event`` without ``allocate_on_comm_stream``; ``EventOverlap`` used as a context manager waits."""

from __future__ import annotations

from conformance.backends.views import Unsupported
from conformance.checks.assert_errors import (
    assert_raised_everywhere,
    assert_tensor_bytes_equal,
    assert_view_matches_oracle,
    assert_views_equal,
    recorded_errors,
)
from conformance.checks.registry import register
from conformance.example import Example

REFUSAL = "v2_previous_event_without_comm_alloc"


@register("P10-events")
def check_events(session, example: Example) -> None:  # noqa: ANN001 - conformance.session.Session
    """For every backend and rank: async+wait == sync (dispatch, and combine waited by ``with event:``),
    a dispatch with ``previous_event`` sees the bytes the prior compute wrote (the oracle's), and V2
    rejects ``previous_event`` without ``allocate_on_comm_stream`` on every rank, staying usable."""
    __tracebackhide__ = True
    per_rank = session.run("conformance.tasks.events:event_results", example)
    backends = per_rank[0].keys()
    for backend in backends:
        results = [ranks[backend] for ranks in per_rank]
        for rank, got in enumerate(results):
            sync = assert_view_matches_oracle(session, example, rank, got["sync"])
            if sync is None:
                continue
            assert_views_equal(got["async_wait"], sync, rank=rank, what="async + event.current_stream_wait()")
            assert_view_matches_oracle(session, example, rank, got["previous_event"],
                                       after="a compute that wrote x, waited through previous_event")
            combine = got.get("combine")
            if isinstance(combine, Unsupported):
                session.record_unsupported(combine, example)
            elif "combine_sync" in got:
                call = f"{backend} combine(recv_x, handle, topk_weights, async) waited by `with event:` on rank {rank}"
                for index, name in enumerate(("combined_x", "combined_topk_weights")):
                    assert_tensor_bytes_equal(got["combine_with"][index], got["combine_sync"][index], name=name,
                                              rank=rank, call=call, against="the synchronous combine")
        if "refusal" in results[0]:
            expected_type, expected_message = recorded_errors()[REFUSAL]
            assert_raised_everywhere(
                [got["refusal"] for got in results], expected_type=expected_type, expected_message=expected_message,
                call=f"{backend} ElasticBuffer.dispatch(..., previous_event=capture(), allocate_on_comm_stream=False)",
            )
            for rank, got in enumerate(results):
                assert_view_matches_oracle(session, example, rank, got["after_refusal"],
                                           after="the refused previous_event dispatch")
