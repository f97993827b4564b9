"""Fidelity of the emulation against the real DeepEP recordings, per version.

Every recording is replayed against the emulation of the DeepEP version it recorded (``tests.helpers.replay``: its
``meta['deep_ep']`` picks the module, ``--deep-ep emulation:VERSION``'s): by default the 2.1.0 reference recordings
(``fixtures/deepep-real``: the old cases and errors, 2 x H200; ``fixtures/deepep-real-2026-12-05``: the sections of
``fixtures/record.py``) and the real 2.5.0's (``fixtures/deepep-real-2.5.0-2026-12-06``: the old cases and errors on
``EPBuffer``, one H100, compacted by ``fixtures/compact.py``).  Every recorded case is replayed on a 2-rank gloo world
(CPU) and every recorded field is compared byte for byte (a field kept as its digest: by hashing the emulation's
tensor); the recorded errors are re-triggered; a Megatron-style integrator (``fused_a2a.py``) runs unchanged against
``import conformance.emulation as deep_ep``.

Every section ``fixtures/record.py`` records beyond the old format (FP8, worst-case, V2 options, low-latency, bad
calls) has a test of its own per recorded version: where the version's recording holds it, it is replayed against the
emulation; where it does not, the test is SKIPPED with that reason and checks nothing.  The sections that build a V1
``Buffer`` first (:data:`V1_SECTIONS`) have no test for a version without V1 (DeepEP 2.5.0 removed the legacy
``Buffer``: all such a recording could hold is that lookup's error).  The 2.5.0 recording's V2 sections are run 29's
(``docs/real-runs/README.md``).  Point ``DEEPEP_REAL_FIXTURES`` at another recording (``fixtures/deepep-real-<date>``)
to replay it alone.

The ranks are a :class:`conformance.world.World` (torchrun environment, gloo on CPU); all recordings share one world.
"""

from __future__ import annotations

import importlib
import traceback
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from conformance import versions
from conformance.world.launcher import World, WorldShape
from tests.helpers import replay

#: Its module-scoped fixtures are built once: under xdist (the self-tests run with -n) its tests share a worker.
pytestmark = pytest.mark.xdist_group("test_emulation_fidelity")

WORLD_SIZE = 2
TIMEOUT_S = 180
#: ``{label: (cases and errors folder, sections folder)}``: the label is the recorded DeepEP version (the folder's name
#: where two recordings share one).
_VERSIONS = [replay.recording_version(cases) for cases, _ in replay.fidelity_recordings()]
RECORDINGS = {(v if _VERSIONS.count(v) == 1 else Path(cases).name): (cases, sections)
              for v, (cases, sections) in zip(_VERSIONS, replay.fidelity_recordings(), strict=True)}
#: ``{label: the recorded DeepEP version}``.
VERSION_OF = {label: v for label, v in zip(RECORDINGS, _VERSIONS, strict=True)}
CASES = [(label, name) for label, (cases, _) in RECORDINGS.items() for name in replay.recorded_case_names(cases)]
JOBS = [(f"{label}/case:{name}", "tests.helpers.replay:replay_recorded_case", (name,),
         {"fixtures_dir": RECORDINGS[label][0]})
        for label, name in CASES]
#: The recordings with the old cases (and so the bad calls on the ``base`` case); a sections-only one has none.
ERRORS = [label for label, (cases, _) in RECORDINGS.items() if replay.recorded_case_names(cases)]
JOBS += [(f"{label}/errors", "tests.helpers.replay:replay_recorded_errors", (), {"fixtures_dir": RECORDINGS[label][0]})
         for label in ERRORS]
