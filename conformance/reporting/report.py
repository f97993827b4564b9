"""Reports: ``conformance.json`` (schema in docs/reference.md), a Markdown summary, an HTML page (``html.py``),
pytest's JUnit XML, and the terminal summary.

Property tests record what they saw in a :class:`conformance.harness.session.Recorder`; the plugin attaches it to
the test report (``user_properties``), which pytest-xdist carries to the controller.  The controller
collects one entry per property test here and writes the files at the end of the session.

A property's status is the verdict on what was checked (``failed`` > ``known-defect`` > ``divergence`` >
``unsupported`` > ``passed`` over its columns: each backend against the oracle, each compared pair); the examples a
known limit excluded are listed beside it.  Only a backend checked on no example at all is ``unsupported``.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
from dataclasses import dataclass, field
from typing import Any

from conformance.core.api_coverage import per_property_calls, report_section
from conformance.core.ids import is_pair, sort_key
from conformance.core.outcomes import STATUSES, VERDICTS, WHYS
from conformance.core.probe import torch_version
from conformance.harness.config import RunConfig
from conformance.reporting.accept import Acceptance
from conformance.reporting.bump import explain
from conformance.reporting.bump import markdown as bump_markdown
from conformance.reporting.bump import terminal_lines as bump_terminal_lines
from conformance.reporting.matrix import SYMBOLS, counts_text, matrix_rows, pair_legend, short_column
from conformance.reporting.migration import markdown as migration_markdown
from conformance.reporting.migration import migrations
from conformance.reporting.migration import summary as migration_summary
from conformance.reporting.schema import SCHEMA
from conformance.world.launcher import describe_engine

USER_PROPERTY = "conformance"
#: Column verdicts, worst first (conformance.core.outcomes).
VERDICT_ORDER = VERDICTS
__all__ = ["SCHEMA", "STATUSES", "USER_PROPERTY", "PropertyEntry", "entry_from_report", "finish_run", "markdown",
           "repro_command", "rerun_command", "summarise", "summary_lines", "write_reports"]


def repro_command(property_id: str, example_json: str, config: RunConfig) -> str:
    """The one-line command that replays ``example_json`` against ``property_id``."""
    return f"python -m conformance.repro {property_id} {shlex.quote(example_json)} {config.cli_args()}"


def rerun_command(nodeid: str, config: RunConfig, report_dir: str) -> str:
    """The pytest command that runs the property again with the same seed and the same example database (the
    stored counterexample comes back first)."""
    return (f"pytest {shlex.quote(nodeid)} {config.cli_args()} --conformance-seed {config.seed} "
            f"--max-examples {config.max_examples} --report-dir {shlex.quote(report_dir)}")


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
    why: dict[str, list[str]] = field(default_factory=dict)  # backend -> kinds of reason it was not checked (Why)
    seen: dict[str, Any] = field(default_factory=dict)  # backend -> the deep_ep it drove in the ranks
    verdicts: dict[str, Any] = field(default_factory=dict)  # column (backend, or "a vs b") -> counts and status
    known_defects: dict[str, Any] = field(default_factory=dict)  # known-defect id -> failed/held counts, example
    divergence_examples: dict[str, Any] = field(default_factory=dict)  # divergence key -> the first case showing it
    first_failure_at: int | None = None  # examples checked when the first one failed
    failure_detail: dict[str, Any] | None = None  # what differs, as data (assertions.Mismatch)
    rerun: str | None = None  # pytest command: same seed, same example database (the counterexample comes first)
    shapes: list[Any] = field(default_factory=list)  # the distinct [hidden, top-k, experts, pinned max, alignment]
    stopped: str | None = None  # why the property stopped drawing early (a known defect that retires the world)
    world_lost: str | None = None  # the world died outside the property's examples (between them and the next)
    blob: str | None = None  # Hypothesis' @reproduce_failure(...) line, when Hypothesis printed one
    api_calls: dict[str, Any] = field(default_factory=dict)  # "Class.method" -> what its calls gave (api_coverage)


def _worst(statuses: list[str]) -> str | None:
    ranked = [s for s in VERDICT_ORDER if s in statuses]
    return ranked[0] if ranked else None


def property_status(failed: bool, skipped: bool, recorded: dict[str, Any]) -> str:
    """The property's status from pytest's outcome and the recorded columns (module docstring); ``suite-error``
    when the suite's own code raised (never a pass, never a backend's failure)."""
    if recorded.get("suite_error"):
        return "suite-error"
    if failed:
        return "failed"
    if skipped:
        return "skipped"
    columns = [c["status"] for c in recorded.get("verdicts", {}).values()]
    if recorded["divergences"]:
        columns.append("divergence")
    if recorded.get("not_applicable"):
        columns.append("unsupported")
    if not recorded.get("verdicts") and recorded["unsupported"]:  # recorded without a tally
        columns.append("unsupported")
    return _worst(columns) or "passed"


def _failed_columns(verdicts: dict[str, Any], recorded: dict[str, Any], backends: list[str]) -> dict[str, Any]:
    """A failed test: the backends a broken construction left out are failed columns (the others keep their own
    verdicts: they were checked); a failure no column was charged with (a spent budget) is charged to the backend
    its cause names, else to every backend."""
    cause = recorded.get("cause") or {}
    broken = cause.get("broken", {}) if cause.get("kind") == "construction" else {}
    if broken:
        names = list(broken)
    elif any(c["status"] in ("failed", "suite-error") for c in verdicts.values()):
        return verdicts
    else:
        names = [cause["backend"]] if cause.get("backend") else backends
    out = dict(verdicts)
    for name in names:
        column = dict(out.get(name) or _empty_column())
        column["status"] = "failed"
        column["failed"] = max(1, column.get("failed", 0))
        if name in broken:
            column["reason"] = describe_cause_text({"kind": "construction", "broken": {name: broken[name]}})
        out[name] = column
    return out


def entry_from_report(report: Any, config: RunConfig, report_dir: str = "reports") -> PropertyEntry | None:
    """Build the entry for a finished test report, or ``None`` for tests that are not property tests."""
    recorded = dict(report.user_properties).get(USER_PROPERTY)
    if recorded is None or recorded.get("id") is None:
        return None
    status = property_status(report.failed, report.skipped, recorded)
    verdicts = recorded.get("verdicts", {})
    if report.failed:
        verdicts = _failed_columns(verdicts, recorded, [b for b in verdicts if not is_pair(b)]
                                   or [b.name for b in config.backends])
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
        why=recorded.get("why") or {},
        seen=recorded.get("seen") or {},
        verdicts=verdicts,
        known_defects=recorded.get("known_defects", {}),
        divergence_examples=recorded.get("divergence_examples", {}),
        first_failure_at=recorded.get("first_failure_at"),
        api_calls=recorded.get("api_calls") or {},
        shapes=recorded.get("shapes") or [],
        stopped=recorded.get("stopped"),
        world_lost=recorded.get("world_lost"),
    )
    if report.failed:
        entry.message = recorded.get("suite_error") or _failure_message(report)
        entry.failure_detail = recorded.get("failure_detail")
        entry.rerun = rerun_command(report.nodeid, config, report_dir)
        entry.blob = _reproduce_failure_blob(report)
        if recorded["last_example"]:
            entry.counterexample = json.loads(recorded["last_example"])
            entry.repro = repro_command(entry.id, recorded["last_example"], config)
    elif entry.world_lost:  # a passed property's message says what happened to its world
        entry.message = entry.world_lost
    if report.skipped:  # never silent: the reason is the property's message and every backend's column
        entry.message = _skip_reason(report)
        entry.verdicts = {b.name: {**_empty_column(), "status": "skipped", "reason": entry.message}
                          for b in config.backends}
        return entry
    entry.verdicts = annotate_verdicts(entry, config, recorded.get("distinct_examples", entry.examples))
    return entry


def _skip_reason(report: Any) -> str:
    """The reason pytest recorded for a skipped test (``Skipped: `` removed)."""
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr or "")
    return text.removeprefix("Skipped: ") or "skipped (no reason given)"


def annotate_verdicts(entry: PropertyEntry, config: RunConfig, distinct: int) -> dict[str, Any]:
    """Every selected backend's column, with the reason for each verdict but ``passed`` and the parts of the check it
    could not take (``not_checked``): a backend the property does not apply to (another API, a missing capability)
    gets an ``unsupported`` column saying why; a failed column the message; a partly rejecting backend the
    examples it rejected.  ``distinct``: distinct examples drawn."""
    out = {name: dict(column) for name, column in entry.verdicts.items()}
    for spec in config.backends:
        name = spec.name
        reason = entry.excluded.get(name) or (entry.not_applicable if name not in out else None)
        if reason and name not in out:
            out[name] = {**_empty_column(), "status": "unsupported", "reason": reason}
    for name, column in out.items():
        status = column["status"]
        if status in ("failed", "suite-error"):  # the column's own failure where it was recorded
            column.setdefault("reason", column.get("message") or entry.message or describe_cause_text(entry.cause))
        elif status == "divergence":
            column.setdefault("reason", "; ".join(entry.divergences.get(k, k) for k in column.get("divergences", []))
                              or "; ".join(entry.divergences.values()))
        elif status == "known-defect":
            column.setdefault("reason", "known defect " + ", ".join(column.get("defects", {})))
        elif status == "unsupported":
            info = entry.unsupported.get(name)
            column.setdefault("reason", "; ".join(column.get("exclusions", {})) or (
                f"{info['call']} raised {info['error']}" if info else "checked on no example"))
        else:
            column.setdefault("reason", None)
        parts = list(entry.not_checked.get(name, []))
        info = entry.unsupported.get(name)
        if info and status not in ("unsupported",) and column.get("excluded"):
            parts.insert(0, f"rejected {column['excluded']} of {distinct} example(s): {info['call']} raised "
                            f"{info['error'][:300]} (first: {info['example']})")
        if parts:
            column["not_checked"] = parts
        kinds = entry.why.get(name)
        if kinds:  # why (some of) it was not checked: the kinds of reason (conformance.core.outcomes.Why)
            column["why"] = [kind for kind in WHYS if kind in kinds]
    return out


def _empty_column() -> dict[str, Any]:
    return {"checked": 0, "held": 0, "failed": 0, "known_defect": 0, "divergent": 0, "excluded": 0,
            "exclusions": {}, "defects": {}, "divergences": []}


def describe_cause_text(cause: dict[str, Any] | None) -> str | None:
    """A crash, hang or broken construction in one line (``None`` without a cause)."""
    if not cause:
        return None
    from conformance.harness.faults import describe_cause

    if cause.get("kind") == "construction":
        return "broken on buffer construction: " + "; ".join(describe_cause(c) for c in cause["broken"].values())
    return describe_cause(cause)


def _reproduce_failure_blob(report: Any) -> str | None:
    """Hypothesis' ``@reproduce_failure(...)`` line from the failure's text, when it printed one."""
    text = str(getattr(report, "longrepr", "") or "")
    for line in text.splitlines():
        line = line.strip().lstrip("E").strip()
        if line.startswith("@reproduce_failure("):
            return line
    return None


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
        impl = spec.impl if spec is not None else backend.rsplit("-", 1)[0]
        # The migration's question (V2 refuses what V1 took) within one implementation: the emulation refusing what
        # the real library took is a limit of the emulation, not of V2 (e.g. P29 on emulated-v1 beside real-v2).
        accepted_by = [b.name for b in config.backends if b.api != api and not b.plugin and b.name not in unsupported
                       and b.impl == impl]
        marked[backend] = {**info, "accepted_by": accepted_by, "capability_regression": bool(accepted_by)}
    return marked


def backend_entry(spec: Any, config: RunConfig) -> dict[str, Any]:
    """One backend in the report's environment: its API, whether it is real, the module it drives; for a plug-in
    also where it comes from, what it declares and which deep_ep it sees."""
    if spec.substitute:
        module = {"real": "deep_ep", "emulation": "conformance.emulation (as deep_ep)", None: None}[spec.deep_ep]
        return {"name": spec.name, "api": spec.class_name, "real": spec.real, "module": module, "class": spec.target,
                "description": spec.description, "deep_ep": spec.deep_ep}
    if not spec.plugin:
        return {"name": spec.name, "api": spec.class_name, "real": spec.real,
                "module": "deep_ep" if spec.real else spec.contract.emulation,
                "deep_ep_version": spec.contract.version, **({"removed": spec.removed} if spec.removed else {})}
    module = {"real": "deep_ep", "emulation": "conformance.emulation (as deep_ep)", None: None}[spec.deep_ep]
    return {"name": spec.name, "api": spec.class_name, "real": spec.real, "module": module, "plugin": spec.source,
            "description": spec.description, "capabilities": sorted(spec.capabilities), "deep_ep": spec.deep_ep,
            "family": spec.family or spec.name}


def with_role(entry: dict[str, Any], spec: Any, config: RunConfig) -> dict[str, Any]:
    """A backend's entry with what the version gate matches and compares it by (schema 4): its ``contract`` (V1 /
    V2, whatever its class is called in its version) and, for a plug-in, ``wrapper``: what the wrapper checked to
    decide whether it drives DeepEP (its declaration's ``wrapper_checks()``, read by the plug-in probe)."""
    entry["contract"] = "V1" if spec.api == "v1" else "V2"
    if spec.plugin:
        entry["wrapper"] = (config.plugin_probes.get(spec.target) or {}).get("wrapper")
    return entry


def _failure_message(report: Any) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    return text.replace("conformance.assertions.Mismatch: ", "AssertionError: ", 1)[:4000]


def shapes_entry(config: RunConfig) -> dict[str, Any]:
    """Which shape vocabulary the run drew on (``--shapes``), and its shapes."""
    from conformance.strategies.vocabulary import named

    vocabulary = named(config.shapes)
    if vocabulary is None:
        return {"vocabulary": "free", "shapes": None}
    return {"vocabulary": vocabulary.name, "description": vocabulary.describe(),
            "shapes": [list(vars(s).values()) for s in vocabulary.shapes]}


def environment(config: RunConfig, probes: dict[str, Any], seed: int | None) -> dict[str, Any]:
    """The report header: versions, which backends are real, the world shape, the seed."""
    real = probes.get("deep_ep") or {}
    return {
        "torch": torch_version(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "deep_ep": real.get("version") or ("installed" if real.get("importable") else None),
        "backends": [with_role(backend_entry(b, config), b, config) for b in config.backends],
        "deep_ep_alias": config.deep_ep,
        # the DeepEP version the run tests (its contract: conformance/versions/), and the one the emulation models
        "library_version": getattr(config, "library_version", None),
        "emulation_version": getattr(config, "emulation_version", None),
        "probes": probes,
        "nodes": config.shape.nodes,
        "ranks_per_node": config.shape.ranks_per_node,
        "device": config.device,
        **describe_engine(config.rdzv_endpoint, config.shape, config.remote_nodes, device=config.device),
        "seed": seed,
        "mutant": config.mutant,
        "known_defects": _known_defects_path(config),
        "notes": list(config.notes),
        "shapes": shapes_entry(config),
        "command": " ".join(shlex.quote(a) for a in sys.argv),
    }


def _known_defects_path(config: RunConfig) -> str | None:
    from conformance.harness.known_defects import resolve

    return resolve(config)


def known_defects_section(config: RunConfig, entries: list[PropertyEntry],
                          catalog_ids: list[str]) -> dict[str, Any]:
    """Every entry of the run's known-defects file with its status: ``known-defect`` (it failed as the entry
    says), ``fixed`` (its condition was reached and held everywhere), ``not-reached`` (no example met its
    condition), ``not-exercised`` (no property exercises it), ``not-run`` (its property did not run)."""
    from conformance.harness.known_defects import known_defects_of

    defects = known_defects_of(config)
    ran = {e.id: e for e in entries if e.status != "not-run"}
    known_ids = set(catalog_ids)
    listed = []
    for entry in defects.entries:
        seen = [e.known_defects.get(entry.id) for e in entries if e.id == entry.property]
        seen = [s for s in seen if s]
        failed, held = sum(s["failed"] for s in seen), sum(s["held"] for s in seen)
        first = next((s for s in seen if s.get("example")), None)
        if not entry.exercised:
            status, why = "not-exercised", entry.why_not_exercised or "no property exercises it"
        elif entry.property not in known_ids:
            status, why = "not-exercised", f"no property {entry.property!r} in this catalog"
        elif entry.property not in ran:
            status, why = "not-run", f"{entry.property} did not run"
        elif failed:
            status, why = "known-defect", None
        elif held:
            status, why = "fixed", (f"{held} example(s) met its condition and held on every backend it names: "
                                    f"remove the entry from {defects.path}")
        else:
            status, why = "not-reached", "no example met its condition in this run"
        listed.append({**entry.as_dict(), "status": status, "why": why, "failed": failed, "held": held,
                       "example": first["example"] if first else None,
                       "message": first["message"] if first else None})
    return {"file": defects.path, "deep_ep": defects.version, "entries": listed}


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
    hung: dict[str, list[str]] = {}  # a hang charged to its backend (harness.faults.HungBackend): no budget spent
    for e in entries:
        if not e.cause:
            continue
        if e.cause.get("kind") == "construction":
            broken.update(e.cause["broken"])
        else:
            (hung if e.cause.get("contained") else stopped).setdefault(describe_cause(e.cause), []).append(e.id)
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
    for cause, ids in hung.items():
        lines.append(f"Hung in {', '.join(ids)}: {cause} (one world restart each; that backend was left out of the "
                     f"property's later examples).")
    for e in entries:
        if e.world_lost:
            lines.append(f"{e.id}: {e.world_lost}.")
    return lines


def build_document(
    env: dict[str, Any],
    entries: list[PropertyEntry],
    wall_s: float,
    catalog: list[str],
    *,
    interrupted: bool = False,
    known_defects: dict[str, Any] | None = None,
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
    document = {
        "schema": SCHEMA,
        "complete": not reasons,
        "incomplete_reason": "; ".join(reasons) or None,
        "not_run": not_run,
        "headline": headline(entries),
        "environment": env,
        "wall_s": round(wall_s, 3),
        "summary": summarise(entries),
        "properties": [vars(e) for e in entries],
        "known_defects": known_defects or {"file": None, "deep_ep": None, "entries": []},
        "api_coverage": report_section(per_property_calls([{"properties": [vars(e) for e in entries]}])),
    }
    document["migration"] = migrations(document)
    return document


def write_reports(report_dir: str, document: dict[str, Any]) -> dict[str, Any]:
    """Write ``conformance.json``, ``conformance.md`` and ``conformance.html`` into ``report_dir``; return the
    document with ``path`` (and ``html``, ``markdown``).

    A partial run never replaces a complete report: it goes to ``conformance.partial.*`` then.
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
    document["path"] = json_path
    document["markdown"] = os.path.join(report_dir, f"{name}.md")
    if document.get("gate", {}).get("bump"):
        document["bump"] = os.path.join(report_dir, "bump.md" if name == "conformance" else f"{name}.bump.md")
        with open(document["bump"], "w") as f:
            f.write(bump_markdown(document["gate"]["bump"]))
    with open(document["markdown"], "w") as f:
        f.write(markdown(document))
    from conformance.reporting.html import write_html

    document["html"], document["html_note"] = write_html(os.path.join(report_dir, f"{name}.html"), document)
    with open(json_path, "w") as f:
        json.dump(document, f, indent=2, default=str)
    return document


def _catalog_ids() -> list[str]:
    """Every property id in catalog order: from the catalog where this process has it loaded, else from the
    modules' source (importing them costs seconds: an interrupted xdist controller must stop fast)."""
    if not any(name.startswith("conformance.properties.test_p") for name in sys.modules):
        from conformance.core.ids import ids_from_source

        ids = ids_from_source()
        if ids is not None:
            return ids
    from conformance.properties import catalog

    return list(catalog())


def _emulation_probe(interrupted: bool) -> dict[str, Any]:
    """:func:`~conformance.core.probe.probe_module` of the emulation; not made when it would import torch into a
    controller that is stopping after an interrupt (the report says so instead)."""
    from conformance.core.probe import probe_module

    if interrupted and "conformance.emulation" not in sys.modules:
        return {"module": "conformance.emulation", "importable": None,
                "error": "not probed: the run was interrupted before a worker reported it"}
    return probe_module("conformance.emulation")


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
    emulation_probe: dict[str, Any] | None = None,
    jit: dict[str, Any] | None = None,
    accept: Acceptance | None = None,
    baseline_path: str | None = None,
) -> dict[str, Any]:
    """Build, gate and write the run's report (controller, end of the session); store it as a baseline at
    ``write_baseline``; append the verdict matrix to ``$GITHUB_STEP_SUMMARY`` when that is set.

    ``emulation_probe``: :func:`~conformance.core.probe.probe_module` of ``conformance.emulation`` as a worker
    found it (``None``: probe it here).  With a ``baseline``: the gate (section ``gate``, with the explanation of
    the bump, ``gate.bump``, also written as ``bump.md``); ``accept``: the accepted changes (``--accept-bump``)."""

    catalog_ids = _catalog_ids()

    probes = {"deep_ep": config.deep_ep_probe or None,
              "conformance.emulation": emulation_probe or _emulation_probe(interrupted)}
    env = environment(config, probes, config.seed)
    for backend in env["backends"]:  # which deep_ep the backend drove in the ranks (construction preflight)
        seen = next((e.seen[backend["name"]] for e in entries if backend["name"] in e.seen), None)
        if seen is not None:
            backend["deep_ep_seen"] = seen
    document = build_document(env, entries, wall_s, catalog_ids, interrupted=interrupted,
                              known_defects=known_defects_section(config, entries, catalog_ids))
    if jit is not None:
        document["jit"] = jit
    if baseline is not None:
        blocking = [] if document["complete"] or allow_partial else [
            f"This run is partial ({document['incomplete_reason']}): the version gate needs a complete run; pass "
            f"--allow-partial to compare anyway."]
        bump = explain(baseline, document, accept, baseline_path=baseline_path, blocking=blocking)
        document["gate"] = {"baseline": baseline.get("environment", {}), "regressions": bump["regressions"],
                            "improvements": bump["improvements"], "additions": bump["additions"],
                            "still_failing": bump["still_failing"], "findings": bump["findings"],
                            "accepted": bump["accepted"], "accept_file": bump["accept_file"], "bump": bump}
    write_reports(report_dir, document)
    summary_file = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary_file:
        try:
            with open(summary_file, "a") as f:
                f.write(step_summary(document))
            document["step_summary"] = summary_file
        except OSError as exc:
            document["step_summary"] = f"not written: {exc}"
    document["gate_failed"] = bool(baseline is not None and document["gate"]["regressions"])
    if write_baseline:
        if document["complete"] or allow_partial:
            os.makedirs(os.path.dirname(os.path.abspath(write_baseline)), exist_ok=True)
            stored = {k: v for k, v in document.items() if k not in ("gate", "gate_failed", "bump")}
            with open(write_baseline, "w") as f:
                json.dump(stored, f, indent=2, default=str)
            document["baseline_written"] = write_baseline
        else:
            document["baseline_refused"] = (f"--write-baseline {write_baseline}: not written, this run is partial "
                                            f"({document['incomplete_reason']}); pass --allow-partial to write it")
    return document


def summary_lines(document: dict[str, Any]) -> list[tuple[str, dict[str, bool]]]:
    """The terminal summary, one screen: the verdict matrix (verdict and held/checked examples, +Nx excluded by a
    known limit), the known defects, the slowest properties, completeness, the gate, where the reports are."""
    styles = {"failed": {"red": True}, "suite-error": {"red": True}, "not-run": {"yellow": True},
              "passed": {"green": True}, "known-defect": {"yellow": True}, "unsupported": {"yellow": True}}
    columns, rows = matrix_rows(document)
    width = max([20] + [len(short_column(c)) for c in columns]) + 2
    header = f"{'property':<26}{'status':<14}" + "".join(f"{short_column(c):<{width}}" for c in columns)
    bump = (document.get("gate") or {}).get("bump")
    lines: list[tuple[str, dict[str, bool]]] = bump_terminal_lines(bump, document.get("bump")) if bump else []
    lines.append((header, {"bold": True}))
    for p, cells in rows:
        text = f"{p['id'][:25]:<26}{p['status']:<14}"
        for column, (verdict, _) in zip(columns, cells, strict=True):
            counts = counts_text(p, column)
            text += f"{(SYMBOLS.get(verdict, verdict) + (' ' + counts if counts else ''))[:width - 1]:<{width}}"
        lines.append((text.rstrip(), styles.get(p["status"], {})))
    legend = pair_legend(columns)
    lines.append(("(held/checked examples; +Nx: N examples a known limit excluded; A~B: the pair compared"
                  + (f"; {legend}" if legend else "") + ")", {}))
    for entry in document.get("known_defects", {}).get("entries", []):
        if entry["status"] in ("known-defect", "fixed"):
            lines.append((f"known defect {entry['id']}: {entry['status']}"
                          + (f" ({entry['failed']} example(s))" if entry["status"] == "known-defect" else
                             f" - {entry['why']}"), {"yellow": True} if entry["status"] == "fixed" else {}))
    lines += [(line, {"bold": True}) for line in migration_summary(document)]
    jit = document.get("jit")
    if jit:
        warm = jit.get("warm_up") or {}
        lines.append((f"JIT: {jit['kernels']} kernels compiled ({jit['compiles']} compiles, {jit['compile_s']} s), "
                      f"busy {jit['busy_s']} s of the run's {jit['wall_s']} s ({(jit['share'] or 0) * 100:.0f} %)"
                      + ("; warm-up skipped (the kernel cache is warm)" if warm.get("skipped") else
                         f"; warm-up {warm['wall_s']} s ({len(warm['jobs'])} runs, {warm['side_by_side']} side by side)"
                         if warm else ""), {}))
    shapes = {tuple(s) for p in document["properties"] for s in p.get("shapes") or []}
    if shapes:
        drawn = document["environment"].get("shapes") or {}
        lines.append((f"shapes: {drawn.get('vocabulary', 'free')}, {len(shapes)} distinct (hidden, top-k, experts, "
                      f"pinned maximum, alignment) over the run", {}))
    ran = [p for p in document["properties"] if p["status"] != "not-run"]
    slowest = sorted(ran, key=lambda p: -p["wall_s"])[:3]
    if slowest:
        lines.append(("slowest: " + ", ".join(f"{p['id']} {p['wall_s']:.1f} s ({p['examples']} examples)"
                                              for p in slowest), {}))
    if not document["complete"]:
        lines.append((f"PARTIAL RUN: {document['incomplete_reason']}", {"yellow": True, "bold": True}))
    gate = document.get("gate")
    if gate is not None:
        for line in gate["regressions"]:
            lines.append((f"GATE REGRESSION {line}", {"red": True}))
        for line in gate["improvements"]:
            lines.append((f"gate: {line}", {}))
        lines.append((f"version gate: {len(gate['regressions'])} regression(s), {len(gate['improvements'])} "
                      f"improvement(s), {len(gate.get('additions', []))} addition(s)"
                      + (f", {len(gate['accepted'])} accepted change(s)" if gate.get("accepted") else "")
                      + (f", {len(gate['still_failing'])} failure(s) of the baseline still there (not the bump's)"
                         if gate.get("still_failing") else ""),
                      {"red": bool(gate["regressions"])}))
    if document.get("kept_complete_report"):
        lines.append((f"partial report written beside the complete one ({document['kept_complete_report']}, kept)",
                      {"yellow": True}))
    lines.append((f"conformance report: {document['path']} (also .md"
                  + (", .html" if document.get("html") else "") + ")"
                  + (f"; the bump explained: {document['bump']}" if document.get("bump") else ""), {}))
    if document.get("html_note"):
        lines.append((f"html report: {document['html_note']}", {"yellow": True}))
    if document.get("baseline_written"):
        lines.append((f"baseline written: {document['baseline_written']}", {}))
    if document.get("baseline_refused"):
        lines.append((document["baseline_refused"], {"red": True}))
    return lines


def _kind(backend: dict[str, Any]) -> str:
    if "class" in backend:
        return f"class backend {backend['class']} in place of deep_ep.{backend['api']}, real: {backend['real']}"
    if "plugin" not in backend:
        seen = (backend.get("deep_ep_seen") or {}).get("version") or backend.get("deep_ep_version")
        version = f", deep_ep {seen}" if seen else ""
        gone = ": unsupported, not in this version" if backend.get("removed") else ""
        return ("real" if backend["real"] else "emulated") + version + gone
    on = {"real": "real deep_ep", "emulation": "conformance.emulation as deep_ep"}.get(backend.get("deep_ep"),
                                                                                        "no deep_ep")
    return f"plug-in {backend['plugin']}, {backend['api']} contract, on {on}"


def _verdict_notes(document: dict[str, Any]) -> list[str]:
    """Per property and backend, every verdict but ``passed`` with its whole reason, and every part of a check a
    backend could not take."""
    notes = []
    for p in document["properties"]:
        for name, v in p.get("verdicts", {}).items():
            if v["status"] not in ("passed", "not-checked") and v.get("reason"):
                notes.append(f"- {p['id']} on `{name}`: **{v['status']}**: {_md_long(v['reason'])}")
            for part in v.get("not_checked", []):
                notes.append(f"- {p['id']} on `{name}`: not checked: {_md_long(part)}")
    return ["", "## Verdicts explained", ""] + notes if notes else []


def _md_long(text: str) -> str:
    return text.replace("\n", " ")[:600]


def markdown_matrix(document: dict[str, Any]) -> list[str]:
    """The verdict matrix as a Markdown table: property x backend / pair, verdict, counts and the reason."""
    columns, rows = matrix_rows(document)
    lines = ["| property | status | " + " | ".join(columns) + " |", "|---|---|" + "---|" * len(columns)]
    for p, cells in rows:
        rendered = []
        for column, (verdict, reason) in zip(columns, cells, strict=True):
            counts = counts_text(p, column)
            rendered.append(f"{'**FAILED**' if verdict == 'failed' else verdict}"
                            + (f" {counts}" if counts else "")
                            + (f"<br><sub>{_md(reason)}</sub>" if reason and verdict not in ("-", "passed") else ""))
        lines.append(f"| {p['id']} | {p['status']} | " + " | ".join(rendered) + " |")
    return lines


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")[:300]


def step_summary(document: dict[str, Any]) -> str:
    """What is appended to ``$GITHUB_STEP_SUMMARY``: the headline, the counts, the matrix, the gate's verdict."""
    env, summary = document["environment"], document["summary"]
    lines = ["## DeepEP conformance", ""]
    lines += [f"**{line}**" for line in document.get("headline", [])]
    lines += [f"{summary['total']} properties: " + ", ".join(f"{summary[s]} {s}" for s in STATUSES if summary[s])
              + f" - backends {', '.join(b['name'] for b in env['backends'])}, seed {env['seed']}", ""]
    lines += markdown_matrix(document)
    gate = document.get("gate")
    if gate is not None:
        bump = gate.get("bump")
        lines += ["", f"**Version gate: {'FAILED' if gate['regressions'] else 'passed'}**"
                  + (f" ({bump['verdict']['text']})" if bump else ""), ""]
        lines += [f"- {r}" for r in gate["regressions"]]
    return "\n".join(lines) + "\n\n"


def markdown(document: dict[str, Any]) -> str:
    """The human summary: header, verdict matrix, known defects, then each failure with its counterexample and
    reproduction, each divergence, each exclusion."""
    env, summary = document["environment"], document["summary"]
    top = [f"**{line}**" for line in document.get("headline", [])]
    if document.get("complete") is False:
        top.append(f"**Partial run: {document['incomplete_reason']}.** Not run: {', '.join(document['not_run'])}.")
    backends = ", ".join(f"{b['name']} ({_kind(b)})" for b in env["backends"])
    bump = (document.get("gate") or {}).get("bump")
    lines = [
        "# DeepEP conformance report",
        "",
        *[line for text in top for line in (text, "")],
        *(_bump_section(bump, document.get("bump")) if bump else []),
        f"- backends: {backends}",
        f"- world: {env['nodes']} node(s) x {env['ranks_per_node']} rank(s), device {env['device']}",
        f"- launcher: {env.get('launcher')}; rendezvous: {env.get('rendezvous')}; hosts: "
        f"{', '.join(env.get('hosts') or [])}",
        f"- torch {env['torch']}, deep_ep {env['deep_ep']}, seed {env['seed']}"
        + (f", mutant {env['mutant']}" if env.get("mutant") else ""),
        f"- known defects: {env.get('known_defects') or 'none'}",
        f"- shapes: {(env.get('shapes') or {}).get('description') or 'drawn freely'}",
        f"- {summary['total']} property tests: "
        + ", ".join(f"{summary[s]} {s}" for s in STATUSES if summary.get(s)) + f" ({document['wall_s']} s)",
        "",
        "Each cell: the verdict of that backend against the oracle (or of that pair against each other), held/checked "
        "examples, and `+Nx` for N examples a known limit excluded (listed, not counted against the backend).",
        "",
        *markdown_matrix(document),
        *_verdict_notes(document),
    ]
    changes = migration_markdown(document)
    if changes:
        lines += ["", "## What changes for a wrapper's users when DeepEP V2 is installed", "", *changes]
    known = document.get("known_defects", {}).get("entries", [])
    if known:
        lines += ["", f"## Known defects ({document['known_defects']['file']})", "",
                  "| id | property | backend | status | what is wrong |", "|---|---|---|---|---|"]
        for k in known:
            lines.append(f"| {k['id']} | {k['property'] or '-'} | {k['backend']} | {k['status']}"
                         + (f" ({k['failed']} examples)" if k["status"] == "known-defect" else "")
                         + f" | {_md(k['wrong'])} |")
    for p in document["properties"]:
        if p["status"] in ("failed", "suite-error"):
            lines += ["", f"## {'FAILED' if p['status'] == 'failed' else 'SUITE ERROR'} {p['id']} (`{p['test']}`)",
                      "", "```", p["message"] or "", "```"]
            if p["counterexample"]:
                lines += ["", f"Counterexample: `{json.dumps(p['counterexample'])}`", "",
                          f"Reproduce: `{p['repro']}`"]
                calls = p["counterexample"].get("calls") if isinstance(p["counterexample"], dict) else None
                if calls:  # a call sequence (P30): the shrunk calls, one per line
                    lines += ["", "The shrunk call sequence (every call on each backend, V1 and V2 side by side):",
                              "", *[f"    {call}" for call in calls]]
            if p.get("rerun"):
                lines += ["", f"Run again (the stored counterexample comes first): `{p['rerun']}`"]
        for key, text in p["divergences"].items():
            lines += ["", f"## DIVERGENCE {p['id']}: {key}", "", text]
        if p.get("not_applicable"):
            lines += ["", f"## UNSUPPORTED {p['id']} (not applicable)", "", p["not_applicable"]]
        for backend, info in p["unsupported"].items():
            verdict = p.get("verdicts", {}).get(backend, {})
            checked = (f"{verdict.get('held', 0)} of {verdict.get('checked', 0)} checked examples held; "
                       if verdict else "")
            title = "UNSUPPORTED" if verdict.get("status", "unsupported") == "unsupported" else "EXCLUDED"
            lines += ["", f"## {title} {p['id']} on {backend} ({info['count']} examples excluded"
                      + (f": {info['condition']}" if info.get("condition") else "") + ")", "",
                      f"{checked}`{info['call']}` raised `{info['error']}`"]
            if info.get("capability_regression"):
                lines += ["", f"Capability regression: {', '.join(info['accepted_by'])} accepted the same "
                          f"configurations (first rejected: `{info['example']}`)."]
    lines += _coverage_lines(document)
    if "gate" in document:
        gate = document["gate"]
        verdict = "FAILED" if gate["regressions"] else "passed"
        lines += ["", f"## Version gate: {verdict} (against deep_ep {gate['baseline'].get('deep_ep')})", ""]
        lines += [f"- REGRESSION {r}" for r in gate["regressions"]]
        lines += [f"- reported {i}" for i in gate["improvements"]]
        lines += [f"- added {a}" for a in gate.get("additions", [])]
    return "\n".join(lines) + "\n"


def _bump_section(bump: dict[str, Any], path: str | None) -> list[str]:
    """The bump, first in the Markdown report: bump.md's text one heading level down."""
    text = bump_markdown(bump).replace("\n## ", "\n### ").replace("\n### Accepted", "\n#### Accepted")
    body = text.split("\n", 1)[1].strip()
    title = f"## The bump {bump['before']['deep_ep']} -> {bump['after']['deep_ep']}"
    return [title, "", *([f"(Also `{path}`, to paste into a PR.)", ""] if path else []), body, ""]


def _coverage_lines(document: dict[str, Any]) -> list[str]:
    """The Markdown "API coverage" section: the counts, then every item missing, and every stale or unknown
    exclusion (the full table: ``python -m conformance.core.api_coverage <this conformance.json>``)."""
    coverage = document.get("api_coverage")
    if not coverage:
        return []
    counts = coverage["summary"]
    partial = "" if document.get("complete", True) else " (a partial run)"
    lines = ["", f"## API coverage (the recorded DeepEP 2.1.0 surface, {coverage['surface']})", "",
             f"Measured from the library calls the properties made{partial}: {counts['items']} methods and "
             f"keywords, {counts['exercised']} exercised, {counts['excluded']} "
             f"excluded ({coverage['exclusions']}), {counts['missing']} neither. Table: "
             f"`python -m conformance.core.api_coverage {document.get('path') or 'conformance.json'}`."]
    if coverage["missing"]:
        lines += ["", "Neither exercised nor excluded: " + ", ".join(f"`{m}`" for m in coverage["missing"]) + "."]
    for kind in ("stale", "unknown"):
        if coverage[kind]:
            lines += ["", f"{kind.capitalize()} exclusions: " + ", ".join(f"`{m}`" for m in coverage[kind]) + "."]
    return lines
