"""P1 per-expert payloads: every rank's local experts receive exactly the oracle's (source, bytes, weight)."""

from __future__ import annotations

from conformance.backends.views import Unsupported
from conformance.canonical import receipts_from_view
from conformance.checks.assertions import assert_receipts_equal
from conformance.checks.registry import register
from conformance.example import Example, build_all_inputs
from conformance.oracle import expected_receipts


@register("P1-per-expert-payloads")
def check_per_expert_payloads(session, example: Example) -> None:  # noqa: ANN001 - conformance.session.Session
    """Byte-exact per-expert receipts against the oracle, for every backend, and pairwise across backends."""
    __tracebackhide__ = True
    inputs = build_all_inputs(example)
    for rank, views in enumerate(session.dispatch_views(example)):
        expected = expected_receipts(example, inputs, rank)
        seen = []
        for view in views.values():
            if isinstance(view, Unsupported):
                session.record_unsupported(view, example)
                continue
            observed = receipts_from_view(view)
            assert_receipts_equal(observed, expected, rank=rank, call=view.call)
            seen.append((view, observed))
        for (first, first_rows), (other, other_rows) in zip(seen, seen[1:], strict=False):
            assert_receipts_equal(other_rows, first_rows, rank=rank, call=other.call, against=first.backend)
