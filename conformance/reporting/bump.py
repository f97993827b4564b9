"""The explanation of a DeepEP version bump, from two reports alone: what an integrator must change, what they lose,
what holds, which defects are fixed or still there, what happens to their wrapper, and the gate's verdict.

:func:`explain` turns a baseline report and this run's (any schema the gate reads) into the ``bump`` section of the
report (``gate.bump`` in conformance.json): the two library versions (per backend, from the reports'
environments), the API migration table (from the two API surfaces P14 recorded: removed, renamed, changed, with
what to do), per property and backend what held before and what holds now (backends matched by role:
``real-v2`` is ``ElasticBuffer`` on 2.1.0 and ``EPBuffer`` on 2.5.0), the known defects by id across the two
reports, what each plug-in's wrapper drove before and now, the findings (each with the id ``--accept-bump``
names, :mod:`conformance.reporting.accept`), and the verdict.  :func:`markdown` writes it for a PR
(``reports/bump.md``); :func:`terminal_lines` gives the first lines of the terminal summary.

``python -m conformance.reporting.bump OLD.json NEW.json --out docs/bumps/2.1.0-to-2.5.0.md [--accept-bump FILE]``
writes the same Markdown from two kept reports (no run); ``--gate`` makes its exit status the verdict.  ``--rerun
REPORT`` (repeatable): the properties a later run of the same DeepEP version made replace the new report's (a rerun
after a fix of the suite), said in the Markdown with the rerun's report and command (:func:`with_reruns`).
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Any

from conformance.reporting.accept import Acceptance, load_acceptance
from conformance.reporting.gate import Comparison, load_report, versions_of
from conformance.reporting.schema import contract_of

#: Order of the API migration table.
KIND_ORDER = ("removed-class", "renamed-class", "removed-method", "added-required-param", "removed-param",
              "renamed-param", "kind-changed", "moved-param", "default-changed", "static-changed",
              "return-arity-changed", "probe-changed", "added-class", "added-method", "added-optional-param")


# ------------------------------------------------------------------------------------------ versions
def library_version(document: dict[str, Any]) -> str:
    """The deep_ep a report ran: the real library's version, else what the backends drove (the emulation's)."""
    env = document.get("environment", {})
    if env.get("deep_ep"):
        return str(env["deep_ep"])
    seen = sorted({str(b["deep_ep_seen"]["version"]) for b in env.get("backends", [])
                   if (b.get("deep_ep_seen") or {}).get("version")})  # what the ranks imported, first
    seen = seen or sorted({v for v in versions_of(document).values() if v})
    if seen:
        return " / ".join(seen)
    probe = (env.get("probes") or {}).get("conformance.emulation") or {}
    return str(probe.get("version") or "unknown")


def _short(version: str) -> str:
    return version.replace("+emulation", "")


def _backend_rows(c: Comparison) -> list[dict[str, Any]]:
    """Per backend of either report: its class, contract and version before and now, and what became of it."""
    versions_old, versions_new = versions_of(c.old), versions_of(c.new)
    wrappers = {row["name"]: row for row in c.wrappers}
    rows = []
    for name, entry in c.olds.items():
        new_name = c.mapping.get(name)
        after = c.news.get(new_name) if new_name else None
        collapsed = c.collapsed.get(name)
        status = "compared"
        if collapsed is not None:
            status = {"api-removed": "API removed", "wrapper": "the wrapper stopped using DeepEP"}.get(
                collapsed.kind, "checked on nothing now")
        elif after is None:
            status = "not in this run"
        elif name in wrappers and wrappers[name]["change"]:
            status = wrappers[name]["change"]
        rows.append({"baseline": name, "now": new_name, "contract": contract_of(entry),
                     "class_before": entry.get("api"), "class_now": (after or {}).get("api"),
                     "version_before": versions_old.get(name), "version_now": versions_new.get(new_name or ""),
                     "real_before": bool(entry.get("real")), "real_now": bool((after or {}).get("real")),
                     "status": status, "finding": collapsed.id if collapsed else None})
    for name, entry in c.news.items():
        if name not in c.mapping.values():
            rows.append({"baseline": None, "now": name, "contract": contract_of(entry), "class_before": None,
                         "class_now": entry.get("api"), "version_before": None, "version_now": versions_new.get(name),
                         "real_before": False, "real_now": bool(entry.get("real")), "status": "new in this run",
                         "finding": None})
    return rows


# ------------------------------------------------------------------------------------------ API migration
def _param(where: str) -> tuple[str, str]:
    """``Class.method(param)`` -> (``Class.method``, ``param``)."""
    head, _, rest = where.partition("(")
    return head, rest.rstrip(")")


def migration_row(change: Any, collapsed: dict[str, Any]) -> dict[str, Any]:
    """One row of the migration table: the API element before, what it is now, and what an integrator does."""
    where, kind, detail = change.where, change.kind, change.detail
    now, action = detail, ""
    if kind == "removed-class":
        backends = [name for name, f in collapsed.items() if f.id == change.id]
        now = "removed"
        action = (f"no class carries its methods in the new version: code using `{where}` stops working; "
                  + ("the V1 properties are unsupported" if where == "Buffer" else "its properties are unsupported")
                  + (f" ({', '.join(backends)}: checked on nothing now)" if backends else "")
                  + "; move to the other API or stay on the old version")
    elif kind == "renamed-class":
        target = detail.split("'")[1] if "'" in detail else "?"
        now = f"`{target}`"
        action = f"replace `deep_ep.{where}` by `deep_ep.{target}` (same methods; their changes are listed below)"
    elif kind == "removed-method":
        now, action = "removed", f"stop calling `{where}`: no method of that name in the new version"
    elif kind == "removed-param":
        method, param = _param(where)
        now, action = "parameter removed", f"stop passing `{param}` to `{method}`"
    elif kind == "renamed-param":
        method, param = _param(where)
        target = detail.split("'")[1] if "'" in detail else "?"
        now, action = f"renamed to `{target}`", f"pass `{target}=` instead of `{param}=` to `{method}`"
    elif kind == "added-required-param":
        method, param = _param(where)
        now, action = "new required parameter", f"pass `{param}` to `{method}` (no default)"
    elif kind == "default-changed":
        method, param = _param(where)
        before = detail.split(" -> ")[0]
        now, action = f"default {detail}", f"pass `{param}={before}` to `{method}` to keep the old behaviour"
    elif kind in ("kind-changed", "moved-param"):
        method, param = _param(where)
        now, action = detail, f"pass `{param}` to `{method}` by keyword"
    elif kind == "static-changed":
        now, action = detail, f"call `{where}` as the new version defines it"
    elif kind == "return-arity-changed":
        now, action = detail, f"unpack what `{where}` returns anew ({detail})"
    elif kind == "probe-changed":
        name = where.removeprefix("import ")
        before, _, after = detail.partition(" -> ")
        now = f"import: {after}"
        action = (f"import `{name}` from `deep_ep{after.strip(chr(39))}`" if after.startswith("'.") else
                  f"`from deep_ep import {name}` gives {after} (was {before})")
    elif kind == "added-class":
        now, action = "new class", "nothing to do"
    elif kind == "added-method":
        now, action = "new method", "nothing to do"
    elif kind == "added-optional-param":
        method, param = _param(where)
        now, action = detail, "nothing to do (optional)"
    return {"id": change.id, "where": where, "kind": kind, "detail": detail, "now": now, "action": action,
            "breaking": change.breaking, "modules": list(change.modules)}


def _migration(c: Comparison) -> list[dict[str, Any]]:
    """The migration table: one row per change, the parameters one removal moved grouped per method (a removed
    positional parameter moves every one after it: pass them by keyword)."""
    rows: list[dict[str, Any]] = []
    classes = {ch.where for ch in c.api if ch.kind in ("removed-class", "renamed-class")}
    moved: dict[str, dict[str, Any]] = {}
    for change in sorted(c.api, key=lambda ch: (KIND_ORDER.index(ch.kind) if ch.kind in KIND_ORDER else 99,
                                                ch.where)):
        if change.kind == "probe-changed" and change.where.removeprefix("import ") in classes:
            continue  # the class' own row says it
        finding = c.findings.get(change.id)
        if change.kind == "moved-param":
            method, param = _param(change.where)
            if method in moved:
                group = moved[method]
                group["params"].append(param)
                group["ids"].append(change.id)
                group["now"] = f"{len(group['params'])} parameters moved"
                group["action"] = (f"pass {', '.join(f'`{q}`' for q in group['params'])} to `{method}` by keyword")
                group["accepted"] = group["accepted"] if finding and finding.accepted else None
                continue
            row = migration_row(change, c.collapsed)
            row.update(params=[param], ids=[change.id], where=f"{method}(...)", now="1 parameter moved")
            moved[method] = row
        else:
            row = migration_row(change, c.collapsed)
            row["ids"] = [change.id]
        row["accepted"] = finding.accepted if finding else None
        rows.append(row)
    for row in moved.values():
        if len(row["ids"]) > 1:
            row["id"] = f"{row['ids'][0].split('(')[0]}(...)"
    return rows


# ------------------------------------------------------------------------------------------ the explanation
def explain(baseline: dict[str, Any], current: dict[str, Any], accept: Acceptance | None = None,
            baseline_path: str | None = None, blocking: list[str] | None = None) -> dict[str, Any]:
    """The ``bump`` section (module docstring) of ``current`` against ``baseline``.  ``blocking``: reasons to fail
    that no finding carries and nothing can accept (a partial run), said first."""
    c = Comparison(baseline, current, accept)
    result = c.result()
    result["regressions"] = [*(blocking or []), *result["regressions"]]
    before, after = library_version(c.old), library_version(c.new)
    failing = [f for f in result["findings"] if f["fails"]]
    counts: dict[str, int] = {}
    for row in c.transitions:
        key = row["change"].split(":")[0]
        counts[key] = counts.get(key, 0) + 1
    verdict = {
        "failed": bool(result["regressions"]),
        "findings": len(failing),
        "accepted": len(result["accepted"]),
        "text": (f"the bump {_short(before)} -> {_short(after)} "
                 + ("FAILS the gate: " + "; ".join(
                     [*(["this run is partial"] if blocking else []),
                      *([f"{len(failing)} finding(s) lost or changed a behaviour"] if failing else [])])
                    if result["regressions"] else "passes the gate: nothing lost or changed")
                 + (f" ({len(result['accepted'])} accepted)" if result["accepted"] else "")
                 + (f"; {len(c.still_failing)} failure(s) of the baseline still there" if c.still_failing else "")),
    }
    accept = accept or Acceptance()
    return {
        "before": {"deep_ep": before, "report": baseline_path, "command": c.old["environment"].get("command"),
                   "schema": c.old.get("schema_written"), "mutant": c.old["environment"].get("mutant")},
        "after": {"deep_ep": after, "command": c.new["environment"].get("command"),
                  "mutant": c.new["environment"].get("mutant")},
        "version_changed": _short(before) != _short(after),
        "backends": _backend_rows(c),
        "matching": c.match_notes,
        "api": {"source": c.api_source, "migration": _migration(c)},
        "transitions": [row for row in c.transitions if row["change"] not in ("held", "unchanged")],
        "transition_counts": counts,
        "defects": c.defects,
        "wrappers": c.wrappers,
        "findings": result["findings"],
        "accepted": result["accepted"],
        "accept_file": accept.path,
        "stale_acceptances": [{"finding": e.finding, "why": e.why} for e in accept.stale()],
        "regressions": result["regressions"],
        "improvements": result["improvements"],
        "additions": result["additions"],
        "still_failing": result["still_failing"],
        "verdict": verdict,
    }


def with_reruns(current: dict[str, Any], reruns: list[tuple[str, dict[str, Any]]]) -> tuple[dict[str, Any],
                                                                                        list[dict[str, Any]]]:
    """``current`` with every property a rerun reported (not ``not-run``) replaced by the rerun's entry, and the
    known defects of those properties by the rerun's; and what was replaced from where.  A rerun of another DeepEP
    version than ``current``'s is refused (ValueError): it would mix two libraries in one column."""
    out = copy.deepcopy(current)
    notes: list[dict[str, Any]] = []
    for path, rerun in reruns:
        if library_version(rerun) != library_version(current):
            raise ValueError(f"the rerun {path} ran deep_ep {library_version(rerun)}, the report "
                             f"{library_version(current)}: a rerun replaces properties of the same version only")
        index = {p["id"]: i for i, p in enumerate(out["properties"])}
        ran = [p for p in rerun.get("properties", []) if p.get("status") != "not-run" and p["id"] in index]
        if not ran:
            raise ValueError(f"the rerun {path} reports none of the report's properties")
        ids = {p["id"] for p in ran}
        for entry in ran:
            out["properties"][index[entry["id"]]] = entry
        known = out.setdefault("known_defects", {"entries": []})
        known["entries"] = [e for e in known.get("entries", []) if e.get("property") not in ids] + \
            [e for e in rerun.get("known_defects", {}).get("entries", []) if e.get("property") in ids]
        notes.append({"report": path, "properties": sorted(ids), "command": rerun["environment"].get("command")})
    return out, notes


