"""API coverage: which methods and keywords of the recorded DeepEP 2.1.0 surface the properties exercised, as
measured from the calls they made, against the deliberate exclusions.

The measurement comes from the rank side (``conformance.backends.tracing``: every traced library call adds
``(backend, "Class.method", given parameters, returned, enclosing call)``); each property's calls are collected at
its end and reported per property (``api_calls`` of its report entry, :func:`calls_as_json`).  Here they are
judged against the surface:

* the *items* are every method of the snapshot (DeepEP 2.1.0's ``api-surface.json``: the compared ``classes`` and
  the methods listed ``not_covered``) and every parameter of the compared methods: ``Buffer.dispatch`` and
  ``Buffer.dispatch(num_worst_tokens)``;
* a method is *exercised* by a property when the property called it and the call returned (a call that raised
  tested a refusal, not the method: it is shown as ``refused`` and does not count); a parameter when, in such a
  call, it was *given*: a required one passed at all, an optional one passed with a value other than its default
  (so a bool option exercised only at its default is not exercised; the rule is ``tracing``'s);
* calls the library made itself (``Buffer.dispatch`` forwarding to ``Buffer.internode_dispatch`` on several
  nodes, building its ``EventOverlap``) count, and the table says through which call;
* ``coverage.toml`` lists what is deliberately not exercised, each item with a category and a reason (excluding a
  method excludes its parameters).  An item neither exercised nor excluded is *missing*; an exclusion that names
  nothing of the surface is *unknown*; one whose item is exercised after all is *stale*.

``python -m conformance.core.api_coverage REPORT.json [REPORT.json ...]`` prints the table (method / keyword /
exercised by / excluded why) for the union of the reports (e.g. a 1-node and a 2-node run); exit status 1 when
something is missing, stale or unknown.  ``tests/nocover/test_api_coverage.py`` runs the catalog on the emulation and
fails the same way.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conformance.core.api_surface import SNAPSHOT, SNAPSHOT_DIR, load_snapshot

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

EXCLUSIONS = SNAPSHOT_DIR / "coverage.toml"
#: The categories an exclusion may give (``coverage.toml``'s header explains them).
CATEGORIES = ("outside-contract", "hardware-only", "not-emulated", "no-observable-effect")
#: How a call made from the suite itself (not from inside another traced library call) is named in ``called_from``.
SUITE = "(suite)"
#: Properties whose calls that return are only checked to return: P12's valid neighbours of refusal rows.  They
#: count as exercising (the library accepted the value), and the table flags an item no other property exercises.
ACCEPTANCE_ONLY = ("P12-bad-input",)


# ------------------------------------------------------------------------------------------ measured calls
def calls_as_json(calls: Iterable[tuple[str, str, Iterable[str], bool, str | None]]) -> dict[str, Any]:
    """One property's recorded calls, per ``Class.method``: the backends that called it, whether a call returned,
    the parameters given in calls that returned (``given``) and in calls that raised (``given_when_raised``), and
    where it was called from (:data:`SUITE`, or the enclosing library call)."""
    out: dict[str, dict[str, Any]] = {}
    for backend, method, given, returned, outer in calls:
        entry = out.setdefault(method, {"backends": set(), "returned": False, "given": set(),
                                        "given_when_raised": set(), "called_from": set()})
        entry["backends"].add(backend)
        entry["returned"] |= bool(returned)
        entry["given" if returned else "given_when_raised"].update(given)
        entry["called_from"].add(outer or SUITE)
    return {method: {k: sorted(v) if isinstance(v, set) else v for k, v in entry.items()}
            for method, entry in sorted(out.items())}


# ------------------------------------------------------------------------------------------ the surface
@dataclass(frozen=True)
class Item:
    """A method (``param`` None) or one of its parameters."""

    cls: str
    method: str
    param: str | None = None
    required: bool = False
    default: str | None = None
    compared: bool = True  # False: a method listed ``not_covered`` (its signature is not in the snapshot)

    @property
    def name(self) -> str:
        where = f"{self.cls}.{self.method}"
        return where if self.param is None else f"{where}({self.param})"

    @property
    def owner(self) -> str:
        """The method item's name."""
        return f"{self.cls}.{self.method}"


