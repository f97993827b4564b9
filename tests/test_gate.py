"""The version gate flags regressions (failures, lost capabilities, API changes) and only those."""

import json

import pytest

from conformance.reporting.gate import compare, load_report


def _report(*entries: dict) -> dict:
    return {"properties": [{"unsupported": {}, "artifacts": {}, "message": None, **e} for e in entries]}


def test_a_property_that_held_and_now_fails_is_a_regression() -> None:
    gate = compare(_report({"id": "P1", "status": "passed"}), _report({"id": "P1", "status": "failed", "message": "x"}))
    assert len(gate["regressions"]) == 1 and "P1: passed in the baseline, failed now" in gate["regressions"][0]


def test_a_lost_capability_and_an_api_change_are_regressions() -> None:
    old = _report({"id": "P5", "status": "passed"}, {"id": "P14", "status": "passed", "artifacts": {"v2": [1]}})
    new = _report(
        {"id": "P5", "status": "unsupported",
         "unsupported": {"real-v2": {"call": "ElasticBuffer.combine", "error": "RuntimeError: Invalid hidden"}}},
        {"id": "P14", "status": "passed", "artifacts": {"v2": [2]}},
    )
    regressions = compare(old, new)["regressions"]
    assert any("capability lost on real-v2" in r for r in regressions)
    assert any("API surface changed: v2" in r for r in regressions)


def test_fixes_and_gains_are_improvements_not_regressions() -> None:
    old = _report({"id": "P5", "status": "failed", "unsupported": {"real-v2": {}}})
    new = _report({"id": "P5", "status": "passed"}, {"id": "P15", "status": "passed"})
    gate = compare(old, new)
    assert gate["regressions"] == [] and len(gate["improvements"]) == 3


def test_a_vanished_property_is_a_regression_and_an_unchanged_run_is_clean() -> None:
    base = _report({"id": "P1", "status": "passed"}, {"id": "P4", "status": "divergence"})
    assert compare(base, _report({"id": "P1", "status": "passed"}))["regressions"] == [
        "P4: ran in the baseline, missing now"
    ]
    assert compare(base, base) == {"regressions": [], "improvements": []}


def test_a_bad_baseline_file_is_named(tmp_path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"nope": 1}))
    with pytest.raises(ValueError, match="not a conformance.json"):
        load_report(str(bad))
    with pytest.raises(ValueError, match="not a readable conformance report"):
        load_report(str(tmp_path / "missing.json"))
