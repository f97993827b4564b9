"""The kill matrix: one entry per mutant (which properties caught it, after how many examples), a summary,
the JSON report and the exit status.

Entries are plain JSON-able dicts so that reports written by worker processes (``--jobs``) merge as is::

    {"name", "kind", "description", "killed", "killed_by": [property ids], "examples_to_kill", "wall_s",
     "properties": {property id: {"outcome", "examples", "message", "example", "wall_s"}},
     "not_applicable": why the mutant did not run in this world (e.g. a multi-node defect, one node), or null}

A not-applicable mutant counts neither as harmful nor as benign in the summary; it is listed with its reason.

A property's ``outcome`` on a mutant is one of :data:`OUTCOMES`.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

#: held: every example passed.  killed: an example failed (assertion or rank failure) and passes without
#: the mutant.  unattributed: it fails without the mutant too (the property or the emulation is broken).
#: error: the check itself raised something other than an assertion or a rank failure (a suite bug).
OUTCOMES = ("held", "killed", "unattributed", "error")


def property_outcome(
    outcome: str, examples: int, message: str | None = None, example: str | None = None, wall_s: float = 0.0
) -> dict:
    """One cell of the matrix: what ``examples`` draws of one property did on one mutant."""
    if outcome not in OUTCOMES:
        raise ValueError(f"outcome must be one of {OUTCOMES}, got {outcome!r}")
    return {"outcome": outcome, "examples": examples, "message": message, "example": example,
            "wall_s": round(wall_s, 3)}


def mutant_entry(name: str, kind: str, description: str, properties: dict[str, dict], wall_s: float,
                 not_applicable: str | None = None) -> dict:
    """One row of the matrix; ``killed_by`` / ``examples_to_kill`` are derived from the cells."""
    killers = {pid: cell for pid, cell in properties.items() if cell["outcome"] == "killed"}
    return {
        "name": name,
        "kind": kind,
        "description": description,
        "killed": bool(killers),
        "killed_by": sorted(killers, key=property_sort_key),
        "examples_to_kill": min((cell["examples"] for cell in killers.values()), default=None),
        "wall_s": round(wall_s, 3),
        "properties": properties,
        "not_applicable": not_applicable,
    }


def property_sort_key(property_id: str) -> tuple[int, str]:
    """Order ``P2-...`` before ``P10-...``."""
    digits = "".join(ch for ch in property_id.split("-", 1)[0] if ch.isdigit())
    return (int(digits) if digits else 1 << 30, property_id)


def summarize(entries: list[dict], *, wall_s: float, max_examples: int, world: dict[str, Any]) -> dict:
    """The summary of a kill matrix (counts, survivors, false alarms, median examples to kill)."""
    applicable = [e for e in entries if not e.get("not_applicable")]
    harmful = [e for e in applicable if e["kind"] == "harmful"]
    benign = [e for e in applicable if e["kind"] == "benign"]
    to_kill = [e["examples_to_kill"] for e in harmful if e["killed"]]
    problems = {outcome: [f"{e['name']} / {pid}: {cell['message']}" for e in entries
                          for pid, cell in e["properties"].items() if cell["outcome"] == outcome]
                for outcome in ("unattributed", "error")}
    return {
        "harmful": len(harmful),
        "benign": len(benign),
        "harmful_killed": sum(e["killed"] for e in harmful),
        "benign_spared": sum(not e["killed"] for e in benign),
        "survivors": [e["name"] for e in harmful if not e["killed"]],
        "false_alarms": [e["name"] for e in benign if e["killed"]],
        "not_applicable": [f"{e['name']}: {e['not_applicable']}" for e in entries if e.get("not_applicable")],
        "unattributed": problems["unattributed"],
        "errors": problems["error"],
        "median_examples_to_kill": statistics.median(to_kill) if to_kill else None,
        "wall_s": round(wall_s, 3),
        "max_examples": max_examples,
        "world": world,
    }


def exit_status(summary: dict) -> int:
    """0 if every harmful mutant was killed, every benign one spared and nothing else went wrong; else 1."""
    bad = summary["survivors"] or summary["false_alarms"] or summary["unattributed"] or summary["errors"]
    return 1 if bad else 0


def write_report(path: str | Path, entries: list[dict], summary: dict) -> Path:
    """Write ``{"mutants": entries, "summary": summary}`` as JSON; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"mutants": entries, "summary": summary}, indent=2) + "\n")
    return path


def verdict(entry: dict) -> str:
    """``killed`` / ``SURVIVED`` for harmful mutants, ``spared`` / ``FALSE ALARM`` for benign ones."""
    if entry.get("not_applicable"):
        return "n/a"
    if entry["kind"] == "harmful":
        return "killed" if entry["killed"] else "SURVIVED"
    return "FALSE ALARM" if entry["killed"] else "spared"


TABLE_FORMAT = "{:<28} {:<8} {:<12} {:>9} {:>8}  {}"


def table_header() -> str:
    """The header of the table printed while mutants run."""
    return TABLE_FORMAT.format("mutant", "kind", "verdict", "examples", "seconds", "killed by")


def table_row(entry: dict) -> str:
    """One printed row per mutant (``examples`` = examples to kill)."""
    examples = "-" if entry["examples_to_kill"] is None else str(entry["examples_to_kill"])
    return TABLE_FORMAT.format(entry["name"], entry["kind"], verdict(entry), examples, f"{entry['wall_s']:.1f}",
                               ", ".join(entry["killed_by"]) or "-")


def summary_lines(summary: dict) -> list[str]:
    """The closing lines: totals, then every survivor, false alarm and broken property, spelled out."""
    lines = [
        f"harmful killed {summary['harmful_killed']}/{summary['harmful']}, benign spared "
        f"{summary['benign_spared']}/{summary['benign']}, median examples to kill "
        f"{summary['median_examples_to_kill']}, {summary['wall_s']:.1f} s "
        f"(max {summary['max_examples']} examples per property)"
    ]
    lines += [f"not applicable here: {item}" for item in summary.get("not_applicable", [])]
    lines += [f"SURVIVOR (harmful, no property failed): {name}" for name in summary["survivors"]]
    lines += [f"FALSE ALARM (benign, a property failed): {name}" for name in summary["false_alarms"]]
    lines += [f"UNATTRIBUTED (fails without the mutant too): {item}" for item in summary["unattributed"]]
    lines += [f"ERROR (suite bug: a check crashed, or a property module does not import): {item}"
              for item in summary["errors"]]
    return lines
