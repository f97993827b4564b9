"""Report entries: statuses, capability regressions, counterexample and reproduction line."""

from __future__ import annotations

import json
from types import SimpleNamespace

from conformance.core.spec import parse_backends
from conformance.harness.config import RunConfig
from conformance.reporting.report import USER_PROPERTY, entry_from_report, markdown, summarise
from conformance.reporting.schema import SCHEMA
from conformance.world.launcher import WorldShape

CONFIG = RunConfig(WorldShape(2, 2), tuple(parse_backends("emulated", False)))
EXAMPLE = '{"tokens_per_rank":[0,0,0,1],"hidden":128}'


def _report(outcome: str, **recorded) -> SimpleNamespace:
    base = {"id": "P5-combine", "examples": 25, "last_example": EXAMPLE, "divergences": {}, "unsupported": {},
            "artifacts": {}, "wall_s": 1.0}
    crash = SimpleNamespace(message="AssertionError: combined_x[rank 3, token 0, col 1] differs")
    return SimpleNamespace(
        user_properties=[(USER_PROPERTY, {**base, **recorded})], nodeid="conformance/properties/test_p05.py::t",
        failed=outcome == "failed", skipped=outcome == "skipped", longrepr=SimpleNamespace(reprcrash=crash),
    )


def test_failed_entry_carries_counterexample_and_repro() -> None:
    entry = entry_from_report(_report("failed"), CONFIG)
    assert entry.status == "failed" and entry.counterexample == json.loads(EXAMPLE)
    assert entry.repro.startswith("python -m conformance.repro P5-combine '{")
    assert "--nodes 2 --ranks-per-node 2 --backends emulated-v1,emulated-v2" in entry.repro
    assert "combined_x[rank 3" in entry.message


def test_rejection_the_other_api_accepts_is_a_capability_regression() -> None:
    rejected = {"emulated-v2": {"call": "ElasticBuffer.combine", "error": "RuntimeError", "count": 3,
                                "example": EXAMPLE}}
    entry = entry_from_report(_report("passed", unsupported=rejected), CONFIG)
    assert entry.status == "unsupported" and entry.counterexample is None
    info = entry.unsupported["emulated-v2"]
    assert info["capability_regression"] is True and info["accepted_by"] == ["emulated-v1"]
    both = {**rejected, "emulated-v1": dict(rejected["emulated-v2"], call="Buffer.combine")}
    entry = entry_from_report(_report("passed", unsupported=both), CONFIG)
    assert not entry.unsupported["emulated-v2"]["capability_regression"]


def test_the_emulation_refusing_what_the_real_library_took_is_no_capability_regression() -> None:
    """Run 21 (one H200): P29's emulated-v1 refusal was called a capability regression because real-v2 took the
    configurations; the migration's question is V2 against V1 of the same implementation."""
    config = RunConfig(WorldShape(1, 2), tuple(parse_backends("real-v1,real-v2,emulated-v1,emulated-v2", False)))
    rejected = {name: {"call": "dispatch", "error": "the emulation models no CUDA-graph capture", "count": 25,
                       "example": EXAMPLE} for name in ("emulated-v1", "emulated-v2")}
    entry = entry_from_report(_report("passed", unsupported=rejected), config)
    for name in rejected:
        assert entry.unsupported[name]["capability_regression"] is False, entry.unsupported[name]
    v2_only = {"real-v2": dict(rejected["emulated-v2"], call="ElasticBuffer.combine")}
    info = entry_from_report(_report("passed", unsupported=v2_only), config).unsupported["real-v2"]
    assert info["capability_regression"] is True and info["accepted_by"] == ["real-v1"]


def test_divergence_outranks_unsupported_and_markdown_names_everything() -> None:
    entry = entry_from_report(
        _report("passed", divergences={"P4": "V1 writes 0"}, unsupported={
            "emulated-v2": {"call": "c", "error": "e", "count": 1, "example": EXAMPLE}}), CONFIG)
    assert entry.status == "divergence"
    failed = entry_from_report(_report("failed"), CONFIG)
    document = {"environment": {"backends": [{"name": "emulated-v1", "real": False}], "nodes": 2,
                                "ranks_per_node": 2, "device": "cpu", "torch": "x", "deep_ep": None, "seed": 7},
                "wall_s": 1.0, "summary": summarise([entry, failed]), "properties": [vars(entry), vars(failed)]}
    text = markdown(document)
    assert "## FAILED P5-combine" in text and "Reproduce: `python -m conformance.repro" in text
    assert "## DIVERGENCE P5-combine: P4" in text and "Capability regression: emulated-v1" in text
    assert document["summary"]["failed"] == 1 and document["summary"]["divergence"] == 1


