"""Self-tests of ``fixtures/record.py``, the recorder the next real-library run uses, on CPU with the emulation.

The script is run as its users will run it: ``--nproc 2`` (with a hang planted on one rank, which the watchdog must
stop and the restarted world record as an error before it goes on), and under torchrun; then:

- the re-recorded old cases and errors equal ``fixtures/deepep-real`` field by field, through the fidelity test's own
  comparison (``tests/helpers/replay.py``): the emulation matches those recordings, so equality shows the script makes
  the calls the original recording made, on the same inputs;
- every new section is present and well formed;
- replaying the new sections against the emulation (the fidelity test's section replay) finds no mismatch, and the
  comparison does find one when a recorded byte, count or message is changed;
- on ``--deep-ep emulation:2.5.0`` the recorder drives 2.5.0's ``EPBuffer`` and records the missing ``Buffer``, and
  its cases and errors equal the real 2.5.0 recording (``fixtures/deepep-real-2.5.0-2026-12-06``).
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conformance.world.launcher import World, WorldShape
from tests.conftest import once_per_session
from tests.helpers import replay

#: Its module-scoped fixtures are built once: under xdist (the self-tests run with -n) its tests share a worker.
pytestmark = [pytest.mark.xdist_group("test_record"), pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
RECORDER = ROOT / "fixtures" / "record.py"
REAL = ROOT / "fixtures" / "deepep-real"
TIMEOUT_S = 300
SECTIONS = replay.recorder_section_ids()
#: What every run of a kind holds (beyond ``kind``), when it did not raise.
RUN_FIELDS = {
    "v1_dispatch": ("recv_x",),
    "v2_dispatch": ("recv_x", "recv_topk_idx", "recv_topk_weights", "handle", "shapes"),
    "v2_expand": ("recv_x", "recv_topk_weights", "handle", "shapes"),
    "v2_cached": ("recv_x", "after"),
    "ll_dispatch": ("options", "recv_count", "layout_range", "recv_x_valid", "src_info_valid", "hook_returned",
                    "stats_after", "shapes"),
    "ll_combine": ("options", "combined_x", "hook_returned"),
    "errors": ("errors", "returned"),
    "value": (),
    "graph": ("api",),
}
#: The bad calls the brief names, by section: every one must be recorded (raised or returned).
BAD_CALLS = {
    "errors_fp8_low_latency": ("v1_fp8_x_without_scales", "v1_fp8_scales_wrong_rows", "v1_fp8_scales_bf16",
                               "v1_fp8_scales_1d", "v1_fp8_hidden_not_multiple_of_128", "v2_fp8_x_without_scales",
                               "v2_fp8_scales_wrong_rows", "v2_fp8_scales_bf16", "v2_fp8_hidden_not_multiple_of_128",
                               "v1_low_latency_dispatch_on_normal_buffer", "v1_low_latency_combine_on_normal_buffer"),
    "v1_low_latency": ("ll_hidden_not_multiple_of_128", "ll_fp8_hidden_not_multiple_of_512", "ll_too_many_tokens",
                       "ll_ue8m0_without_round_scale"),
}


def record(out: Path, *extra: str, torchrun: bool = False, env: dict[str, str] | None = None) -> str:
    """Run the recorder (emulation, CPU); its output, after asserting it exited 0."""
    args = [str(RECORDER), "--out", str(out), "--deep-ep", "emulation", "--device", "cpu", *extra]
    cmd = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *args]
           if torchrun else [sys.executable, *args, "--nproc", "2"])
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    assert proc.returncode == 0, (f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n"
                                  f"{proc.stderr[-6000:]}")
    return proc.stdout + proc.stderr


def load(folder: Path, rank: int) -> dict:
    return torch.load(folder / f"rank{rank}.pt", weights_only=True)


#: The unit the self-test makes rank 1 hang in, on the first start (``timing``: skipped on the emulation anyway, so
#: every other unit is still compared), and the watchdog's limit then.
HANG, HANG_TIMEOUT_S = "timing@1", 10


@pytest.fixture(scope="session")
def recording(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """The whole recording, ``--nproc 2``; rank 1 hangs once (the watchdog stops it, the world restarts, resumes).
    Made once per self-test session (``tests.conftest.once_per_session``)."""
    def make(out: Path) -> str:
        out.mkdir(parents=True, exist_ok=True)
        record(out, "--section-timeout", str(HANG_TIMEOUT_S), env={"RECORDER_SELFTEST_HANG": HANG})
        return str(out)

    return Path(once_per_session(tmp_path_factory, worker_id, "recording", make))


def test_both_ranks_written_in_the_old_format(recording: Path) -> None:
    for rank in (0, 1):
        rec, real = load(recording, rank), load(REAL, rank)
        for key in ("meta", "timing_ms_per_dispatch_combine", "errors", "cases"):
            assert key in rec, f"rank{rank}.pt has no {key!r} (the old format has it)"
        assert set(real["meta"]) <= set(rec["meta"]), f"meta lacks {set(real['meta']) - set(rec['meta'])}"
        assert list(rec["cases"]) == list(real["cases"])
        recorder = rec["meta"]["recorder"]
        assert recorder["deep_ep_mode"] == "emulation" and recorder["backend"] == "gloo", recorder
        assert recorder["env"]["NCCL_NVLS_ENABLE"] == "0" and recorder["env"]["NVSHMEM_DISABLE_NVLS"] == "1"
        timing = rec["timing_ms_per_dispatch_combine"]
        assert timing["error"].startswith(("RecorderTimeout", "RecorderCrash")), timing
        assert recorder["starts"] == 2, recorder
        failed = {u: s for u, s in recorder["units"].items() if s["status"] != "ok"}
        assert list(failed) == ["timing"], failed
    hung = load(recording, 1)["timing_ms_per_dispatch_combine"]["error"]
    assert hung.startswith("RecorderTimeout") and f"{HANG_TIMEOUT_S} s" in hung, hung


def _compared(rec: dict, real: dict, rank: int) -> tuple[dict, list[str]]:
    """A recording's old cases and errors against the real one's, through the fidelity test's comparison: the
    mismatches and the fields compared."""
    checked: list[str] = []
    mismatches = {}
    for name, case in real["cases"].items():
        mismatches.update(replay.compare_case(rec["cases"][name], case, f"rank{rank}.{name}", checked))
    chk = replay._Checker(f"rank{rank}.errors", checked)  # noqa: SLF001 - the fidelity test's checker
    replay.compare_errors(chk, rec["errors"], real["errors"], rec["errors_not_raised"])
    mismatches.update(chk.mismatches)
    return mismatches, checked


def test_old_cases_and_errors_equal_the_real_recording(recording: Path) -> None:
    """Field by field, through the fidelity test's comparison, inputs included."""
    for rank in (0, 1):
        rec, real = load(recording, rank), load(REAL, rank)
        mismatches, checked = _compared(rec, real, rank)
        assert not mismatches, "\n".join(f"{k}: {v}" for k, v in mismatches.items())
        assert sum(k.endswith(".inputs.x") for k in checked) == len(real["cases"])
        assert len(checked) > 60 * len(real["cases"]), f"only {len(checked)} fields compared"


