"""The integrator's change under test: the seed PR's Megatron-Core ``fused_a2a`` with a DeepEP V2 path, both paths
side by side on the emulation (CPU, gloo, 1 node x 2 ranks).

Test input, never copied into the project: ``../shared/clients/megatron-seed-pr/fused_a2a-deepep-v2.patch`` (or
the file ``CONFORMANCE_MEGATRON_SEED_PR`` names), applied to megatron-core 0.16.1 in a cache folder.  Where the
patch is absent the test is skipped, saying so.

What must hold (issue 24):
- every property gets a verdict on both wrapper paths (``megatron-fused-a2a-v1``: the legacy path forced,
  ``megatron-fused-a2a-v2``: the V2 path), none of them caused by the suite's own calls: every failure is the
  wrapper's (P25: the V2 path's module-global ElasticBuffer kills the process at exit) and every non-pass says why;
- the divergences of the two paths are listed ("what changes"), and docs/integrators.md shows the run's table;
- the exit-time crash is reported as a defect of the wrapper, the same one the raw V2 shows as the library's known
  defect when a user leaves a buffer to the garbage collector;
- ``megatron-fused-a2a-v2`` on a Megatron without a V2 path is refused in one line before any rank starts.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from conformance.integrations import MEGATRON_CAPABILITIES
from tests.conftest import ROOT, completed, once_per_session, process, run_suite
from tests.helpers.expectations import expected_for
from tests.helpers.installs import patched_install, target_install
from tests.nocover.test_integrators_megatron import PINNED, entry_point_dir

pytestmark = pytest.mark.slow  # a whole run of the suite or more: scheduled first (tests/conftest.py)

PATCH = Path(os.environ.get("CONFORMANCE_MEGATRON_SEED_PR")
             or ROOT.parent / "shared" / "clients" / "megatron-seed-pr" / "fused_a2a-deepep-v2.patch")
V1, V2 = "megatron-fused-a2a-v1", "megatron-fused-a2a-v2"
BACKENDS = f"{V1},{V2},emulated-v1,emulated-v2"
#: Properties both paths take (derived from the catalog and Megatron's declaration), with the verdict each path must
#: get: held (passed or a documented divergence), except where the comparison below says a path fails.
HOLDS = tuple(pid for pid in expected_for("v1", MEGATRON_CAPABILITIES).checked
              if pid in expected_for("v2", MEGATRON_CAPABILITIES).checked and pid != "P25-clean-exit")
#: What the two paths' comparison must show (the run finds it; docs/integrators.md lists it).
CHANGES = {"P4-weights": "recv_topk_weights at -1 slots", "P9-gradients": "P9-weight-grads-at-non-local-slots",
           "P25-clean-exit": "the V2 path fails"}


def seed_pr_megatron() -> str:
    """megatron-core 0.16.1 with the seed PR applied (a cache folder), or skip saying why."""
    if not PATCH.is_file():
        pytest.skip(f"the seed PR's patch is not here ({PATCH}; set CONFORMANCE_MEGATRON_SEED_PR to its path)")
    for module in ("numpy", "packaging"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"megatron-core needs {module}, which is not installed here")
    return str(patched_install(f"megatron-core=={PINNED}", f"megatron-core-{PINNED}+seed-pr", PATCH))


def entry_points(tmp_path: Path) -> str:
    """The plug-ins' entry points, registered as an installed deepep-conformance registers them."""
    info = tmp_path / "ep" / "megatron_v2_selftest-0.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: megatron-v2-selftest\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text(
        "[deepep_conformance.backends]\n"
        f"{V1} = conformance.integrations.megatron:MegatronFusedA2AV1\n"
        f"{V2} = conformance.integrations.megatron:MegatronFusedA2AV2\n")
    return str(tmp_path / "ep")


