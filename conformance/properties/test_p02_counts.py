"""P2 counts: per-expert counts with alignment rounding, V2 prefix sums, V1 layout outputs, against the oracle."""

from __future__ import annotations

import dataclasses
from typing import Any

from conformance.assertions import as_ints, assert_ints_equal, for_each_backend
from conformance.canonical import api_of
from conformance.core.example import Example, RankInputs, build_all_inputs
from conformance.core.outcomes import NotChecked, Why
from conformance.core.views import DispatchView, v1_layout, v2_layout
from conformance.oracle import (
    expected_aligned_counts,
    expected_layout,
    expected_psum_per_expert,
    expected_raw_counts,
    expected_tokens_per_source_rank,
)
from conformance.properties import CheckContext, Property, register
from conformance.strategies import sized
from conformance.strategies.layout import alignment_examples
from conformance.tasks.dispatch import dispatch_views


def check_v2_counts(view: DispatchView, example: Example, inputs: list[RankInputs], rank: int) -> None:
    """V2 fields: raw counts, inclusive prefix sum of the aligned counts, received-token totals."""
    __tracebackhide__ = True
    handle, call = v2_layout(view), view.call
    assert_ints_equal(
        f"num_unaligned_recv_tokens_per_expert[rank {rank}]", handle.num_unaligned_recv_tokens_per_expert,
        expected_raw_counts(example, inputs, rank), call=call, why="the oracle's raw counts",
    )
    assert_ints_equal(
        f"psum_num_recv_tokens_per_expert[rank {rank}]", handle.psum_num_recv_tokens_per_expert,
        expected_psum_per_expert(example, inputs, rank, do_expand=False), call=call,
        why=f"inclusive prefix sum of the counts rounded up to expert_alignment={example.expert_alignment}",
    )
    per_source = expected_tokens_per_source_rank(example, inputs, rank)
    total = sum(per_source)
    assert_ints_equal(f"handle.num_recv_tokens[rank {rank}]", [handle.num_recv_tokens], [total], call=call,
                      why="tokens received, each once")
    assert_ints_equal(f"recv_x.shape[0][rank {rank}]", [view.x.shape[0]], [total], call=call,
                      why="tokens received, each once")
    psum = as_ints(handle.psum_num_recv_tokens_per_scaleup_rank)
    groups = len(psum)
    if groups == 0 or example.world_size % groups:
        raise AssertionError(
            f"psum_num_recv_tokens_per_scaleup_rank[rank {rank}] has {groups} entries, expected a divisor of "
            f"the world size {example.world_size} (one per scale-up peer) [{call}]"
        )
    # A token from source rank s arrives through scale-up peer s % groups (groups = world size on one node).
    expected = [sum(per_source[s] for s in range(peer, example.world_size, groups)) for peer in range(groups)]
    assert_ints_equal(
        f"psum_num_recv_tokens_per_scaleup_rank[rank {rank}]", psum,
        [sum(expected[: i + 1]) for i in range(groups)], call=call,
        why=f"inclusive prefix sum over scale-up peers of the tokens received from source ranks {per_source}; "
        f"its last entry is the {total} tokens received",
    )


def check_v1_layout(view: DispatchView, example: Example, inputs: list[RankInputs], rank: int) -> None:
    """V1 ``get_dispatch_layout`` outputs of this rank's own ``topk_idx``."""
    __tracebackhide__ = True
    got, layout = v1_layout(view), expected_layout(example, inputs[rank])
    call = f"Buffer.get_dispatch_layout(topk_idx, num_experts={example.num_experts}) on rank {rank}"
    for name in ("num_tokens_per_rank", "num_tokens_per_expert"):
        assert_ints_equal(f"{name}[rank {rank}]", getattr(got, name), layout[name], call=call)
    in_rank = got.is_token_in_rank
    expected_in_rank = layout["is_token_in_rank"]
    got_rows = [[bool(v) for v in row] for row in in_rank.tolist()]
    if got_rows != expected_in_rank:
        if len(got_rows) != len(expected_in_rank):
            raise AssertionError(f"is_token_in_rank[rank {rank}] has {len(got_rows)} rows, expected "
                                 f"{len(expected_in_rank)} (one per token) [{call}]")
        token = next(t for t, (g, e) in enumerate(zip(got_rows, expected_in_rank, strict=True)) if g != e)
        raise AssertionError(
            f"is_token_in_rank[rank {rank}, token {token}] = {got_rows[token]}, expected {expected_in_rank[token]} "
            f"(topk_idx row {inputs[rank].topk_idx[token].tolist()}, {example.experts_per_rank} experts per rank) "
            f"[{call}]"
        )


def check(ctx: CheckContext, example: Example, per_rank: list[dict[str, Any]]) -> None:
    """Per-expert counts = oracle counts rounded up to ``expert_alignment`` (every backend, pairwise equal);
    V2 raw counts, prefix sums per expert and per scale-up peer; V1 layout outputs."""
    __tracebackhide__ = True
    inputs = build_all_inputs(example)

    def against_oracle(rank: int, backend: str, view: DispatchView) -> None:
        applied = applied_example(view)
        if applied.expert_alignment != example.expert_alignment:
            ctx.not_checked(NotChecked.part(
                backend, Why.CAPABILITY, f"P2 counts at the examples' expert_alignment > 1: the backend does not "
                                         f"declare the capability 'expert_alignment'; its counts were checked at "
                                         f"the alignment it applies ({applied.expert_alignment})"))
        assert_ints_equal(
            f"num_recv_tokens_per_expert_list[rank {rank}]", view.num_recv_tokens_per_expert,
            expected_aligned_counts(applied, inputs, rank), call=view.call,
            why=f"raw counts {expected_raw_counts(applied, inputs, rank)} rounded up to "
            f"expert_alignment={applied.expert_alignment}",
        )
        if view.layout is None:  # a plug-in that does not expose its layout (capability 'layout')
            ctx.not_checked(NotChecked.part(
                backend, Why.CAPABILITY, "P2 layout outputs (V1 get_dispatch_layout / V2 handle prefix sums): "
                                         "the backend does not declare the capability 'layout'"))
        elif api_of(view) == "v2":
            check_v2_counts(view, applied, inputs, rank)
        else:
            check_v1_layout(view, applied, inputs, rank)

    def applied_example(view: DispatchView) -> Example:
        if view.expert_alignment is None or view.expert_alignment == example.expert_alignment:
            return example
        return dataclasses.replace(example, expert_alignment=view.expert_alignment)

    def pairwise(rank: int, first: tuple[str, DispatchView], other: tuple[str, DispatchView]) -> None:
        if applied_example(first[1]) != applied_example(other[1]):
            return  # counts at different alignments (a backend without expert_alignment): each checked above
        assert_ints_equal(f"num_recv_tokens_per_expert_list[rank {rank}]", other[1].num_recv_tokens_per_expert,
                          first[1].num_recv_tokens_per_expert, call=other[1].call, why=first[0])

    for_each_backend(ctx, example, per_rank, against_oracle, pairwise)


PROPERTY = register(Property(
    id="P2-counts",
    title="per-expert counts, alignment rounding, V2 prefix sums consistent with the counts, V1 layout",
    strategy=sized(alignment_examples), task=dispatch_views, check=check,
))
test_counts = PROPERTY.test
