"""P11 QP cap: the automatic cap and an explicit one (``num_allocated_qps``, with an explicit ``num_bytes`` /
``num_cpu_bytes``), the theoretical QP and SM counts (the library's formulas, deep_ep/buffers/elastic.py:729-853,
for drawn bandwidths), over-asking refused before any communication, combine reusing the dispatch's SM count, and
the pinned ``num_max_tokens_per_rank``.  On the real library with ranks sharing one GPU (``--rank-setup shared``)
an example's explicit buffer with ``num_cpu_bytes > 0`` is reported unsupported instead of built: its constructor
never returned there (set-up limit ``shared-gpu-v2-cpu-bytes`` of ``conformance/core/setup_limits.py``, with its
evidence: docs/real-runs/2026-12-04-1xH200, runs 16 and 18)."""

from __future__ import annotations

from typing import Any

from conformance.assertions import assert_bytes_equal, assert_refused_then_usable, assert_value_equal, per_backend
from conformance.core.cases import QpCase
from conformance.core.outcomes import NotChecked
from conformance.oracle.recorded import expected_refusal
from conformance.oracle.schedule import CPU_DEVICE_SMS, expected_num_qps, expected_num_sms
from conformance.properties import CheckContext, Property, register
from conformance.strategies import sized
from conformance.strategies.calls import BANDWIDTHS, qp_cases
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


def _check_schedule(caps: dict[str, Any], case: QpCase, shape: Any, device_sms: int, call: str,
                    rules: Any = None) -> None:
    """One buffer's theoretical QP counts (every even SM count) and SM count (the case's experts and bandwidths)
    against the oracle of the library's formulas, for its cap and its ``allow_hybrid_mode`` (``rules``: the SM
    model's constants of the backend's DeepEP version, its contract's rules)."""
    __tracebackhide__ = True
    hybrid, cap = caps["allow_hybrid_mode"], caps["num_allocated_qps"]
    for num_sms, qps in caps["theoretical"].items():
        expected = expected_num_qps(num_sms, allow_hybrid_mode=hybrid, num_allocated_qps=cap)
        assert_value_equal(f"get_theoretical_num_qps(num_sms={num_sms})", qps, expected, call=call,
                           why=f"{'16 per SM + 1' if hybrid else 'at most 9'}, capped by num_allocated_qps={cap}")
    example, bandwidths = case.example, {name: getattr(case, name) for name in BANDWIDTHS}
    rules = rules or {}
    expected = expected_num_sms(example.num_experts, example.num_topk, num_nodes=shape.nodes,
                                ranks_per_node=shape.ranks_per_node, allow_hybrid_mode=hybrid,
                                prefer_overlap_with_compute=True, device_sms=device_sms,
                                margin=rules.get("sm_margin", 1.25), multiple=int(rules.get("sm_align", 2)),
                                combine_terms=bool(rules.get("sm_combine_terms", False)),
                                cap_even=bool(rules.get("sm_cap_even", False)), **bandwidths)
    given = ", ".join(f"{name}={value:g}" for name, value in bandwidths.items())
    assert_value_equal(f"get_theoretical_num_sms({example.num_experts}, {example.num_topk}, {given})",
                       caps["theoretical_sms"], expected, call=call,
                       why=f"the library's bandwidth model on {shape.nodes} node(s) of {shape.ranks_per_node} ranks, "
                           f"{device_sms} device SMs")


def _check_caps(got: dict, case: QpCase, shape: Any, backend: str, rank: int, rules: Any = None) -> None:
    """The automatic caps (hybrid and direct), the explicit buffer's cap and size, and every buffer's schedule."""
    __tracebackhide__ = True
    device_sms = got["device_sms"] or CPU_DEVICE_SMS
    for mode, allowed in (("hybrid", (AUTO_QPS_HYBRID, AUTO_QPS_HYBRID_FAST_ATOMICS)), ("direct", (AUTO_QPS_DIRECT,))):
        cap = got[mode]["num_allocated_qps"]
        call = f"{backend} ElasticBuffer(num_allocated_qps=0, allow_hybrid_mode={mode == 'hybrid'}) on rank {rank}"
        if cap not in allowed:
            raise AssertionError(f"num_allocated_qps = {cap}, expected the automatic cap {allowed[0]} [{call}]")
        _check_schedule(got[mode], case, shape, device_sms, call, rules)
    explicit = got["explicit"]
    call = (f"{backend} ElasticBuffer(num_bytes={got['explicit_num_bytes']}, num_cpu_bytes={case.num_cpu_bytes}, "
            f"num_allocated_qps={case.num_allocated_qps}) on rank {rank}")
    assert_value_equal("num_allocated_qps", explicit["num_allocated_qps"], case.num_allocated_qps, call=call,
                       why="the count asked for")
    assert_value_equal("num_bytes", explicit["num_bytes"], got["explicit_num_bytes"], call=call,
                       why="the size asked for")
    _check_schedule(explicit, case, shape, device_sms, call, rules)