JOBS += [
    ("megatron", "tests.quality.test_emulation_fidelity:megatron_style_round_trip", (), {}),
    ("robustness", "tests.quality.test_emulation_fidelity:bad_input_on_one_rank", (), {}),
]
MULTI_NODE_JOBS = [("multinode", "tests.quality.test_emulation_fidelity:two_node_round_trip", (), {})]
#: The recorder's sections that build a V1 ``Buffer`` before any other call (``fixtures/record.py``: the FP8 V1
#: dispatch, the bad FP8 and low-latency calls, the low-latency mode).  On a DeepEP version without V1 (its contract
#: names no V1 class: 2.5.0) the recorder records nothing of them but ``AttributeError: module 'deep_ep' has no
#: attribute 'Buffer'``, so they are not replayed for its recording (checked by
#: ``test_the_v1_sections_are_not_replayed_for_a_version_without_v1``).
V1_SECTIONS = ("v1_fp8_dispatch", "errors_fp8_low_latency", "v1_low_latency")


def has_v1(version: str) -> bool:
    """Whether DeepEP ``version`` has the V1 API (its contract names a V1 class)."""
    return versions.contract(version).class_name("v1") is not None


SECTIONS = [(label, sid) for label in RECORDINGS for sid in replay.recorder_section_ids()
            if sid not in V1_SECTIONS or has_v1(VERSION_OF[label])]
#: Why a section is not replayed (no real recording of it, or one that holds an error); absent when it is.
SECTION_SKIPS = {(label, sid): reason for label, sid in SECTIONS
                 if (reason := replay.recorded_section_status(sid, RECORDINGS[label][1]))}
JOBS += [(f"{label}/section:{sid}", "tests.helpers.replay:replay_recorded_section", (sid,),
          {"fixtures_dir": RECORDINGS[label][1]}) for label, sid in SECTIONS if (label, sid) not in SECTION_SKIPS]


# ------------------------------------------------------------------------------------------ rank side
def run_jobs(jobs: list) -> dict:
    """Rank task: run every job, collecting mismatches (or the exception) and the fields checked."""
    results = {}
    for name, target, args, kwargs in jobs:
        module, func = target.split(":")
        checked: list[str] = []
        try:
            fn = getattr(importlib.import_module(module), func)
            if module.endswith("replay"):
                kwargs = {**kwargs, "checked": checked}
            results[name] = {"mismatches": fn(*args, **kwargs), "checked": checked}
        except Exception:  # noqa: BLE001 - reported to the controller
            results[name] = {"exception": traceback.format_exc(), "checked": checked}
    return results


def megatron_style_round_trip() -> dict:
    """Megatron ``fused_a2a``-style calls (V1 Buffer, ``deep_ep.utils.EventOverlap``); {} when correct."""
    import conformance.emulation as deep_ep
    from conformance.emulation.utils.event import EventHandle, EventOverlap

    group = dist.group.WORLD
    rank = group.rank()
    num_experts, hidden = 8, 64
    gen = torch.Generator().manual_seed(rank)
    x = torch.randint(-8, 8, (12, hidden), generator=gen).to(torch.bfloat16)
    token_indices = torch.stack([torch.randperm(num_experts, generator=gen)[:2] for _ in range(12)])
    token_probs = torch.rand(12, 2, generator=gen)
    problems = {}
    configs = (deep_ep.Buffer.get_dispatch_config(group.size()), deep_ep.Buffer.get_combine_config(group.size()))
    num_nvl_bytes = max(config.get_nvl_buffer_size_hint(hidden * 2, group.size()) for config in configs)
    for async_finish in (False, True):
        buffer = deep_ep.Buffer(group, num_nvl_bytes, 0)  # sized from the config hints, as Megatron's get_buffer does
        previous_event = EventOverlap(EventHandle()) if async_finish else None
        per_rank, per_rdma, per_expert, in_rank, event = buffer.get_dispatch_layout(
            token_indices,
            num_experts,
            previous_event=previous_event,
            async_finish=async_finish,
            allocate_on_comm_stream=False,
        )
        recv_x, recv_idx, recv_probs, counts, handle, after = buffer.dispatch(
            x,
            topk_idx=token_indices,
            topk_weights=token_probs,
            num_tokens_per_rank=per_rank,
            num_tokens_per_rdma_rank=per_rdma,
            is_token_in_rank=in_rank,
            num_tokens_per_expert=per_expert,
            previous_event=event,
            async_finish=async_finish,
            allocate_on_comm_stream=False,
        )
        if async_finish:
            after.current_stream_wait()
        tokens_per_expert = torch.tensor(counts)
        if int(tokens_per_expert.sum()) != int((recv_idx >= 0).sum()):
            problems[f"{async_finish}.counts"] = (
                "num_recv_tokens_per_expert_list disagrees with recv_topk_idx"
            )
        combined, _, after = buffer.combine(
            recv_x,
            handle=handle,
            async_finish=async_finish,
            previous_event=EventOverlap(EventHandle()) if async_finish else None,
            allocate_on_comm_stream=False,
        )
        if async_finish:
            after.current_stream_wait()
        reached = in_rank.sum(1, keepdim=True).to(torch.float32)
        if not torch.equal(combined.float(), x.float() * reached):
            problems[f"{async_finish}.combine"] = "combine(dispatch(x)) != x * number of ranks reached"
        grad_x, _, _, _, _, after = buffer.dispatch(
            combined.contiguous(), handle=handle, async_finish=async_finish
        )
        with after:
            pass
        if not torch.equal(grad_x, buffer.dispatch(combined, handle=handle)[0]):
            problems[f"{async_finish}.cached"] = "cached dispatch is not deterministic"
        grad, grad_probs, _ = buffer.combine(recv_x, handle, topk_weights=recv_probs.float())
        if not torch.equal(grad_probs, token_probs * (token_indices >= 0)):
            problems[f"{async_finish}.probs"] = "combined probabilities differ from the dispatched ones"
    deep_ep.Buffer.set_num_sms(20)
    return problems


