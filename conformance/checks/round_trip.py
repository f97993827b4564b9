"""A dispatch and combine round trip against the oracle (P6, P28, P29).

Shared by several properties: a property module imports the checks it shares from here, never another
property module (moved from ``conformance/properties/test_p06_round_trip.py``)."""

from __future__ import annotations

from typing import Any

from conformance.assertions import (
    assert_bytes_equal,
    assert_positive_zero_rows,
    assert_reduction,
    assert_same_values,
    assert_sum_or_special,
    for_each_backend,
)
from conformance.core.example import Example, build_all_inputs
from conformance.oracle.reduction import ExpectedSum, expected_round_trip_bf16, expected_round_trip_sum, reach_counts
from conformance.oracle.tree import tree_groups
from conformance.tasks.combine import CombineResult


def check(ctx: Any, example: Example, per_rank: list[dict[str, Any]]) -> None:
    """combined_x[t] = x[t] * (ranks t reached), computed by float32 accumulation and one bf16 rounding (``ctx``:
    the property's ``CheckContext``, of the layer above this one).

    Integer payloads: byte-exact against the oracle and across backends.  Random and special payloads on one
    node: exact too (n*x is exact in float32, so the one rounding is deterministic), except that NaN matches
    any NaN and -0.0 may come back as +0.0.  On several nodes (a bf16 partial per node, then a second rounding):
    byte for byte the backend's reduction tree wherever its float32 sums are exact (every element of integer and
    random payloads but subnormal ones), within the float32-accumulation bound elsewhere; special values: NaN
    matching NaN, +-Inf the same infinity.
    A token that reached no rank comes back as +0.0 bit for bit (recorded on the real library).  A known
    combine limit is reported unsupported for that backend while the others are still checked."""
    __tracebackhide__ = True
    inputs = build_all_inputs(example)
    sums: dict[int, ExpectedSum] = {}  # per rank, shared by the backends (the tree is cached in it)
    two_level = ctx.shape.nodes > 1

    def against_oracle(rank: int, backend: str, result: CombineResult) -> None:
        expected_bf16 = expected_round_trip_bf16(example, inputs, rank)
        got = result.combined_x
        if got.shape != expected_bf16.shape or got.dtype != expected_bf16.dtype:
            raise AssertionError(f"combined_x[rank {rank}] has shape {tuple(got.shape)} {got.dtype}, expected "
                                 f"{tuple(expected_bf16.shape)} bfloat16 [{result.call}]")
        unreached = [token for token, n in enumerate(reach_counts(example, inputs, rank)) if n == 0]
        assert_positive_zero_rows(got, unreached, name="combined_x", rank=rank, call=result.call)
        if not two_level:  # one rounding of an exact float32 sum: the bytes (up to NaN payloads and zero signs)
            if example.payload == "integers":
                assert_bytes_equal(got, expected_bf16, name="combined_x", rank=rank, call=result.call)
            else:
                assert_same_values(got, expected_bf16, name="combined_x", rank=rank, call=result.call)
            return
        if rank not in sums:
            sums[rank] = expected_round_trip_sum(example, inputs, rank, ctx.shape.ranks_per_node)
        expected = sums[rank]
        if example.payload == "special":
            groups = None if result.reduction_group is None else tree_groups(result.reduction_group, example.world_size)
            assert_sum_or_special(got, expected, expected_bf16, two_level=two_level, name="combined_x", rank=rank,
                                  call=result.call, groups=groups)
        else:
            assert_reduction(got, expected, ranks_per_group=result.reduction_group, world_size=example.world_size,
                             two_level=two_level, name="combined_x", rank=rank, call=result.call,
                             require_determined=example.payload == "integers")

    def pairwise(rank: int, first: tuple[str, CombineResult], other: tuple[str, CombineResult]) -> None:
        if example.payload == "integers" or not two_level:
            # One rounding of an exactly representable float32 value: every backend gives the same bytes (up to
            # NaN payloads and the sign of zero for special values).
            assert_same_values(other[1].combined_x, first[1].combined_x, name="combined_x", rank=rank,
                               call=other[1].call, against=first[0])

    for_each_backend(ctx, example, per_rank, against_oracle, pairwise)
