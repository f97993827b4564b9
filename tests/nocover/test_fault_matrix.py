"""The fault matrix: a broken library, an impossible set-up, an interrupted run, a pytest run that is not ours.

Each case runs pytest as a user would (a subprocess) and checks the message, the exit code, the time it took
and that no process is left behind.  The times are printed (``-s``) for the closing notes.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conformance.harness.options import Machine, SetupError, build_run_config
from conformance.properties import catalog
from tests.conftest import ROOT
from tests.helpers.runs import RUN_TAG, assert_group_gone, tagged
from tests.helpers.runs import report_of as _report
from tests.helpers.runs import run_pytest as _pytest

pytestmark = pytest.mark.slow  # a whole run of the suite or more: scheduled first (tests/conftest.py)

PROPERTIES = len(catalog())


# ------------------------------------------------------------------------------------ a broken library


def test_crash_on_construction_fails_every_property_fast_with_one_headline(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    proc, took = _pytest(["-n", "auto", "--nodes", "2", "--mutant", "crash-on-construction", f"--report-dir={reports}"],
                         timeout=300)
    print(f"crash-on-construction: exit {proc.returncode} in {took:.1f} s")
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert took <= 120, f"took {took:.0f} s"
    headline = ("The library crashed on buffer construction: emulated-v1: a rank died by SIGSEGV in Buffer.__init__; "
                "emulated-v2: a rank died by SIGSEGV in ElasticBuffer.__init__.")
    summary_start = proc.stdout.index("DeepEP conformance")
    assert headline in proc.stdout[summary_start:summary_start + 600], proc.stdout[-3000:]
    report = _report(reports)
    assert report["headline"][0].startswith(headline)
    # P14 (the API surface) runs anyway: the surface is what explains a broken build; it makes no call there.
    statuses = {p["id"]: p["status"] for p in report["properties"]}
    assert statuses.pop("P14-api-surface") == "passed" and statuses.pop("P31-soak") == "skipped"  # soak is off
    assert set(statuses.values()) == {"failed"}, statuses
    crashed = {"emulated-v1": "SIGSEGV in Buffer.__init__", "emulated-v2": "SIGSEGV in ElasticBuffer.__init__"}
    for entry in [p for p in report["properties"] if p["id"] not in ("P14-api-surface", "P31-soak")]:
        # the failed columns: P8 and P11 use V2 only, P15-P17 V1 only (the other API's column is unsupported)
        used = [b for b, column in entry["verdicts"].items() if b in crashed and column["status"] == "failed"]
        assert used and all(crashed[b] in entry["message"] for b in used), entry["message"]


def test_a_rank_dying_in_dispatch_spends_a_bounded_budget(tmp_path: Path) -> None:
    """Each crash restarts the world; shrinking stops at the budget with the smallest case found, and once the
    run's budget is spent the remaining properties fail at once."""
    reports = tmp_path / "reports"
    proc, took = _pytest(["-p", "no:xdist", "--nodes", "1", "--max-restarts", "1", "--mutant", "rank-dies-in-dispatch",
                          f"--report-dir={reports}", "-q"], timeout=600)
    print(f"rank-dies-in-dispatch (budget 1, run budget 4): exit {proc.returncode} in {took:.1f} s")
    assert proc.returncode == 1, proc.stdout[-3000:]
    report = _report(reports)
    failed = [p for p in report["properties"] if p["status"] == "failed"]
    assert failed, report["summary"]
    first = failed[0]
    assert "stopped after 2 world restarts (--max-restarts 1)" in first["message"], first["message"]
    assert "SIGKILL in ElasticBuffer.dispatch [emulated-v2]" in first["message"], first["message"]
    assert first["counterexample"] is not None and first["repro"]
    assert any("spent its crash/hang budget" in p["message"] for p in failed), [p["message"] for p in failed]
    assert took <= 180, f"took {took:.0f} s"


# ------------------------------------------------------------------------------------ impossible set-ups


