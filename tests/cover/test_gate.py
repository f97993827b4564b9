"""The version gate: one paragraph per reason to fail, fixes reported, additions listed, schema-2 baselines read."""

import copy
import json

import pytest

from conformance.core.api_surface import load_snapshot
from conformance.reporting.gate import compare, load_report


def _column(status: str, held: int = 10, excluded: int = 0, **extra) -> dict:
    return {"status": status, "checked": held if status != "unsupported" else 0, "held": held, "failed": 0,
            "known_defect": 0, "divergent": 0, "excluded": excluded,
            "exclusions": {"ElasticBuffer.combine with hidden == 128": excluded} if excluded else {}, "defects": {},
            "divergences": [], **extra}


def _entry(pid: str, status: str = "passed", **fields) -> dict:
    verdicts = fields.pop("verdicts", {"real-v1": _column("passed"), "real-v2": _column("passed")})
    return {"id": pid, "status": status, "examples": 10, "unsupported": {}, "artifacts": {}, "message": None,
            "divergences": {}, "verdicts": verdicts, "counterexample": None, "repro": None, **fields}


def _report(*entries: dict, known: list | None = None) -> dict:
    return {"schema": 3, "environment": {"deep_ep": "2.1.0", "backends": [{"name": "real-v1", "real": True}]},
            "properties": list(entries), "known_defects": {"file": "k.toml", "entries": known or []}}


def test_a_property_that_held_and_now_fails_is_one_paragraph_naming_the_backend_and_the_case() -> None:
    failed = _entry("P1", "failed", message="recv_x[rank 1, expert 3] bytes differ", counterexample={"hidden": 256},
                    repro="python -m conformance.repro P1 '{}'",
                    verdicts={"real-v1": _column("passed"), "real-v2": {**_column("failed"), "failed": 1}})
    gate = compare(_report(_entry("P1")), _report(failed))
    (paragraph,) = gate["regressions"]
    assert paragraph.startswith("P1 held in the baseline (deep_ep 2.1.0: passed on 10 examples) and fails now on "
                                "real-v2")
    assert "bytes differ" in paragraph and '{"hidden":256}' in paragraph and "python -m conformance.repro" in paragraph


def test_a_capability_that_became_unsupported_fails_and_partial_exclusions_do_not() -> None:
    old = _report(_entry("P5"))
    partly = _report(_entry("P5", verdicts={"real-v1": _column("passed"), "real-v2": _column("passed", 7, 3)}))
    assert compare(old, partly)["regressions"] == []
    gone = _report(_entry("P5", "unsupported", verdicts={"real-v1": _column("passed"),
                                                          "real-v2": _column("unsupported", 0, 10)}))
    (paragraph,) = compare(old, gone)["regressions"]
    assert "capability became unsupported on real-v2" in paragraph and "hidden == 128 (10 examples)" in paragraph
    assert compare(gone, old)["improvements"] == [
        "P5: capability gained on real-v2 (unsupported in the baseline, passed on 10 example(s) now)."]


def test_divergences_that_appear_disappear_or_change_their_description_fail() -> None:
    base = _report(_entry("P4", "divergence", divergences={"weights": "V1 writes 0"}))
    assert compare(base, base) == {"regressions": [], "improvements": [], "additions": []}
    appeared = compare(_report(_entry("P4")), base)["regressions"]
    assert len(appeared) == 1 and "a divergence appeared" in appeared[0] and "V1 writes 0" in appeared[0]
    gone = compare(base, _report(_entry("P4")))["regressions"]
    assert len(gone) == 1 and "is gone" in gone[0]
    changed = compare(base, _report(_entry("P4", "divergence", divergences={"weights": "V1 writes NaN"})))
    assert len(changed["regressions"]) == 1 and "changed its description" in changed["regressions"][0]


def test_a_new_known_defect_fails_and_a_fixed_one_is_reported_not_failed() -> None:
    failing = {"id": "kd", "property": "P12", "status": "known-defect", "failed": 3, "wrong": "TypeError",
               "reproduction": "dispatch(x, handle=h)"}
    fixed = {**failing, "status": "fixed", "failed": 0, "held": 4}
    old, new = _report(_entry("P12"), known=[failing]), _report(_entry("P12"), known=[fixed])
    gate = compare(old, new)
    assert gate["regressions"] == [] and len(gate["improvements"]) == 1
    assert "known defect kd is fixed" in gate["improvements"][0] and "Remove the entry from k.toml" in \
        gate["improvements"][0]
    (paragraph,) = compare(new, old)["regressions"]
    assert "known defect kd is new" in paragraph and "dispatch(x, handle=h)" in paragraph
    not_reached = _report(_entry("P12"), known=[{**failing, "status": "not-reached", "failed": 0}])
    assert compare(not_reached, old)["regressions"] == []  # not drawn in the baseline: no claim either way


