"""The version gate: compare this run's report with a baseline report (e.g. the previous DeepEP build).

Backends are matched across the two reports by name, then by role (:func:`match_backends`: ``real-v2`` drives
``ElasticBuffer`` on 2.1.0 and ``EPBuffer`` on 2.5.0, the same V2 contract), so that like is compared with like.
The gate fails, with one paragraph per reason, when

- a property held on a backend (or pair) in the baseline and fails there now, or became unsupported there, or
  vanished; a backend (or pair) failing now that the baseline did not have fails too;
- a divergence appeared, disappeared or changed its description;
- a known defect is new (failing now, while the baseline had no such failure);
- the API surface changed incompatibly: a class renamed (``ElasticBuffer`` -> ``EPBuffer``) or removed, a keyword
  removed or renamed, a method removed, a changed return arity;
- a backend that held in the baseline is checked on nothing now.  That is one paragraph, not one per property:
  *API removed* where its class is gone from the new surface (``Buffer`` in 2.5.0: every V1 property), *the
  wrapper stopped using DeepEP* for a plug-in whose wrapper says so (Megatron's ``HAVE_DEEP_EP_V2`` turned False),
  else the cause (not in the run, broken on construction).

A failure the baseline had too is reported ("still fails"), never failed: the gate judges the bump, not the
library's standing defects.  A known defect that is fixed, a failure that now holds, a capability gained are
reported (``improvements``); additions (a new optional keyword, method or class, a new property, a new backend)
are listed (``additions``).  Each reason to fail is a *finding* with an id (``api:Buffer``,
``P1-per-expert-payloads:real-v2``, ``defect:<id>``, ``wrapper:<backend>``, ``backend:<backend>``); a finding that
the accepted-changes file lists (``--accept-bump``, :mod:`conformance.reporting.accept`) is reported as accepted
and fails nothing.  Reports of schema 2 and 3 are read (:mod:`conformance.reporting.schema`).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from conformance.core.ids import Pair, is_pair, members
from conformance.core.outcomes import Verdict
from conformance.reporting.accept import Acceptance
from conformance.reporting.schema import contract_of, upgrade

#: Statuses in which a property (or a column) holds.
HOLDS = tuple(v.value for v in (Verdict.PASSED, Verdict.DIVERGENCE, Verdict.UNSUPPORTED, Verdict.KNOWN_DEFECT))
#: Column statuses of a backend that was checked and did what the contract (or a known-defect entry) says.
CHECKED_OK = tuple(v.value for v in (Verdict.PASSED, Verdict.DIVERGENCE, Verdict.KNOWN_DEFECT))
#: Schema-2 divergence keys (suffix) that schema 3 reports as known defects.
LEGACY_DIVERGENCE_DEFECTS = {":cached-dispatch-without-num-experts": "v2-cached-dispatch-without-num-experts"}
#: The property whose failure *is* an API change (its column failures are the API findings, said once).
API_PROPERTY = "P14-api-surface"


def load_report(path: str) -> dict[str, Any]:
    """Read a ``conformance.json``; raise ``ValueError`` naming the problem if it is not one."""
    try:
        with open(path) as f:
            document = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"--baseline {path!r} is not a readable conformance report: {exc}") from None
    if not isinstance(document, dict) or "properties" not in document:
        raise ValueError(f"--baseline {path!r} has no 'properties': not a conformance.json report")
    return document


# ------------------------------------------------------------------------------------------ reading reports
def _by_id(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["id"]: p for p in document["properties"]}


def deep_ep_name(document: dict[str, Any]) -> str:
    """How the report names the library it ran: ``deep_ep 2.1.0``, ``the emulation``, ``the baseline build``."""
    env = document.get("environment", {})
    version = env.get("deep_ep")
    kinds = {("real" if b.get("real") else "emulated") for b in env.get("backends", [])}
    if version:
        return f"deep_ep {version}"
    seen = sorted({str((b.get("deep_ep_seen") or {}).get("version")).removesuffix("+emulation")
                   for b in env.get("backends", []) if (b.get("deep_ep_seen") or {}).get("version")})
    if kinds == {"emulated"}:
        return "the emulation" + (f" of deep_ep {' / '.join(seen)}" if seen else "")
    return "the baseline build"


def versions_of(document: dict[str, Any]) -> dict[str, str | None]:
    """Backend -> the deep_ep version it drove (what the ranks imported; else the run's probe)."""
    env = document.get("environment", {})
    probes = env.get("probes") or {}
    out = {}
    for b in env.get("backends", []):
        seen = (b.get("deep_ep_seen") or {}).get("version") or b.get("deep_ep_version")
        if seen is None:
            probe = probes.get("deep_ep" if b.get("real") else "conformance.emulation") or {}
            seen = probe.get("version") or (env.get("deep_ep") if b.get("real") else None)
        out[b["name"]] = seen
    return out


def columns(p: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The per-backend / per-pair verdicts of a property entry (schema 3), or ones derived from a schema-2 entry
    (its status for every backend; a backend whose every example was rejected is not knowable there)."""
    if "verdicts" in p:
        return p["verdicts"]
    status = p["status"]
    derived = {}
    for backend in p.get("backends", []):
        column = "failed" if status == "failed" else "passed" if status in HOLDS else status
        derived[backend] = {"status": column, "checked": p.get("examples", 0), "held": 0, "excluded": 0}
    return derived


def _legacy_defects(p: dict[str, Any]) -> tuple[dict[str, str], list[str]]:
    """A schema-2 entry's divergences without those schema 3 reports as known defects, and those defect ids."""
    divergences, defects = {}, []
    for key, text in p.get("divergences", {}).items():
        match = next((d for suffix, d in LEGACY_DIVERGENCE_DEFECTS.items() if key.endswith(suffix)), None)
        if match and "verdicts" not in p:
            defects.append(match)
        else:
            divergences[key] = text
    return divergences, defects


def known_defects(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Known-defect id -> its entry in the report (schema 2: read from the legacy divergences)."""
    section = document.get("known_defects")
    if section is not None:
        return {k["id"]: k for k in section.get("entries", [])}
    out = {}
    for p in document["properties"]:
        for defect in _legacy_defects(p)[1]:
            out[defect] = {"id": defect, "status": "known-defect", "property": p["id"], "failed": 1}
    return out


def surfaces(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The API surfaces P14 recorded: ``{module: surface}``."""
    out = {}
    for p in document["properties"]:
        for key, value in (p.get("artifacts") or {}).items():
            if key.startswith("api-surface:") and isinstance(value, dict) and "surface" in value:
                out[key.split(":", 1)[1]] = value["surface"]
    return out


def _example(p: dict[str, Any]) -> str:
    counterexample = p.get("counterexample")
    return f" Shrunk counterexample: {json.dumps(counterexample, separators=(',', ':'))}." if counterexample else ""


def _order(pid: str) -> tuple[int, str]:
    digits = "".join(c for c in pid.split("-", 1)[0] if c.isdigit())
    return (int(digits) if digits else 1 << 30, pid)


def _properties(n: int) -> str:
    return f"{n} propert{'y' if n == 1 else 'ies'}"


def _first_line(text: str | None, limit: int = 300) -> str:
    line = ((text or "").strip().splitlines() or [""])[0]
    return line if len(line) <= limit else line[: limit - 3] + "..."


# ------------------------------------------------------------------------------------------ matching backends
def match_backends(old: dict[str, Any], new: dict[str, Any]) -> tuple[dict[str, str], list[str]]:
    """Old backend name -> new backend name: the same name first (``real-v2`` is V2 on every version, whatever its
    class is called), then a built-in backend left over by its role (implementation and contract) and, where each
    side has exactly one left of a contract, by the contract alone (the emulation's V2 against the real V2: said in
    the notes).  Plug-ins and class backends match by name only."""
    olds = {b["name"]: b for b in old["environment"].get("backends", [])}
    news = {b["name"]: b for b in new["environment"].get("backends", [])}
    mapping = {name: name for name in olds if name in news}
    notes: list[str] = []

    def builtin(b: dict[str, Any]) -> bool:
        return "plugin" not in b and "class" not in b

    def left(side: dict[str, dict[str, Any]], used: set[str]) -> list[dict[str, Any]]:
        return [b for name, b in side.items() if name not in used and builtin(b)]

    for key in (lambda b: (bool(b.get("real")), contract_of(b)), lambda b: contract_of(b)):
        old_left, new_left = left(olds, set(mapping)), left(news, set(mapping.values()))
        for role in {key(b) for b in old_left}:
            a = [b for b in old_left if key(b) == role]
            c = [b for b in new_left if key(b) == role]
            if len(a) == 1 and len(c) == 1:
                mapping[a[0]["name"]] = c[0]["name"]
                notes.append(f"{a[0]['name']} of the baseline is compared with {c[0]['name']} of this run (the same "
                             f"{contract_of(a[0])} contract"
                             + ("" if bool(a[0].get("real")) == bool(c[0].get("real")) else
                                ", another implementation") + ")")
    return mapping, notes


def map_column(column: str, mapping: dict[str, str]) -> str | None:
    """A column of the baseline (a backend or ``a vs b``) under ``mapping`` (``None``: a backend is unmatched)."""
    pair = Pair.parse(column)
    if pair:
        return str(Pair(mapping[pair.first], mapping[pair.other])) if set(pair) <= set(mapping) else None
    return mapping.get(column)


def _lookup(cols: dict[str, Any], column: str | None) -> tuple[str | None, dict[str, Any] | None]:
    """The column of ``cols`` named ``column`` (a pair in either order)."""
    if column is None:
        return None, None
    if column in cols:
        return column, cols[column]
    pair = Pair.parse(column)
    if pair:
        swapped = str(Pair(pair.other, pair.first))
        if swapped in cols:
            return swapped, cols[swapped]
    return column, None


# ------------------------------------------------------------------------------------------ API changes
@dataclass
class ApiChange:
    """One change of the API surface between the two reports (``core.api_surface.Change`` with its finding id)."""

    id: str
    where: str
    kind: str
    detail: str
    breaking: bool
    modules: list[str] = field(default_factory=list)


def _library(module: str) -> str:
    """A surface's module without the emulation's version (``conformance.emulation.v2_5_0``: the emulation)."""
    return re.sub(r"\.v\d+_\d+_\d+$", "", module)


def _surface_pairs(old: dict[str, Any], new: dict[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    old_surfaces = {_library(m): s for m, s in surfaces(old).items()}
    new_surfaces = {_library(m): s for m, s in surfaces(new).items()}
    pairs = [(m, old_surfaces[m], new_surfaces[m]) for m in sorted(set(old_surfaces) & set(new_surfaces))]
    if not pairs and len(old_surfaces) == 1 and len(new_surfaces) == 1:  # e.g. the emulation vs the real deep_ep
        (m_old, s_old), (m_new, s_new) = next(iter(old_surfaces.items())), next(iter(new_surfaces.items()))
        pairs = [(f"{m_old} -> {m_new}", s_old, s_new)]
    return pairs


def _probe_surface(probe: dict[str, Any]) -> dict[str, Any]:
    """An import probe (``environment.probes``) as a surface with no signatures: its classes present as empty."""
    classes = {name: {} for name in ("Buffer", "ElasticBuffer", "EPBuffer") if probe.get(name)}
    return {"probe": {k: probe.get(k) for k in ("Buffer", "ElasticBuffer")}, "classes": classes}


def _probe_pairs(old: dict[str, Any], new: dict[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """Without P14's surfaces: the two runs' import probes of the library they drove."""
    def probe(doc: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
        probes = doc["environment"].get("probes") or {}
        real = any(b.get("real") for b in doc["environment"].get("backends", []))
        for module in (("deep_ep", "conformance.emulation") if real else ("conformance.emulation", "deep_ep")):
            if (probes.get(module) or {}).get("importable"):
                return module, probes[module]
        return None

    a, b = probe(old), probe(new)
    if a is None or b is None:
        return []
    label = a[0] if a[0] == b[0] else f"{a[0]} -> {b[0]}"
    return [(f"{label} (import probe)", _probe_surface(a[1]), _probe_surface(b[1]))]


def _snapshot_pairs(old: dict[str, Any], new: dict[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """Without P14's surfaces: the suite's API snapshots (``conformance/versions/<version>/api-surface.json``, the
    surface probed on that release) of the one deep_ep version each run drove, where the suite has both and each
    agrees with its run's import probe (which classes import); otherwise none (a fork with a known version number
    but other classes is compared by its probes)."""
    from conformance import versions

    probes = _probe_pairs(old, new)
    chosen = []
    for doc, probed in zip((old, new), probes[0][1:] if probes else (None, None), strict=True):
        seen = {versions.base_version(str(v)) for v in versions_of(doc).values() if v}
        if len(seen) != 1 or None in seen:
            return []
        (version,) = seen
        try:
            snapshot = versions.contract(version).api_surface()
        except (versions.UnknownVersion, OSError, ValueError):
            return []
        if probed is not None and {k: bool(v) for k, v in probed["probe"].items()} != {
                k: bool(snapshot.get("probe", {}).get(k)) for k in probed["probe"]}:
            return []
        chosen.append((version, snapshot))
    (was, a), (now, b) = chosen
    return [(f"deep_ep {was} -> {now} (the suite's API snapshots)", a, b)]


def api_changes(old: dict[str, Any], new: dict[str, Any]) -> tuple[list[ApiChange], str]:
    """Every change of the API surface from the baseline to this run, each once (the modules it was seen in), and
    where they come from (``surfaces``: P14's; ``snapshots``: the suite's snapshots of the two versions the runs
    drove, where P14 did not run; ``probes``: the import probes only; ``none``)."""
    from conformance.core.api_surface import diff_surface

    pairs, source = _surface_pairs(old, new), "surfaces"
    if not pairs:
        pairs, source = _snapshot_pairs(old, new), "snapshots"
    if not pairs:
        pairs, source = _probe_pairs(old, new), "probes"
    if not pairs:
        return [], "none"
    found: dict[tuple[str, str], ApiChange] = {}
    for module, a, b in pairs:
        for c in diff_surface(_with_not_covered(a), b):
            key = (c.where, c.kind)
            if key not in found:
                found[key] = ApiChange(_change_id(c.where), c.where, c.kind, c.detail, c.breaking)
            found[key].modules.append(module)
    first = ("removed-class", "renamed-class")  # a class' change before the import probe's that it explains
    changes = sorted(found.values(), key=lambda c: c.kind not in first)
    gone = {c.where for c in changes if c.kind in first}
    for c in changes:  # "import ElasticBuffer: True -> False" is part of the class' removal or rename
        if c.kind == "probe-changed" and c.where.removeprefix("import ") in gone:
            c.id = _change_id(c.where.removeprefix("import "))
    return changes, source


def _with_not_covered(surface: dict[str, Any]) -> dict[str, Any]:
    """A surface a run recorded (P14's, which lists every public method) with the methods the suite does not cover
    named as in its version's snapshot (``conformance/versions/<version>/api-surface.json``), where the suite knows
    the version: a renamed class is recognised by the methods the suite covers."""
    if surface.get("not_covered") is not None:
        return surface
    from conformance import versions

    try:
        snapshot = versions.contract(versions.base_version(str(surface.get("version")))).api_surface()
    except Exception:  # a version the suite has no data for: compared on every method
        return surface
    return {**surface, "not_covered": snapshot.get("not_covered", {})}


def _change_id(where: str) -> str:
    return f"api:{where}"


# ------------------------------------------------------------------------------------------ findings
@dataclass
class Finding:
    """One reason the gate fails (unless accepted): its id (what ``--accept-bump`` names), kind, one line."""

    id: str
    kind: str  # api, api-removed, lost, unsupported, divergence, vanished, new-failure, new-defect, wrapper, backend
    summary: str
    accepted: str | None = None  # the reason from the accepted-changes file

    @property
    def fails(self) -> bool:
        return self.accepted is None


class Comparison:
    """The baseline against this run (both read through :func:`~conformance.reporting.schema.upgrade`).

    Attributes: ``regressions`` / ``improvements`` / ``additions`` / ``still_failing`` (paragraphs), ``findings``
    (one per id), ``mapping`` (old backend -> new), ``collapsed`` (old backend -> the finding that says why it is
    checked on nothing now), ``api`` (the API changes), ``transitions`` (per property and backend: before, after),
    ``defects`` (known defects by id), ``wrappers`` (plug-ins: what they drove before and now)."""

    def __init__(self, baseline: dict[str, Any], current: dict[str, Any], accept: Acceptance | None = None) -> None:
        self.old, self.new = upgrade(baseline), upgrade(current)
        self.accept = accept or Acceptance()
        self.old_name, self.new_name = deep_ep_name(self.old), deep_ep_name(self.new)
        self.regressions: list[str] = []
        self.improvements: list[str] = []
        self.additions: list[str] = []
        self.still_failing: list[str] = []
        self.findings: dict[str, Finding] = {}
        self.transitions: list[dict[str, Any]] = []
        self.defects: list[dict[str, Any]] = []
        self.wrappers: list[dict[str, Any]] = []
        self.olds = {b["name"]: b for b in self.old["environment"].get("backends", [])}
        self.news = {b["name"]: b for b in self.new["environment"].get("backends", [])}
        self.mapping, self.match_notes = match_backends(self.old, self.new)
        self.api, self.api_source = api_changes(self.old, self.new)
        self.renamed = {c.where: c.detail.split("'")[1] for c in self.api
                        if c.kind == "renamed-class" and "'" in c.detail}
        self.removed = {c.where for c in self.api if c.kind == "removed-class"}
        self.collapsed: dict[str, Finding] = {}
        self._compare()

    # -------------------------------------------------------------------------------- acceptance
    def _finding(self, finding_id: str, kind: str, summary: str, acceptable: bool = True) -> bool:
        """Record a reason to fail; ``True`` when it fails (no accepted-changes entry names it, or it cannot be
        accepted: a suite error)."""
        existing = self.findings.get(finding_id)
        if existing is not None:
            return existing.fails
        finding = Finding(finding_id, kind, summary, self.accept.why(finding_id) if acceptable else None)
        self.findings[finding_id] = finding
        return finding.fails

    # -------------------------------------------------------------------------------- the comparison
    def _compare(self) -> None:
        self._compare_wrappers()
        self._collapse_backends()
        self._compare_properties()
        self._compare_known_defects()
        self._compare_surfaces()

    def _checked(self, document: dict[str, Any], name: str) -> list[str]:
        """The properties on which backend ``name`` ran examples: checked them, or had them excluded by a known limit
        (a configuration refused cleanly: the backend ran; P5's ``hidden == 128`` on V2)."""
        out = []
        for p in document["properties"]:
            if p["id"] == API_PROPERTY:  # it reads the module's surface, builds nothing: not a sign the backend runs
                continue
            v = columns(p).get(name)
            if v and ((v.get("checked") or 0) > 0 or (v.get("excluded") or 0) > 0):
                out.append(p["id"])
        return out

    def _held(self, document: dict[str, Any], name: str) -> list[str]:
        """The properties (P14 aside: :meth:`_checked`) that held on backend ``name``, known defects included."""
        return [p["id"] for p in document["properties"] if p["id"] != API_PROPERTY
                and (columns(p).get(name) or {}).get("status") in CHECKED_OK and (columns(p)[name].get("checked") or 0)]

    def _cause(self, name: str | None) -> str:
        """Why backend ``name`` of this run checked nothing: the reason its columns give (the first), or absent."""
        if name is None or name not in self.news:
            return "it is not in this run"
        reasons: dict[str, int] = {}
        for p in self.new["properties"]:
            if p["id"] == API_PROPERTY:
                continue
            reason = (columns(p).get(name) or {}).get("reason")
            if reason:
                reasons[_first_line(reason, 400)] = reasons.get(_first_line(reason, 400), 0) + 1
        if not reasons:
            return "it was checked on no example"
        top = max(reasons, key=lambda r: reasons[r])
        return top + (f" (and {len(reasons) - 1} other reason(s))" if len(reasons) > 1 else "")

    def _compare_wrappers(self) -> None:
        """Per plug-in: what it drove before and now; a wrapper that drove DeepEP and does not now, or that took
        another path, is a finding of its own (``wrapper:<name>``)."""
        for name in [*self.olds, *[n for n in self.news if n not in self.olds]]:
            before, after = self.olds.get(name), self.news.get(name)
            if not ((before and "plugin" in before) or (after and "plugin" in after)):
                continue
            was, now = self._wrapper_state(self.old, before), self._wrapper_state(self.new, after)
            row: dict[str, Any] = {"name": name, "family": (after or before or {}).get("family") or name,
                                   "before": was, "after": now, "change": None, "finding": None}
            if was is None:
                row["change"] = "new in this run"
            elif now is None:
                row["change"] = "not in this run"
            elif was["drives_deep_ep"] and now["drives_deep_ep"] is False:
                row["change"] = "stopped using DeepEP"
                row["finding"] = f"wrapper:{name}"
                summary = self._wrapper_paragraph(name, was, now)
                if self._finding(row["finding"], "wrapper", f"{name}: the wrapper stopped using DeepEP"
                                 + self._checks_text(was, now)):
                    self.regressions.append(summary)
            elif was["drives_deep_ep"] and now["drives_deep_ep"] and was["contract"] != now["contract"]:
                row["change"] = f"takes its {now['contract']} path now (was {was['contract']})"
                row["finding"] = f"wrapper:{name}"
                summary = (f"{name}: the wrapper takes another path through DeepEP now: its {now['contract']} path "
                           f"with {self.new_name}, its {was['contract']} path with {self.old_name}"
                           + self._checks_text(was, now) + ". Its users get the other contract's behaviour "
                           "(see the properties below).")
                if self._finding(row["finding"], "wrapper", f"{name}: {row['change']}"):
                    self.regressions.append(summary)
            elif was["drives_deep_ep"] is False and now["drives_deep_ep"]:
                row["change"] = "uses DeepEP now"
                self.improvements.append(f"{name}: the wrapper drives DeepEP now ({now['contract']} path), it did not "
                                         f"with {self.old_name}{self._checks_text(was, now)}.")
            else:
                row["change"] = ("still drives DeepEP" if now["drives_deep_ep"] else "does not drive DeepEP")
            self.wrappers.append(row)

    def _wrapper_state(self, document: dict[str, Any], entry: dict[str, Any] | None) -> dict[str, Any] | None:
        """What a plug-in drove: from what its wrapper checked (schema 4), else from its verdicts (it drove DeepEP
        where it was checked on an example)."""
        if entry is None:
            return None
        declared = entry.get("wrapper")
        checked = self._checked(document, entry["name"])
        state = {"contract": contract_of(entry), "api": entry.get("api"), "checked": None, "why": None,
                 "deep_ep": (entry.get("deep_ep_seen") or {}).get("version") or entry.get("deep_ep"),
                 "properties_checked": len(checked), "inferred": declared is None}
        if declared:
            state.update(checked=declared.get("checked"), why=declared.get("why"),
                         drives_deep_ep=bool(declared.get("drives_deep_ep")))
        else:
            state["drives_deep_ep"] = bool(checked) and entry.get("deep_ep") is not None
        return state

    @staticmethod
    def _checks_text(was: dict[str, Any] | None, now: dict[str, Any] | None) -> str:
        """``; the wrapper checked HAVE_DEEP_EP_V2 True -> False, ...``: its own flags, before -> now."""
        old_checked, new_checked = (was or {}).get("checked") or {}, (now or {}).get("checked") or {}
        names = [*new_checked, *[k for k in old_checked if k not in new_checked]]
        if not names:
            return ""
        parts = []
        for key in names:
            if key in old_checked and key in new_checked and old_checked[key] != new_checked[key]:
                parts.append(f"{key} {old_checked[key]} -> {new_checked[key]}")
            else:
                parts.append(f"{key} {new_checked.get(key, old_checked.get(key))}")
        return ("; the wrapper checked " + ", ".join(parts)
                + (" (the baseline predates wrapper checks)" if new_checked and not old_checked else ""))

    def _wrapper_paragraph(self, name: str, was: dict[str, Any], now: dict[str, Any]) -> str:
        held = len(self._held(self.old, name))
        return (f"{name}: the wrapper stopped using DeepEP. With {self.old_name} it drove DeepEP's "
                f"{was['contract']} path ({_properties(held)} held on it); with {self.new_name} it does not"
                + self._checks_text(was, now)
                + (f" ({now['why']})" if now.get("why") else "")
                + ". Its users' calls no longer go through DeepEP, and nothing fails at import: the wrapper falls "
                  "back silently. Its properties are not checked now (one finding, not one per property).")

    def _collapse_backends(self) -> None:
        """A backend that held in the baseline and is checked on nothing now: one finding (API removed, the wrapper
        stopped using DeepEP, or the cause), in place of one per property."""
        wrappers = {row["name"]: row for row in self.wrappers}
        for name, entry in self.olds.items():
            held = self._held(self.old, name)
            new_name = self.mapping.get(name)
            if new_name is not None and self._checked(self.new, new_name):
                continue
            if not held:
                if new_name is None:
                    self.additions.append(f"{name} of the baseline is not in this run (it held on no property "
                                          f"there).")
                continue
            api_class = entry.get("api")
            wrapper = wrappers.get(name)
            if wrapper is not None and wrapper["finding"] and wrapper["change"] == "stopped using DeepEP":
                self.collapsed[name] = self.findings[wrapper["finding"]]
                continue
            removed_now = (self.news.get(new_name or "") or {}).get("removed")  # the run says its API is gone
            if "plugin" not in entry and (api_class in self.removed or removed_now):
                finding_id = _change_id(api_class)
                version = self.new_name
                why = removed_now or self._cause(new_name)
                summary = (f"{name} (deep_ep.{api_class}, the {contract_of(entry)} contract): API removed in "
                           f"{version}. The {_properties(len(held))} that held on it in the baseline "
                           f"({', '.join(held)}) cannot run now: every {contract_of(entry)} property is unsupported "
                           f"({why}). Integrators calling {api_class} must move to the other API (see the migration "
                           f"table) or stay on {self.old_name}.")
            else:
                finding_id = f"backend:{name}"
                renamed = self.renamed.get(api_class or "")
                summary = (f"{name} held on {_properties(len(held))} in the baseline ({self.old_name}) and is "
                           f"checked on none now: {self._cause(new_name)}."
                           + (f" Its class {api_class} was renamed to {renamed} (finding api:{api_class}): this run "
                              f"did not drive {renamed}, so no property of the {contract_of(entry)} contract was "
                              f"checked on it." if renamed else "")
                           + " One finding for the backend, not one per property.")
            short = (f"{name}: API removed ({api_class}): {_properties(len(held))} that held cannot run"
                     if finding_id.startswith("api:") else
                     f"{name}: held on {_properties(len(held))}, checked on none now: {self._cause(new_name)[:200]}")
            fails = self._finding(finding_id, "api-removed" if finding_id.startswith("api:") else "backend", short)
            self.collapsed[name] = self.findings[finding_id]
            if fails:
                self.regressions.append(summary)

    def _is_collapsed(self, column: str) -> bool:
        return any(name in self.collapsed for name in members(column))

    def _compare_properties(self) -> None:
        before, now = _by_id(self.old), _by_id(self.new)
        api_changed = any(c.breaking for c in self.api)
        for pid, old in sorted(before.items(), key=lambda item: _order(item[0])):
            new = now.get(pid)
            if old["status"] == "not-run":
                continue
            if new is None or new["status"] == "not-run":
                summary = (f"{pid} ran in the baseline ({self.old_name}: {old['status']}) and "
                           f"{'is missing from this run' if new is None else 'did not run now'}: a property that "
                           f"vanished checks nothing, so the gate cannot say it still holds. "
                           + ("Run the complete suite." if new is not None else
                              "Was it renamed or removed from the catalog?"))
                if self._finding(pid, "vanished", f"{pid}: ran in the baseline ({old['status']}), "
                                 f"{'missing' if new is None else 'not run'} now"):
                    self.regressions.append(summary)
                continue
            self._compare_property(pid, old, new, api_changed)
        for pid, new in sorted(now.items(), key=lambda item: _order(item[0])):
            if new["status"] == "suite-error":  # the suite's own code raised: never a pass, never accepted
                summary = (f"{pid}: a suite error (the suite's own code raised while checking, not a backend's "
                           f"failure): {_first_line(new.get('suite_error') or new.get('message'), 500)}. The gate "
                           f"cannot judge the property: fix the suite and run again.")
                if self._finding(f"{pid}:suite-error", "suite-error", f"{pid}: a suite error", acceptable=False):
                    self.regressions.append(summary)
        for pid in sorted(set(now) - set(before), key=_order):
            new = now[pid]
            failed = [c for c, v in columns(new).items() if v.get("status") == "failed"]
            if failed:
                summary = (f"{pid} is a new property (not in the baseline) and fails now on {', '.join(failed)}: "
                           f"{_first_line(new.get('message'), 700)}")
                if self._finding(pid, "new-failure", f"{pid}: a new property, fails now"):
                    self.regressions.append(summary)
            else:
                self.additions.append(f"{pid} is a new property (not in the baseline): {new['status']} now.")

    def _compare_property(self, pid: str, old: dict[str, Any], new: dict[str, Any], api_changed: bool) -> None:
        old_cols, new_cols = columns(old), columns(new)
        lost, seen = [], set()
        for column, was in old_cols.items():
            target, v = _lookup(new_cols, map_column(column, self.mapping))
            if target is not None:
                seen.add(target)
            if self._is_collapsed(column) or v is None:
                continue
            self._transition(pid, column, target, was, v)
            if v.get("status") == "failed":
                if was.get("status") == "failed":
                    self.still_failing.append(f"{pid} on {target}: failed in the baseline and fails now: "
                                              f"{_first_line(v.get('reason') or new.get('message'), 300)}")
                elif not (pid == API_PROPERTY and api_changed):  # P14's failure is the API change, said once
                    lost.append((target, was))
            elif was.get("status") == "failed" and v.get("status") in HOLDS:
                self.improvements.append(f"{pid} failed in the baseline on {column} ({self.old_name}) and holds now "
                                         f"on {target} ({v.get('status')}).")
            elif was.get("status") in CHECKED_OK and v.get("status") == "unsupported":
                conditions = "; ".join(f"{c} ({n} examples)" for c, n in v.get("exclusions", {}).items())
                info = new.get("unsupported", {}).get(target, {})
                summary = (f"{pid}: a capability became unsupported on {target}. In the baseline ({self.old_name}) it "
                           f"was checked on {was.get('checked', 0)} example(s) ({was.get('status')}); now "
                           + (f"a known limit excluded every example ({conditions})" if conditions else
                              f"it is checked on none ({_first_line(v.get('reason'), 300) or 'no reason recorded'})")
                           + (f": {info.get('call')} raised {str(info.get('error', ''))[:300]}" if info else "")
                           + ". Integrations that run these configurations on this backend break.")
                if self._finding(f"{pid}:{target}", "unsupported", f"{pid} on {target}: {was.get('status')} in the "
                                 f"baseline, unsupported now"):
                    self.regressions.append(summary)
            elif was.get("status") == "unsupported" and v.get("status") in CHECKED_OK:
                self.improvements.append(f"{pid}: capability gained on {target} (unsupported in the baseline, "
                                         f"{v.get('status')} on {v.get('checked', 0)} example(s) now).")
        for column, v in new_cols.items():
            if column in seen or v.get("status") in (None, "not-checked"):
                continue
            self._transition(pid, None, column, None, v)
            if v.get("status") == "failed":
                lost.append((column, None))
            elif old_cols:
                self.additions.append(f"{pid} is now also checked on {column} ({v.get('status')}).")
        if new["status"] == "failed" and not any(v.get("status") == "failed" for v in new_cols.values()) \
                and old["status"] != "failed":  # a failure charged to no column (an older report): the property's
            lost.append((pid, {"status": old["status"]}))
        if lost:
            self._lost(pid, old, new, lost)
        if "verdicts" not in old:  # schema 2: a backend newly rejecting configurations is all we can see
            for backend in sorted(set(new.get("unsupported", {})) - set(old.get("unsupported", {}))):
                info = new["unsupported"][backend]
                if new_cols.get(backend, {}).get("status") != "unsupported":
                    self.additions.append(f"{pid}: {backend} now rejects some configurations "
                                          f"({info.get('condition') or ''}: {info.get('call')} raised "
                                          f"{str(info.get('error'))[:200]}); the others held.")
        self._compare_divergences(pid, old, new)

    def _lost(self, pid: str, old: dict[str, Any], new: dict[str, Any],
              lost: list[tuple[str, dict[str, Any] | None]]) -> None:
        """One paragraph for the columns of ``pid`` that fail now (those not accepted)."""
        failing = []
        for column, was in lost:
            kind = "lost" if was is not None else "new-failure"
            one = (f"{pid} on {column}: " + ("held in the baseline, fails now" if was is not None else
                                            "not in the baseline, fails now"))
            if self._finding(pid if column == pid else f"{pid}:{column}", kind, one):
                failing.append((column, was))
        if not failing:
            return
        held = [was for _, was in failing if was is not None]
        names = ", ".join(column for column, _ in failing if column != pid)
        reasons = [(columns(new).get(c) or {}).get("reason") for c, _ in failing]
        message = _first_line(new.get("message") or next((r for r in reasons if r), ""), 700).rstrip(".")
        if held:
            statuses = sorted({str(w.get("status")) for w in held}, key=lambda s: HOLDS.index(s) if s in HOLDS else 9)
            head = (f"{pid} held in the baseline ({self.old_name}: {'/'.join(statuses)} on {old.get('examples', 0)} "
                    f"examples) and fails now" + (f" on {names}" if names else "") + f" ({self.new_name})")
        else:
            head = f"{pid} fails now on {names}, which the baseline did not check ({self.new_name})"
        self.regressions.append(f"{head}: {message}.{_example(new)}"
                                + (f" Reproduce: {new['repro']}" if new.get("repro") else ""))

    def _transition(self, pid: str, old_column: str | None, new_column: str | None, was: dict[str, Any] | None,
                    now: dict[str, Any]) -> None:
        """A row of "per property and backend, before and now" (backends only: pairs are said in the findings)."""
        column = new_column or old_column or ""
        if is_pair(column):
            return
        before = (was or {}).get("status")
        after = now.get("status")
        defects_before, defects_after = sorted((was or {}).get("defects") or {}), sorted(now.get("defects") or {})
        if before is None:
            change = f"new: {after}"
        elif before in ("passed", "divergence") and after in ("passed", "divergence"):
            change = "held" if before == after else f"held ({before} -> {after})"
        elif before == "known-defect" and after in ("passed", "divergence"):
            change = "fixed: " + ", ".join(defects_before)
        elif before == "known-defect" and after == "known-defect":
            new_ids = [d for d in defects_after if d not in defects_before]
            change = "still there: " + ", ".join(defects_after) + (f" (new: {', '.join(new_ids)})" if new_ids else "")
        elif after == "known-defect":
            change = "new known defect: " + ", ".join(defects_after)
        elif after == "failed" and pid == API_PROPERTY and any(c.breaking for c in self.api):
            change = "API changed: P14 fails (the migration table)"
        elif after == "failed":
            change = "still fails" if before == "failed" else "lost: fails now"
        elif before == "failed":
            change = f"holds now ({after})"
        elif after == "unsupported" and before != "unsupported":
            change = "lost: unsupported now"
        elif before == "unsupported" and after != "unsupported":
            change = f"gained ({after})"
        elif before == after:
            change = f"still {after}"
        else:
            change = f"{before} -> {after}"
        self.transitions.append({"property": pid, "backend": column, "baseline_backend": old_column,
                                 "before": before, "after": after, "change": change,
                                 "reason": None if after in ("passed", None) else _first_line(now.get("reason"), 300),
                                 "defects_before": defects_before, "defects_after": defects_after})

    def _normalise(self, key: str) -> str:
        """A divergence key of the baseline with renamed classes under their new names."""
        for old, new in self.renamed.items():
            key = key.replace(old, new)
        return key

    def _compare_divergences(self, pid: str, old: dict[str, Any], new: dict[str, Any]) -> None:
        old_div, _ = _legacy_defects(old)
        old_div = {self._normalise(k): v for k, v in old_div.items()}
        new_div = {self._normalise(k): v for k, v in new.get("divergences", {}).items()}
        owners: dict[str, list[str]] = {}
        for column, v in columns(old).items():
            for key in v.get("divergences") or []:
                owners.setdefault(self._normalise(key), []).append(column)
        for key in sorted(set(new_div) - set(old_div)):
            summary = (f"{pid}: a divergence appeared that the baseline ({self.old_name}) did not show: {key}. "
                       f"{new_div[key]} "
                       + (f"First seen on {new['divergence_examples'][key]}. "
                          if new.get("divergence_examples", {}).get(key) else "")
                       + "Integrators relying on the old behaviour must be told; if it is intended, update the "
                         "baseline.")
            if self._finding(f"{pid}:divergence:{key}", "divergence", f"{pid}: divergence {key} appeared"):
                self.regressions.append(summary)
        for key in sorted(set(old_div) - set(new_div)):
            if owners.get(key) and all(self._is_collapsed(c) for c in owners[key]):
                continue  # its backends are checked on nothing now: said by their finding
            summary = (f"{pid}: the divergence {key} of the baseline ({self.old_name}) is gone in this run: "
                       f"{old_div[key]} Either the APIs now agree (integrator workarounds may now be wrong) or no "
                       f"drawn example reached it; check and update the baseline.")
            if self._finding(f"{pid}:divergence:{key}", "divergence", f"{pid}: divergence {key} is gone"):
                self.regressions.append(summary)
        for key in sorted(set(old_div) & set(new_div)):
            if old_div[key] != new_div[key]:
                summary = (f"{pid}: the divergence {key} changed its description. Baseline ({self.old_name}): "
                           f"{old_div[key]} Now ({self.new_name}): {new_div[key]}")
                if self._finding(f"{pid}:divergence:{key}", "divergence",
                                 f"{pid}: divergence {key} changed its description"):
                    self.regressions.append(summary)

    def _compare_known_defects(self) -> None:
        before, now = known_defects(self.old), known_defects(self.new)
        new_file = self.new.get("known_defects", {}).get("file")
        for defect_id in sorted(set(before) | set(now)):
            was, entry = before.get(defect_id), now.get(defect_id)
            old_status = was.get("status") if was else None
            new_status = entry.get("status") if entry else None
            row = {"id": defect_id, "property": (entry or was or {}).get("property"),
                   "backend": (entry or was or {}).get("backend"), "before": old_status, "after": new_status,
                   "wrong": (entry or was or {}).get("wrong"), "change": None}
            if new_status == "known-defect" and old_status == "known-defect":
                row["change"] = "still there"
            elif new_status == "known-defect":
                if old_status in (None, "fixed"):
                    row["change"] = "new"
                    then = "not failing, fixed" if old_status == "fixed" else "no such failure"
                    summary = (f"{entry.get('property')}: known defect {defect_id} is new against the baseline "
                               f"({self.old_name}: {then}); {self.new_name} fails as the entry says on "
                               f"{entry.get('failed', 0)} example(s): "
                               f"{entry.get('wrong', '')} Reproduction: {entry.get('reproduction', '')}")
                    if self._finding(f"defect:{defect_id}", "new-defect",
                                     f"{entry.get('property')}: known defect {defect_id} is new: "
                                     f"{_first_line(entry.get('wrong'), 200)}"):
                        self.regressions.append(summary)
                else:
                    row["change"] = f"failing now (was {old_status}: no claim then)"
            elif new_status == "fixed" and old_status == "known-defect":
                row["change"] = "fixed"
                self.improvements.append(
                    f"{entry.get('property')}: known defect {defect_id} is fixed: it failed in the baseline "
                    f"({self.old_name}); now {entry.get('held', 0)} example(s) met its condition and held. "
                    f"Remove the entry from {new_file}.")
            elif old_status == "known-defect" and new_status is None:
                row["change"] = f"not listed for {self.new_name} ({new_file or 'no known-defects file'}): not checked"
            elif old_status == "known-defect":
                row["change"] = f"not reached now ({new_status}: no claim)"
            elif new_status == "fixed" and old_status == "fixed":
                row["change"] = f"fixed in both runs: remove the entry from {new_file}"
            elif new_status == "fixed":
                row["change"] = f"fixed (was {old_status or 'not listed'} in the baseline)"
            else:
                continue  # neither run saw it fail
            self.defects.append(row)

    def _compare_surfaces(self) -> None:
        # where P14 ran in neither report, the surfaces are the suite's snapshots of the versions the runs drove
        label = "the API (P14 did not run)" if self.api_source == "snapshots" else API_PROPERTY
        breaking: dict[str, list[ApiChange]] = {}
        for c in self.api:
            if c.breaking:
                summary = f"{c.where}: {c.detail}"
                if self._finding(c.id, "api-removed" if c.kind == "removed-class" else "api", summary):
                    for module in c.modules:
                        breaking.setdefault(module, []).append(c)
            else:
                for module in c.modules:
                    self.additions.append(f"{label}: {module}: {c.where}: {c.detail}.")
        for module, changes in breaking.items():
            listed = "; ".join(f"{c.where}: {c.detail}" for c in changes[:12])
            self.regressions.append(
                f"{label}: the API surface of {module} changed incompatibly from the baseline "
                f"({self.old_name}) to {self.new_name}, {len(changes)} breaking change(s): {listed}"
                + (f"; and {len(changes) - 12} more" if len(changes) > 12 else "")
                + ". Code written against the baseline's API no longer runs unchanged.")

    # -------------------------------------------------------------------------------- results
    def accepted(self) -> list[dict[str, Any]]:
        """The findings an accepted-changes entry names, with its reason."""
        return [asdict(f) for f in self.findings.values() if f.accepted is not None]

    def result(self) -> dict[str, Any]:
        """``{"regressions", "improvements", "additions", "still_failing", "accepted", "findings"}``."""
        return {"regressions": self.regressions, "improvements": self.improvements, "additions": self.additions,
                "still_failing": self.still_failing, "accepted": self.accepted(),
                "findings": [{**asdict(f), "fails": f.fails} for f in self.findings.values()]}


def compare(baseline: dict[str, Any], current: dict[str, Any], accept: Acceptance | None = None
            ) -> dict[str, list[str]]:
    """``{"regressions": [...], "improvements": [...], "additions": [...]}``: one readable paragraph each."""
    result = Comparison(baseline, current, accept).result()
    return {"regressions": result["regressions"], "improvements": result["improvements"],
            "additions": result["additions"]}


def exit_status(gate_failed: bool, pytest_status: int) -> int:
    """The run's exit status with ``--baseline``: the gate's verdict (1: a behaviour lost or changed that no
    accepted-changes entry lists; 0: none, even where properties fail as they failed in the baseline: "still fails"
    is the baseline's, reported); any status but 0 and 1 (interrupted, internal or usage error, no tests) stands."""
    if pytest_status in (0, 1):
        return 1 if gate_failed else 0
    return pytest_status
