"""The gate explains a bump, from reports alone (reporting.bump, reporting.gate, reporting.accept, reporting.schema).

The baseline is a kept report of the real DeepEP 2.1.0 (docs/real-runs, run 21c: real-v1, real-v2 and the seed PR's
Megatron on both paths, one H200).  The "2.5.0" side is **derived from it** by :func:`like_2_5_0`, which edits what
DeepEP 2.5.0 changed as issue 36 measured it on the real 2.5.0 (no ``Buffer``, ``ElasticBuffer`` renamed
``EPBuffer`` without ``num_cpu_bytes``; Megatron's ``HAVE_DEEP_EP`` and ``HAVE_DEEP_EP_V2`` both False,
``fused_dispatch is None``), plus one lost behaviour planted on ``real-v2`` (P7).  It stands in for a report of the
2.5.0 emulation until that emulation lands; every verdict not edited is the real run's.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from conformance.reporting.accept import load_acceptance
from conformance.reporting.bump import explain, main, markdown, terminal_lines
from conformance.reporting.gate import exit_status, match_backends
from conformance.reporting.schema import SCHEMA, upgrade
from tests.conftest import ROOT

REAL_2_1_0 = ROOT / "docs" / "real-runs" / "2026-12-05-1xH200" / "21c-megatron" / "conformance.json"
WRAPPERS = ("megatron-fused-a2a-v1", "megatron-fused-a2a-v2")
#: What the seed PR's fused_a2a checks at import, and found on the real 2.5.0 (issue 36's table).
OFF = {"HAVE_DEEP_EP": False, "HAVE_DEEP_EP_V2": False, "fused_dispatch is None": True}
ON = {"HAVE_DEEP_EP": True, "HAVE_DEEP_EP_V2": True, "fused_dispatch is None": False}
REMOVED_V1 = "DeepEP 2.5.0 removed the legacy Buffer"


@pytest.fixture(scope="module")
def old() -> dict:
    return json.loads(REAL_2_1_0.read_text())


def _column(status: str, reason: str, checked: int = 0) -> dict:
    return {"status": status, "checked": checked, "held": 0, "failed": int(status == "failed"), "known_defect": 0,
            "divergent": 0, "excluded": 0, "exclusions": {}, "defects": {}, "divergences": [], "reason": reason}


def like_2_5_0(report: dict) -> dict:
    """The real 2.1.0 report with 2.5.0's changes edited in (module docstring): the environment and probe, P14's
    surface, real-v1 unsupported (its API is gone), the wrappers' flags off and their construction failing, V1's
    known defects not listed, P7 failing on real-v2."""
    new = copy.deepcopy(report)
    env = new["environment"]
    env["deep_ep"] = "2.5.0"
    env["probes"]["deep_ep"].update(version="2.5.0", Buffer=False, ElasticBuffer=False, EPBuffer=True)
    for backend in env["backends"]:
        backend["deep_ep_seen"]["version"] = "2.5.0"
        if backend["name"] == "real-v2":
            backend["api"] = "EPBuffer"
        if backend["name"] in WRAPPERS:
            backend["wrapper"] = {"checked": dict(OFF), "drives_deep_ep": False,
                                  "why": "HAVE_DEEP_EP_V2 is False ('from deep_ep import ElasticBuffer' fails: this "
                                         "deep_ep has no ElasticBuffer); fused_dispatch is None"}
    for p in new["properties"]:
        verdicts = {}
        for column, verdict in p["verdicts"].items():
            names = column.split(" vs ")
            if " vs " in column and ({"real-v1", *WRAPPERS} & set(names)):
                continue  # a pair with a backend that checks nothing is not compared
            if column == "real-v1":
                verdict = _column("unsupported", REMOVED_V1)
            elif column in WRAPPERS:
                verdict = _column("failed", f"broken on buffer construction: {column}: a rank raised RuntimeError: "
                                            f"megatron.core.transformer.moe.fused_a2a found no deep_ep")
            elif column == "real-v2" and p["id"] == "P7-cached-dispatch":
                verdict = {**_column("failed", "recv_x differs from the first dispatch [EPBuffer.dispatch(x, "
                                               "handle=handle)]", checked=10), "held": 9}
            verdicts[column] = verdict
        p["verdicts"] = verdicts
        kept = {key for v in verdicts.values() for key in v.get("divergences") or []}
        p["divergences"] = {k: v for k, v in p["divergences"].items() if k in kept}  # shown by a pair that is gone
        if p["id"] == "P14-api-surface":
            surface = p["artifacts"]["api-surface:deep_ep"]["surface"]
            surface["probe"].update(Buffer=False, ElasticBuffer=False)
            del surface["classes"]["Buffer"]
            surface["classes"]["EPBuffer"] = surface["classes"].pop("ElasticBuffer")
            init = surface["classes"]["EPBuffer"]["__init__"]
            init["params"] = [q for q in init["params"] if q["name"] != "num_cpu_bytes"]
            surface["exports"] = ["EPBuffer", "EPHandle", "EventOverlap"]
    new["known_defects"]["entries"] = [k for k in new["known_defects"]["entries"] if not k["backend"].endswith("v1")]
    new["known_defects"]["file"] = "conformance/known_defects/deep_ep-2.5.0.toml"
    return new


def test_the_2_1_0_to_2_5_0_bump_is_explained_from_the_two_reports(old) -> None:
    bump = explain(old, like_2_5_0(old), baseline_path=str(REAL_2_1_0))
    assert (bump["before"]["deep_ep"], bump["after"]["deep_ep"], bump["version_changed"]) == ("2.1.0", "2.5.0", True)
    backends = {row["baseline"]: row for row in bump["backends"]}
    assert backends["real-v2"]["class_before"] == "ElasticBuffer" and backends["real-v2"]["class_now"] == "EPBuffer"
    assert backends["real-v2"]["status"] == "compared" and backends["real-v2"]["version_now"] == "2.5.0"
    assert backends["real-v1"]["status"] == "API removed" and backends["real-v1"]["finding"] == "api:Buffer"
    # the migration table, from the two P14 surfaces
    table = {row["where"]: row for row in bump["api"]["migration"]}
    assert bump["api"]["source"] == "surfaces"
    assert table["Buffer"]["now"] == "removed" and "V1 properties are unsupported" in table["Buffer"]["action"]
    assert "real-v1" in table["Buffer"]["action"]
    assert table["ElasticBuffer"]["now"] == "`EPBuffer`"
    assert "replace `deep_ep.ElasticBuffer` by `deep_ep.EPBuffer`" in table["ElasticBuffer"]["action"]
    assert table["EPBuffer.__init__(num_cpu_bytes)"]["action"] == "stop passing `num_cpu_bytes` to `EPBuffer.__init__`"
    assert "import Buffer" not in table  # said by the class' row
    # one finding per reason: no per-property finding for the removed V1 or the wrappers
    failing = {f["id"]: f for f in bump["findings"] if f["fails"]}
    (moved,) = [row for row in bump["api"]["migration"] if row["kind"] == "moved-param"]  # one row per method
    assert moved["where"] == "EPBuffer.__init__(...)" and moved["id"] == "api:EPBuffer.__init__(...)"
    assert len(moved["ids"]) == 13 and "`num_max_tokens_per_rank`" in moved["action"]  # every one after it
    assert moved["action"].endswith("to `EPBuffer.__init__` by keyword")
    assert set(failing) - set(moved["ids"]) == {"api:Buffer", "api:ElasticBuffer",
                                                "api:EPBuffer.__init__(num_cpu_bytes)", "P7-cached-dispatch:real-v2",
                                                "wrapper:megatron-fused-a2a-v1", "wrapper:megatron-fused-a2a-v2"}, \
        sorted(failing)
    assert failing["api:Buffer"]["kind"] == "api-removed" and failing["P7-cached-dispatch:real-v2"]["kind"] == "lost"
    (v1,) = [r for r in bump["regressions"] if r.startswith("real-v1")]
    assert "API removed in deep_ep 2.5.0" in v1 and "every V1 property is unsupported" in v1 and REMOVED_V1 in v1
    assert not [r for r in bump["regressions"] if r.startswith("P") and "real-v1" in r.split(":")[0]]
    (wrapper,) = [r for r in bump["regressions"] if r.startswith("megatron-fused-a2a-v2")]
    assert "stopped using DeepEP" in wrapper and "HAVE_DEEP_EP_V2 False" in wrapper
    assert "fused_dispatch is None True" in wrapper and "predates wrapper checks" in wrapper
    (p7,) = [r for r in bump["regressions"] if r.startswith("P7-")]
    assert p7.startswith("P7-cached-dispatch held in the baseline (deep_ep 2.1.0: passed on") and "on real-v2" in p7
    # per property and backend: the compared cells (real-v2), not the backends checked on nothing now
    cells = {(t["property"], t["backend"]): t for t in bump["transitions"]}
    assert cells[("P7-cached-dispatch", "real-v2")]["change"] == "lost: fails now"
    assert bump["transition_counts"]["held"] >= 10 and not any(b != "real-v2" for _, b in cells)
    assert cells[("P27-fresh-groups", "real-v2")]["change"].startswith("still there: v2-buffer-on-uninitialised")
    defects = {d["id"]: d["change"] for d in bump["defects"]}
    assert defects["v2-buffer-on-uninitialised-nccl-group-sigsegv"] == "still there"
    assert defects["v1-shrink-clean-needs-ibgda"].startswith("not listed for deep_ep 2.5.0")
    rows = {w["name"]: w for w in bump["wrappers"]}
    assert rows["megatron-fused-a2a-v2"]["change"] == "stopped using DeepEP"
    assert rows["megatron-fused-a2a-v2"]["before"]["drives_deep_ep"] is True  # from its 2.1.0 verdicts
    assert rows["megatron-fused-a2a-v2"]["after"]["checked"] == OFF
    assert bump["verdict"]["failed"] and bump["verdict"]["text"].startswith("the bump 2.1.0 -> 2.5.0 FAILS the gate")
    # the Markdown for a PR and the terminal's first lines
    text = markdown(bump)
    assert text.startswith("# DeepEP bump: 2.1.0 -> 2.5.0\n")
    for part in ("## What to change: the API", "| `Buffer` | removed |", "`api:ElasticBuffer`",
                 "## What fails the gate", "## Per property and backend", "## Known defects", "## Wrappers",
                 "`HAVE_DEEP_EP_V2` = False", "| real-v1 | V1 | `Buffer`, 2.1.0 |"):
        assert part in text, part
    lines = [line for line, _ in terminal_lines(bump, "reports/bump.md")]
    assert lines[0].startswith("DeepEP bump 2.1.0 -> 2.5.0: the bump 2.1.0 -> 2.5.0 FAILS the gate")
    assert any("Buffer removed" in line and "ElasticBuffer -> EPBuffer" in line for line in lines)
    assert "  real-v1: API removed (Buffer): 18 properties that held cannot run [api:Buffer]" in lines
    assert lines[-1] == "  the bump explained: reports/bump.md"
    assert any(line.startswith("  megatron-fused-a2a-v2: stopped using DeepEP; the wrapper checked HAVE_DEEP_EP False, "
                               "HAVE_DEEP_EP_V2 False") for line in lines)


def test_a_baseline_with_wrapper_checks_names_what_turned_off(old) -> None:
    """A schema-4 baseline records what the wrapper checked: the finding says which flag turned off."""
    baseline = copy.deepcopy(old)
    for backend in baseline["environment"]["backends"]:
        if backend["name"] in WRAPPERS:
            backend["wrapper"] = {"checked": dict(ON), "drives_deep_ep": True, "why": ""}
    bump = explain(baseline, like_2_5_0(old))
    (wrapper,) = [r for r in bump["regressions"] if r.startswith("megatron-fused-a2a-v2")]
    assert "HAVE_DEEP_EP_V2 True -> False" in wrapper and "fused_dispatch is None False -> True" in wrapper
    assert "With deep_ep 2.1.0 it drove DeepEP's V2 path" in wrapper and "predates" not in wrapper
    # the same wrapper, still driving DeepEP after the bump: no finding
    same = like_2_5_0(old)
    for backend in same["environment"]["backends"]:
        if backend["name"] in WRAPPERS:
            backend["wrapper"] = {"checked": dict(ON), "drives_deep_ep": True, "why": ""}
    for p in same["properties"]:
        p["verdicts"].update({name: old_p["verdicts"][name] for old_p in old["properties"] if old_p["id"] == p["id"]
                              for name in WRAPPERS if name in old_p["verdicts"]})
    rows = {w["name"]: w for w in explain(baseline, same)["wrappers"]}
    assert rows["megatron-fused-a2a-v2"]["change"] == "still drives DeepEP" and not rows["megatron-fused-a2a-v2"][
        "finding"]


def test_accepted_changes_pass_the_gate_and_a_stale_entry_is_listed(old, tmp_path: Path) -> None:
    accept = tmp_path / "accept.toml"
    accept.write_text('''
[[accept]]
finding = "api:*"
why = "we moved to EPBuffer"

[[accept]]
finding = "wrapper:megatron-fused-a2a-*"
why = "Megatron gets its EPBuffer path in its next release"

[[accept]]
finding = "P7-cached-dispatch:real-v2"
why = "2.5.0's cached dispatch takes topk_idx=None: reviewed"

[[accept]]
finding = "defect:no-such-defect"
why = "stale on purpose"
''')
    new = like_2_5_0(old)
    bump = explain(old, new, load_acceptance(str(accept)))
    assert bump["regressions"] == [] and not bump["verdict"]["failed"], bump["regressions"]
    accepted = {a["id"] for a in bump["accepted"]}
    assert {"api:Buffer", "api:ElasticBuffer", "api:EPBuffer.__init__(num_cpu_bytes)", "P7-cached-dispatch:real-v2",
            "wrapper:megatron-fused-a2a-v1", "wrapper:megatron-fused-a2a-v2"} <= accepted
    assert len(accepted) == 6 + 13  # and the 13 moved parameters of EPBuffer.__init__
    assert bump["stale_acceptances"] == [{"finding": "defect:no-such-defect", "why": "stale on purpose"}]
    assert "passes the gate" in bump["verdict"]["text"] and "(19 accepted)" in bump["verdict"]["text"]
    assert "### Accepted" in markdown(bump) and "`defect:no-such-defect`" in markdown(bump)
    # accepting the removal of V1 alone: its paragraph goes, the API paragraph keeps what is not accepted
    only_v1 = tmp_path / "v1.toml"
    only_v1.write_text('[[accept]]\nfinding = "api:Buffer"\nwhy = "V1 users stay on 2.1.0"\n')
    bump = explain(old, new, load_acceptance(str(only_v1)))
    assert not [r for r in bump["regressions"] if r.startswith("real-v1")]
    (api,) = [r for r in bump["regressions"] if r.startswith("P14-api-surface")]
    assert "ElasticBuffer: renamed to 'EPBuffer'" in api and "Buffer: class not found" not in api


def test_an_accepted_changes_file_is_checked(tmp_path: Path) -> None:
    cases = {"no why": '[[accept]]\nfinding = "api:Buffer"\n', "unknown key": 'accepted = 1\n',
             "empty finding": '[[accept]]\nfinding = ""\nwhy = "x"\n', "not toml": "[[accept\n"}
    for name, text in cases.items():
        path = tmp_path / f"{name}.toml"
        path.write_text(text)
        with pytest.raises(ValueError, match="--accept-bump"):
            load_acceptance(str(path))
    assert load_acceptance(None).entries == []


def test_reports_of_older_schemas_are_upgraded_and_a_newer_one_refused(old) -> None:
    assert old["schema"] == 3
    upgraded = upgrade(old)
    assert upgraded["schema"] == SCHEMA and upgraded["schema_written"] == 3 and old["schema"] == 3  # a copy
    contracts = {b["name"]: b["contract"] for b in upgraded["environment"]["backends"]}
    assert contracts == {"megatron-fused-a2a-v1": "V1", "megatron-fused-a2a-v2": "V2", "real-v1": "V1",
                         "real-v2": "V2"}
    assert all(b["wrapper"] is None for b in upgraded["environment"]["backends"] if "plugin" in b)
    with pytest.raises(ValueError, match="newer than this suite reads"):
        upgrade({**old, "schema": SCHEMA + 1})


def test_backends_are_matched_by_name_then_by_role() -> None:
    def report(*backends: tuple[str, str, bool]) -> dict:
        return {"environment": {"backends": [{"name": n, "api": a, "real": r} for n, a, r in backends]},
                "properties": []}

    emulated = report(("emulated-v1", "Buffer", False), ("emulated-v2", "ElasticBuffer", False))
    real = report(("real-v2", "EPBuffer", True))
    mapping, notes = match_backends(emulated, real)
    assert mapping == {"emulated-v2": "real-v2"}
    assert notes == ["emulated-v2 of the baseline is compared with real-v2 of this run (the same V2 contract, "
                     "another implementation)"]
    assert match_backends(real, report(("real-v2", "ElasticBuffer", True)))[0] == {"real-v2": "real-v2"}


def test_the_exit_status_is_the_gates_verdict() -> None:
    assert exit_status(False, 1) == 0  # the failures are the baseline's ("still fails")
    assert exit_status(True, 0) == 1 and exit_status(True, 1) == 1 and exit_status(False, 0) == 0
    assert exit_status(False, 2) == 2 and exit_status(True, 4) == 4  # interrupted, usage error: their own


def test_the_bump_of_two_kept_reports_is_written_for_docs(old, tmp_path: Path) -> None:
    new = tmp_path / "2.5.0.json"
    new.write_text(json.dumps(like_2_5_0(old)))
    out = tmp_path / "docs" / "bumps" / "2.1.0-to-2.5.0.md"
    assert main([str(REAL_2_1_0), str(new), "--out", str(out)]) == 0
    assert out.read_text().startswith("# DeepEP bump: 2.1.0 -> 2.5.0")
    assert main([str(REAL_2_1_0), str(new), "--out", str(out), "--gate"]) == 1
    assert main([str(REAL_2_1_0), str(REAL_2_1_0), "--gate"]) == 0  # a report against itself: nothing changed


REAL_2_5_0 = ROOT / "docs" / "real-runs" / "2026-12-06-1xH100" / "26-catalog25" / "conformance.json"
REAL_2_1_0_COLD = ROOT / "docs" / "real-runs" / "2026-12-06-1xH100" / "27a-catalog21-cold" / "conformance.json"


def test_the_real_rename_is_a_rename_and_a_rerun_replaces_its_properties(tmp_path: Path) -> None:
    """The two real runs (27a: 2.1.0, 26: 2.5.0, one H100): ``ElasticBuffer`` is renamed ``EPBuffer`` although 2.5.0
    dropped its agrs_/pp_/engram_ methods (judged on the methods the suite covers; those methods are listed as
    removed); a rerun of P12 (of the same version) replaces the run's P12 and its known defects, and is named; a
    rerun of another version is refused."""
    old, new = json.loads(REAL_2_1_0_COLD.read_text()), json.loads(REAL_2_5_0.read_text())
    bump = explain(old, new)
    table = {r["where"]: r for r in bump["api"]["migration"]}
    assert table["ElasticBuffer"]["now"] == "`EPBuffer`" and table["EPBuffer.pp_send"]["now"] == "removed"
    assert "P12-bad-input:real-v2" in {f["id"] for f in bump["findings"] if f["fails"]}  # run 26: the suite's fault
    rerun = copy.deepcopy(new)
    p12 = next(p for p in rerun["properties"] if p["id"] == "P12-bad-input")
    p12["status"], p12["verdicts"]["real-v2"] = "known-defect", dict(p12["verdicts"]["emulated-v2"])
    for other in rerun["properties"]:
        if other["id"] != "P12-bad-input":
            other["status"] = "not-run"
    path = tmp_path / "rerun.json"
    path.write_text(json.dumps(rerun))
    out = tmp_path / "bump.md"
    assert main([str(REAL_2_1_0_COLD), str(REAL_2_5_0), "--rerun", str(path), "--out", str(out)]) == 0
    text = out.read_text()
    assert f"Rerun: P12-bad-input from `{path}`" in text and "| P12-bad-input | real-v2 | known-defect | failed" \
        not in text
    rerun["environment"]["deep_ep"] = "2.1.0"
    path.write_text(json.dumps(rerun))
    assert main([str(REAL_2_1_0_COLD), str(REAL_2_5_0), "--rerun", str(path)]) == 2


REAL_P12_RERUN_2_5_0 = ROOT / "docs" / "real-runs" / "2026-12-06-1xH100" / "28e-p12-25" / "conformance.json"


def test_the_real_p12_rerun_turns_the_suites_finding_into_the_defect_still_there(tmp_path: Path,
                                                                                  monkeypatch) -> None:
    """Run 28e (P12 alone on the real 2.5.0, after ffd8b9d) as ``--rerun`` of run 26: ``P12-bad-input:real-v2`` is
    no longer a finding (it was the suite's comparison), the cached-dispatch defect is still there, the bump still
    fails the gate on its other findings (V1 removed, P22 lost, ...) and the document names the rerun; the kept
    docs/bumps/2.1.0-to-2.5.0.md is exactly this output (regenerated from the repository's root)."""
    monkeypatch.chdir(ROOT)
    reports = [str(p.relative_to(ROOT)) for p in (REAL_2_1_0_COLD, REAL_2_5_0, REAL_P12_RERUN_2_5_0)]
    out = tmp_path / "bump.md"
    assert main([reports[0], reports[1], "--rerun", reports[2], "--out", str(out), "--gate"]) == 1
    text = out.read_text()
    assert f"Rerun: P12-bad-input from `{reports[2]}`" in text
    assert "`P12-bad-input:real-v2`" not in text
    assert "| P12-bad-input | real-v2 | known-defect | known-defect | still there: " \
           "v2-cached-dispatch-without-num-experts |" in text
    assert (ROOT / "docs" / "bumps" / "2.1.0-to-2.5.0.md").read_text() == text


REAL_MEGATRON_2_1_0 = ROOT / "docs" / "real-runs" / "2026-12-06-1xH100" / "28b-megatron21" / "conformance.json"
REAL_MEGATRON_2_5_0 = ROOT / "docs" / "real-runs" / "2026-12-06-1xH100" / "28c-megatron25" / "conformance.json"


def test_without_p14_the_gate_reads_the_suites_snapshots_of_the_two_versions(tmp_path: Path, monkeypatch) -> None:
    """Runs 28b/28c (the seed PR's Megatron on the real 2.1.0 and 2.5.0, P14 in neither): the API table comes from
    the suite's snapshots of the two versions the runs drove, so ``ElasticBuffer`` is renamed ``EPBuffer`` (with its
    parameter changes), not removed; the wrappers' findings stay; docs/bumps/megatron-2.1.0-to-2.5.0.md is exactly
    this output.  A run whose import probe disagrees with its version's snapshot (a fork that kept ``ElasticBuffer``
    under the number 2.5.0) is compared by its probes instead."""
    from conformance.reporting.gate import api_changes, load_report

    monkeypatch.chdir(ROOT)
    old_report, new_report = load_report(str(REAL_MEGATRON_2_1_0)), load_report(str(REAL_MEGATRON_2_5_0))
    changes, source = api_changes(old_report, new_report)
    assert source == "snapshots"
    kinds = {c.where: c.kind for c in changes}
    assert kinds["ElasticBuffer"] == "renamed-class" and kinds["Buffer"] == "removed-class", kinds
    assert kinds["EPBuffer.__init__(num_cpu_bytes)"] == "removed-param", kinds
    reports = [str(p.relative_to(ROOT)) for p in (REAL_MEGATRON_2_1_0, REAL_MEGATRON_2_5_0)]
    out = tmp_path / "bump.md"
    assert main([*reports, "--out", str(out), "--gate"]) == 1
    text = out.read_text()
    assert "From the suite's API snapshots of the two deep_ep versions the runs drove" in text
    assert "| `ElasticBuffer` | `EPBuffer` | replace `deep_ep.ElasticBuffer` by `deep_ep.EPBuffer`" in text
    assert "`wrapper:megatron-fused-a2a-v1`" in text and "`wrapper:megatron-fused-a2a-v2`" in text
    assert (ROOT / "docs" / "bumps" / "megatron-2.1.0-to-2.5.0.md").read_text() == text
    fork = copy.deepcopy(new_report)
    fork["environment"]["probes"]["deep_ep"]["ElasticBuffer"] = True
    changes, source = api_changes(old_report, fork)
    assert source == "probes" and "ElasticBuffer" not in {c.where for c in changes}