def _surface_report(surface: dict) -> dict:
    return _report(_entry("P14", artifacts={"api-surface:deep_ep": {"surface": surface}}))


def test_api_surface_renamed_class_renamed_keyword_and_return_arity_fail_additions_are_listed() -> None:
    old = copy.deepcopy(load_snapshot())
    old["returns"] = {"ElasticBuffer.dispatch": 5, "ElasticBuffer.combine": 3}
    renamed = copy.deepcopy(old)
    renamed["classes"]["EPBuffer"] = renamed["classes"].pop("ElasticBuffer")
    renamed["probe"]["ElasticBuffer"] = False
    (paragraph,) = compare(_surface_report(old), _surface_report(renamed))["regressions"]
    assert "ElasticBuffer: renamed to 'EPBuffer'" in paragraph and "import ElasticBuffer" in paragraph
    kwarg = copy.deepcopy(old)
    for p in kwarg["classes"]["ElasticBuffer"]["dispatch"]["params"]:
        if p["name"] == "num_max_tokens_per_rank":
            p["name"] = "max_tokens_per_rank"
    kwarg["returns"]["ElasticBuffer.dispatch"] = 4
    (paragraph,) = compare(_surface_report(old), _surface_report(kwarg))["regressions"]
    assert "ElasticBuffer.dispatch(num_max_tokens_per_rank): renamed to 'max_tokens_per_rank'" in paragraph
    assert "ElasticBuffer.dispatch(): returns a 4-tuple, was a 5-tuple" in paragraph
    added = copy.deepcopy(old)
    added["classes"]["ElasticBuffer"]["combine"]["params"].append(
        {"name": "do_zero_padding", "kind": "POSITIONAL_OR_KEYWORD", "default": "False"})
    gate = compare(_surface_report(old), _surface_report(added))
    assert gate["regressions"] == [] and any("do_zero_padding" in a for a in gate["additions"])


def test_a_vanished_property_fails_and_a_new_one_is_listed() -> None:
    base = _report(_entry("P1"), _entry("P4", "divergence"))
    gate = compare(base, _report(_entry("P1"), _entry("P15")))
    assert len(gate["regressions"]) == 1 and gate["regressions"][0].startswith("P4 ran in the baseline")
    assert gate["additions"] == ["P15 is a new property (not in the baseline): passed now."]


def test_a_schema_2_baseline_is_read() -> None:
    """Schema 2 had no per-backend verdicts (V2's partial rejections made P5 'unsupported') and reported V2's cached
    dispatch TypeError as a divergence: neither is a regression against the same library in schema 3."""
    old = {"schema": 2, "environment": {"deep_ep": "2.1.0"}, "properties": [
        {"id": "P5", "status": "unsupported", "backends": ["real-v1", "real-v2"], "examples": 25, "artifacts": {},
         "divergences": {}, "unsupported": {"real-v2": {"call": "ElasticBuffer.combine", "error": "RuntimeError"}}},
        {"id": "P12", "status": "divergence", "backends": ["real-v1", "real-v2"], "examples": 25, "artifacts": {},
         "unsupported": {}, "divergences": {"real-v2:cached-dispatch-without-num-experts": "TypeError ..."}},
        {"id": "P1", "status": "passed", "backends": ["real-v1", "real-v2"], "examples": 25, "artifacts": {},
         "unsupported": {}, "divergences": {}}]}
    kd = {"id": "v2-cached-dispatch-without-num-experts", "property": "P12", "status": "known-defect", "failed": 2}
    new = _report(_entry("P5", verdicts={"real-v1": _column("passed"), "real-v2": _column("passed", 20, 5)}),
                  _entry("P12", "known-defect"), _entry("P1"), known=[kd])
    assert compare(old, new)["regressions"] == []
    broken = _report(_entry("P5"), _entry("P12", "known-defect"), _entry("P1", "failed", message="x"), known=[kd])
    (paragraph,) = compare(old, broken)["regressions"]
    assert paragraph.startswith("P1 held in the baseline")


def test_a_bad_baseline_file_is_named(tmp_path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"nope": 1}))
    with pytest.raises(ValueError, match="not a conformance.json"):
        load_report(str(bad))
    with pytest.raises(ValueError, match="not a readable conformance report"):
        load_report(str(tmp_path / "missing.json"))