def surface_items(snapshot: dict[str, Any]) -> dict[str, Item]:
    """Every method and parameter of ``snapshot``, by name, in the snapshot's order."""
    items: dict[str, Item] = {}
    for cls, methods in snapshot["classes"].items():
        for method, entry in methods.items():
            items[f"{cls}.{method}"] = Item(cls, method)
            for p in entry["params"]:
                item = Item(cls, method, p["name"], required=p["default"] is None and p["kind"] not in (
                    "VAR_POSITIONAL", "VAR_KEYWORD"), default=p["default"])
                items[item.name] = item
    for cls, methods in snapshot.get("not_covered", {}).items():
        for method in methods:
            items[f"{cls}.{method}"] = Item(cls, method, compared=False)
    return items


# ------------------------------------------------------------------------------------------ exclusions
@dataclass(frozen=True)
class Exclusion:
    """One entry of ``coverage.toml``."""

    item: str
    category: str
    reason: str


def load_exclusions(path: Path = EXCLUSIONS) -> dict[str, Exclusion]:
    """The exclusions file, by item (a malformed entry raises ``ValueError`` naming it)."""
    with open(path, "rb") as f:
        data = tomllib.load(f)
    out: dict[str, Exclusion] = {}
    for index, entry in enumerate(data.get("exclude", [])):
        where = f"{path.name}: [[exclude]] #{index + 1} ({entry.get('item')!r})"
        if set(entry) != {"item", "category", "reason"}:
            raise ValueError(f"{where}: needs exactly the keys item, category, reason; has {sorted(entry)}")
        if entry["category"] not in CATEGORIES:
            raise ValueError(f"{where}: category {entry['category']!r} is not one of {', '.join(CATEGORIES)}")
        if not str(entry["reason"]).strip():
            raise ValueError(f"{where}: the reason is empty")
        if entry["item"] in out:
            raise ValueError(f"{where}: excluded twice")
        out[entry["item"]] = Exclusion(entry["item"], entry["category"], entry["reason"])
    return out


# ------------------------------------------------------------------------------------------ judgement
@dataclass
class Row:
    """One item of the surface, what measured it and what excludes it."""

    item: Item
    exercised_by: list[str] = field(default_factory=list)  # properties
    refused_in: list[str] = field(default_factory=list)  # properties whose calls with it only raised
    called_from: list[str] = field(default_factory=list)  # (suite) / the enclosing library call (methods only)
    backends: list[str] = field(default_factory=list)
    excluded: Exclusion | None = None  # its own exclusion, or its method's
    excluded_with_method: bool = False

    @property
    def status(self) -> str:
        if self.exercised_by:
            return "exercised"
        return "excluded" if self.excluded is not None else "missing"

    @property
    def accepted_only(self) -> bool:
        """Exercised only by :data:`ACCEPTANCE_ONLY` properties (the library accepted it; no result compared)."""
        return bool(self.exercised_by) and all(p in ACCEPTANCE_ONLY for p in self.exercised_by)


