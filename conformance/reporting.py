"""Reports: ``conformance.json`` (schema in README), a Markdown summary, and pytest's JUnit XML.

Property tests record what they saw in a :class:`conformance.session.Recorder`; the plugin attaches it to
the test report (``user_properties``), which pytest-xdist carries to the controller.  The controller
collects one entry per property test here and writes the files at the end of the session.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
from dataclasses import dataclass, field
from typing import Any

from conformance.config import RunConfig
from conformance.gate import compare

USER_PROPERTY = "conformance"
STATUSES = ("passed", "failed", "skipped", "divergence", "unsupported")


def repro_command(property_id: str, example_json: str, config: RunConfig) -> str:
    """The one-line command that replays ``example_json`` against ``property_id``."""
    return f"python -m conformance.repro {property_id} {shlex.quote(example_json)} {config.cli_args()}"


@dataclass
class PropertyEntry:
    """One property test's verdict."""

    id: str
    test: str
    backends: list[str]
    status: str
    examples: int
    wall_s: float
    counterexample: dict[str, Any] | None = None
    repro: str | None = None
    message: str | None = None
    divergences: dict[str, str] = field(default_factory=dict)
    unsupported: dict[str, Any] = field(default_factory=dict)
    artifacts: dict[str, Any] = field(default_factory=dict)


def entry_from_report(report: Any, config: RunConfig) -> PropertyEntry | None:
    """Build the entry for a finished test report, or ``None`` for tests that are not property tests."""
    recorded = dict(report.user_properties).get(USER_PROPERTY)
    if recorded is None or recorded.get("id") is None:
        return None
    if report.failed:
        status = "failed"
    elif report.skipped:
        status = "skipped"
    elif recorded["divergences"]:
        status = "divergence"
    elif recorded["unsupported"]:
        status = "unsupported"
    else:
        status = "passed"
    entry = PropertyEntry(
        id=recorded["id"],
        test=report.nodeid,
        backends=[b.name for b in config.backends],
        status=status,
        examples=recorded["examples"],
        wall_s=recorded["wall_s"],
        divergences=recorded["divergences"],
        unsupported=_with_capability_gaps(recorded["unsupported"], config),
        artifacts=recorded.get("artifacts", {}),
    )
    if report.failed:
        entry.message = _failure_message(report)
        if recorded["last_example"]:
            entry.counterexample = json.loads(recorded["last_example"])
            entry.repro = repro_command(entry.id, recorded["last_example"], config)
    return entry


def _with_capability_gaps(unsupported: dict[str, Any], config: RunConfig) -> dict[str, Any]:
    """Mark each rejection that a backend of the other API accepted as a capability regression.

    The property ran every backend on the same examples: a backend of the other API that did not
    reject any of them handled the configurations this one refused.
    """
    marked = {}
    for backend, info in unsupported.items():
        api = backend.rsplit("-", 1)[-1]
        accepted_by = [b.name for b in config.backends if b.api != api and b.name not in unsupported]
        marked[backend] = {**info, "accepted_by": accepted_by, "capability_regression": bool(accepted_by)}
    return marked


def _failure_message(report: Any) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    return text[:4000]


def environment(config: RunConfig, probes: dict[str, Any], seed: int | None) -> dict[str, Any]:
    """The report header: versions, which backends are real, the world shape, the seed."""
    import torch

    real = probes.get("deep_ep", {})
    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "deep_ep": real.get("version") or ("installed" if real.get("importable") else None),
        "backends": [
            {"name": b.name, "api": b.class_name, "real": b.real,
             "module": "deep_ep" if b.real else "conformance.emulation"}
            for b in config.backends
        ],
        "probes": probes,
        "nodes": config.shape.nodes,
        "ranks_per_node": config.shape.ranks_per_node,
        "device": config.device,
        "seed": seed,
        "mutant": config.mutant,
        "command": " ".join(shlex.quote(a) for a in sys.argv),
    }