def test_a_failure_the_baseline_had_is_still_there_and_a_new_one_fails_per_backend() -> None:
    """Judged per backend: real-v2 failed before and fails now (the baseline's: reported, not failed); real-v1 held
    before and fails now beside it (lost, though the property's status was 'failed' in both); a backend the
    baseline did not have, failing now, fails too."""
    v2_fails = {**_column("failed"), "failed": 1, "reason": "TypeError in ElasticBuffer.dispatch"}
    old = _report(_entry("P12", "failed", verdicts={"real-v1": _column("passed"), "real-v2": v2_fails}))
    same = compare(old, old)
    assert same["regressions"] == []
    from conformance.reporting.gate import Comparison

    assert Comparison(old, old).still_failing == ["P12 on real-v2: failed in the baseline and fails now: TypeError "
                                                  "in ElasticBuffer.dispatch"]
    worse = _report(_entry("P12", "failed", message="rank 0 raised", verdicts={
        "real-v1": {**_column("failed"), "failed": 1}, "real-v2": v2_fails}))
    (paragraph,) = compare(old, worse)["regressions"]
    assert paragraph.startswith("P12 held in the baseline (deep_ep 2.1.0: passed on 10 examples) and fails now on "
                                "real-v1 (deep_ep 2.1.0): rank 0 raised")
    new_backend = _report(_entry("P12", "failed", message="x", verdicts={
        "real-v1": _column("passed"), "real-v2": v2_fails, "v2=pkg:MyBuffer": {**_column("failed"), "failed": 1}}))
    (paragraph,) = compare(old, new_backend)["regressions"]
    assert paragraph.startswith("P12 fails now on v2=pkg:MyBuffer, which the baseline did not check")


def test_a_backend_checked_on_nothing_now_is_one_finding() -> None:
    """real-v2 broken on construction: one paragraph with the cause (not one per property); P14's failure is the
    API change it reports, said once."""
    broken = {**_column("failed", 0), "checked": 0, "held": 0, "failed": 1,
              "reason": "broken on buffer construction: real-v2: a rank raised AttributeError: module 'deep_ep' has "
                        "no attribute 'ElasticBuffer'"}
    old = _report(_entry("P1"), _entry("P5"), _entry("P7"))
    new = _report(*[_entry(pid, "failed", message="broken", verdicts={"real-v1": _column("passed"),
                                                                      "real-v2": broken})
                    for pid in ("P1", "P5", "P7")])
    (paragraph,) = compare(old, new)["regressions"]
    assert paragraph.startswith("real-v2 held on 3 properties in the baseline (deep_ep 2.1.0) and is checked on none "
                                "now: broken on buffer construction") and "no attribute 'ElasticBuffer'" in paragraph


def test_a_backend_whose_version_removed_its_api_is_api_removed_without_surfaces() -> None:
    """The run says a backend's API is gone from its version (``removed``, issue 36's contracts: ``real-v1`` on
    DeepEP 2.5.0) and neither report has P14's surfaces: still one 'API removed' finding, ``api:Buffer``."""
    old = _report(_entry("P1"), _entry("P5"))
    old["environment"]["backends"] = [{"name": "real-v1", "api": "Buffer", "real": True},
                                      {"name": "real-v2", "api": "ElasticBuffer", "real": True}]
    gone = {**_column("unsupported", 0), "reason": "DeepEP 2.5.0 removed the legacy Buffer"}
    new = _report(*[_entry(pid, verdicts={"real-v1": gone, "real-v2": _column("passed")}) for pid in ("P1", "P5")])
    new["environment"] = {"deep_ep": "2.5.0", "backends": [
        {"name": "real-v1", "api": "Buffer", "real": True, "removed": "DeepEP 2.5.0 removed the legacy Buffer"},
        {"name": "real-v2", "api": "EPBuffer", "real": True}]}
    paragraph, api = compare(old, new)["regressions"]
    assert paragraph.startswith("real-v1 (deep_ep.Buffer, the V1 contract): API removed in deep_ep 2.5.0. The 2 "
                                "properties that held on it in the baseline (P1, P5) cannot run now")
    assert "(DeepEP 2.5.0 removed the legacy Buffer)" in paragraph
    # the API itself from the suite's snapshots of the two versions (P14 ran in neither): renamed, not removed
    assert api.startswith("the API (P14 did not run): the API surface of deep_ep 2.1.0 -> 2.5.0 (the suite's API "
                          "snapshots) changed incompatibly") and "ElasticBuffer: renamed to 'EPBuffer'" in api, api


def test_a_suite_error_fails_the_gate_and_cannot_be_accepted(tmp_path) -> None:
    """A property whose status is ``suite-error`` (the suite's own code raised; issue 35) is never a pass: the gate
    fails, whatever the accepted-changes file says."""
    from conformance.reporting.accept import load_acceptance

    accept = tmp_path / "all.toml"
    accept.write_text('[[accept]]\nfinding = "*"\nwhy = "everything"\n')
    errored = _report(_entry("P1", "suite-error", suite_error="AttributeError in conformance/tasks/x.py"))
    (paragraph,) = compare(_report(_entry("P1")), errored, load_acceptance(str(accept)))["regressions"]
    assert paragraph.startswith("P1: a suite error") and "AttributeError in conformance/tasks/x.py" in paragraph