@pytest.fixture(scope="session")
def both_paths(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> tuple[object, dict]:
    """The catalog on both paths of the seed PR's Megatron beside the raw emulated APIs: one run per session."""
    def make(tmp: Path) -> dict:
        tmp.mkdir(parents=True, exist_ok=True)
        proc, report = run_suite(["-p", "no:xdist", "--nodes", "1", "--backends", BACKENDS, "--deep-ep", "emulation",
                                  "--device", "cpu", "--max-examples", "3", "--conformance-seed", "7"],
                                 tmp / "reports", timeout=900, extra_path=(seed_pr_megatron(), entry_points(tmp)))
        return {"proc": completed(proc), "report": report}

    made = once_per_session(tmp_path_factory, worker_id, "megatron-v2-both-paths", make)
    return process(made["proc"]), made["report"]


def test_both_paths_get_a_verdict_on_every_property_and_only_the_wrappers_own_defect_fails(both_paths) -> None:
    proc, report = both_paths
    assert report, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert proc.returncode == 1, proc.stdout[-4000:]  # the wrapper's exit-time defect (P25)
    failed = {p["id"] for p in report["properties"] if p["status"] == "failed"}
    assert failed == {"P25-clean-exit"}, [(p["id"], (p["message"] or "")[:600]) for p in report["properties"]
                                           if p["status"] == "failed"]
    by_id = {p["id"]: p for p in report["properties"]}
    for pid in HOLDS:
        for path in (V1, V2):
            verdict = by_id[pid]["verdicts"][path]
            assert verdict["status"] in ("passed", "divergence") and verdict["held"] > 0, (pid, path, verdict)
    for p in report["properties"]:
        for path in (V1, V2):
            verdict = p["verdicts"].get(path)
            assert verdict is not None, (p["id"], path)
            assert verdict["status"] in ("passed", "divergence", "failed", "unsupported", "skipped"), (p["id"], verdict)
            assert verdict["status"] in ("passed", "divergence") or verdict.get("reason"), (p["id"], path, verdict)
    # the pairs that mean something: each path with the raw API under it, and the two paths with each other
    for pair in (f"emulated-v1 vs {V1}", f"emulated-v2 vs {V2}", f"{V1} vs {V2}"):
        assert by_id["P1-per-expert-payloads"]["verdicts"][pair]["status"] == "passed", pair
    assert "emulated-v2 vs megatron-fused-a2a-v1" not in by_id["P1-per-expert-payloads"]["verdicts"]


def test_the_exit_time_crash_is_the_wrappers_defect(both_paths) -> None:
    _, report = both_paths
    exit_check = next(p for p in report["properties"] if p["id"] == "P25-clean-exit")
    v1, v2 = exit_check["verdicts"][V1], exit_check["verdicts"][V2]
    assert v1["status"] == "passed", v1
    assert v2["status"] == "failed", v2
    assert "A defect of the wrapper" in v2["reason"] and "illegal memory access" in v2["reason"], v2["reason"]
    assert "after destroy_process_group()" in v2["reason"], v2["reason"]
    # the raw V2 shows the library's side of it as its known defect; the raw V1 exits cleanly either way
    assert exit_check["verdicts"]["emulated-v2"]["defects"] == {"v2-buffer-outlives-process-group": 1}
    assert exit_check["verdicts"]["emulated-v1"]["status"] == "passed"
    assert exit_check["repro"] and "P25-clean-exit" in exit_check["repro"]


def test_what_changes_for_the_wrappers_users_is_listed_and_documented(both_paths) -> None:
    from conformance.reporting.migration import BEGIN, block_of, markdown

    _, report = both_paths
    (migration,) = report["migration"]
    assert (migration["family"], migration["v1"], migration["v2"]) == ("megatron-fused-a2a", V1, V2)
    rows = {row["property"]: row for row in migration["rows"]}
    for pid, text in CHANGES.items():
        assert any(text in change for change in rows[pid]["changes"]), (pid, rows[pid])
    assert {pid for pid, row in rows.items() if row["changes"]} == set(CHANGES), rows
    docs = (ROOT / "docs" / "integrators.md").read_text()
    assert BEGIN in docs
    assert block_of(docs) == "\n".join(markdown(report, changes_only=True)).strip(), (
        "docs/integrators.md's table differs from this run's: python -m conformance.reporting.migration "
        "REPORT --write-docs docs/integrators.md (REPORT: this test's conformance.json)")


def test_a_v2_backend_on_a_megatron_without_a_v2_path_is_refused_in_one_line(tmp_path: Path) -> None:
    released = str(target_install(f"megatron-core=={PINNED}", f"megatron-core-{PINNED}"))
    proc, _ = run_suite(["-p", "no:xdist", "--backends", f"emulated-v2,{V2}", "--deep-ep", "emulation",
                         "--device", "cpu"], tmp_path / "reports", extra_path=(released, entry_points(tmp_path),
                                                                               entry_point_dir(tmp_path)))
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if "megatron-fused-a2a-v2" in line]
    assert len(lines) == 1 and "has no DeepEP V2 path" in lines[0], proc.stderr[-2000:]