@dataclass
class Coverage:
    """The judged surface: one row per item, and what is wrong."""

    rows: list[Row]
    missing: list[str]  # items neither exercised nor excluded
    stale: list[str]  # exclusions whose item is exercised
    unknown: list[str]  # exclusions naming nothing of the surface
    properties: list[str]  # the properties measured

    @property
    def ok(self) -> bool:
        return not (self.missing or self.stale or self.unknown)

    def summary(self) -> dict[str, int]:
        counts = {"items": len(self.rows), "exercised": 0, "excluded": 0, "missing": 0}
        for row in self.rows:
            counts[row.status] += 1
        return counts

    def problems(self) -> list[str]:
        """One line per problem, saying what to do."""
        by_name = {r.item.name: r for r in self.rows}
        lines = [f"missing: {name} is neither exercised by a property nor excluded" + _refused_hint(by_name[name])
                 for name in self.missing]
        lines += [f"stale exclusion: {name} is exercised by {', '.join(by_name[name].exercised_by)}"
                  for name in self.stale]
        lines += [f"unknown exclusion: {name} names no method or parameter of the recorded surface"
                  for name in self.unknown]
        return lines

    def message(self, exclusions_path: Path = EXCLUSIONS) -> str:
        """The failure message of the coverage self-test: the problems and what to do about each kind."""
        counts = self.summary()
        text = [f"API coverage of the recorded DeepEP 2.1.0 surface ({SNAPSHOT.name}): {counts['items']} items, "
                f"{counts['exercised']} exercised, {counts['excluded']} excluded, {counts['missing']} missing; "
                f"{len(self.stale)} stale and {len(self.unknown)} unknown exclusions.", *self.problems()]
        if self.missing:
            text.append(f"For a missing item: exercise it in a property (call it with a non-default value, on a "
                        f"call that returns, and check the result), or exclude it with a category and a reason in "
                        f"{exclusions_path}.")
        if self.stale:
            text.append(f"For a stale exclusion: the item is exercised now; remove its entry from {exclusions_path}.")
        if self.unknown:
            text.append(f"For an unknown exclusion: fix the name (Class.method or Class.method(keyword), as in "
                        f"{SNAPSHOT.name}) or remove the entry from {exclusions_path}.")
        return "\n".join(text)


def _refused_hint(row: Row) -> str:
    return (f" (only in calls that raised, in {', '.join(row.refused_in)}: a refusal is not an exercise)"
            if row.refused_in else "")


def judge(snapshot: dict[str, Any], per_property: dict[str, dict[str, Any]],
          exclusions: dict[str, Exclusion]) -> Coverage:
    """The coverage of ``snapshot`` by ``per_property`` (property id -> its :func:`calls_as_json`)."""
    items = surface_items(snapshot)
    rows = {name: Row(item) for name, item in items.items()}
    for prop, calls in sorted(per_property.items(), key=lambda kv: property_order(kv[0])):
        for method, entry in calls.items():
            owner = rows.get(method)
            if owner is None:  # a method outside the recorded surface (e.g. an emulation-only helper)
                continue
            if entry["returned"]:
                owner.exercised_by.append(prop)
            elif prop not in owner.refused_in:
                owner.refused_in.append(prop)
            owner.called_from = sorted(set(owner.called_from) | set(entry["called_from"]))
            owner.backends = sorted(set(owner.backends) | set(entry["backends"]))
            for param in entry["given"]:
                row = rows.get(f"{method}({param})")
                if row is not None:
                    row.exercised_by.append(prop)
            for param in entry["given_when_raised"]:
                row = rows.get(f"{method}({param})")
                if row is not None and param not in entry["given"] and prop not in row.refused_in:
                    row.refused_in.append(prop)
    unknown = sorted(name for name in exclusions if name not in rows)
    for name, row in rows.items():
        own = exclusions.get(name)
        method = exclusions.get(row.item.owner) if row.item.param is not None else None
        row.excluded = own or method
        row.excluded_with_method = own is None and method is not None
    stale = [name for name in exclusions if name in rows and rows[name].exercised_by]
    missing = [name for name, row in rows.items() if row.status == "missing"]
    return Coverage(list(rows.values()), missing, stale, unknown, sorted(per_property, key=property_order))


def property_order(property_id: str) -> tuple[int, str]:
    """P2 before P10 (the catalog's order)."""
    match = re.match(r"P(\d+)", property_id)
    return (int(match.group(1)) if match else 10**6, property_id)


