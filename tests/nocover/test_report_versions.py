"""Done-when of the reports issue, end to end through the suite (subprocesses on the emulation):

- the version gate on two emulated 'versions' (a planted regression; a renamed API): it fails on each with its
  paragraph, passes on an identical run, and reports a fixed known defect without failing;
- a stored counterexample comes back first: the same failing command run twice reaches the failure in fewer
  examples the second time (Hypothesis' example database in the report directory).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conformance.reporting.accept import load_acceptance
from conformance.reporting.bump import explain
from conformance.reporting.schema import SCHEMA
from tests.conftest import PLANTED_RUN, run_suite

pytestmark = pytest.mark.slow  # a whole run of the suite or more: scheduled first (tests/conftest.py)

PROPERTIES = ["conformance/properties/test_p01_payloads.py", "conformance/properties/test_p12_bad_input.py",
              "conformance/properties/test_p14_api_surface.py"]
#: Fixed seed: P12 draws the V2 cached-dispatch call (the known defect) with it, and P1 is caught by flip-one-byte.
COMMON = ["--max-examples", "8", "--conformance-seed", "3", "-p", "no:xdist"]
KNOWN = "v2-cached-dispatch-without-num-experts"


def test_the_gate_fails_on_a_regression_and_on_a_renamed_api_and_passes_an_identical_run(tmp_path: Path) -> None:
    baseline = tmp_path / "baseline" / "deep_ep-old.json"
    proc, report = run_suite([*PROPERTIES, *COMMON, f"--write-baseline={baseline}", "--allow-partial"], tmp_path / "r0")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert json.loads(baseline.read_text())["schema"] == SCHEMA and f"baseline written: {baseline}" in proc.stdout
    known = {k["id"]: k for k in report["known_defects"]["entries"]}
    assert known[KNOWN]["status"] == "known-defect", known[KNOWN]
    p12 = next(p for p in report["properties"] if p["id"] == "P12-bad-input")
    assert p12["status"] == "known-defect" and p12["verdicts"]["emulated-v2"]["defects"][KNOWN] >= 1
    gate = ["--baseline", str(baseline), "--allow-partial"]  # three properties: a partial run on purpose
    # the three gated runs are independent: side by side
    with ThreadPoolExecutor(3) as pool:
        runs = list(pool.map(lambda case: run_suite([*PROPERTIES, *COMMON, *gate, *case[0]], tmp_path / case[1]),
                             [((), "r1"), (("--mutant", "flip-one-byte"), "r2"),
                              (("--mutant", "renamed-elastic-buffer"), "r3")]))

    same, report = runs[0]
    assert same.returncode == 0 and report["gate"] == {**report["gate"], "regressions": []}, same.stdout[-3000:]
    assert "version gate: 0 regression(s)" in same.stdout

    regression, report = runs[1]
    assert regression.returncode == 1
    (paragraph,) = [r for r in report["gate"]["regressions"] if r.startswith("P1-")]  # P12's next call breaks too
    assert paragraph.startswith("P1-per-expert-payloads held in the baseline (the emulation of deep_ep 2.1.0: passed "
                                "on")
    assert "fails now on emulated-v" in paragraph and "bytes differ" in paragraph and "python -m conformance.repro" \
        in paragraph and "Shrunk counterexample" in paragraph
    assert "GATE REGRESSION P1-per-expert-payloads held in the baseline" in regression.stdout

    renamed, report = runs[2]
    assert renamed.returncode == 1
    surface = [r for r in report["gate"]["regressions"] if "API surface of conformance.emulation changed" in r]
    assert len(surface) == 1 and "ElasticBuffer: renamed to 'EPBuffer' (same methods)" in surface[0], \
        report["gate"]["regressions"]
    assert "import ElasticBuffer: True -> False" in surface[0]
    # The bump explained: emulated-v2 (its construction now fails on the old name) is one finding, not one per
    # property; P14's own failure is the API change, said once; bump.md beside the report; the terminal opens with it.
    bump = report["gate"]["bump"]
    failing = {f["id"] for f in bump["findings"] if f["fails"]}
    assert failing == {"api:ElasticBuffer", "backend:emulated-v2"}, sorted(failing)
    (backend,) = [r for r in report["gate"]["regressions"] if r.startswith("emulated-v2 held on")]
    assert "no attribute 'ElasticBuffer'" in backend and "renamed to EPBuffer (finding api:ElasticBuffer)" in backend
    assert [r["where"] for r in bump["api"]["migration"]] == ["ElasticBuffer"]
    text = (tmp_path / "r3" / "bump.md").read_text()
    assert text.startswith("# DeepEP bump: 2.1.0+emulation -> 2.1.0+emulation (planted: mutant "
                           "renamed-elastic-buffer)") and "| `ElasticBuffer` | `EPBuffer` |" in text
    summary = renamed.stdout[renamed.stdout.index("DeepEP conformance summary"):]
    assert summary.splitlines()[1].startswith("DeepEP bump 2.1.0+emulation -> 2.1.0+emulation: the bump 2.1.0 -> "
                                              "2.1.0 FAILS the gate"), summary[:2000]
    # ... and accepted: the same two reports pass the gate with both findings listed (and a stale entry reported)
    accept = tmp_path / "accept.toml"
    accept.write_text('[[accept]]\nfinding = "api:ElasticBuffer"\nwhy = "renamed upstream"\n\n[[accept]]\n'
                      'finding = "backend:emulated-v2"\nwhy = "our adapter moves to EPBuffer"\n\n[[accept]]\n'
                      'finding = "defect:*"\nwhy = "none expected"\n')
    accepted = explain(json.loads(baseline.read_text()), report, load_acceptance(str(accept)))
    assert accepted["regressions"] == [] and len(accepted["accepted"]) == 2, accepted["regressions"]
    assert [e["finding"] for e in accepted["stale_acceptances"]] == ["defect:*"]


def test_the_gate_reports_a_fixed_known_defect_without_failing(tmp_path: Path) -> None:
    baseline = tmp_path / "baseline.json"
    proc, _ = run_suite([PROPERTIES[1], *COMMON, f"--write-baseline={baseline}", "--allow-partial"], tmp_path / "r0")
    assert proc.returncode == 0, proc.stdout[-3000:]
    fixed, report = run_suite([PROPERTIES[1], *COMMON, "--baseline", str(baseline), "--allow-partial", "--mutant",
                               "v2-cached-dispatch-fixed"], tmp_path / "r1")
    assert fixed.returncode == 0, fixed.stdout[-3000:]
    assert report["gate"]["regressions"] == []
    (note,) = [i for i in report["gate"]["improvements"] if KNOWN in i]
    assert note.startswith(f"P12-bad-input: known defect {KNOWN} is fixed") and "Remove the entry from" in note
    known = {k["id"]: k for k in report["known_defects"]["entries"]}
    assert known[KNOWN]["status"] == "fixed" and known[KNOWN]["held"] >= 1
    assert f"known defect {KNOWN}: fixed" in fixed.stdout


def test_a_stored_counterexample_comes_back_first(tmp_path: Path, planted_run) -> None:
    """The same failing command twice, same report directory: the second run replays the stored counterexample
    before drawing, so it fails on its first example.  The first run is the session's planted run (P1 and P5 with a
    byte flip, tests/conftest.py: PLANTED_RUN), its report folder copied."""
    reports = tmp_path / "reports"
    shutil.copytree(planted_run.report_dir, reports)
    (entry,) = [p for p in planted_run.report["properties"] if p["id"] == "P1-per-expert-payloads"]
    before = entry["first_failure_at"]
    assert list((reports / "hypothesis").iterdir()), "no example database written"
    second, report = run_suite(PLANTED_RUN, reports)
    assert second.returncode == 1
    (again,) = [p for p in report["properties"] if p["id"] == "P1-per-expert-payloads"]
    assert again["counterexample"] == entry["counterexample"]
    assert again["first_failure_at"] == 1 < before, (before, again["first_failure_at"])
    assert f"--conformance-seed 1 --max-examples 10 --report-dir {reports}" in again["rerun"], again["rerun"]


def test_a_known_defect_that_kills_the_process_is_reported_as_known_not_failed(tmp_path: Path) -> None:
    """A library defect that crashes the rank (the real V1's SIGFPE in low_latency_combine) is matched by its
    known-defects entry like a wrong result: the property is known-defect, the world restarts, the run goes on;
    without the entry the same run fails."""
    entries = tmp_path / "known.toml"
    entries.write_text('''[[defect]]
id = "v2-dispatch-killed"
property = "P1-per-expert-payloads"
backend = "emulated-v2"
message = "SIGKILL in ElasticBuffer\\\\.dispatch"
reproduction = "pytest --mutant rank-dies-in-dispatch"
wrong = "the last rank dies inside ElasticBuffer.dispatch"
''')
    args = ["conformance/properties/test_p01_payloads.py", "--max-examples", "4", "--conformance-seed", "3",
            "-p", "no:xdist", "--mutant", "rank-dies-in-dispatch"]
    proc, report = run_suite([*args, f"--known-defects={entries}"], tmp_path / "known")
    p1 = next(p for p in report["properties"] if p["id"] == "P1-per-expert-payloads")
    assert proc.returncode == 0 and p1["status"] == "known-defect", proc.stdout[-3000:]
    assert p1["verdicts"]["emulated-v2"]["defects"]["v2-dispatch-killed"] >= 1, p1["verdicts"]
    # a known defect that retires the world stops the property after two examples: each would be a world restart
    assert p1["verdicts"]["emulated-v2"]["defects"]["v2-dispatch-killed"] == 2, p1["verdicts"]
    assert p1["stopped"] and "retired the world on 2 examples" in p1["stopped"], p1["stopped"]
    plain, report = run_suite([*args, "--known-defects=none", "--max-restarts", "1"], tmp_path / "plain")
    p1 = next(p for p in report["properties"] if p["id"] == "P1-per-expert-payloads")
    assert plain.returncode == 1 and p1["status"] == "failed", plain.stdout[-3000:]


#: The 2.5.0 emulation and the versioned contracts (issue 36) are on this branch: ``--deep-ep emulation:VERSION``.
VERSIONED = importlib.util.find_spec("conformance.versions") is not None
BUMP_PROPERTIES = ["conformance/properties/test_p01_payloads.py", "conformance/properties/test_p07_cached_dispatch.py",
                   "conformance/properties/test_p14_api_surface.py",
                   "conformance/properties/test_p26_worst_case_whole.py"]


@pytest.mark.skipif(not VERSIONED, reason="the DeepEP 2.5.0 emulation (issue 36, --deep-ep emulation:2.5.0) is not "
                                          "on this branch yet")
def test_the_2_1_0_to_2_5_0_bump_on_the_emulation_is_explained(tmp_path: Path) -> None:
    """The gate as a user without a GPU runs it: ``--deep-ep emulation:2.1.0 --write-baseline`` then ``--deep-ep
    emulation:2.5.0 --baseline``.  The explanation: V1 removed (one finding for emulated-v1, not one per property),
    ElasticBuffer -> EPBuffer with its changed parameters, V2's properties held on EPBuffer against 2.1.0's results,
    the recv_topk_idx defect still there; accepted, the same reports pass."""
    baseline = tmp_path / "old.json"
    common = [*BUMP_PROPERTIES, "--backends", "emulated", "--max-examples", "4", "--conformance-seed", "5", "-p",
              "no:xdist", "--allow-partial"]
    old, _ = run_suite([*common, "--deep-ep", "emulation:2.1.0", f"--write-baseline={baseline}"], tmp_path / "r0")
    assert old.returncode == 0, old.stdout[-3000:]
    new, report = run_suite([*common, "--deep-ep", "emulation:2.5.0", "--baseline", str(baseline)], tmp_path / "r1")
    assert new.returncode == 1, new.stdout[-3000:]
    bump = report["gate"]["bump"]
    assert (bump["before"]["deep_ep"], bump["after"]["deep_ep"]) == ("2.1.0+emulation", "2.5.0+emulation")
    rows = {r["baseline"]: r for r in bump["backends"]}
    assert rows["emulated-v1"]["status"] == "API removed" and rows["emulated-v2"]["class_now"] == "EPBuffer"
    table = {r["where"]: r for r in bump["api"]["migration"]}
    assert table["Buffer"]["now"] == "removed" and table["ElasticBuffer"]["now"] == "`EPBuffer`"
    assert table["EPBuffer.__init__(num_cpu_bytes)"]["kind"] == "removed-param"
    (v1,) = [r for r in report["gate"]["regressions"] if "emulated-v1" in r.split(":")[0]]
    assert v1.startswith("emulated-v1 (deep_ep.Buffer, the V1 contract): API removed") and "P1-per-expert" in v1
    failing = {f["id"] for f in bump["findings"] if f["fails"]}
    assert all(f.startswith("api:") for f in failing), sorted(failing)  # nothing of V2's behaviour was lost
    cells = {(t["property"], t["backend"]): t["change"] for t in bump["transitions"]}
    assert cells[("P26-worst-case-whole", "emulated-v2")].startswith("still there: "), cells
    assert bump["transition_counts"]["held"] >= 2  # P1, P7 on EPBuffer against ElasticBuffer's results
    assert (tmp_path / "r1" / "bump.md").read_text().startswith("# DeepEP bump: 2.1.0+emulation -> 2.5.0+emulation")
    accept = tmp_path / "accept.toml"
    accept.write_text('[[accept]]\nfinding = "api:*"\nwhy = "the 2.5.0 API: reviewed, our code moved to EPBuffer"\n')
    accepted = explain(json.loads(baseline.read_text()), report, load_acceptance(str(accept)))
    assert accepted["regressions"] == [] and not accepted["verdict"]["failed"], accepted["regressions"]