@pytest.mark.parametrize(("args", "expected"), [
    (["--backends", "real", "--ranks-per-node", "1"], "the real DeepEP needs at least 2 ranks"),
    (["--backends", "real"], "the real DeepEP runs on CUDA GPUs and none is visible here"),
    (["--device", "cuda"], "--device cuda: no CUDA GPU is visible here"),
    (["--backends", "bogus"], "unknown backend 'bogus': expected one of emulated-v1, emulated-v2, real-v1, real-v2"),
    (["--nodes", "0"], "--nodes must be at least 1, got 0"),
    (["--time-budget", "-5"], "--time-budget must be 0 (off) or a number of seconds, got -5"),
    (["--device", "tpu"], "argument --device: invalid choice: 'tpu'"),
    (["--mutant", "nope"], "--mutant 'nope' is not registered; known:"),
    (["--baseline", "/nonexistent/conformance.json"], "is not a readable conformance report"),
], ids=["real-1-rank", "real-no-gpu", "cuda-no-gpu", "unknown-backend", "zero-nodes", "negative-time-budget",
        "unknown-device",
        "unknown-mutant", "missing-baseline"])
def test_an_impossible_set_up_is_one_line_before_anything_starts(args: list[str], expected: str,
                                                                  tmp_path: Path) -> None:
    proc, took = _pytest([*args, f"--report-dir={tmp_path}"], env={"CUDA_VISIBLE_DEVICES": ""}, timeout=120)
    print(f"{' '.join(args)}: exit {proc.returncode} in {took:.1f} s")
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, proc.stdout[-2000:] + proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines()  # pytest's own usage line aside (argparse's errors)
              if line.startswith(("ERROR:", "python -m pytest: error:")) and not line.startswith("ERROR: usage:")]
    assert len(errors) == 1 and expected in errors[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "INTERNALERROR" not in proc.stdout + proc.stderr
    assert not list(tmp_path.iterdir()), "a refused run wrote reports"
    assert took <= 30, f"took {took:.0f} s"


def _machine(gpus: int, deep_ep: bool = True, error: str = "") -> Machine:
    return Machine(tuple(str(i) for i in range(gpus)), {"importable": deep_ep, "error": error})


def _options(**values: object) -> object:
    from types import SimpleNamespace

    return SimpleNamespace(**values)


def test_set_up_checks_that_need_gpus() -> None:
    """The set-ups a CPU machine cannot show end to end, through the same function the plugin calls."""
    with pytest.raises(SetupError, match=r"one GPU per rank is needed, 4 in all .* but 2 are visible here"):
        build_run_config(_options(device="cuda", nodes=2), _machine(2))
    with pytest.raises(SetupError, match=r"needed, 4 in all \(1 node\(s\) x 2 rank\(s\) x 2 xdist workers\)"):
        build_run_config(_options(device="cuda"), _machine(2), workers=2)
    with pytest.raises(SetupError, match="the real deep_ep does not import here: ImportError: libnccl.so.2: cannot"):
        build_run_config(_options(backends="real"), _machine(2, False, "ImportError: libnccl.so.2: cannot open"))
    with pytest.raises(SetupError, match=r"needed, 2 in all .* but 1 is visible here.*needs at least 2 ranks"):
        build_run_config(_options(backends="real-v1"), _machine(1))
    with pytest.raises(SetupError, match="selects no emulated backend"):
        build_run_config(_options(backends="real", mutant="flip-one-byte"), _machine(2))
    auto = build_run_config(_options(), _machine(1))  # one GPU for two ranks: auto takes the CPU, says why
    assert auto.device == "cpu" and [b.name for b in auto.backends] == ["emulated-v1", "emulated-v2"]
    assert any("--device auto chose cpu" in note for note in auto.notes)
    real = build_run_config(_options(), _machine(2))
    assert real.device == "cuda" and [b.name for b in real.backends] == ["real-v1", "real-v2"]
    assert real.gpu_ids == ("0", "1") and real.rank_env["NCCL_NVLS_ENABLE"] == "0"


# ------------------------------------------------------------------------------------ a guest in others' runs

GUEST_TEST = '''
import sys
from hypothesis import given, settings, strategies as st

TORCH_AT_COLLECTION = "torch" in sys.modules


def test_guest_state():
    assert not TORCH_AT_COLLECTION, "torch was imported before the tests were collected"
    # Hypothesis picks its own profile ("default", or "ci" where the CI variable is set): printed, and compared
    # with the same run without the plugin.
    print(f"GUEST-STATE profile={settings._current_profile} max_examples={settings.default.max_examples}")


@settings(database=None)
@given(st.integers())
def test_theirs(x):
    assert x == x
'''


def _files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if "__pycache__" not in p.parts}