#: Sections whose calls probe a contract one DeepEP version changed (fixtures/record.py: v2_contract): a call may
#: raise on the version recorded (2.1.0 has no ``defer_epilogue``; 2.5.0 refuses ``do_handle_copy=True``).
PROBE_SECTIONS = {"v2_contract"}


def test_every_new_section_present_and_well_formed(recording: Path) -> None:
    for rank in (0, 1):
        sections = load(recording, rank)["sections"]
        assert list(sections) == SECTIONS
        for sid, section in sections.items():
            assert section["status"] == "ok" and section["runs"], f"{sid}: {section.get('error')}"
            assert section["about"] and section["seconds"] >= 0
            for name in ("x", "topk_idx", "topk_weights"):
                assert isinstance(section["inputs"][name], torch.Tensor), f"{sid}: input {name} not saved"
            assert section["inputs"]["topk_idx"].dtype == torch.int64
            for run_name, run in section["runs"].items():
                where = f"rank {rank} {sid}.{run_name}"
                if sid in PROBE_SECTIONS:  # a call one version refuses: what it raised is the recording
                    assert "error" not in run or run["error"].partition(": ")[0].isidentifier(), where
                    if "error" in run:
                        continue
                assert "error" not in run, f"{where} raised on the emulation: {run['error']}"
                assert run["kind"] in RUN_FIELDS, f"{where}: unknown kind {run['kind']!r}"
                missing = [f for f in RUN_FIELDS[run["kind"]] if f not in run]
                assert not missing, f"{where} lacks {missing}"
            for bad in BAD_CALLS.get(sid, ()):
                run = next(r for r in section["runs"].values() if r["kind"] == "errors")
                assert bad in run["errors"] or bad in run["returned"], f"{sid}: bad call {bad} not recorded"
        fp8 = sections["v1_fp8_dispatch"]
        assert fp8["inputs"]["x_fp8"].dtype == torch.float8_e4m3fn and fp8["inputs"]["scales"].dtype == torch.float32
        assert fp8["runs"]["plain"]["recv_x"].dtype == torch.float8_e4m3fn
        assert fp8["runs"]["num_worst_tokens"]["shapes"]["recv_x"]["shape"][0] == 2 * 32
        col = sections["v2_fp8_dispatch"]["runs"]["col_major_sf"]
        rows = col["shapes"]["recv_sf"]["shape"][0]
        assert col["shapes"]["recv_sf"]["stride"] == (1, -(-rows // 4) * 4), col["shapes"]["recv_sf"]
        ll = sections["v1_low_latency"]["runs"]
        assert ll["dispatch_fp8_ue8m0_hook"]["recv_x_scales_valid"].dtype == torch.int32
        assert ll["dispatch_fp8_hook"]["hook_returned"] and not ll["dispatch_bf16"]["hook_returned"]
        assert ll["combine_out"]["returned_out"] is True


def replay_sections(fixtures_dir: str) -> dict:
    """Rank task: every section of the recording in ``fixtures_dir`` replayed against the emulation."""
    out = {}
    for sid in replay.recorder_section_ids():
        checked: list[str] = []
        out[sid] = {"mismatches": replay.replay_recorded_section(sid, fixtures_dir=fixtures_dir, checked=checked),
                    "checked": len(checked)}
    return out


def test_new_sections_replay_against_the_emulation(recording: Path) -> None:
    """The fidelity test's section replay, on this recording: the emulation agrees with itself, every run compared."""
    with World(WorldShape(1, 2)) as world:
        per_rank = world.run("tests.nocover.test_record:replay_sections", str(recording), timeout=120)
    for rank, results in enumerate(per_rank):
        for sid, res in results.items():
            assert res["checked"] > 5, f"rank {rank} {sid}: only {res['checked']} fields compared"
            assert not res["mismatches"], f"rank {rank} {sid}: {res['mismatches']}"


def _first_tensor(run: dict, skip: tuple[str, ...] = ()) -> tuple[str, dict] | None:
    for name, value in run.items():
        if isinstance(value, torch.Tensor) and value.numel() and name not in skip:
            return name, run
        if isinstance(value, dict) and name not in ("shapes", "options", "kwargs") and (
                found := _first_tensor(value, skip)):
            return found
    return None


def test_the_comparison_catches_a_changed_value(recording: Path) -> None:
    """One byte (or count, or message) changed in a run of every kind: the comparison names that run."""
    rec = load(recording, 0)
    seen_kinds = set()
    for sid, section in rec["sections"].items():
        for run_name, run in section["runs"].items():
            target = copy.deepcopy(run)
            if target["kind"] == "errors":
                name = next(iter(target["errors"]))
                target["errors"][name] = (target["errors"][name][0], target["errors"][name][1] + "!")
            elif (found := _first_tensor(target, skip=("src_info_valid", "layout_range"))) is not None:
                name, holder = found
                flat = holder[name].reshape(-1).view(torch.uint8)
                flat[0] ^= 0x01
            else:
                key = next(k for k in target if k != "kind")
                target[key] = f"changed {target[key]!r}"
            chk = replay._Checker(f"{sid}.{run_name}", None)  # noqa: SLF001 - the fidelity test's checker
            replay.compare_run(chk, target, run, {**section["runs"], run_name: target}, section["runs"])
            assert chk.mismatches, f"changing {sid}.{run_name} went unnoticed"
            chk = replay._Checker(f"{sid}.{run_name}", None)  # noqa: SLF001
            replay.compare_run(chk, run, run, section["runs"], section["runs"])
            assert not chk.mismatches and chk.checked, f"{sid}.{run_name} against itself: {chk.mismatches}"
            seen_kinds.add(run["kind"])
    assert seen_kinds == set(RUN_FIELDS), f"kinds never perturbed: {set(RUN_FIELDS) - seen_kinds}"
    case = copy.deepcopy(rec["cases"]["base"])
    case["v2"]["recv_x"].view(torch.uint8).reshape(-1)[7] ^= 0x01
    assert "base.v2.recv_x" in replay.compare_case(case, rec["cases"]["base"], "base")


REAL_2_5_0 = ROOT / "fixtures" / "deepep-real-2.5.0-2026-12-06"


def test_a_2_5_0_recording_of_the_emulation_equals_the_real_2_5_0(tmp_path: Path) -> None:
    """``--deep-ep emulation:2.5.0``: the recorder drives ``EPBuffer`` (and records the V1 lookup's error, no V1 bad
    calls), and what it records equals the real 2.5.0 recording field by field through the fidelity test's comparison
    (given the recording machine's NVLink condition, as the replay gives it)."""
    out = record(tmp_path, "--deep-ep", "emulation:2.5.0", "--sections", "meta,cases,errors",
                 env={"DEEP_EP_EMULATION_NVLINK_GBS": "1"})
    for rank in (0, 1):
        rec, real = load(tmp_path, rank), replay.load_recording(rank, str(REAL_2_5_0))
        assert rec["meta"]["deep_ep"] == "2.5.0+emulation" and rec["meta"]["recorder"]["deep_ep_mode"] == \
            "emulation:2.5.0", (rec["meta"], out[-2000:])
        mismatches, checked = _compared(rec, real, rank)
        assert not mismatches, "\n".join(f"{k}: {v}" for k, v in mismatches.items())
        assert set(rec["errors"]) | set(rec["errors_not_raised"]) == set(real["errors"])  # no V1 rows
        assert len(checked) > 40 * len(real["cases"]), f"only {len(checked)} fields compared"


def test_torchrun_form(tmp_path: Path) -> None:
    """``torchrun --nproc-per-node 2 fixtures/record.py``: the same recording (two units of it here)."""
    record(tmp_path, "--sections", "case:uneven,v1_fp8_dispatch", torchrun=True)
    for rank in (0, 1):
        rec, real = load(tmp_path, rank), load(REAL, rank)
        assert list(rec["cases"]) == ["uneven"] and list(rec["sections"]) == ["v1_fp8_dispatch"]
        assert rec["meta"]["recorder"]["starts"] == 1
        mismatches = replay.compare_case(rec["cases"]["uneven"], real["cases"]["uneven"], "uneven")
        assert not mismatches, mismatches
        assert rec["sections"]["v1_fp8_dispatch"]["status"] == "ok"
