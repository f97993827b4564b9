"""Meta-tests of P11: QP cap, combine SM reuse, too many tokens, and the pinned-maximum preflight."""

import dataclasses

import pytest

from conformance.harness.hypothesis_glue import found
from conformance.strategies.calls import qp_cases
from tests.helpers.meta import FIND_SETTINGS, assert_caught, assert_holds, assert_reaches, sample

P11 = "P11-qp-cap"


def test_p11_catches_qp_over_asking_that_no_longer_raises(emulated_session) -> None:
    _, message = assert_caught(emulated_session, P11, "qp-cap-exceeded-silently", qp_cases(2), shrink=False)
    assert "returned normally" in message and "num_qps=num_allocated_qps +" in message


def test_p11_catches_too_many_tokens_accepted_and_truncated(emulated_session) -> None:
    _, message = assert_caught(emulated_session, P11, "too-many-tokens-truncated", qp_cases(2), shrink=False)
    assert "returned normally" in message and "num_max_tokens_per_rank=" in message


def test_p11_catches_combine_ignoring_the_handle_sm_count(emulated_session) -> None:
    case, message = assert_caught(emulated_session, P11, "combine-ignores-handle-num-sms", qp_cases(2), shrink=False)
    assert case.num_sms != 0
    assert "expected the dispatch handle's" in message


def test_p11_catches_a_refusal_that_corrupts_the_buffer(emulated_session) -> None:
    _, message = assert_caught(emulated_session, P11, "refusal-corrupts-buffer", qp_cases(2), shrink=False)
    assert "the call right after the refused" in message


def test_p11_catches_an_explicit_qp_count_ignored(emulated_session) -> None:
    case, message = assert_caught(emulated_session, P11, "explicit-qp-count-ignored", qp_cases(2))
    assert case.num_allocated_qps not in (129, 65)
    assert "num_allocated_qps =" in message and "the count asked for" in message


def test_p11_catches_an_explicit_num_bytes_ignored(emulated_session) -> None:
    case, message = assert_caught(emulated_session, P11, "explicit-num-bytes-ignored", qp_cases(2), shrink=False)
    assert case.extra_bytes > 0 and case.num_cpu_bytes == 0
    assert "num_bytes =" in message and "the size asked for" in message


def test_p11_catches_a_theoretical_sm_count_that_drops_an_argument(emulated_session) -> None:
    case, message = assert_caught(emulated_session, P11, "theoretical-sms-ignores-write-bandwidth", qp_cases(2),
                                  shrink=False)
    assert case.sm_write_gbs != 50
    assert "get_theoretical_num_sms(" in message and "bandwidth model" in message


def test_p11_holds_on_the_emulation_including_two_nodes(emulated_session, two_node_session) -> None:
    assert_holds(emulated_session, P11, sample(qp_cases(2), 6))
    assert_holds(two_node_session, P11, sample(qp_cases(4), 3))


def test_preflight_names_the_ranks_that_disagree(two_node_session) -> None:
    verdicts = two_node_session.world.run("tests.quality.test_p11_meta:_disagree", timeout=60)
    for verdict in verdicts:
        assert verdict == "ranks disagree on num_max_tokens_per_rank: 64 on rank(s) [0, 1, 3]; 128 on rank(s) [2] " \
                          "(every rank must pin the same value)"


def _disagree() -> str:
    """Rank task: rank 2 pins 128, the others 64."""
    from conformance.tasks.pinned_max import PinnedMaxMismatch, check_pinned_max
    from conformance.world.rank import context

    ctx = context()
    try:
        check_pinned_max(ctx.group, 128 if ctx.rank == 2 else 64, ctx.torch_device())
    except PinnedMaxMismatch as exc:
        return str(exc)
    return "no mismatch reported"