def per_property_calls(reports: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Property id -> its recorded calls, merged over ``reports`` (conformance.json documents: e.g. a 1-node and
    a 2-node run of the catalog)."""
    merged: dict[str, dict[str, dict[str, Any]]] = {}
    for report in reports:
        for entry in report.get("properties", []):
            for method, calls in (entry.get("api_calls") or {}).items():
                into = merged.setdefault(entry["id"], {}).setdefault(method, {
                    "backends": [], "returned": False, "given": [], "given_when_raised": [], "called_from": []})
                into["returned"] = into["returned"] or calls["returned"]
                for key in ("backends", "given", "given_when_raised", "called_from"):
                    into[key] = sorted(set(into[key]) | set(calls[key]))
    return merged


def report_section(per_property: dict[str, dict[str, Any]], snapshot: dict[str, Any] | None = None,
                   exclusions: dict[str, Exclusion] | None = None) -> dict[str, Any]:
    """The ``api_coverage`` section of conformance.json: the counts; per exercised item the properties; per excluded
    one (itself, or a method with its parameters) the category (the reason is in ``coverage.toml``); what is
    missing, given only in calls that raised, given only by :data:`ACCEPTANCE_ONLY` properties, stale or unknown."""
    error = None
    if exclusions is None:
        try:
            exclusions = load_exclusions()
        except (OSError, ValueError) as exc:  # the report is still written; the section says why it has none
            error, exclusions = f"{type(exc).__name__}: {exc}", {}
    coverage = judge(snapshot or load_snapshot(), per_property, exclusions)
    return {
        "surface": SNAPSHOT.name,
        "exclusions": EXCLUSIONS.name,
        "exclusions_error": error,
        "summary": coverage.summary(),
        "exercised": {r.item.name: r.exercised_by for r in coverage.rows if r.exercised_by},
        "excluded": {r.item.name: r.excluded.category for r in coverage.rows
                     if r.excluded is not None and not r.exercised_by and not r.excluded_with_method},
        "missing": coverage.missing,
        "refused_only": {r.item.name: r.refused_in for r in coverage.rows if r.refused_in and not r.exercised_by},
        "accepted_only": [r.item.name for r in coverage.rows if r.accepted_only],
        "stale": coverage.stale,
        "unknown": coverage.unknown,
    }


# ------------------------------------------------------------------------------------------ the table
def table(coverage: Coverage) -> list[str]:
    """The human table: method / keyword / exercised by / excluded why, one line per item."""
    lines = [f"{'method':<48} {'keyword':<36} {'status':<9} exercised by / excluded why", "-" * 140]
    for row in coverage.rows:
        item = row.item
        method = f"{item.cls}.{item.method}" if item.param is None else ""
        keyword = item.param or ("(method)" if item.compared else "(method, signature not compared)")
        if row.exercised_by:
            what = ", ".join(_short(p) for p in row.exercised_by)
            via = [c for c in row.called_from if c != SUITE]
            if via:
                what += f" (through {', '.join(via)}" + (" and directly" if SUITE in row.called_from else "") + ")"
            if row.accepted_only:
                what += " [only a valid neighbour of a refusal row: accepted, its result not compared]"
        elif row.excluded is not None:
            what = (f"[{row.excluded.category}] " + ("(with its method) " if row.excluded_with_method else "")
                    + row.excluded.reason)
        else:
            what = "MISSING" + _refused_hint(row)
        lines.append(f"{method:<48} {keyword:<36} {row.status:<9} {what}")
    counts = coverage.summary()
    lines += ["", f"{counts['items']} items: {counts['exercised']} exercised, {counts['excluded']} excluded, "
                  f"{counts['missing']} missing; properties measured: {len(coverage.properties)}"]
    lines += coverage.problems()
    return lines


def _short(property_id: str) -> str:
    return property_id.split("-", 1)[0]


def main(argv: list[str] | None = None) -> int:
    """Print the coverage table of one or more conformance.json reports (their union)."""
    parser = argparse.ArgumentParser(prog="python -m conformance.core.api_coverage",
                                     description="Print the API coverage table of conformance.json reports.")
    parser.add_argument("reports", nargs="+", type=Path, help="conformance.json files (their calls are merged)")
    parser.add_argument("--exclusions", type=Path, default=EXCLUSIONS)
    args = parser.parse_args(argv)
    reports = [json.loads(path.read_text()) for path in args.reports]
    coverage = judge(load_snapshot(), per_property_calls(reports), load_exclusions(args.exclusions))
    print("\n".join(table(coverage)))
    return 0 if coverage.ok else 1


if __name__ == "__main__":
    sys.exit(main())
