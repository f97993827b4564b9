"""Report entries: statuses, capability regressions, counterexample and reproduction line."""

from __future__ import annotations

import json
from types import SimpleNamespace

from conformance.core.spec import parse_backends
from conformance.harness.config import RunConfig
from conformance.reporting.report import USER_PROPERTY, entry_from_report, markdown, summarise
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