def test_installed_plugin_is_a_guest_in_an_unrelated_run(tmp_path: Path) -> None:
    """The plugin is loaded through its entry point (the suite is installed in this environment) into a run of
    someone else's tests: no torch at collection, Hypothesis' settings untouched, nothing written (compared with
    the same run without the plugin)."""
    entry_points = subprocess.run([sys.executable, "-c", "from importlib.metadata import entry_points; "
                                   "print([e.value for e in entry_points(group='pytest11')])"],
                                  capture_output=True, text=True).stdout
    assert "conformance.plugin" in entry_points, "the suite is not installed here (pip install -e .)"
    runs = {}
    for name, extra in (("with", []), ("without", ["-p", "no:conformance.plugin"])):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "test_theirs.py").write_text(GUEST_TEST)
        before = _files(folder)
        # a fresh interpreter: what the run has imported (torch?) is what this test reads
        proc, took = _pytest(["-q", "-s", "-p", "no:cacheprovider", *extra], cwd=folder, env={"PYTHONPATH": ""},
                             fresh=True)
        assert proc.returncode == 0, proc.stdout[-3000:]
        state = [line for line in proc.stdout.splitlines() if "GUEST-STATE" in line]
        assert len(state) == 1, proc.stdout[-3000:]
        runs[name] = (_files(folder) - before, took, state[0][state[0].index("GUEST-STATE"):])
        print(f"unrelated run {name} the plugin: {took:.1f} s, {runs[name][2]}, new files {sorted(runs[name][0])}")
    assert runs["with"][2] == runs["without"][2], "the plugin changed Hypothesis' settings in someone else's run"
    # Hypothesis caches the constants of every module it finds outside site-packages under .hypothesis/constants:
    # with an editable install that includes the plugin's own modules (a regular install is in site-packages).
    ours = {name: {f for f in files if not f.startswith(".hypothesis")} for name, (files, _, _) in runs.items()}
    assert ours["with"] == ours["without"], "the plugin wrote files into someone else's run"
    assert not any(f.startswith("reports") or f.endswith(".xml") for f in runs["with"][0])


def test_suite_runs_where_xdist_is_not_installed(catalog_runs) -> None:
    """As without the package: no entry points are loaded and ``import xdist`` fails; only the suite's plugin and
    Hypothesis' are named; the whole catalog runs serially, complete (the session's one-node catalog run; CI also
    uninstalls pytest-xdist for real and runs the main job)."""
    run = catalog_runs[1]
    print(f"without xdist --max-examples 3: exit {run.proc.returncode} in {run.took:.1f} s")
    assert run.proc.returncode == 0, run.proc.stdout[-3000:] + run.proc.stderr[-2000:]
    report = run.report
    assert report["complete"] and report["summary"]["total"] == PROPERTIES and report["summary"]["failed"] == 0
    assert report["summary"]["passed"] + report["summary"]["divergence"] >= 1


# ------------------------------------------------------------------------------------ option spellings


def test_options_mean_the_same_in_both_spellings(tmp_path: Path, catalog_runs) -> None:
    """``--baseline PATH --report-dir DIR`` (the value after a space, outside the checkout) collects exactly the
    properties, like the ``=`` spelling.  The baseline: the session's one-node catalog run (outside the checkout).
    (A run gated with the space spelling against a baseline of identical options, which must find nothing changed:
    tests/nocover/test_report_versions.py, its ``r1``.)"""
    assert catalog_runs[1].proc.returncode == 0, catalog_runs[1].proc.stdout[-2000:]
    baseline = catalog_runs[1].report_dir / "conformance.json"
    collected = {}
    for spelling, args in (("space", ["--baseline", str(baseline), "--report-dir", str(tmp_path / "a")]),
                           ("equals", [f"--baseline={baseline}", f"--report-dir={tmp_path / 'b'}"])):
        proc, took = _pytest(["-n", "2", "--nodes", "2", "--collect-only", "-q", *args])
        assert proc.returncode == 0, proc.stdout[-2000:]
        collected[spelling] = sorted(line.split("::", 1)[1] for line in proc.stdout.splitlines() if "::" in line)
        print(f"{spelling}: {len(collected[spelling])} tests collected in {took:.1f} s")
    assert collected["space"] == collected["equals"] and len(collected["space"]) == PROPERTIES


# ------------------------------------------------------------------------------------ partial runs


