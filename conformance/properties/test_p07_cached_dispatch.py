"""P7 cached dispatch: ``dispatch(x, handle=handle)`` repeats the first dispatch's layout for any payload."""

from __future__ import annotations

from typing import Any

from conformance.assertions import assert_bytes_equal, for_each_backend
from conformance.canonical import source_order
from conformance.core.example import Example, build_all_inputs, second_payload
from conformance.oracle.reduction import expected_rows_by_source
from conformance.properties import CheckContext, Property, register
from conformance.strategies import sized
from conformance.strategies.combine import cached_dispatch_examples
from conformance.tasks.combine import CachedResult, cached_dispatch

ROWS = ("row", "col")


def check(ctx: CheckContext, example: Example, per_rank: list[dict[str, Any]]) -> None:
    """A cached dispatch of the same payload returns the first dispatch's bytes in the same row order; a cached
    dispatch of another payload x2 returns, row for row, x2's row of the same source (rank, token).  Both
    byte-exact (NaN payloads and -0.0 included) and, in source order, byte-identical across backends."""
    __tracebackhide__ = True
    inputs = build_all_inputs(example)
    second = [second_payload(example, rank) for rank in range(example.world_size)]

    def against_oracle(rank: int, backend: str, result: CachedResult) -> None:
        assert_bytes_equal(result.cached_same, result.recv_x, name="cached recv_x", rank=rank, call=result.call,
                           labels=ROWS, against="the first dispatch's recv_x")
        first_rows = expected_rows_by_source(result.src_rank, result.src_token, [r.x for r in inputs])
        assert_bytes_equal(result.recv_x, first_rows, name="recv_x", rank=rank, call=result.call, labels=ROWS,
                           against="x of the row's source (rank, token)")
        assert_bytes_equal(result.cached_other, expected_rows_by_source(result.src_rank, result.src_token, second),
                           name="cached recv_x (second payload)", rank=rank, call=result.call, labels=ROWS,
                           against="the second payload's row of the same source (rank, token)")

    def pairwise(rank: int, first: tuple[str, CachedResult], other: tuple[str, CachedResult]) -> None:
        (name, a), (_, b) = first, other
        order_a, order_b = source_order(a.src_rank, a.src_token), source_order(b.src_rank, b.src_token)
        sources_a = list(zip(a.src_rank[order_a].tolist(), a.src_token[order_a].tolist(), strict=True))
        sources_b = list(zip(b.src_rank[order_b].tolist(), b.src_token[order_b].tolist(), strict=True))
        if sources_a != sources_b:
            raise AssertionError(f"rank {rank} received tokens from sources {sources_b[:5]}... ({len(sources_b)}), "
                                 f"{name} from {sources_a[:5]}... ({len(sources_a)}) [{b.call}]")
        assert_bytes_equal(b.cached_other[order_b], a.cached_other[order_a], name="cached recv_x (source order)",
                           rank=rank, call=b.call, labels=ROWS, against=name)

    for_each_backend(ctx, example, per_rank, against_oracle, pairwise)


PROPERTY = register(Property(
    id="P7-cached-dispatch",
    title="cached dispatch equals the first dispatch",
    strategy=sized(cached_dispatch_examples), task=cached_dispatch, check=check, needs=("cached_dispatch",),
))
test_cached_dispatch = PROPERTY.test
