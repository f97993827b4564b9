"""P8 V2 expand layout: rows per (token, local expert) contiguous per expert with alignment padding between
experts, expand-mode prefix sums, slot pointers in ``recv_src_metadata[:, 2:]``, 1-D weights, and the
expanded rows fold back to the non-expand per-expert receipts (same bytes, same weights as the oracle)."""

from __future__ import annotations

from typing import Any

from conformance.assertions import assert_ints_equal, assert_receipts_equal, assert_same_tokens, for_each_backend
from conformance.canonical import Segments, fold_expanded, receipts_from_view, segments_of, slot_pointers, token_rows
from conformance.checks.expand import check_expand_shapes
from conformance.core.example import Example, RankInputs, build_all_inputs
from conformance.core.views import DispatchView, v2_layout
from conformance.oracle import (
    expected_aligned_counts,
    expected_psum_per_expert,
    expected_raw_counts,
    expected_receipts,
    expected_received_tokens,
    expected_recv_topk_idx,
)
from conformance.properties import CheckContext, Property, register
from conformance.strategies import sized
from conformance.strategies.layout import alignment_examples
from conformance.tasks.dispatch import expand_views


def check_slot_pointers(
    view: DispatchView, segments: Segments, oracle_idx: dict, num_topk: int, *, rank: int
) -> None:
    """Slot ``k`` of a received token points into its expert's live rows iff that expert is local; the rows of
    each expert are exactly ``[start, start + raw count)`` (contiguous, padding after)."""
    __tracebackhide__ = True
    pointers = slot_pointers(view)
    if pointers.shape[1] != num_topk:
        raise AssertionError(
            f"recv_src_metadata[rank {rank}] has {pointers.shape[1] + 2} columns, expected 2 + num_topk = "
            f"{2 + num_topk} [{view.call}]"
        )
    per_expert: dict[int, list[int]] = {e: [] for e in range(len(segments.aligned))}
    for token, row in sorted(token_rows(view).items()):
        for slot, expert in enumerate(oracle_idx[token]):
            pointer = int(pointers[row, slot])
            where = f"recv_src_metadata[rank {rank}, src {token}, 2 + slot {slot}]"
            if expert < 0:
                if pointer != -1:
                    raise AssertionError(f"{where} = {pointer}, expected -1 (the slot's expert is not on this rank "
                                         f"or the slot is masked) [{view.call}]")
                continue
            live = segments.live(expert)
            if pointer not in live:
                segment = range(segments.starts[expert], segments.starts[expert] + segments.aligned[expert])
                inside = "in its aligned segment but" if pointer in segment else "outside its segment and"
                raise AssertionError(
                    f"{where} = {pointer}, expected a row of local expert {expert}'s contiguous block "
                    f"[{live.start}, {live.stop}) ({inside} not among the first {segments.raw[expert]} rows: "
                    f"expert rows must be contiguous from the aligned start {segments.starts[expert]}) [{view.call}]"
                )
            per_expert[expert].append(pointer)
    for expert, rows in per_expert.items():
        live = segments.live(expert)
        if sorted(rows) != list(live):
            duplicated = sorted({r for r in rows if rows.count(r) > 1})
            raise AssertionError(
                f"rows of local expert {expert}[rank {rank}] = {sorted(rows)[:12]}..., expected exactly "
                f"[{live.start}, {live.stop}) (each once, contiguous)"
                + (f"; rows named by more than one slot: {duplicated[:5]}" if duplicated else "")
                + f" [{view.call}]"
            )


def check_expand_view(
    view: DispatchView, plain: DispatchView, example: Example, inputs: list[RankInputs], rank: int
) -> None:
    """Every P8 assertion on one V2 backend's expanded view (``plain`` = the same dispatch without expand)."""
    __tracebackhide__ = True
    call = view.call
    raw = expected_raw_counts(example, inputs, rank)
    assert_ints_equal(f"num_recv_tokens_per_expert_list[rank {rank}]", view.num_recv_tokens_per_expert,
                      expected_aligned_counts(example, inputs, rank), call=call,
                      why=f"raw counts {raw} rounded up to expert_alignment={example.expert_alignment}")
    layout = v2_layout(view)
    assert_ints_equal(f"num_unaligned_recv_tokens_per_expert[rank {rank}]",
                      layout.num_unaligned_recv_tokens_per_expert, raw, call=call, why="the oracle's raw counts")
    assert_ints_equal(f"psum_num_recv_tokens_per_expert[rank {rank}]", layout.psum_num_recv_tokens_per_expert,
                      expected_psum_per_expert(example, inputs, rank, do_expand=True), call=call,
                      why="expand mode: aligned sum of the experts before i plus expert i's raw count")
    segments = segments_of(view)
    check_expand_shapes(view, segments, rank=rank)
    tokens = expected_received_tokens(example, inputs, rank)
    assert_same_tokens(view, tokens, rank=rank)
    oracle_idx = {tok: expected_recv_topk_idx(example, inputs, rank, *tok) for tok in tokens}
    check_slot_pointers(view, segments, oracle_idx, example.num_topk, rank=rank)
    folded = fold_expanded(view)
    assert_receipts_equal(folded, expected_receipts(example, inputs, rank), rank=rank, call=call + " folded back")
    assert_receipts_equal(folded, receipts_from_view(plain), rank=rank, call=call + " folded back",
                          against=f"the same backend without do_expand ({plain.call})")


def check(ctx: CheckContext, example: Example, per_rank: list[dict[str, Any]]) -> None:
    """V2 ``do_expand=True``: counts and expand prefix sums, contiguous per-expert rows with alignment padding,
    slot pointers, 1-D weights, and a fold back equal to the oracle and to the non-expand dispatch.  V1 has no
    expand mode: with no V2 backend selected the property is not applicable (reported unsupported)."""
    __tracebackhide__ = True
    inputs = build_all_inputs(example)

    def expanded(rank: int, backend: str, views: tuple[DispatchView, DispatchView]) -> None:
        view, plain = views
        check_expand_view(view, plain, example, inputs, rank)

    for_each_backend(ctx, example, per_rank, expanded)


PROPERTY = register(Property(
    id="P8-expand-layout",
    title="V2 expand layout: contiguous per expert, alignment padding, prefix sums, folds back to non-expand",
    strategy=sized(alignment_examples), task=expand_views, check=check, apis=("v2",), needs=("expand",),
))
test_expand_layout = PROPERTY.test