def check(ctx: CheckContext, case: QpCase, per_rank: list[dict[str, Any]]) -> None:
    """Automatic caps (129 hybrid / 17 direct), an explicit ``num_allocated_qps`` and ``num_bytes`` (with
    ``num_cpu_bytes``) kept as asked; every theoretical QP count (even SM counts 2..132) and the theoretical SM
    count for drawn bandwidths equal the oracle of the library's formulas; over-asking the explicit cap raises
    'Allocated QPs are not enough' on every rank before any collective, and a dispatch / combine asking exactly
    the cap returns the oracle's rows / the automatic combine's bytes; combine with ``num_sms=0`` uses the
    handle's SM count (same bytes as passing it);
    too many tokens are refused on every rank and the next dispatch is correct; the preflight names the
    ranks that disagree on ``num_max_tokens_per_rank``."""
    __tracebackhide__ = True
    example = case.example
    for backend, results in per_backend(ctx, per_rank):
        if any(isinstance(got, NotChecked) for got in results):  # not built here (a set-up limit)
            ctx.not_checked(next(got for got in results if isinstance(got, NotChecked)), case)
            continue
        for rank, got in enumerate(results):
            _check_caps(got, case, ctx.shape, backend, rank, ctx.contract(backend).rules)
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

        over_type, over_message = expected_refusal(ctx.contract(backend), OVER_QPS, "v2_dispatch_qps")
        call = (f"{backend} ElasticBuffer.dispatch(..., num_qps=num_allocated_qps + {case.over_qps}) on "
                f"ElasticBuffer(num_allocated_qps={case.num_allocated_qps})")
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
            capped = (f"{backend} ElasticBuffer.combine(x, handle, num_qps={case.num_allocated_qps}) on "
                      f"ElasticBuffer(num_allocated_qps={case.num_allocated_qps}) on rank {rank}")
            for index, name in enumerate(("combined_x", "combined_topk_weights")):
                assert_bytes_equal(got["combine_reused"][index], got["combine_explicit"][index], name=name,
                                   rank=rank, call=call, against=f"combine(num_sms={got['handle_num_sms']})")
                assert_bytes_equal(got["combine_capped"][index], got["combine_reused"][index], name=name,
                                   rank=rank, call=capped, against="the combine on the automatic buffer")
            if launch is None:
                ctx.record_divergence(
                    f"{backend}:combine-num-sms-unobservable",
                    "the SM count of combine is not observable on this backend (no `last_launch`); only the bytes "
                    "of num_sms=0 vs the handle's count were compared",
                )

        where = "every rank (the real V2 refuses it on the offending rank only: known defect " \
                "v2-too-many-tokens-refused-on-one-rank)" if ctx_real(ctx, backend) else f"rank {case.offender}"
        call = (f"{backend} ElasticBuffer.dispatch(x[{example.num_max_tokens_per_rank + case.over_tokens} rows on "
                f"{where}], num_max_tokens_per_rank={example.num_max_tokens_per_rank})")
        assert_refused_then_usable(ctx, example, results, refused="too_many_tokens", after="after_too_many_tokens",
                                   call=call, what="the refused too-many-tokens dispatch")


def ctx_real(ctx: Any, backend: str) -> bool:
    """Whether ``backend`` runs on the real library (the check context's run configuration says)."""
    config = getattr(ctx, "config", None)
    return any(b.name == backend and b.real for b in getattr(config, "backends", ()))


PROPERTY = register(Property(
    id="P11-qp-cap",
    title="automatic and explicit QP cap (num_allocated_qps, num_bytes), theoretical QP / SM counts = the library's "
          "formulas, over-asking fails before communicating, combine num_sms=0 reuses the handle, pinned "
          "num_max_tokens_per_rank (a preflight reports disagreeing ranks)",
    strategy=sized(qp_cases), task=qp_results, check=check, case_type=QpCase, apis=("v2",),
    needs=("qp_cap",), shapes="small",
))
test_qp_cap = PROPERTY.test
