"""Reports: ``conformance.json`` (schema in README), a Markdown summary, and pytest's JUnit XML.

Property tests record what they saw in a :class:`conformance.harness.session.Recorder`; the plugin attaches it to
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

from conformance.harness.config import RunConfig
from conformance.properties import sort_key
from conformance.reporting.gate import compare

USER_PROPERTY = "conformance"
SCHEMA = 2
STATUSES = ("passed", "failed", "skipped", "divergence", "unsupported", "not-run")


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
    cause: dict[str, Any] | None = None  # a crash, hang or broken construction that stopped the property
    not_applicable: str | None = None  # why no selected backend could check the property
    excluded: dict[str, str] = field(default_factory=dict)  # backend -> why the property does not apply to it
    not_checked: dict[str, list[str]] = field(default_factory=dict)  # backend -> parts it could not take
    verdicts: dict[str, dict[str, Any]] = field(default_factory=dict)  # backend -> {status, reason, not_checked}
    seen: dict[str, Any] = field(default_factory=dict)  # backend -> the deep_ep it drove in the ranks


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
    elif recorded["unsupported"] or recorded.get("not_applicable"):
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
        cause=recorded.get("cause"),
        not_applicable=recorded.get("not_applicable"),
        excluded=recorded.get("excluded") or {},
        not_checked=recorded.get("not_checked") or {},
        seen=recorded.get("seen") or {},
    )
    if report.failed:
        entry.message = _failure_message(report)
        if recorded["last_example"]:
            entry.counterexample = json.loads(recorded["last_example"])
            entry.repro = repro_command(entry.id, recorded["last_example"], config)
    entry.verdicts = backend_verdicts(entry, recorded.get("failing") or [], config,
                                      recorded.get("distinct_examples", entry.examples))
    return entry


def backend_verdicts(entry: PropertyEntry, failing: list[str], config: RunConfig, distinct: int
                     ) -> dict[str, dict[str, Any]]:
    """Each selected backend's verdict on the property: ``status`` (``passed``, ``divergence``, ``failed``,
    ``unsupported``, ``skipped``, or ``inconclusive`` when the property stopped at another backend's failure),
    ``reason`` for every status but ``passed``, and the parts of the check it could not take (``not_checked``,
    with the examples it rejected when it was checked on others).  ``distinct``: distinct examples drawn."""
    out: dict[str, dict[str, Any]] = {}
    for spec in config.backends:
        name = spec.name
        partial: list[str] = []
        if name in entry.unsupported:
            info = entry.unsupported[name]
            rejected = (f"rejected {info['count']} of {distinct} example(s): {info['call']} raised {info['error']} "
                        f"(first: {info['example']})")
            if info["count"] >= distinct:
                out[name] = {"status": "unsupported", "reason": rejected}
                continue
            partial.append(rejected)
        if name in entry.excluded:
            verdict = {"status": "unsupported", "reason": entry.excluded[name]}
        elif entry.status == "failed":
            if name in failing or not failing:
                verdict = {"status": "failed", "reason": entry.message}
            elif (entry.cause or {}).get("kind") == "construction" and entry.examples:
                # the broken backends were left out and every example was checked on this one
                verdict = ({"status": "divergence", "reason": "; ".join(entry.divergences)} if entry.divergences
                           else {"status": "passed", "reason": None})
            else:
                verdict = {"status": "inconclusive",
                           "reason": f"the property stopped at a failure of {', '.join(failing)}"}
        elif entry.status == "divergence":
            verdict = {"status": "divergence", "reason": "; ".join(entry.divergences)}
        elif entry.status == "skipped":
            verdict = {"status": "skipped", "reason": entry.message}
        else:  # passed, or unsupported because of another backend's rejections
            verdict = {"status": "passed", "reason": None}
        if partial or entry.not_checked.get(name):
            verdict["not_checked"] = partial + entry.not_checked.get(name, [])
        out[name] = verdict
    return out


def _with_capability_gaps(unsupported: dict[str, Any], config: RunConfig) -> dict[str, Any]:
    """Mark each rejection that a backend of the other API accepted as a capability regression.

    The property ran every backend on the same examples: a backend of the other API that did not
    reject any of them handled the configurations this one refused.
    """
    marked = {}
    specs = {b.name: b for b in config.backends}
    for backend, info in unsupported.items():
        spec = specs.get(backend)
        if spec is not None and spec.plugin:  # a wrapper's own limit: which backends took those configurations
            accepted_by = [b.name for b in config.backends if b.name != backend and b.name not in unsupported]
            marked[backend] = {**info, "accepted_by": accepted_by, "capability_regression": False}
            continue
        api = spec.api if spec is not None else backend.rsplit("-", 1)[-1]
        accepted_by = [b.name for b in config.backends if b.api != api and not b.plugin and b.name not in unsupported]
        marked[backend] = {**info, "accepted_by": accepted_by, "capability_regression": bool(accepted_by)}
    return marked


def backend_entry(spec: Any, config: RunConfig) -> dict[str, Any]:
    """One backend in the report's environment: its API, whether it is real, the module it drives; for a plug-in
    also where it comes from, what it declares and which deep_ep it sees."""
    if not spec.plugin:
        return {"name": spec.name, "api": spec.class_name, "real": spec.real,
                "module": "deep_ep" if spec.real else "conformance.emulation"}
    module = {"real": "deep_ep", "emulation": "conformance.emulation (as deep_ep)", None: None}[spec.deep_ep]
    return {"name": spec.name, "api": spec.class_name, "real": spec.real, "module": module, "plugin": spec.source,
            "description": spec.description, "capabilities": sorted(spec.capabilities), "deep_ep": spec.deep_ep}


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
        "backends": [backend_entry(b, config) for b in config.backends],
        "deep_ep_alias": config.deep_ep,
        "probes": probes,
        "nodes": config.shape.nodes,
        "ranks_per_node": config.shape.ranks_per_node,
        "device": config.device,
        "seed": seed,
        "mutant": config.mutant,
        "notes": list(config.notes),
        "command": " ".join(shlex.quote(a) for a in sys.argv),
    }


def summarise(entries: list[PropertyEntry]) -> dict[str, int]:
    """Counts per status."""
    counts = {status: 0 for status in STATUSES}
    for e in entries:
        counts[e.status] += 1
    counts["total"] = len(entries)
    return counts


def headline(entries: list[PropertyEntry]) -> list[str]:
    """The line(s) at the top of the terminal summary and the report when crashes, hangs or a broken
    construction stopped properties (one cause, said once, instead of once per property)."""
    from conformance.harness.faults import describe_cause

    broken: dict[str, dict[str, Any]] = {}
    stopped: dict[str, list[str]] = {}
    for e in entries:
        if not e.cause:
            continue
        if e.cause.get("kind") == "construction":
            broken.update(e.cause["broken"])
        else:
            stopped.setdefault(describe_cause(e.cause), []).append(e.id)
    lines = []
    if broken:
        kinds = {c["kind"] for c in broken.values()}
        verb = "crashed" if "crash" in kinds else "hung" if "hang" in kinds else "raised"
        affected = [e for e in entries if e.cause and e.cause.get("kind") == "construction"]
        unchecked = sum(1 for e in affected if not e.examples)
        lines.append(f"The library {verb} on buffer construction: " + "; ".join(map(describe_cause, broken.values()))
                     + f". {len(affected)} properties failed for it"
                     + (f" ({unchecked} not checked on any backend)." if unchecked else
                        " (the other backends were checked)."))
    for cause, ids in stopped.items():
        lines.append(f"Crash/hang budget spent by {', '.join(ids)}: {cause}.")
    return lines


def build_document(
    env: dict[str, Any],
    entries: list[PropertyEntry],
    wall_s: float,
    catalog: list[str],
    *,
    interrupted: bool = False,
) -> dict[str, Any]:
    """The report: every property of ``catalog`` (those that did not run as ``not-run``), completeness, headline."""
    ran = {e.id for e in entries}
    not_run = [pid for pid in catalog if pid not in ran]
    reasons = []
    if interrupted:
        reasons.append("the run was interrupted")
    if not_run:
        reasons.append(f"{len(not_run)} of {len(catalog)} properties did not run"
                       + ("" if interrupted else " (a subset was selected: -k, --deselect or paths)"))
    placeholders = [PropertyEntry(id=pid, test="", backends=[b["name"] for b in env["backends"]], status="not-run",
                                  examples=0, wall_s=0.0, message="not run: " + "; ".join(reasons))
                    for pid in not_run]
    entries = sorted(entries + placeholders, key=lambda e: (sort_key(e.id), e.test))
    return {
        "schema": SCHEMA,
        "complete": not reasons,
        "incomplete_reason": "; ".join(reasons) or None,
        "not_run": not_run,
        "headline": headline(entries),
        "environment": env,
        "wall_s": round(wall_s, 3),
        "summary": summarise(entries),
        "properties": [vars(e) for e in entries],
    }


def write_reports(report_dir: str, document: dict[str, Any]) -> dict[str, Any]:
    """Write ``conformance.json`` and ``conformance.md`` into ``report_dir``; return the document with ``path``.

    A partial run never replaces a complete report: it goes to ``conformance.partial.json`` / ``.md`` then.
    """
    os.makedirs(report_dir, exist_ok=True)
    name = "conformance"
    existing = os.path.join(report_dir, "conformance.json")
    if not document["complete"] and os.path.exists(existing):
        try:
            with open(existing) as f:
                kept = json.load(f).get("complete", True)
        except (OSError, ValueError):
            kept = False
        if kept:
            name = "conformance.partial"
            document["kept_complete_report"] = existing
    json_path = os.path.join(report_dir, f"{name}.json")
    with open(json_path, "w") as f:
        json.dump(document, f, indent=2, default=str)
    with open(os.path.join(report_dir, f"{name}.md"), "w") as f:
        f.write(markdown(document))
    document["path"] = json_path
    return document


def finish_run(
    report_dir: str,
    config: RunConfig,
    entries: list[PropertyEntry],
    wall_s: float,
    *,
    baseline: dict[str, Any] | None = None,
    interrupted: bool = False,
    allow_partial: bool = False,
    write_baseline: str | None = None,
) -> dict[str, Any]:
    """Build, gate and write the run's report (controller, end of the session); with ``write_baseline``, copy it
    there for a later ``--baseline`` (a complete run only, unless ``allow_partial``)."""
    from conformance.core.probe import probe_module
    from conformance.properties import catalog

    probes = {"deep_ep": config.deep_ep_probe or None, "conformance.emulation": probe_module("conformance.emulation")}
    env = environment(config, probes, config.seed)
    for backend in env["backends"]:  # which deep_ep the backend drove in the ranks (construction preflight)
        seen = next((e.seen[backend["name"]] for e in entries if backend["name"] in e.seen), None)
        if seen is not None:
            backend["deep_ep_seen"] = seen
    document = build_document(env, entries, wall_s, list(catalog()), interrupted=interrupted)
    if baseline is not None:
        gate = {"baseline": baseline.get("environment", {}), **compare(baseline, document)}
        if not document["complete"] and not allow_partial:
            gate["regressions"].insert(0, f"this run is partial ({document['incomplete_reason']}): the version gate "
                                          f"needs a complete run; pass --allow-partial to compare anyway")
        document["gate"] = gate
    write_reports(report_dir, document)
    document["gate_failed"] = bool(baseline is not None and document["gate"]["regressions"])
    if write_baseline:
        if document["complete"] or allow_partial:
            import shutil

            os.makedirs(os.path.dirname(os.path.abspath(write_baseline)), exist_ok=True)
            shutil.copyfile(document["path"], write_baseline)
            document["baseline_written"] = write_baseline
        else:
            document["baseline_refused"] = (f"--write-baseline {write_baseline}: not written, this run is partial "
                                            f"({document['incomplete_reason']}); pass --allow-partial to write it")
    return document


def summary_lines(document: dict[str, Any]) -> list[tuple[str, dict[str, bool]]]:
    """The terminal summary: one line per property, completeness, the gate, where the reports are."""
    styles = {"failed": {"red": True}, "not-run": {"yellow": True}, "passed": {"green": True}}
    lines = []
    for p in document["properties"]:
        lines.append((f"{p['id']:<28} {p['status']:<12} {p['examples']:>4} examples {p['wall_s']:>8.1f} s",
                      styles.get(p["status"], {})))
    if not document["complete"]:
        lines.append((f"PARTIAL RUN: {document['incomplete_reason']}", {"yellow": True, "bold": True}))
    gate = document.get("gate")
    if gate is not None:
        for line in gate["regressions"]:
            lines.append((f"GATE REGRESSION {line}", {"red": True}))
        lines.append((f"version gate: {len(gate['regressions'])} regression(s), {len(gate['improvements'])} "
                      f"improvement(s)", {"red": bool(gate["regressions"])}))
    if document.get("baseline_written"):
        lines.append((f"baseline written: {document['baseline_written']}", {}))
    if document.get("baseline_refused"):
        lines.append((document["baseline_refused"], {"red": True}))
    if document.get("kept_complete_report"):
        lines.append((f"partial report written beside the complete one ({document['kept_complete_report']}, kept)",
                      {"yellow": True}))
    lines.append((f"conformance report: {document['path']}", {}))
    return lines


def _kind(backend: dict[str, Any]) -> str:
    if "plugin" not in backend:
        return "real" if backend["real"] else "emulated"
    on = {"real": "real deep_ep", "emulation": "conformance.emulation as deep_ep"}.get(backend.get("deep_ep"),
                                                                                        "no deep_ep")
    return f"plug-in {backend['plugin']}, {backend['api']} contract, on {on}"


def _verdict_table(document: dict[str, Any]) -> list[str]:
    """Per property and backend: the backend's verdict, and every non-pass with its reason."""
    names = [b["name"] for b in document["environment"]["backends"]]
    if not names:
        return []
    lines = ["", "## Verdicts per backend", "", "| property | " + " | ".join(f"`{n}`" for n in names) + " |",
             "|---|" + "---|" * len(names)]
    notes = []
    for p in document["properties"]:
        cells = []
        for name in names:
            verdict = p.get("verdicts", {}).get(name)
            if verdict is None:
                cells.append(p["status"] if p["status"] == "not-run" else "")
                continue
            cell = verdict["status"] + (" (partial)" if verdict.get("not_checked") else "")
            cells.append(cell)
            if verdict["status"] != "passed" and verdict.get("reason"):
                notes.append(f"- {p['id']} on `{name}`: **{verdict['status']}**: {verdict['reason'][:600]}")
            for part in verdict.get("not_checked", []):
                notes.append(f"- {p['id']} on `{name}`: not checked: {part}")
        lines.append(f"| {p['id']} | " + " | ".join(cells) + " |")
    return lines + ([""] + notes if notes else [])


def markdown(document: dict[str, Any]) -> str:
    """The human summary: header, verdict table, then each failure with its counterexample and repro."""
    env, summary = document["environment"], document["summary"]
    top = [f"**{line}**" for line in document.get("headline", [])]
    if document.get("complete") is False:
        top.append(f"**Partial run: {document['incomplete_reason']}.** Not run: {', '.join(document['not_run'])}.")
    backends = ", ".join(f"{b['name']} ({_kind(b)})" for b in env["backends"])
    lines = [
        "# DeepEP conformance report",
        "",
        *[line for text in top for line in (text, "")],
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
    lines += _verdict_table(document)
    for p in document["properties"]:
        if p["status"] == "failed":
            lines += ["", f"## FAILED {p['id']} (`{p['test']}`)", "", "```", p["message"] or "", "```"]
            if p["counterexample"]:
                lines += ["", f"Counterexample: `{json.dumps(p['counterexample'])}`", "",
                          f"Reproduce: `{p['repro']}`"]
        for key, text in p["divergences"].items():
            lines += ["", f"## DIVERGENCE {p['id']}: {key}", "", text]
        if p.get("not_applicable"):
            lines += ["", f"## UNSUPPORTED {p['id']} (not applicable)", "", p["not_applicable"]]
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

