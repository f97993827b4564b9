"""P20 V2 dispatch options: what ``do_handle_copy``, ``do_zero_padding`` and ``cumulative_local_expert_recv_stats``
of ``ElasticBuffer.dispatch`` promise (deep_ep/buffers/elastic.py, csrc/elastic/buffer.hpp, the dispatch kernels).

* ``do_handle_copy=True`` (the default): the handle keeps a copy of ``topk_idx`` (elastic.py:1005, buffer.hpp:957-960),
  so a caller that overwrites its ``topk_idx`` in place right after the dispatch changes nothing: a cached dispatch
  through the handle and a combine through it still equal the oracle.  ``do_handle_copy=False``: the handle holds
  the caller's tensor itself (no copy is made), and with that tensor left alone the dispatch and a combine through
  the handle equal the oracle too.
* ``do_zero_padding=True`` (expand mode only): the alignment padding rows of ``recv_x`` between the experts are
  +0.0 and their weights 0 (dispatch_copy_epilogue.cuh:231-322); the rows fold back to the oracle's receipts in P8's
  layout (P8 checks the rest of that layout).  Without a CPU sync (``do_cpu_sync=False``, capability ``worst_case``)
  the gaps are zeroed too, inside the
  worst-case allocation (buffer.hpp:1067-1070); the tail after the last expert is not promised.
* ``cumulative_local_expert_recv_stats``: every non-cached dispatch adds each local expert's unaligned receipts
  (dispatch.cuh:204-219), so after call ``i`` it holds the oracle's raw counts times ``i``.

On the real library: held on the real V2 (docs/real-runs/, run 11b); its recording replays exactly.  A backend that
refuses one of the ``do_handle_copy`` runs before calling (``NotSupported``: DeepEP 2.5.0 asserts ``do_handle_copy`` is
``False``, its handle keeps the caller's tensor) is checked on the rest, that run listed as not checked with the
reason.
"""

from __future__ import annotations

from typing import Any

import torch

from conformance.assertions import (
    assert_bytes_equal,
    assert_receipts_equal,
    assert_reduction,
    for_each_backend,
)
from conformance.canonical import fold_expanded, receipts_from_view, segments_of
from conformance.checks.dispatch_options import check_no_sync_layout, check_zero_padding
from conformance.checks.expand import check_expand_shapes
from conformance.core.example import Example, RankInputs, build_all_inputs, second_payload
from conformance.core.outcomes import NotChecked, Why
from conformance.core.views import v2_layout
from conformance.oracle import Receipts, expected_raw_counts, expected_receipts
from conformance.oracle.reduction import (
    ExpectedSum,
    expected_combined_weights,
    expected_round_trip_sum,
    expected_rows_by_source,
)
from conformance.properties import CheckContext, Property, register
from conformance.strategies import sized
from conformance.strategies.options import dispatch_option_examples
from conformance.tasks.options import HandleCopyRun, dispatch_option_runs

ROWS = ("row", "col")


def check_handle_run(ctx: CheckContext, example: Example, inputs: list[RankInputs], rank: int, backend: str,
                     run: HandleCopyRun, receipts: Receipts, expected: ExpectedSum, second: list[torch.Tensor]
                     ) -> None:
    """One ``do_handle_copy`` run: the dispatch (the oracle's ``receipts``), then the cached dispatch and the combine
    of ``second`` (every rank's second payload) and the combine through its handle (``expected``: the round trip's exact
    sum); and whether the handle holds the caller's ``topk_idx``."""
    __tracebackhide__ = True
    dispatch_call = run.view.call
    after = " (the caller overwrote its topk_idx with -1 right after the dispatch)" if run.caller_changed else ""
    assert_receipts_equal(receipts_from_view(run.view), receipts, rank=rank, call=dispatch_call)
    if run.cached is not None:
        assert_bytes_equal(run.cached, expected_rows_by_source(run.view.src_rank, run.view.src_token, second),
                           name="cached recv_x (second payload)", rank=rank,
                           call=f"{dispatch_call}, then a cached dispatch{after}", labels=ROWS,
                           against="the second payload's row of the same source (rank, token)")
    call = f"{dispatch_call}, then combine(recv_x, handle, recv_topk_weights) (identity experts){after}"
    assert_reduction(run.combined_x, expected, ranks_per_group=run.reduction_group, world_size=example.world_size,
                     two_level=ctx.shape.nodes > 1, name="combined_x", rank=rank, call=call,
                     require_determined=example.payload == "integers")
    if run.combined_topk_weights is not None:
        own = inputs[rank].topk_weights
        weights = expected_combined_weights(example, inputs, rank, lambda dst, t, k: float(own[t, k]))
        assert_bytes_equal(run.combined_topk_weights, weights, name="combined_topk_weights", rank=rank, call=call,
                           labels=("token", "slot"))
    aliased = v2_layout(run.view).handle_topk_idx_is_input
    if aliased is None:
        ctx.not_checked(NotChecked.part(
            backend, Why.CAPABILITY, "whether the handle keeps the caller's topk_idx (no handle_topk_idx_is_input)"))
    elif bool(aliased) == run.caller_changed:
        raise AssertionError(
            f"handle.topk_idx on rank {rank} {'is' if aliased else 'is not'} the caller's topk_idx tensor, expected "
            + ("a copy (do_handle_copy=True clones it, csrc/elastic/buffer.hpp:957-960)" if run.caller_changed else
               "the caller's own tensor (do_handle_copy=False makes no copy, deep_ep/buffers/elastic.py:1005)")
            + f" [{dispatch_call}]")