# ------------------------------------------------------------------------------------------ Markdown
def _cell(text: Any) -> str:
    return str(text if text is not None else "-").replace("|", "\\|").replace("\n", " ")


def _checks(state: dict[str, Any] | None) -> str:
    if state is None:
        return "not in the run"
    drives = ("drives DeepEP" + f" ({state['contract']} path)") if state.get("drives_deep_ep") else \
        "does not drive DeepEP"
    checked = state.get("checked")
    if checked:
        drives += ": " + ", ".join(f"`{k}` = {v}" for k, v in checked.items())
    elif state.get("inferred"):
        drives += f" (from its verdicts: checked on {state.get('properties_checked', 0)} properties)"
    return drives


def markdown(bump: dict[str, Any]) -> str:
    """``bump.md``: the explanation, for a person to paste into a PR."""
    before, after = bump["before"]["deep_ep"], bump["after"]["deep_ep"]
    v = bump["verdict"]
    mutants = [m for m in (bump["before"].get("mutant"), bump["after"].get("mutant")) if m]
    lines = [f"# DeepEP bump: {before} -> {after}"
             + (f" (planted: {', '.join(f'mutant {m}' for m in mutants)})" if mutants else ""), "",
             f"**Verdict: {v['text']}.** " + ("Exit status 1: every finding below fails the gate unless an "
                                              "accepted-changes file lists it (`--accept-bump FILE`, entries by the "
                                              "finding ids shown)." if v["failed"] else "Exit status 0."), ""]
    if bump["before"].get("report"):
        lines += [f"Baseline: `{bump['before']['report']}`" + (f" (`{bump['before']['command']}`)"
                                                              if bump["before"].get("command") else ""), ""]
    if bump["after"].get("report"):
        lines += [f"Now: `{bump['after']['report']}`" + (f" (`{bump['after']['command']}`)"
                                                        if bump["after"].get("command") else ""), ""]
    for rerun in bump["after"].get("reruns", []):
        lines += [f"Rerun: {', '.join(rerun['properties'])} from `{rerun['report']}`"
                  + (f" (`{rerun['command']}`)" if rerun.get("command") else "")
                  + ": its results replace the run's (a rerun of the same version after a fix of the suite).", ""]
    lines += ["| backend | contract | baseline | now | |", "|---|---|---|---|---|"]
    for row in bump["backends"]:
        was = (f"`{row['class_before']}`, {row['version_before']}" if row["baseline"] else "-")
        now = (f"`{row['class_now']}`, {row['version_now']}" if row["now"] else "-")
        name = row["baseline"] if row["baseline"] == row["now"] or not row["now"] else (
            row["now"] if not row["baseline"] else f"{row['baseline']} -> {row['now']}")
        lines.append(f"| {name} | {row['contract']} | {was} | {now} | {row['status']}"
                     + (f" (`{row['finding']}`)" if row["finding"] else "") + " |")
    for note in bump["matching"]:
        lines += ["", f"_{note}._"]
    lines += ["", "## What to change: the API", ""]
    api = bump["api"]
    if api["source"] == "none":
        lines.append("Not compared: neither report carries an API surface (P14 did not run) or an import probe.")
    else:
        source = {"surfaces": "the two API surfaces P14 recorded",
                  "snapshots": "the suite's API snapshots of the two deep_ep versions the runs drove "
                               "(`conformance/versions/<version>/api-surface.json`; P14 did not run in one of them)",
                  }.get(api["source"], "the two runs' import probes only (P14 did not run in one of them: "
                                       "signatures not compared)")
        rows = [r for r in api["migration"] if r["breaking"]]
        extra = [r for r in api["migration"] if not r["breaking"]]
        lines.append(f"From {source}." + ("" if rows else " No breaking change."))
        if rows:
            lines += ["", "| was | now | what to do | finding |", "|---|---|---|---|"]
            for r in rows:
                lines.append(f"| `{_cell(r['where'])}` | {_cell(r['now'])} | {_cell(r['action'])} | `{r['id']}`"
                             + (" (accepted)" if r.get("accepted") else "") + " |")
        if extra:
            lines += ["", "New (nothing to do): " + "; ".join(f"`{r['where']}` ({r['detail']})" for r in extra) + "."]
    findings = [f for f in bump["findings"] if f["fails"]]
    api_ids = {i for r in api["migration"] for i in r.get("ids", [r["id"]])}
    api_failing = [f for f in findings if f["id"] in api_ids]
    lines += ["", "## What fails the gate", ""]
    if not bump["regressions"]:
        lines.append("Nothing: no behaviour of the baseline is lost or changed"
                     + (" that is not accepted." if bump["accepted"] else "."))
    else:
        if findings:
            lines += ["| finding | kind | what |", "|---|---|---|"]
            grouped = {i: r for r in api["migration"] if len(r.get("ids", [])) > 1 for i in r["ids"]}
            lines += [f"| `{f['id']}` | {f['kind']} | {_cell(f['summary'][:400])} |" for f in findings
                      if f["id"] not in grouped]
            for row in {id(r): r for r in grouped.values()}.values():
                ids = [f for f in api_failing if f["id"] in row["ids"]]
                if ids:
                    lines.append(f"| `{row['id']}` | api | {row['where']}: {row['now']} ({len(ids)} findings, one "
                                 f"per parameter: `{ids[0]['id']}`, ...) |")
        lines += ["", "In full:", ""] + [f"- {r}" for r in bump["regressions"]]
    if bump["accepted"]:
        lines += ["", f"### Accepted ({bump['accept_file']})", ""]
        lines += [f"- `{a['id']}`: {a['accepted']} ({_cell(a['summary'][:300])})" for a in bump["accepted"]]
    if bump["stale_acceptances"]:
        lines += ["", "Entries of the accepted-changes file that match no finding (stale): "
                  + ", ".join(f"`{e['finding']}`" for e in bump["stale_acceptances"]) + "."]
    lines += ["", "## Per property and backend: the baseline and now", ""]
    counts = bump["transition_counts"]
    lines.append(", ".join(f"{n} {k}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1])) + " (property x "
                 "backend cells compared; backends checked on nothing now are in the table above, once)."
                 if counts else "No property was compared on a backend of both runs.")
    if bump["transitions"]:
        lines += ["", "| property | backend | baseline | now | change |", "|---|---|---|---|---|"]
        for t in bump["transitions"]:
            lines.append(f"| {t['property']} | {t['backend']} | {t['before'] or '-'} | {t['after']} | "
                         f"{_cell(t['change'])}" + (f"<br><sub>{_cell(t['reason'])}</sub>"
                                                    if t["reason"] and t["change"].startswith(("lost", "new")) else "")
                         + " |")
    if bump["defects"]:
        lines += ["", "## Known defects", "", "| id | property | backend | baseline | now | |",
                  "|---|---|---|---|---|---|"]
        for d in bump["defects"]:
            lines.append(f"| {d['id']} | {d['property'] or '-'} | {d['backend'] or '-'} | {d['before'] or '-'} | "
                         f"{d['after'] or '-'} | {_cell(d['change'])} |")
    if bump["wrappers"]:
        lines += ["", "## Wrappers (plug-ins)", "", "| plug-in | baseline | now | |", "|---|---|---|---|"]
        for w in bump["wrappers"]:
            lines.append(f"| {w['name']} | {_cell(_checks(w['before']))} | {_cell(_checks(w['after']))} | "
                         f"{_cell(w['change'])}" + (f" (`{w['finding']}`)" if w["finding"] else "") + " |")
    if bump["still_failing"]:
        lines += ["", "## Still failing (failed in the baseline too: not the bump's)", ""]
        lines += [f"- {s}" for s in bump["still_failing"]]
    if bump["improvements"]:
        lines += ["", "## Improvements", ""] + [f"- {s}" for s in bump["improvements"]]
    if bump["additions"]:
        lines += ["", "## Additions", ""] + [f"- {s}" for s in bump["additions"]]
    return "\n".join(lines) + "\n"


def terminal_lines(bump: dict[str, Any], path: str | None = None) -> list[tuple[str, dict[str, bool]]]:
    """The first lines of the terminal summary: the versions and verdict, the API in one line, the findings."""
    v = bump["verdict"]
    lines: list[tuple[str, dict[str, bool]]] = [
        (f"DeepEP bump {bump['before']['deep_ep']} -> {bump['after']['deep_ep']}: {v['text']}",
         {"bold": True, "red": v["failed"], "green": not v["failed"]})]
    breaking = [r for r in bump["api"]["migration"] if r["breaking"]]
    if breaking:
        shown = []
        for r in breaking[:6]:
            shown.append({"removed-class": f"{r['where']} removed", "renamed-class": f"{r['where']} -> "
                          f"{r['now'].strip('`')}"}.get(r["kind"], f"{r['where']}: {r['now']}"))
        lines.append(("  API: " + "; ".join(shown) + (f"; and {len(breaking) - 6} more" if len(breaking) > 6 else ""),
                      {}))
    wrappers = {w["name"]: w for w in bump["wrappers"] if w["finding"]}
    summaries = {f["id"]: f for f in bump["findings"]}
    for r in bump["backends"]:
        if r["finding"] or r["baseline"] in wrappers:
            w = wrappers.get(r["baseline"])
            finding = summaries.get(r["finding"] or (w or {}).get("finding") or "", {})
            text = (f"{r['baseline']}: {w['change']}{Comparison._checks_text(w['before'], w['after'])}" if w else
                    finding.get("summary") or f"{r['baseline']}: {r['status']}")
            lines.append((f"  {text[:300]}" + (f" [{finding['id']}]" if finding else ""),
                          {"red": bool(finding.get("fails"))}))
    counts = bump["transition_counts"]
    if counts:
        lines.append(("  per property and backend: " + ", ".join(f"{n} {k}" for k, n in
                                                                 sorted(counts.items(), key=lambda kv: -kv[1])), {}))
    api_ids = {i for r in bump["api"]["migration"] for i in r.get("ids", [r["id"]])}
    shown = {r["finding"] for r in bump["backends"] if r["finding"]} | {w["finding"] for w in wrappers.values()}
    failing = [f for f in bump["findings"] if f["fails"]]
    api_failing = [f for f in failing if f["id"] in api_ids and f["id"] not in shown]
    listed = [f for f in failing if f not in api_failing and f["id"] not in shown]
    for f in listed[:8]:
        lines.append((f"  finding {f['id']}: {f['summary'][:160]}", {"red": True}))
    if len(listed) > 8:
        lines.append((f"  ... and {len(listed) - 8} more finding(s)", {"red": True}))
    if api_failing:
        lines.append((f"  findings api:...: {len(api_failing)} breaking API change(s) (the migration table)",
                      {"red": True}))
    if bump["accepted"]:
        lines.append((f"  accepted ({bump['accept_file']}): {len(bump['accepted'])} finding(s)", {}))
    if path:
        lines.append((f"  the bump explained: {path}", {}))
    return lines


# ------------------------------------------------------------------------------------------ CLI
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.reporting.bump",
                                     description="Explain a DeepEP bump from two kept conformance.json reports "
                                                 "(Markdown, e.g. docs/bumps/<old>-to-<new>.md).")
    parser.add_argument("baseline", help="the report of the old version (e.g. a --write-baseline file)")
    parser.add_argument("current", help="the report of the new version")
    parser.add_argument("--out", metavar="FILE", help="write the Markdown there (default: print it)")
    parser.add_argument("--accept-bump", metavar="FILE", help="accepted changes (docs/reference.md)")
    parser.add_argument("--gate", action="store_true", help="exit 1 when the bump fails the gate")
    parser.add_argument("--rerun", metavar="REPORT", action="append", default=[],
                        help="a later report of the same DeepEP version whose properties replace the current report's "
                             "(a rerun after a fix of the suite; repeatable)")
    args = parser.parse_args(argv)
    try:
        old, new = load_report(args.baseline), load_report(args.current)
        new, reruns = with_reruns(new, [(path, load_report(path)) for path in args.rerun])
        accept = load_acceptance(args.accept_bump)
        bump = explain(old, new, accept, baseline_path=args.baseline)
        bump["after"].update(report=args.current, reruns=reruns)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text = markdown(bump)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
        print(f"wrote {args.out}: {bump['verdict']['text']}")
    else:
        print(text, end="")
    return 1 if args.gate and bump["verdict"]["failed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
