"""P3 ``recv_topk_idx``: per received token, the local expert index where the sender's expert is on this rank
and -1 in every other slot; equal across backends."""

from __future__ import annotations

from conformance.backends.views import DispatchView, Unsupported
from conformance.checks.assert_layout import assert_same_tokens, token_rows
from conformance.checks.registry import register
from conformance.example import Example, build_all_inputs
from conformance.oracle import expected_received_tokens, expected_recv_topk_idx


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


@register("P3-recv-topk-idx")
def check_recv_topk_idx(session, example: Example) -> None:  # noqa: ANN001 - conformance.session.Session
    """Every backend's ``recv_topk_idx`` rows against the oracle (local index or -1), and pairwise equal."""
    __tracebackhide__ = True
    inputs = build_all_inputs(example)
    for rank, views in enumerate(session.dispatch_views(example)):
        tokens = expected_received_tokens(example, inputs, rank)
        oracle = {
            (src_rank, src_token): expected_recv_topk_idx(example, inputs, rank, src_rank, src_token)
            for src_rank, src_token in tokens
        }
        seen: list[DispatchView] = []
        for view in views.values():
            if isinstance(view, Unsupported):
                session.record_unsupported(view, example)
                continue
            assert_same_tokens(view, tokens, rank=rank)
            assert_topk_rows(view, oracle, rank=rank, against="local index of the sender's expert on this rank, "
                             "-1 for experts elsewhere and masked slots")
            seen.append(view)
        for first, other in zip(seen, seen[1:], strict=False):
            first_rows = token_rows(first)
            assert_topk_rows(other, {tok: first.topk_idx[row].tolist() for tok, row in first_rows.items()},
                             rank=rank, against=first.backend)