#: The DeepEP 2.5.0 emulation (issue 36) is on this branch: the bump below runs on it, else on a mutant.
VERSIONED = importlib.util.find_spec("conformance.versions") is not None


def test_the_gate_says_the_wrapper_stops_using_deep_ep_through_a_bump(both_paths, tmp_path: Path) -> None:
    """Wrappers through the bump: the session's run (both paths on the 2.1.0 emulation) is the baseline; the new
    side is the 2.5.0 emulation (``--deep-ep emulation:2.5.0``: no ``Buffer``, no ``ElasticBuffer``; both paths turn
    off, as measured on the real 2.5.0), or, before that emulation is on the branch, the 2.1.0 emulation with
    ``ElasticBuffer`` renamed ``EPBuffer`` (the mutant: only the V2 path turns off).  The seed PR's ``from deep_ep
    import ElasticBuffer`` fails there.  What each path's wrapper checked is in both reports, and the gate says it
    once: ``wrapper:megatron-fused-a2a-v2`` stopped using DeepEP (``HAVE_DEEP_EP_V2`` True -> False), neither
    ``unsupported`` nor a failure per property."""
    _, old = both_paths
    flags = {b["name"]: b["wrapper"] for b in old["environment"]["backends"] if "plugin" in b}
    on = {"HAVE_DEEP_EP": True, "HAVE_DEEP_EP_V2": True, "fused_dispatch is None": False}
    assert flags == {V1: {"checked": on, "drives_deep_ep": True, "why": ""},
                     V2: {"checked": on, "drives_deep_ep": True, "why": ""}}, flags
    baseline = tmp_path / "old.json"
    baseline.write_text(json.dumps(old))
    new = (["--deep-ep", "emulation:2.5.0", "--backends", f"{V1},{V2},emulated-v2"] if VERSIONED else
           ["--deep-ep", "emulation", "--backends", f"{V1},{V2},emulated-v1", "--mutant", "renamed-elastic-buffer"])
    proc, report = run_suite(["-p", "no:xdist", "--nodes", "1", *new, "--device", "cpu", "--max-examples", "2",
                              "--baseline", str(baseline), "--allow-partial",
                              "conformance/properties/test_p01_payloads.py"],
                             tmp_path / "reports", timeout=600, extra_path=(seed_pr_megatron(), entry_points(tmp_path)))
    assert report, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert proc.returncode == 1, proc.stdout[-4000:]
    (v2,) = [b for b in report["environment"]["backends"] if b["name"] == V2]
    assert v2["wrapper"]["drives_deep_ep"] is False and v2["wrapper"]["checked"]["HAVE_DEEP_EP_V2"] is False
    assert "this deep_ep has no ElasticBuffer" in v2["wrapper"]["why"]
    p1 = next(p for p in report["properties"] if p["id"] == "P1-per-expert-payloads")
    assert p1["verdicts"][V2]["status"] == "failed", p1["verdicts"]
    assert p1["verdicts"][V1]["status"] == ("failed" if VERSIONED else "passed"), p1["verdicts"]
    gate = report["gate"]
    (paragraph,) = [r for r in gate["regressions"] if r.startswith(V2)]
    assert "the wrapper stopped using DeepEP" in paragraph and "HAVE_DEEP_EP_V2 True -> False" in paragraph
    assert not [r for r in gate["regressions"] if r.startswith("P1-") and V2 in r], gate["regressions"]
    rows = {w["name"]: w for w in gate["bump"]["wrappers"]}
    assert rows[V2]["change"] == "stopped using DeepEP" and rows[V2]["finding"] == f"wrapper:{V2}"
    if VERSIONED:  # 2.5.0 has no Buffer either: the legacy path turns off too (HAVE_DEEP_EP)
        assert rows[V1]["change"] == "stopped using DeepEP" and rows[V1]["after"]["checked"]["HAVE_DEEP_EP"] is False
    else:
        assert rows[V1]["change"] == "still drives DeepEP" and not rows[V1]["finding"]
    assert f"wrapper:{V2}" in {f["id"] for f in gate["findings"] if f["fails"]}
    assert "## Wrappers (plug-ins)" in (tmp_path / "reports" / "bump.md").read_text()
