"""P6 round trip: combine(dispatch(x)) with identity experts = x times the number of ranks the token reached."""

from __future__ import annotations

from conformance.backends.views import Unsupported
from conformance.checks.assert_numeric import (
    assert_bytes_equal,
    assert_positive_zero_rows,
    assert_same_values,
    assert_sum_or_special,
)
from conformance.checks.registry import register
from conformance.example import Example, build_all_inputs
from conformance.oracle.reduction import expected_round_trip_bf16, expected_round_trip_sum, reach_counts


@register("P6-round-trip")
def check_round_trip(session, example: Example) -> None:  # noqa: ANN001 - conformance.session.Session
    """combined_x[t] = x[t] * (ranks t reached), computed by float32 accumulation and one bf16 rounding.

    Integer payloads: byte-exact against the oracle and across backends.  Random and special payloads on one
    node: exact too (n*x is exact in float32, so the one rounding is deterministic), except that NaN matches
    any NaN and -0.0 may come back as +0.0.  On several nodes (a bf16 partial per node, then a second rounding):
    within the float32-accumulation bound of the exact product, NaN matching NaN, +-Inf the same infinity.
    A token that reached no rank comes back as +0.0 bit for bit (recorded on the real library).  A known
    combine limit is reported unsupported for that backend while the others are still checked."""
    __tracebackhide__ = True
    inputs = build_all_inputs(example)
    shape = session.config.shape
    two_level = shape.nodes > 1
    results = session.run("conformance.tasks.combine:round_trip", example)
    for rank, per_backend in enumerate(results):
        expected_bf16 = expected_round_trip_bf16(example, inputs, rank)
        expected = expected_round_trip_sum(example, inputs, rank, shape.ranks_per_node)
        unreached = [token for token, n in enumerate(reach_counts(example, inputs, rank)) if n == 0]
        seen = []
        for backend, result in per_backend.items():
            if isinstance(result, Unsupported):
                session.record_unsupported(result, example)
                continue
            got = result.combined_x
            if got.shape != expected_bf16.shape or got.dtype != expected_bf16.dtype:
                raise AssertionError(
                    f"combined_x[rank {rank}] has shape {tuple(got.shape)} {got.dtype}, expected "
                    f"{tuple(expected_bf16.shape)} bfloat16 [{result.call}]"
                )
            assert_positive_zero_rows(got, unreached, name="combined_x", rank=rank, call=result.call)
            if example.payload == "integers":
                assert_bytes_equal(got, expected_bf16, name="combined_x", rank=rank, call=result.call)
            elif not two_level:
                assert_same_values(got, expected_bf16, name="combined_x", rank=rank, call=result.call)
            else:
                assert_sum_or_special(
                    got, expected, expected_bf16, two_level=two_level, name="combined_x", rank=rank, call=result.call
                )
            seen.append((backend, result))
        for (first, first_result), (_, other) in zip(seen, seen[1:], strict=False):
            if example.payload == "integers" or not two_level:
                # One rounding of an exactly representable float32 value: every backend gives the same bytes
                # (up to NaN payloads and the sign of zero for special values).
                assert_same_values(other.combined_x, first_result.combined_x, name="combined_x", rank=rank,
                                   call=other.call, against=first)
