"""P3 ``recv_topk_idx``: per received token, the local expert index where the sender's expert is on this rank
and -1 in every other slot; equal across backends."""

from __future__ import annotations

from typing import Any

from conformance.assertions import assert_same_tokens, for_each_backend
from conformance.canonical import token_rows
from conformance.core.example import Example, build_all_inputs
from conformance.core.views import DispatchView
from conformance.oracle import expected_received_tokens, expected_recv_topk_idx
from conformance.properties import CheckContext, Property, register
from conformance.strategies import sized
from conformance.strategies.layout import layout_examples
from conformance.tasks.dispatch import dispatch_views


def assert_topk_rows(view: DispatchView, expected: dict, *, rank: int, against: str) -> None:
    """Fail unless every received token's ``recv_topk_idx`` row equals ``expected[token]`` slot by slot."""
    __tracebackhide__ = True
    for token, row in sorted(token_rows(view).items()):
        got = view.topk_idx[row].tolist()
        want = expected[token]
        if got != want:
            where = ""
            if len(got) == len(want):
                slot = next(k for k, (g, e) in enumerate(zip(got, want, strict=True)) if g != e)
                where = f" (slot {slot}: got {got[slot]}, expected {want[slot]})"
            raise AssertionError(
                f"recv_topk_idx[rank {rank}, src {token}] = {got}, expected {want} ({against}){where} [{view.call}]"
            )


def check(ctx: CheckContext, example: Example, per_rank: list[dict[str, Any]]) -> None:
    """Every backend's ``recv_topk_idx`` rows against the oracle (local index or -1), and pairwise equal."""
    __tracebackhide__ = True
    inputs = build_all_inputs(example)

    def against_oracle(rank: int, backend: str, view: DispatchView) -> None:
        tokens = expected_received_tokens(example, inputs, rank)
        oracle = {token: expected_recv_topk_idx(example, inputs, rank, *token) for token in tokens}
        assert_same_tokens(view, tokens, rank=rank)
        assert_topk_rows(view, oracle, rank=rank, against="local index of the sender's expert on this rank, "
                         "-1 for experts elsewhere and masked slots")

    def pairwise(rank: int, first: tuple[str, DispatchView], other: tuple[str, DispatchView]) -> None:
        reference = first[1]
        rows = {tok: reference.topk_idx[row].tolist() for tok, row in token_rows(reference).items()}
        assert_topk_rows(other[1], rows, rank=rank, against=reference.backend)

    for_each_backend(ctx, example, per_rank, against_oracle, pairwise)


PROPERTY = register(Property(
    id="P3-recv-topk-idx",
    title="recv_topk_idx holds the local expert index or -1, equal across backends",
    strategy=sized(layout_examples), task=dispatch_views, check=check,
))
test_recv_topk_idx = PROPERTY.test