def summarise(entries: list[PropertyEntry]) -> dict[str, int]:
    """Counts per status."""
    counts = {status: 0 for status in STATUSES}
    for e in entries:
        counts[e.status] += 1
    counts["total"] = len(entries)
    return counts


def write_reports(
    report_dir: str,
    env: dict[str, Any],
    entries: list[PropertyEntry],
    wall_s: float,
    baseline: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write ``conformance.json`` and ``conformance.md`` into ``report_dir``; return the document.

    With a ``baseline`` report, the document gets a ``gate`` section (see :mod:`conformance.gate`).
    """
    os.makedirs(report_dir, exist_ok=True)
    entries = sorted(entries, key=lambda e: (_property_number(e.id), e.test))
    document = {
        "schema": 1,
        "environment": env,
        "wall_s": round(wall_s, 3),
        "summary": summarise(entries),
        "properties": [vars(e) for e in entries],
    }
    if baseline is not None:
        document["gate"] = {"baseline": baseline.get("environment", {}), **compare(baseline, document)}
    json_path = os.path.join(report_dir, "conformance.json")
    with open(json_path, "w") as f:
        json.dump(document, f, indent=2, default=str)
    with open(os.path.join(report_dir, "conformance.md"), "w") as f:
        f.write(markdown(document))
    document["path"] = json_path
    return document


def _property_number(property_id: str) -> int:
    digits = "".join(c for c in property_id.split("-", 1)[0] if c.isdigit())
    return int(digits) if digits else 999


def markdown(document: dict[str, Any]) -> str:
    """The human summary: header, verdict table, then each failure with its counterexample and repro."""
    env, summary = document["environment"], document["summary"]
    backends = ", ".join(f"{b['name']} ({'real' if b['real'] else 'emulated'})" for b in env["backends"])
    lines = [
        "# DeepEP conformance report",
        "",
        f"- backends: {backends}",
        f"- world: {env['nodes']} node(s) x {env['ranks_per_node']} rank(s), device {env['device']}",
        f"- torch {env['torch']}, deep_ep {env['deep_ep']}, seed {env['seed']}"
        + (f", mutant {env['mutant']}" if env.get("mutant") else ""),
        f"- {summary['total']} property tests: "
        + ", ".join(f"{summary[s]} {s}" for s in STATUSES if summary[s]) + f" ({document['wall_s']} s)",
        "",
        "| property | test | status | examples |",
        "|---|---|---|---|",
    ]
    for p in document["properties"]:
        lines.append(f"| {p['id']} | `{p['test'].split('::')[-1]}` | {p['status']} | {p['examples']} |")
    for p in document["properties"]:
        if p["status"] == "failed":
            lines += ["", f"## FAILED {p['id']} (`{p['test']}`)", "", "```", p["message"] or "", "```"]
            if p["counterexample"]:
                lines += ["", f"Counterexample: `{json.dumps(p['counterexample'])}`", "",
                          f"Reproduce: `{p['repro']}`"]
        for key, text in p["divergences"].items():
            lines += ["", f"## DIVERGENCE {p['id']}: {key}", "", text]
        for backend, info in p["unsupported"].items():
            lines += ["", f"## UNSUPPORTED {p['id']} on {backend} ({info['count']} examples)", "",
                      f"`{info['call']}` raised `{info['error']}`"]
            if info.get("capability_regression"):
                lines += ["", f"Capability regression: {', '.join(info['accepted_by'])} accepted the same "
                          f"configurations (first rejected: `{info['example']}`)."]
    if "gate" in document:
        gate = document["gate"]
        verdict = "FAILED" if gate["regressions"] else "passed"
        lines += ["", f"## Version gate: {verdict} (against deep_ep {gate['baseline'].get('deep_ep')})", ""]
        lines += [f"- REGRESSION {r}" for r in gate["regressions"]]
        lines += [f"- improvement {i}" for i in gate["improvements"]]
    return "\n".join(lines) + "\n"

