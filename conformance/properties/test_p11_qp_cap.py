"""P11 QP cap: the automatic cap, the theoretical QP count under it, over-asking refused before any
communication, combine reusing the dispatch's SM count, and the pinned ``num_max_tokens_per_rank``."""

from __future__ import annotations

from typing import Any

from conformance.assertions import assert_bytes_equal, assert_refused_then_usable, per_backend
from conformance.core.cases import QpCase
from conformance.oracle.recorded import recorded_errors
from conformance.properties import CheckContext, Property, register
from conformance.strategies import sized
from conformance.strategies.calls import qp_cases
from conformance.tasks.qp import qp_results

#: The automatic caps (``num_allocated_qps=0``): 129 in hybrid mode (recorded on DeepEP 2.1.0, H200;
#: 65 where fast RDMA atomics exist), 17 with ``allow_hybrid_mode=False`` (deep_ep/buffers/elastic.py).
AUTO_QPS_HYBRID = 129
AUTO_QPS_HYBRID_FAST_ATOMICS = 65
AUTO_QPS_DIRECT = 17
OVER_QPS = "v2_too_many_qps"


def expected_preflight(case: QpCase) -> dict[int, list[int]] | None:
    """What the preflight must report when ``case.offender`` pins one more than every other rank: the value ->
    ranks map of the disagreement, or ``None`` in a world of one rank (nobody to disagree with)."""
    pinned = case.example.num_max_tokens_per_rank
    others = [r for r in range(case.world_size) if r != case.offender]
    return {pinned: others, pinned + 1: [case.offender]} if others else None


def _check_caps(got: dict, backend: str, rank: int) -> None:
    __tracebackhide__ = True
    for mode, allowed in (("hybrid", (AUTO_QPS_HYBRID, AUTO_QPS_HYBRID_FAST_ATOMICS)), ("direct", (AUTO_QPS_DIRECT,))):
        cap = got[mode]["num_allocated_qps"]
        call = f"{backend} ElasticBuffer(num_allocated_qps=0, allow_hybrid_mode={mode == 'hybrid'}) on rank {rank}"
        if cap not in allowed:
            raise AssertionError(f"num_allocated_qps = {cap}, expected the automatic cap {allowed[0]} [{call}]")
        for num_sms, qps in got[mode]["theoretical"].items():
            if not 1 <= qps <= cap:
                raise AssertionError(
                    f"get_theoretical_num_qps(num_sms={num_sms}) = {qps}, expected within 1..{cap} "
                    f"(num_allocated_qps) [{call}]"
                )


def check(ctx: CheckContext, case: QpCase, per_rank: list[dict[str, Any]]) -> None:
    """Automatic caps (129 hybrid / 17 direct) bound every theoretical QP count (even SM counts 2..132);
    over-asking QPs raises 'Allocated QPs are not enough' on every rank before any collective and the next
    dispatch is correct; combine with ``num_sms=0`` uses the handle's SM count (same bytes as passing it);
    too many tokens are refused on every rank and the next dispatch is correct; the preflight names the
    ranks that disagree on ``num_max_tokens_per_rank``."""
    __tracebackhide__ = True
    example = case.example
    for backend, results in per_backend(ctx, per_rank):
        for rank, got in enumerate(results):
            _check_caps(got, backend, rank)
            verdict = got["preflight_disagree"]
            expected_holders = expected_preflight(case)
            if (verdict and verdict[1]) != expected_holders:
                expected = f"a mismatch naming {expected_holders}" if expected_holders else (
                    "no mismatch (a world of one rank cannot disagree with itself)")
                raise AssertionError(
                    f"preflight on rank {rank} reported {verdict!r}, expected {expected} "
                    f"[conformance.tasks.pinned_max.check_pinned_max(num_max_tokens_per_rank) with rank "
                    f"{case.offender} holding {example.num_max_tokens_per_rank + 1}]"
                )

        over_type, over_message = recorded_errors()[OVER_QPS]
        call = f"{backend} ElasticBuffer.dispatch(..., num_qps=num_allocated_qps + {case.over_qps})"
        assert_refused_then_usable(ctx, example, results, refused="over_qps", after="after_over_qps", call=call,
                                   what="the refused num_qps", expected_type=over_type, expected_message=over_message)
        for rank, got in enumerate(results):
            if got["over_qps_collectives"]:
                raise AssertionError(f"rank {rank} ran collectives {got['over_qps_collectives']} before refusing "
                                     f"[{call}]")

        for rank, got in enumerate(results):
            call = (f"{backend} ElasticBuffer.combine(x, handle, num_sms=0) after dispatch(num_sms={case.num_sms}) "
                    f"on rank {rank}")
            if "combine_error" in got:
                if example.hidden != 128:  # the one known V2 combine limit (conformance.backends.limits)
                    raise AssertionError(f"combine raised {got['combine_error']} [{call}]")
                continue
            if case.num_sms and got["handle_num_sms"] != case.num_sms:
                raise AssertionError(f"handle.num_sms = {got['handle_num_sms']}, expected {case.num_sms} [{call}]")
            launch = got["combine_launch"]
            if launch is not None and launch.get("num_sms") != got["handle_num_sms"]:
                raise AssertionError(
                    f"combine launched with num_sms={launch.get('num_sms')}, expected the dispatch handle's "
                    f"{got['handle_num_sms']} [{call}]"
                )
            for index, name in enumerate(("combined_x", "combined_topk_weights")):
                assert_bytes_equal(got["combine_reused"][index], got["combine_explicit"][index], name=name,
                                   rank=rank, call=call, against=f"combine(num_sms={got['handle_num_sms']})")
            if launch is None:
                ctx.record_divergence(
                    f"{backend}:combine-num-sms-unobservable",
                    "the SM count of combine is not observable on this backend (no `last_launch`); only the bytes "
                    "of num_sms=0 vs the handle's count were compared",
                )

        call = (f"{backend} ElasticBuffer.dispatch(x[{example.num_max_tokens_per_rank + case.over_tokens} rows on rank "
                f"{case.offender}], num_max_tokens_per_rank={example.num_max_tokens_per_rank})")
        assert_refused_then_usable(ctx, example, results, refused="too_many_tokens", after="after_too_many_tokens",
                                   call=call, what="the refused too-many-tokens dispatch")


PROPERTY = register(Property(
    id="P11-qp-cap",
    title="automatic QP cap, theoretical QPs within it, over-asking fails before communicating, combine num_sms=0 "
          "reuses the handle, pinned num_max_tokens_per_rank (a preflight reports disagreeing ranks)",
    strategy=sized(qp_cases), task=qp_results, check=check, case_type=QpCase, apis=("v2",),
    needs=("qp_cap",),
))
test_qp_cap = PROPERTY.test