def test_a_subset_run_is_partial_and_never_replaces_a_complete_report(tmp_path: Path, catalog_runs) -> None:
    reports = tmp_path / "reports"
    shutil.copytree(catalog_runs[1].report_dir, reports)  # a complete run's report folder
    assert catalog_runs[1].proc.returncode == 0 and _report(reports)["complete"], catalog_runs[1].proc.stdout[-2000:]
    subset, _ = _pytest(["-p", "no:xdist", "--max-examples", "2", f"--report-dir={reports}", "-q", "-k",
                         "test_per_expert_payloads or test_counts"])
    assert subset.returncode == 0, subset.stdout[-2000:]
    assert _report(reports)["complete"], "a partial run replaced the complete report"
    partial = _report(reports, "conformance.partial.json")
    assert partial["complete"] is False and "a subset was selected" in partial["incomplete_reason"]
    assert len(partial["not_run"]) == PROPERTIES - 2 and "P3-recv-topk-idx" in partial["not_run"]
    assert {p["status"] for p in partial["properties"] if p["id"] in partial["not_run"]} == {"not-run"}
    assert "PARTIAL RUN" in subset.stdout
    gate, _ = _pytest(["-p", "no:xdist", "--max-examples", "2", f"--report-dir={tmp_path / 'g'}", "-q",
                       "--baseline", str(reports / "conformance.partial.json")])
    assert gate.returncode == pytest.ExitCode.USAGE_ERROR and "is a partial run" in gate.stderr, gate.stderr


def _as_in_a_terminal() -> None:
    """(in the run's process, before it starts) Ctrl-C and SIGQUIT as a terminal's foreground job has them: a shell
    without job control starts a background job (``cmd &``) with both ignored, which the run would inherit."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


#: What the interrupted runs select: a quick property first, then two that run for a minute at 200 examples.
INTERRUPTED = [f"conformance/properties/{name}.py" for name in ("test_p14_api_surface", "test_p01_payloads",
                                                                 "test_p05_combine")]


#: How soon an interrupted run must have stopped: 1.8-4 s measured alone; 10.2 s and 11.5 s measured inside the
#: self-tests on the 2-core machine (two other workers' runs beside it), so the bound leaves room for that load.
STOP_WITHIN_S = 20.0
#: One worker runs the three interrupted runs one after the other, so that at most one of them (two xdist workers,
#: two worlds of four ranks) loads the 2-core machine at a time: a stop measured at 1.8-4 s alone took 11.1 s and
#: 11.5 s in two self-test runs where they could run side by side with the other workers' runs.
@pytest.mark.xdist_group("interrupted-runs")
@pytest.mark.parametrize("how", ["SIGINT to the group (Ctrl-C)", "SIGTERM to the group (timeout)",
                                 "SIGTERM to pytest only (kill PID)"])
def test_an_interrupted_run_stops_fast_leaves_nothing_and_says_so(tmp_path: Path, how: str) -> None:
    """Ctrl-C, ``timeout`` and a plain ``kill``: the run stops within seconds, reports what finished as a partial
    run, and leaves no worker or rank process behind."""
    reports = tmp_path / "reports"
    env = tagged({**os.environ, "PYTHONPATH": str(ROOT)})
    # P14 finishes in seconds; P1 and P5 then have 200 examples to run: the signal comes while examples run
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-n", "2", "--nodes", "2", f"--report-dir={reports}",
                             "--max-examples", "200", "-v", *INTERRUPTED], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=_as_in_a_terminal)
    lines = []
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:  # wait until a property finished and others are running examples
        line = proc.stdout.readline()
        lines.append(line)
        if " PASSED " in line or " FAILED " in line:
            break
    time.sleep(0.5)  # the other worker's property is running examples already (it started with P14's)
    started = time.monotonic()
    signum = signal.SIGINT if how.startswith("SIGINT") else signal.SIGTERM
    if "group" in how:
        os.killpg(proc.pid, signum)
    else:
        proc.send_signal(signum)
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    took = time.monotonic() - started
    print(f"{how}: exit {proc.returncode} {took:.1f} s after the signal")
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, "".join(lines)[-2000:] + out[-2000:]
    assert took <= STOP_WITHIN_S, f"took {took:.1f} s to stop"
    assert_group_gone(proc.pid, env[RUN_TAG])
    report = _report(reports)
    assert report["complete"] is False and report["incomplete_reason"].startswith("the run was interrupted")
    assert report["not_run"] and len(report["not_run"]) < PROPERTIES, report["not_run"]
    assert {"P1-per-expert-payloads", "P5-combine"} & set(report["not_run"]), report["not_run"]  # cut mid-run