def bad_input_on_one_rank() -> dict:
    """Too many tokens / out-of-range experts on rank 0 only: every rank raises, then a valid call works.  (V1 drops
    out-of-range expert ids silently, as the library does: no V1 case here.)"""
    import conformance.emulation as deep_ep

    group = dist.group.WORLD
    rank = group.rank()
    problems = {}
    v2 = deep_ep.ElasticBuffer(group, num_max_tokens_per_rank=16, hidden=256, num_topk=2)
    x = torch.ones(8, 256, dtype=torch.bfloat16)
    idx = torch.tensor([[0, 5]] * 8)
    w = torch.ones(8, 2)
    bad_rows = 32 if rank == 0 else 8
    bad_calls = {
        "v2_too_many_tokens": lambda: v2.dispatch(
            torch.ones(bad_rows, 256, dtype=torch.bfloat16),
            torch.tensor([[0, 5]] * bad_rows),
            torch.ones(bad_rows, 2),
            num_experts=8,
        ),
        "v2_expert_out_of_range": lambda: v2.dispatch(x, idx + (8 if rank == 0 else 0), w, num_experts=8),
        "v2_too_many_qps": lambda: v2.dispatch(x, idx, w, num_experts=8, num_qps=10_000),
    }
    for name, call in bad_calls.items():
        try:
            call()
            problems[name] = "no exception"
        except (ValueError, RuntimeError, AssertionError):
            pass
        recv_x, recv_idx, _, handle, _ = v2.dispatch(x, idx, w, num_experts=8)
        if recv_x.shape[0] != 16:  # every token reaches both ranks (experts 0 and 5)
            problems[f"{name}.next_call"] = f"unexpected {recv_x.shape[0]} rows after the refused call"
    return problems


