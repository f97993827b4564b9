"""P1 per-expert payloads: every rank's local experts receive exactly the oracle's (source, bytes, weight).

Special float bytes (NaN payloads, -0.0, +-Inf, subnormals) are drawn on purpose: payload bytes are moved, not
computed, so they must survive dispatch unchanged.
"""

from __future__ import annotations

from typing import Any

from conformance.assertions import assert_receipts_equal, for_each_backend
from conformance.canonical import receipts_from_view
from conformance.core.example import Example, build_all_inputs
from conformance.oracle import expected_receipts
from conformance.properties import CheckContext, Property, register
from conformance.strategies import examples, sized
from conformance.tasks.dispatch import dispatch_views


def check(ctx: CheckContext, example: Example, per_rank: list[dict[str, Any]]) -> None:
    """Byte-exact per-expert receipts against the oracle, for every backend, and pairwise across backends."""
    __tracebackhide__ = True
    inputs = build_all_inputs(example)
    oracle: dict[int, Any] = {}  # per rank: the same expectation for every backend

    def against_oracle(rank: int, backend: str, view: Any) -> Any:
        observed = receipts_from_view(view)
        if rank not in oracle:
            oracle[rank] = expected_receipts(example, inputs, rank)
        assert_receipts_equal(observed, oracle[rank], rank=rank, call=view.call)
        return view, observed

    def pairwise(rank: int, first: tuple[str, Any], other: tuple[str, Any]) -> None:
        (_, (first_view, first_rows)), (_, (view, rows)) = first, other
        assert_receipts_equal(rows, first_rows, rank=rank, call=view.call, against=first_view.backend)

    for_each_backend(ctx, example, per_rank, against_oracle, pairwise)


PROPERTY = register(Property(
    id="P1-per-expert-payloads",
    title="for every rank and local expert, the set of (source rank, source token, x bytes, weight) equals the "
          "oracle's, byte-exact, for every backend; pairwise equal across backends",
    strategy=sized(examples), task=dispatch_views, check=check,
))
test_per_expert_payloads = PROPERTY.test