def check(ctx: CheckContext, example: Example, per_rank: list[dict[str, Any]]) -> None:
    """Per rank and V2 backend: both ``do_handle_copy`` runs, the zero-padded expand layouts, the statistics."""
    __tracebackhide__ = True
    inputs = build_all_inputs(example)
    second = [second_payload(example, r) for r in range(example.world_size)]

    def one(rank: int, backend: str, result: dict[str, Any]) -> None:
        receipts = expected_receipts(example, inputs, rank)
        round_trip = expected_round_trip_sum(example, inputs, rank, ctx.shape.ranks_per_node)  # its tree is cached
        made = []
        for key in ("copy", "no_copy"):
            if isinstance(result[key], str):  # the backend refused the run before calling (its reason)
                ctx.not_checked(NotChecked.part(
                    backend, Why.DECLINED, f"do_handle_copy={key == 'copy'}: {result[key]}"))
                continue
            check_handle_run(ctx, example, inputs, rank, backend, result[key], receipts, round_trip, second)
            made.append(result[key].view.call)
        view = result["zero_padding"]
        check_expand_shapes(view, segments_of(view), rank=rank)
        assert_receipts_equal(fold_expanded(view), receipts, rank=rank, call=view.call + " folded back")
        check_zero_padding(view, example, inputs, rank)
        if "zero_padding_no_sync" in result:
            check_no_sync_layout(result["zero_padding_no_sync"], example, inputs, rank, receipts)
            check_zero_padding(result["zero_padding_no_sync"], example, inputs, rank)
        else:
            ctx.not_checked(NotChecked.part(
                backend, Why.CAPABILITY, "do_zero_padding without a CPU sync (capability worst_case)"))
        calls = [*made, view.call]
        calls += [result["zero_padding_no_sync"].call] if "zero_padding_no_sync" in result else []
        raw = torch.tensor(expected_raw_counts(example, inputs, rank), dtype=torch.int64)
        for i, (got, call) in enumerate(zip(result["stats"], calls, strict=True)):
            if not torch.equal(got.to(torch.int64), raw * (i + 1)):
                raise AssertionError(
                    f"cumulative_local_expert_recv_stats on rank {rank} after call {i + 1} is {got.tolist()}, "
                    f"expected {(raw * (i + 1)).tolist()} (the oracle's unaligned receipts per local expert "
                    f"{raw.tolist()} added by each of {i + 1} dispatches) [{call}]")

    for_each_backend(ctx, example, per_rank, one)


PROPERTY = register(Property(
    id="P20-dispatch-options",
    title="V2 dispatch options: do_handle_copy keeps the handle independent of the caller's topk_idx (False: the "
          "caller's tensor), do_zero_padding zeroes the expand padding, cumulative_local_expert_recv_stats accumulates "
          "the oracle's counts",
    strategy=sized(dispatch_option_examples), task=dispatch_option_runs, check=check, apis=("v2",),
    needs=("dispatch_options", "expand", "cached_dispatch", "combine"), shapes="small",
))
test_dispatch_options = PROPERTY.test