def two_node_round_trip() -> dict:
    """4 ranks as 2 nodes x 2: V1 internode and V2 hybrid dispatch/combine round trips are exact."""
    import conformance.emulation as deep_ep

    group = dist.group.WORLD
    rank = group.rank()
    problems = {}
    gen = torch.Generator().manual_seed(rank)
    num_tokens, num_experts, hidden = 10, 8, 256
    x = torch.randint(-8, 8, (num_tokens, hidden), generator=gen).to(torch.bfloat16)
    idx = torch.stack([torch.randperm(num_experts, generator=gen)[:3] for _ in range(num_tokens)])
    w = torch.rand(num_tokens, 3, generator=gen)
    v1 = deep_ep.Buffer(group, 1 << 30, 1 << 30)  # the adapter's sizes (the defaults of 0 bytes are refused)
    reached = v1._topo  # noqa: SLF001 - sanity of the topology
    if (reached.num_nodes, reached.ranks_per_node) != (2, 2):
        problems["topology"] = f"{reached}"
    per_rank, per_rdma, per_expert, in_rank, _ = v1.get_dispatch_layout(idx, num_experts)
    if per_rdma is None or per_rdma.shape != (2,):
        problems["v1.num_tokens_per_rdma_rank"] = repr(per_rdma)
    recv_x, recv_idx, recv_w, counts, handle, _ = v1.dispatch(
        x,
        num_tokens_per_rank=per_rank,
        num_tokens_per_rdma_rank=per_rdma,
        is_token_in_rank=in_rank,
        num_tokens_per_expert=per_expert,
        topk_idx=idx,
        topk_weights=w,
    )
    if len(handle) != 10:
        problems["v1.handle"] = f"internode handle has {len(handle)} entries"
    combined, combined_w, _ = v1.combine(recv_x, handle, topk_weights=recv_w)
    expected = x.float() * in_rank.sum(1, keepdim=True)
    if not torch.equal(combined.float(), expected):
        problems["v1.combine"] = "round trip differs"
    if not torch.allclose(combined_w, w):
        problems["v1.combined_weights"] = "differ"
    if not torch.equal(v1.dispatch(x, handle=handle)[0], recv_x):
        problems["v1.cached"] = "differs"
    for hybrid in (True, False):
        v2 = deep_ep.ElasticBuffer(
            group, num_max_tokens_per_rank=16, hidden=hidden, num_topk=3, allow_hybrid_mode=hybrid
        )
        if v2.get_logical_domain_size() != (
            (2, 2) if hybrid else (1, 4)
        ) or v2.get_physical_domain_size() != (2, 2):
            problems[f"v2.{hybrid}.domains"] = (
                f"{v2.get_logical_domain_size()} {v2.get_physical_domain_size()}"
            )
        rx, ri, rw, h, _ = v2.dispatch(x, idx, w, num_experts=num_experts)
        if int(h.psum_num_recv_tokens_per_scaleup_rank[-1]) != rx.shape[0]:
            problems[f"v2.{hybrid}.psum"] = "last scale-up prefix sum != received tokens"
        cx, cw, _ = v2.combine(rx, h, topk_weights=rw)
        if not torch.equal(cx.float(), expected):
            problems[f"v2.{hybrid}.combine"] = "round trip differs"
        if not torch.equal(cw, w):
            problems[f"v2.{hybrid}.combined_weights"] = "differ"
    return problems


