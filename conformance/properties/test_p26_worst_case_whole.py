"""P26 worst-case outputs read whole: a V2 dispatch without a CPU sync (``do_cpu_sync=False``, the CUDA-graph path)
returns tensors sized for the worst case; a client that reads them whole (a MoE GEMM over every row) reads its
valid rows as the oracle's and, past them, in ``recv_topk_idx``, -1 (no expert).

For each variant (``rows``: ``num_ranks x num_max_tokens_per_rank`` rows; ``expand`` and ``expand_zero_padding``:
the worst expanded rows), every output is copied whole (reading it must not fault), after the caching allocator was
filled with 0x7F bytes on a GPU (the emulation hands out such bytes where the library leaves memory unwritten).
Asserted: in every variant the valid count ``psum_num_recv_tokens_per_scaleup_rank[-1]`` is the tokens received and
the valid rows hold exactly the oracle's receipts (sources, local experts, bytes, weights; in expand mode P20's check
of a no-sync layout, folded back in the oracle's segments); with ``do_zero_padding`` every alignment gap is +0.0
(P20's check); and the rows of ``recv_topk_idx`` past the valid count are -1.  A graph-mode consumer reads those
rows as expert ids (a grouped GEMM or a permute over every row): V1's ``num_worst_tokens`` writes -1 there, DeepEP's
own fix (PR #739) fills -1, vLLM sanitises them.  On the real 2.1.0 and 2.5.0 they are uninitialised
(csrc/elastic/buffer.hpp:1064-1109, csrc/buffers/ep.hpp:664-702: ``torch::empty``): the known defect
``v2-recv-topk-idx-uninitialised-past-valid-rows`` of both versions (reported ``known-defect`` while the library has
it, with the workaround: mask by the valid count before using the rows).  Nothing is asserted of the other outputs'
rows past the valid ones or of the gaps without ``do_zero_padding``: the report says, per backend, variant, output and
region, what a reader got there (artifact ``what a reader gets``: the 0x7F bytes of uninitialised memory, zeros, -1,
or other bytes), the handle's ``recv_src_metadata`` included (its rows past the valid ones; without expand its columns
2..); mask them by the valid count (``psum_num_recv_tokens_per_scaleup_rank[-1]``) before computing on them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from conformance.assertions import (
    assert_no_expert_rows,
    assert_receipts_equal,
    assert_same_tokens,
    for_each_backend,
)
from conformance.canonical import receipts_from_view
from conformance.checks.dispatch_options import check_no_sync_layout, check_zero_padding
from conformance.core.example import Example, RankInputs, build_all_inputs
from conformance.core.views import DispatchView, v2_layout
from conformance.oracle import expected_aligned_counts, expected_receipts, expected_received_tokens
from conformance.oracle.counts import expected_padding_rows
from conformance.properties import CheckContext, Property, register
from conformance.strategies import examples, sized
from conformance.tasks.worst_case import worst_case_views
from conformance.versions import POISON_BYTE

#: The report's artifact: backend -> "variant output[region]" -> what was read there over the examples.
KEY = "what a reader gets"


def describe(region: torch.Tensor) -> str | None:
    """What a reader gets in ``region`` (``None``: an empty region)."""
    if region.numel() == 0:
        return None
    raw = region.contiguous().view(-1).view(torch.uint8)
    if bool((raw == POISON_BYTE).all()):
        return f"0x{POISON_BYTE:02X} bytes (uninitialised memory, as the allocator left it)"
    if bool((raw == 0).all()):
        return "zeros"
    if not region.is_floating_point() and bool((region == -1).all()):
        return "-1"
    return f"other bytes ({len(torch.unique(raw))} distinct byte values)"


def unwritten_rows(view: DispatchView, variant: str, example: Example, inputs: list[RankInputs], rank: int,
                   valid: int) -> dict[str, list[int] | range]:
    """The rows of ``view`` past its valid ones, by region: ``tail`` (after the valid rows, or after the oracle's
    aligned expert segments in expand mode) and, in expand mode without ``do_zero_padding``, the oracle's alignment
    ``gaps`` (with it, they are asserted zero instead)."""
    rows = view.x.shape[0]
    if variant == "rows":
        return {"tail": range(valid, rows)}
    out: dict[str, list[int] | range] = {"tail": range(sum(expected_aligned_counts(example, inputs, rank)), rows)}
    if variant == "expand":
        out["gaps"] = expected_padding_rows(example, inputs, rank)
    return out


def check(ctx: CheckContext, example: Example, per_rank: list[dict[str, Any]]) -> None:
    """Valid rows as the oracle's, zeroed gaps where asked for, -1 in ``recv_topk_idx`` past the valid rows (checked
    last, after what lies past them was recorded)."""
    __tracebackhide__ = True
    inputs = build_all_inputs(example)

    def one(rank: int, backend: str, variants: dict[str, DispatchView]) -> None:
        expected = expected_received_tokens(example, inputs, rank)
        receipts = expected_receipts(example, inputs, rank)
        for variant, view in variants.items():
            valid = int(v2_layout(view).psum_num_recv_tokens_per_scaleup_rank[-1])
            if valid != len(expected):
                raise AssertionError(f"psum_num_recv_tokens_per_scaleup_rank[-1] on rank {rank} is {valid}, "
                                     f"expected {len(expected)} (the tokens it receives) [{view.call}]")
            if variant == "rows":
                head = dataclasses.replace(view, x=view.x[:valid], topk_idx=view.topk_idx[:valid],
                                           topk_weights=view.topk_weights[:valid], src_rank=view.src_rank[:valid],
                                           src_token=view.src_token[:valid])
                assert_same_tokens(head, expected, rank=rank, against=f"the oracle (the first {valid} rows)")
                assert_receipts_equal(receipts_from_view(head), receipts, rank=rank,
                                      call=f"{view.call} (its first {valid} rows of {view.x.shape[0]})")
            else:
                check_no_sync_layout(view, example, inputs, rank, receipts)  # P20's: the valid expanded rows
                if variant == "expand_zero_padding":
                    check_zero_padding(view, example, inputs, rank)  # P20's: the gaps are +0.0
            for region, rows in unwritten_rows(view, variant, example, inputs, rank, valid).items():
                index = torch.as_tensor(list(rows), dtype=torch.int64)
                for name, t in (("recv_x", view.x), ("recv_topk_idx", view.topk_idx),
                                ("recv_topk_weights", view.topk_weights)):
                    if t.shape[0] == view.x.shape[0] and (what := describe(t[index])) is not None:
                        ctx.record_seen(KEY, backend, f"{variant} {name}[{region}]", what)
            # the handle's recv_src_metadata: its rows past the valid ones, and (not expand) its columns 2..
            meta = v2_layout(view).recv_src_metadata
            metadata_regions = {"recv_src_metadata[tail]": meta[valid:]}
            if variant == "rows":
                metadata_regions["recv_src_metadata[:valid, 2:]"] = meta[:valid, 2:]
            for region, t in metadata_regions.items():
                if (what := describe(t)) is not None:
                    ctx.record_seen(KEY, backend, f"{variant} {region}", what)
        rows = variants.get("rows")
        if rows is not None:  # the rows past the valid count are no expert
            valid = int(v2_layout(rows).psum_num_recv_tokens_per_scaleup_rank[-1])
            assert_no_expert_rows(rows.topk_idx, valid, name="recv_topk_idx", rank=rank, call=rows.call,
                                  why=f"past the valid count psum_num_recv_tokens_per_scaleup_rank[-1] = {valid} of a "
                                      f"do_cpu_sync=False dispatch")

    for_each_backend(ctx, example, per_rank, one)


PROPERTY = register(Property(
    id="P26-worst-case-whole",
    title="V2 do_cpu_sync=False outputs read whole: valid rows as the oracle's, zeroed gaps where asked, -1 in "
          "recv_topk_idx past the valid rows, and what lies past them reported",
    strategy=sized(examples), task=worst_case_views, check=check, apis=("v2",), needs=("worst_case",),
))
test_worst_case_whole = PROPERTY.test