# ----------------------------------------------------------------------------------------- schema 3 verdicts
def _column(status: str, held: int, checked: int, excluded: int = 0, **extra) -> dict:
    return {"status": status, "checked": checked, "held": held, "failed": extra.pop("failed", 0),
            "known_defect": extra.pop("known_defect", 0), "divergent": 0, "excluded": excluded,
            "exclusions": {"ElasticBuffer.combine with hidden == 128": excluded} if excluded else {},
            "defects": extra.pop("defects", {}), "divergences": []}


def test_a_backend_checked_on_some_examples_is_not_unsupported_and_one_checked_on_none_is() -> None:
    partly = {"emulated-v1": _column("passed", 25, 25), "emulated-v2": _column("passed", 20, 20, 5),
              "emulated-v1 vs emulated-v2": _column("passed", 20, 20)}
    rejected = {"emulated-v2": {"call": "ElasticBuffer.combine", "error": "RuntimeError", "count": 5,
                                "condition": "ElasticBuffer.combine with hidden == 128", "example": EXAMPLE}}
    entry = entry_from_report(_report("passed", unsupported=rejected, verdicts=partly), CONFIG)
    assert entry.status == "passed" and entry.verdicts["emulated-v2"]["excluded"] == 5
    never = {**partly, "emulated-v2": _column("unsupported", 0, 0, 25)}
    assert entry_from_report(_report("passed", unsupported=rejected, verdicts=never), CONFIG).status == "unsupported"
    known = {**partly, "emulated-v2": _column("known-defect", 19, 20, 5, known_defect=1, defects={"kd": 1})}
    assert entry_from_report(_report("passed", verdicts=known), CONFIG).status == "known-defect"


def test_the_matrix_says_the_verdict_the_counts_and_the_exclusion_beside_it() -> None:
    from conformance.reporting.matrix import cell
    from conformance.reporting.report import markdown_matrix, step_summary, summary_lines

    verdicts = {"emulated-v1": _column("passed", 25, 25), "emulated-v2": _column("passed", 20, 20, 5),
                "emulated-v1 vs emulated-v2": _column("passed", 20, 20)}
    entry = entry_from_report(_report("passed", verdicts=verdicts), CONFIG)
    failed = entry_from_report(_report("failed", verdicts={"emulated-v1": _column("failed", 3, 4, failed=1)}),
                               CONFIG)
    failed.id = "P1-per-expert-payloads"
    document = {"environment": {"backends": [{"name": "emulated-v1", "real": False},
                                             {"name": "emulated-v2", "real": False}], "seed": 7},
                "properties": [vars(entry), vars(failed)], "summary": summarise([entry, failed]), "complete": True,
                "path": "reports/conformance.json", "headline": []}
    status, reason = cell(vars(entry), "emulated-v2")
    assert status == "passed" and "20/20 checked examples held" in reason
    assert "5 excluded by a known limit (ElasticBuffer.combine with hidden == 128: 5)" in reason
    table = "\n".join(markdown_matrix(document))
    assert "| P5-combine | passed | passed 25/25 | passed 20/20 +5x" in table and "**FAILED** 3/4" in table
    assert "## DeepEP conformance" in step_summary(document) and "| property | status |" in step_summary(document)
    lines = [text for text, _ in summary_lines(document)]
    assert lines[0].split()[:5] == ["property", "status", "emulated-v1", "emulated-v2", "emu1~emu2"]
    assert any(line.startswith("P5-combine") and "passed 20/20 +5x" in line for line in lines)
    assert any(line.startswith("slowest: ") for line in lines)


def test_github_step_summary_gets_the_matrix(tmp_path, monkeypatch) -> None:
    from conformance.reporting.report import finish_run

    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    entry = entry_from_report(_report("passed", verdicts={"emulated-v1": _column("passed", 25, 25)}), CONFIG)
    document = finish_run(str(tmp_path / "reports"), CONFIG, [entry], 1.0, write_baseline=str(tmp_path / "b.json"))
    # One property of the catalog ran: a partial run, whose baseline is refused unless asked for.
    assert not (tmp_path / "b.json").exists() and "this run is partial" in document["baseline_refused"]
    summary.write_text("earlier step\n")
    document = finish_run(str(tmp_path / "reports"), CONFIG, [entry], 1.0, write_baseline=str(tmp_path / "b.json"),
                          allow_partial=True)
    text = summary.read_text()
    assert text.startswith("earlier step\n## DeepEP conformance") and "| P5-combine | passed | passed 25/25" in text
    assert json.loads((tmp_path / "b.json").read_text())["schema"] == SCHEMA
    assert document["step_summary"] == str(summary)