# ------------------------------------------------------------------------------------ controller side
def _run_world(jobs: list, world_size: int = WORLD_SIZE, ranks_per_node: int = WORLD_SIZE) -> list[dict]:
    with World(WorldShape(world_size // ranks_per_node, ranks_per_node)) as world:
        return world.run("tests.quality.test_emulation_fidelity:run_jobs", jobs, timeout=TIMEOUT_S)


@pytest.fixture(scope="module")
def world_results() -> list[dict]:
    return _run_world(JOBS)


def _assert_clean(world_results: list[dict], name: str) -> None:
    __tracebackhide__ = True
    for rank, results in enumerate(world_results):
        res = results[name]
        assert "exception" not in res, f"rank {rank} raised in {name}:\n{res['exception']}"
        assert res["checked"] or name in ("megatron", "robustness", "multinode"), (
            f"rank {rank}: nothing checked in {name}"
        )
        assert not res["mismatches"], f"rank {rank} {name}: " + "\n".join(
            f"  {k}: {v}" for k, v in res["mismatches"].items()
        )


@pytest.mark.parametrize(("recording", "case"), CASES, ids=[f"{label}-{name}" for label, name in CASES])
def test_recorded_case_matches_byte_for_byte(world_results: list[dict], recording: str, case: str) -> None:
    _assert_clean(world_results, f"{recording}/case:{case}")


@pytest.mark.parametrize(("recording", "section"), SECTIONS, ids=[f"{label}-{sid}" for label, sid in SECTIONS])
def test_recorded_section_matches(recording: str, section: str, request: pytest.FixtureRequest) -> None:
    """A section of ``fixtures/record.py``: replayed where the version's real recording has it, else skipped with the
    reason."""
    if (recording, section) in SECTION_SKIPS:
        pytest.skip(SECTION_SKIPS[(recording, section)])
    _assert_clean(request.getfixturevalue("world_results"), f"{recording}/section:{section}")


def test_a_lookup_inside_a_capture_equals_the_replays_error_only_word_for_word() -> None:
    """The 2.5.0 recording's ``capture_build.v1_build_in_capture`` (run 29, on the GPU: ``Buffer`` looked up inside a
    capture and after it) equals a CPU replay that raised the same ``AttributeError`` (``replay.compare_run``:
    :func:`tests.helpers.replay.lookup_failed_inside_capture`); another error, or a recording where the build succeeded
    or something raised before, is still a mismatch."""
    if "2.5.0" not in RECORDINGS or "capture_build" in {s for label, s in SECTION_SKIPS if label == "2.5.0"}:
        pytest.skip("DEEPEP_REAL_FIXTURES names one recording: the 2.5.0 recording is not replayed")
    error = "AttributeError: module 'deep_ep' has no attribute 'Buffer'"

    def mismatches(got_error: str, recorded: dict) -> dict:
        return replay.compare_section({"runs": {"v1_build_in_capture": {"error": got_error}}},
                                      {"runs": {"v1_build_in_capture": recorded}}, "capture_build")

    for rank in (0, 1):
        run = replay.load_recording(rank, RECORDINGS["2.5.0"][1])["sections"]["capture_build"]["runs"][
            "v1_build_in_capture"]
        assert run["raised"] == error and run["eager_after"] == {"error": error} and run["built"] is False, run
        assert mismatches(error, run) == {}
        for got, recorded in ((error.replace("'Buffer'", "'EPBuffer'"), run), (error, {**run, "built": True}),
                              (error, {**run, "raised_first": "RuntimeError: x"}),
                              (error, {**run, "eager_after": {"recv_rows": 36}})):
            assert mismatches(got, recorded), (got, recorded)


def test_the_v1_sections_are_not_replayed_for_a_version_without_v1() -> None:
    """2.5.0 has no V1 API: its recording has no test of :data:`V1_SECTIONS`, each of which fails at the ``Buffer``
    lookup on 2.5.0's emulation before any other call (so nothing else of it could be recorded there); 2.1.0's has
    them all."""
    assert not has_v1("2.5.0") and has_v1("2.1.0")
    recorder = replay.load_recorder()
    for sid in V1_SECTIONS:
        assert sid in recorder.SECTIONS
        section = recorder.SECTIONS[sid]
        ctx = recorder.Context(replay.emulation_of("2.5.0"), None, 0, WORLD_SIZE, torch.device("cpu"))
        with pytest.raises(AttributeError, match="has no attribute 'Buffer'"):
            section.run(ctx, recorder.section_inputs(section, 0))
    for label, version in VERSION_OF.items():
        replayed = {sid for other, sid in SECTIONS if other == label}
        assert replayed == set(replay.recorder_section_ids()) - (set() if has_v1(version) else set(V1_SECTIONS))


@pytest.mark.parametrize("recording", ERRORS)
def test_recorded_errors_match(world_results: list[dict], recording: str) -> None:
    _assert_clean(world_results, f"{recording}/errors")


def test_the_2_5_0_comparison_catches_2_1_0s_behaviour() -> None:
    """Planted: 2.1.0's results (V1 present, its SM count, its assertion sites, its JIT failure) compared with the
    2.5.0 recording are mismatches, named; the JIT comparison tells static assertions apart."""
    if "2.5.0" not in RECORDINGS:
        pytest.skip("DEEPEP_REAL_FIXTURES names one recording: the 2.5.0 recording is not replayed")
    cases = RECORDINGS["2.5.0"][0]
    rec25, rec21 = replay.load_recording(0, cases), replay.load_recording(0, str(replay.DEFAULT_FIXTURES))
    got = {k: rec21["cases"]["base"][k] for k in ("v1", "v2", "v2_det", "v2_expand")}
    mismatches = replay.compare_case(got, rec25["cases"]["base"], "base")
    assert set(mismatches) == {"base.v1.error", "base.v2.handle.num_sms", "base.v2_det.handle.num_sms",
                               "base.v2_expand.handle.num_sms"}, mismatches
    assert "expected \"AttributeError: module 'deep_ep' has no attribute 'Buffer'\"" in mismatches["base.v1.error"]
    chk = replay._Checker("errors", None)  # noqa: SLF001 - the fidelity test's checker
    replay.compare_errors(chk, rec21["errors"], rec25["errors"])
    assert set(chk.mismatches) == {"errors.v2_previous_event_without_comm_alloc.message",
                                   "errors.v2_int32_topk_idx.message"}, chk.mismatches
    recorded = rec25["cases"]["small"]["v2"]["error"]
    assert replay.comparable_message(rec21["cases"]["small"]["v2"]["error"]) != replay.comparable_message(recorded)
    import conformance.emulation.v2_5_0.buffers.ep as ep
    from conformance.emulation import _refusals

    with _refusals.version("2.5.0"):
        emulated = ep._jit_error("v2_combine_hidden_jit", ("impls/ep/combine.cuh", 110, "Invalid hidden"))  # noqa: SLF001
        other = ep._jit_error("v2_combine_hidden_jit", ("impls/ep/combine.cuh", 110, "Invalid hid"))  # noqa: SLF001
    assert replay.comparable_message(f"RuntimeError: {emulated}") == replay.comparable_message(recorded)
    assert replay.comparable_message(f"RuntimeError: {other}") != replay.comparable_message(recorded)


def test_every_recorded_version_is_replayed_against_its_own_emulation() -> None:
    """By default both versions are replayed, each against its own emulation module and V2 class."""
    if replay.fidelity_recordings() != [tuple(map(str, pair)) for pair in replay.FIDELITY_RECORDINGS]:
        pytest.skip("DEEPEP_REAL_FIXTURES names one recording: the default pair is not replayed")
    assert list(RECORDINGS) == ["2.1.0", "2.5.0"]
    assert replay.emulation_of("2.1.0").__name__ == "conformance.emulation"
    assert replay.emulation_of("2.5.0").__name__ == "conformance.emulation.v2_5_0"
    assert replay.v2_class("2.1.0").__name__ == "ElasticBuffer" and replay.v2_class("2.5.0").__name__ == "EPBuffer"
    assert {label for label, _ in CASES} == {"2.1.0", "2.5.0"}


def test_megatron_style_integrator_runs_unchanged(world_results: list[dict]) -> None:
    _assert_clean(world_results, "megatron")


def test_bad_input_on_one_rank_raises_everywhere_without_hang(world_results: list[dict]) -> None:
    _assert_clean(world_results, "robustness")


def test_two_nodes_internode_and_hybrid_round_trip() -> None:
    _assert_clean(_run_world(MULTI_NODE_JOBS, world_size=4, ranks_per_node=2), "multinode")


def test_import_surface() -> None:
    import conformance.emulation as deep_ep
    from conformance.emulation.utils import EventHandle as FromUtils
    from conformance.emulation.utils.event import EventHandle, EventOverlap

    assert FromUtils is EventHandle and EventOverlap is deep_ep.EventOverlap
    with pytest.raises(ImportError):  # as on the real 2.1.0 (docs/real-runs/api-surface-real-2.1.0.json)
        from conformance.emulation.utils import EventOverlap as _  # noqa: F401
    assert deep_ep.topk_idx_t is torch.int64
    for name in ("Buffer", "ElasticBuffer", "EPHandle", "EventHandle", "Config"):
        assert hasattr(deep_ep, name)
    with pytest.raises(AssertionError, match="The SM count must be even"):
        deep_ep.Buffer.set_num_sms(21)