def test_p11_strategy_reaches_its_corners() -> None:
    strategy = qp_cases(2)
    assert_reaches(strategy, lambda c: c.num_sms not in (0, 22), 1000)  # differs from the automatic count
    assert_reaches(strategy, lambda c: c.offender == 1 and c.example.tokens_per_rank[1] == 0, 1000)
    assert_reaches(strategy, lambda c: c.over_qps >= 32, 1000)
    assert_reaches(strategy, lambda c: c.example.hidden == 128, 1000)  # combine limit on V2
    assert_reaches(strategy, lambda c: c.num_allocated_qps < 17, 1000)  # below even the direct automatic cap
    assert_reaches(strategy, lambda c: c.num_cpu_bytes > 0 and c.extra_bytes > 0, 1000)
    assert_reaches(strategy, lambda c: c.sm_write_gbs > 200 and c.nvlink_gbs < 100, 1000)


@pytest.mark.parametrize("nodes, ranks_per_node", [(1, 1), (1, 3), (2, 2)], ids=["1-rank", "3-ranks", "4-ranks"])
def test_p11_holds_at_any_world_size(nodes: int, ranks_per_node: int) -> None:
    """The preflight's expectation comes from the world (one rank has nobody to disagree with); the 2-rank
    world is covered above."""
    from conformance.core.spec import parse_backends
    from conformance.harness.config import RunConfig
    from conformance.harness.session import Session
    from conformance.world.launcher import WorldShape

    shape = WorldShape(nodes, ranks_per_node)
    session = Session(RunConfig(shape, tuple(parse_backends("emulated", False)), "cpu", 120.0))
    try:
        assert_holds(session, P11, sample(qp_cases(shape.size), 3))
    finally:
        session.close()


def test_p11_expects_no_mismatch_in_a_one_rank_world() -> None:
    from conformance.properties.test_p11_qp_cap import expected_preflight

    (one,) = sample(qp_cases(1), 1)
    assert expected_preflight(one) is None
    (three,) = sample(qp_cases(3), 1)
    assert sorted(r for ranks in expected_preflight(three).values() for r in ranks) == [0, 1, 2]


def test_p11_does_not_build_a_cpu_bytes_buffer_on_the_real_library_with_ranks_sharing_a_gpu(monkeypatch) -> None:
    """On DeepEP 2.1.0 with two ranks on one H200, ElasticBuffer(num_cpu_bytes > 0) never returned (docs/real-runs/
    2026-12-04-1xH200): there the explicit buffer is reported unsupported with that evidence (the set-up limit
    shared-gpu-v2-cpu-bytes), not built; the emulation, an isolated set-up and num_cpu_bytes=0 build it as before."""
    from types import SimpleNamespace

    from conformance.tasks import qp
    from conformance.tasks.setup import SetupLimited

    case = found(qp_cases(2), lambda c: c.num_cpu_bytes > 0, FIND_SETTINGS)

    def adapter(real: bool) -> SimpleNamespace:  # what the guard reads: the spec and the size hint (then: no env)
        return SimpleNamespace(spec=SimpleNamespace(real=real), class_name="ElasticBuffer",
                               size_hint=lambda example: 2 << 20)

    monkeypatch.setenv("CONFORMANCE_RANK_SETUP", "shared")
    with pytest.raises(SetupLimited, match="never returns") as refused:
        qp._qp_results(None, adapter(True), case)
    assert "2026-12-04-1xH200" in str(refused.value) and "--rank-setup isolated" in str(refused.value)
    assert refused.value.limit.id == "shared-gpu-v2-cpu-bytes" and "num_cpu_bytes > 0" in refused.value.condition
    for real, setup, cpu in ((False, "shared", case.num_cpu_bytes), (True, "isolated", case.num_cpu_bytes),
                             (True, "shared", 0)):
        monkeypatch.setenv("CONFORMANCE_RANK_SETUP", setup)
        with pytest.raises(AttributeError):  # past the guard: the (absent) env is used
            qp._qp_results(None, adapter(real), dataclasses.replace(case, num_cpu_bytes=cpu))
