"""P22 ``previous_event_before_epilogue``: V2 ``dispatch`` and ``combine`` make the communication stream wait for
that event before their epilogue (``stream_control_before_epilogue``, csrc/elastic/buffer.hpp:551-553, called at
buffer.hpp:1126 before the dispatch copy epilogue and at buffer.hpp:1315 before the combine reduce epilogue).

So, with a compute started on another stream right before the call and the event captured after it (nothing else
waits for it): once the call is complete (synchronous, or its own event waited on with ``async_with_compute_stream``)
that compute is complete too, so what it wrote is visible (dispatch); a combine's bias, read only by the reduce
epilogue, may be produced by that compute, and the result is the oracle's with the bias's final bytes; the
dispatch's rows are the oracle's.  Unlike ``previous_event`` it needs no ``allocate_on_comm_stream=True`` (every call
here passes ``False``).  Built-in backends: an ``EventOverlap`` instead of an ``EventHandle`` is refused by both calls
with the refusal table's exception (rows ``v2_dispatch_event_type`` / ``v2_combine_event_type``) on every rank, and
the valid calls right after it are correct (the dispatch refusal comes before the synchronous run, the combine
refusal before the asynchronous one).  What the communication itself reads before the epilogue (``x``) is not
covered by this event (the emulation waits earlier, which is allowed: see DIVERGENCES.md).

On the real library: held on the real V2 (docs/real-runs/, run 11b).
"""

from __future__ import annotations

from typing import Any

from conformance.assertions import (
    assert_bytes_equal,
    assert_raised_everywhere,
    assert_reduction,
    assert_view_matches_oracle,
    per_backend,
)
from conformance.core.example import Example, build_all_inputs, build_biases, second_payload
from conformance.core.outcomes import NotChecked, Why
from conformance.oracle.reduction import ExpectedSum, expected_round_trip_sum
from conformance.properties import CheckContext, Property, register
from conformance.strategies import sized
from conformance.strategies.options import epilogue_examples
from conformance.tasks.options import EpilogueRun, epilogue_event_runs

ROWS = {"dispatch": "v2_dispatch_event_type", "combine": "v2_combine_event_type"}


def check_run(ctx: CheckContext, example: Example, rank: int, backend: str, mode: str, run: EpilogueRun,
              expected: ExpectedSum) -> None:
    """One sync / async run: the dispatch's rows, the compute its epilogue waited for, the combine with the bias the
    other compute wrote (``expected``: its exact sum)."""
    __tracebackhide__ = True
    event = "previous_event_before_epilogue=capture() after a compute on another stream"
    async_flag = ", async_with_compute_stream=True, waited" if mode == "async" else ""
    dispatch_call = f"{backend}: ElasticBuffer.dispatch(..., {event}{async_flag}) on rank {rank}"
    assert_view_matches_oracle(ctx, example, rank, run.dispatch, after=f"a dispatch with {event}")
    assert_bytes_equal(run.marker, second_payload(example, rank), name="the compute's output", rank=rank,
                       call=dispatch_call + " (read right after the call: its epilogue waited for the compute)",
                       against="what the compute wrote")
    assert_reduction(run.combined_x, expected, ranks_per_group=run.reduction_group, world_size=example.world_size,
                     two_level=ctx.shape.nodes > 1, name="combined_x", rank=rank,
                     call=f"{backend}: ElasticBuffer.combine(recv_x, handle, bias=<written by a compute on another "
                          f"stream>, {event}{async_flag}) on rank {rank} (identity experts)",
                     require_determined=example.payload == "integers")


def check(ctx: CheckContext, example: Example, per_rank: list[dict[str, Any]]) -> None:
    """Per V2 backend: the wrong-type refusals of the built-in backends on every rank, and both runs (made right
    after them: the buffer stayed usable) on every rank."""
    __tracebackhide__ = True
    inputs = build_all_inputs(example)
    for backend, results in per_backend(ctx, per_rank):
        if not isinstance(results[0], dict):  # NotChecked (a known limit, NotSupported): recorded, not checked
            for result in results:
                ctx.not_checked(result, example)
            continue
        if "dispatch_refused" in results[0]:
            refusals = ctx.contract(backend).refusals  # the table of the backend's DeepEP version
            for op, row_id in ROWS.items():
                row = refusals.row(row_id)
                assert_raised_everywhere(
                    [got[f"{op}_refused"] for got in results], expected_type=row["exception"],
                    message_pattern=refusals.message_pattern(row_id),
                    call=f"{backend}: ElasticBuffer.{op}(..., previous_event_before_epilogue=EventOverlap(capture())) "
                         f"[refusal {row_id}, {row['source']}]")
        else:
            ctx.not_checked(NotChecked.part(
                backend, Why.API, "the refusal of a wrong event type (built-in backends only)"))
        for rank, got in enumerate(results):
            expected = expected_round_trip_sum(example, inputs, rank, ctx.shape.ranks_per_node,
                                               biases=build_biases(example, rank, 1))
            for mode in ("sync", "async"):
                check_run(ctx, example, rank, backend, mode, got[mode], expected)


PROPERTY = register(Property(
    id="P22-epilogue-events",
    title="V2 previous_event_before_epilogue (dispatch and combine): the epilogue waits for the event's compute, no "
          "allocate_on_comm_stream needed; a wrong event type is the table's refusal",
    strategy=sized(epilogue_examples), task=epilogue_event_runs, check=check, apis=("v2",),
    needs=("epilogue_events", "events", "combine"), shapes="small",
))
test_epilogue_events = PROPERTY.test
