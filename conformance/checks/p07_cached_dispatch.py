"""P7 cached dispatch: ``dispatch(x, handle=handle)`` repeats the first dispatch's layout for any payload."""

from __future__ import annotations

import torch

from conformance.backends.views import Unsupported
from conformance.checks.assert_numeric import assert_bytes_equal
from conformance.checks.registry import register
from conformance.example import Example, build_all_inputs
from conformance.oracle.reduction import expected_rows_by_source
from conformance.tasks.combine import second_payload


def source_order(src_rank: torch.Tensor, src_token: torch.Tensor) -> torch.Tensor:
    """Row indices sorting by (source rank, source token)."""
    key = src_rank * (int(src_token.max()) + 1 if src_token.numel() else 1) + src_token
    return torch.sort(key, stable=True).indices


@register("P7-cached-dispatch")
def check_cached_dispatch(session, example: Example) -> None:  # noqa: ANN001 - conformance.session.Session
    """A cached dispatch of the same payload returns the first dispatch's bytes in the same row order; a cached
    dispatch of another payload x2 returns, row for row, x2's row of the same source (rank, token).  Both
    byte-exact (NaN payloads and -0.0 included) and, in source order, byte-identical across backends."""
    __tracebackhide__ = True
    inputs = build_all_inputs(example)
    second = [second_payload(example, rank) for rank in range(example.world_size)]
    results = session.run("conformance.tasks.combine:cached_dispatch", example)
    for rank, per_backend in enumerate(results):
        seen = []
        for backend, result in per_backend.items():
            if isinstance(result, Unsupported):
                session.record_unsupported(result, example)
                continue
            labels = ("row", "col")
            assert_bytes_equal(result.cached_same, result.recv_x, name="cached recv_x", rank=rank, call=result.call,
                               labels=labels, against="the first dispatch's recv_x")
            first_rows = expected_rows_by_source(result.src_rank, result.src_token, [r.x for r in inputs])
            assert_bytes_equal(result.recv_x, first_rows, name="recv_x", rank=rank, call=result.call, labels=labels,
                               against="x of the row's source (rank, token)")
            assert_bytes_equal(
                result.cached_other, expected_rows_by_source(result.src_rank, result.src_token, second),
                name="cached recv_x (second payload)", rank=rank, call=result.call, labels=labels,
                against="the second payload's row of the same source (rank, token)",
            )
            seen.append((backend, result))
        for (first, a), (_, b) in zip(seen, seen[1:], strict=False):
            order_a = source_order(a.src_rank, a.src_token)
            order_b = source_order(b.src_rank, b.src_token)
            sources_a = list(zip(a.src_rank[order_a].tolist(), a.src_token[order_a].tolist(), strict=True))
            sources_b = list(zip(b.src_rank[order_b].tolist(), b.src_token[order_b].tolist(), strict=True))
            if sources_a != sources_b:
                raise AssertionError(f"rank {rank} received tokens from sources {sources_b[:5]}... ({len(sources_b)}), "
                                     f"{first} from {sources_a[:5]}... ({len(sources_a)}) [{b.call}]")
            assert_bytes_equal(b.cached_other[order_b], a.cached_other[order_a], name="cached recv_x (source order)",
                               rank=rank, call=b.call, labels=("row", "col"), against=first)
