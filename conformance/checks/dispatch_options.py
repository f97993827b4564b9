"""The layouts of V2's dispatch options (P20, P26): zero padding, the layout of a dispatch without a CPU sync.

Shared by several properties: a property module imports the checks it shares from here, never another
property module (moved from ``conformance/properties/test_p20_dispatch_options.py``)."""

from __future__ import annotations

import dataclasses

from conformance.assertions import (
    assert_positive_zero_rows,
    assert_receipts_equal,
)
from conformance.canonical import fold_expanded
from conformance.core.example import Example, RankInputs
from conformance.core.views import DispatchView, v2_layout
from conformance.oracle import Receipts, expected_aligned_counts
from conformance.oracle.counts import expected_padding_rows, expected_worst_expanded_rows


def check_zero_padding(view: DispatchView, example: Example, inputs: list[RankInputs], rank: int) -> None:
    """The oracle's alignment padding rows of an expand-mode ``recv_x`` are +0.0, their weights 0."""
    __tracebackhide__ = True
    rows = expected_padding_rows(example, inputs, rank)
    why = "is alignment padding and must be +0.0 with do_zero_padding=True"
    assert_positive_zero_rows(view.x, rows, name="recv_x", rank=rank, call=view.call, label="row", why=why)
    assert_positive_zero_rows(view.topk_weights, rows, name="recv_topk_weights", rank=rank, call=view.call,
                              label="row", why=why)


def check_no_sync_layout(view: DispatchView, example: Example, inputs: list[RankInputs], rank: int,
                         receipts: Receipts) -> None:
    """``do_cpu_sync=False``: the worst-case row count, and the valid part (the first
    ``psum_num_recv_tokens_per_scaleup_rank[-1]`` tokens) folds back to the oracle's receipts in the oracle's
    segments (the counts list is empty without a sync)."""
    __tracebackhide__ = True
    worst = expected_worst_expanded_rows(example)
    if view.x.shape[0] != worst or view.topk_weights.shape[0] != worst:
        raise AssertionError(f"recv_x / recv_topk_weights on rank {rank} have {view.x.shape[0]} / "
                             f"{view.topk_weights.shape[0]} rows, expected {worst} (the worst-case expanded "
                             f"allocation, csrc/elastic/buffer.hpp:1067-1070) [{view.call}]")
    layout = v2_layout(view)
    n = int(layout.psum_num_recv_tokens_per_scaleup_rank[-1])
    valid = dataclasses.replace(
        view, src_rank=view.src_rank[:n], src_token=view.src_token[:n],
        num_recv_tokens_per_expert=expected_aligned_counts(example, inputs, rank),
        layout=dataclasses.replace(layout, recv_src_metadata=layout.recv_src_metadata[:n]))
    assert_receipts_equal(fold_expanded(valid), receipts, rank=rank,
                          call=view.call + f" (its first {n} tokens, folded back in the oracle's expert segments)")
