"""The version gate: compare this run's report with a baseline report (e.g. the previous DeepEP build).

The gate fails, with one paragraph per reason, when

- a property (or one backend / pair of it) that held in the baseline fails now, or vanished;
- a capability became unsupported (a backend checked on some examples before is checked on none now);
- a divergence appeared, disappeared or changed its description;
- a known defect is new (failing now, while the baseline had no such failure);
- the API surface changed incompatibly: a class renamed (``ElasticBuffer`` -> ``EPBuffer``) or removed, a
  keyword removed or renamed, a method removed, a changed return arity.

A known defect that is fixed, a failure that now holds, a capability gained are reported (``improvements``), never
failed; additions (a new optional keyword, method or class, a new property, a new backend) are listed
(``additions``).  Baselines of report schema 2 (no per-backend verdicts) are read too: their property status
stands for every backend, and their V2 cached-dispatch divergence is read as the known defect it is now.
"""

from __future__ import annotations

import json
from typing import Any

#: Statuses in which a property (or a column) holds.
HOLDS = ("passed", "divergence", "unsupported", "known-defect")
#: Schema-2 divergence keys (suffix) that schema 3 reports as known defects.
LEGACY_DIVERGENCE_DEFECTS = {":cached-dispatch-without-num-experts": "v2-cached-dispatch-without-num-experts"}


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


def _by_id(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["id"]: p for p in document["properties"]}


def _deep_ep(document: dict[str, Any]) -> str:
    env = document.get("environment", {})
    version = env.get("deep_ep")
    kinds = {("real" if b.get("real") else "emulated") for b in env.get("backends", [])}
    return f"deep_ep {version}" if version else ("the emulation" if kinds == {"emulated"} else "the baseline build")


def _columns(p: dict[str, Any]) -> dict[str, dict[str, Any]]:
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


def _known(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Known-defect id -> its entry in the report (schema 2: read from the legacy divergences)."""
    section = document.get("known_defects")
    if section is not None:
        return {k["id"]: k for k in section.get("entries", [])}
    out = {}
    for p in document["properties"]:
        for defect in _legacy_defects(p)[1]:
            out[defect] = {"id": defect, "status": "known-defect", "property": p["id"], "failed": 1}
    return out


def _surfaces(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
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


def compare(baseline: dict[str, Any], current: dict[str, Any]) -> dict[str, list[str]]:
    """``{"regressions": [...], "improvements": [...], "additions": [...]}``: one readable paragraph each."""
    regressions: list[str] = []
    improvements: list[str] = []
    additions: list[str] = []
    old_name, new_name = _deep_ep(baseline), _deep_ep(current)
    before, now = _by_id(baseline), _by_id(current)
    for pid, old in sorted(before.items(), key=lambda item: _order(item[0])):
        new = now.get(pid)
        if old["status"] == "not-run":
            continue
        if new is None or new["status"] == "not-run":
            regressions.append(
                f"{pid} ran in the baseline ({old_name}: {old['status']}) and "
                f"{'is missing from this run' if new is None else 'did not run now'}: a property that vanished "
                f"checks nothing, so the gate cannot say it still holds. "
                + ("Run the complete suite." if new is not None else "Was it renamed or removed from the catalog?"))
            continue
        _compare_property(pid, old, new, old_name, new_name, regressions, improvements, additions)
    for pid in sorted(set(now) - set(before), key=_order):
        additions.append(f"{pid} is a new property (not in the baseline): {now[pid]['status']} now.")
    _compare_known_defects(baseline, current, old_name, new_name, regressions, improvements)
    _compare_surfaces(baseline, current, old_name, new_name, regressions, additions)
    return {"regressions": regressions, "improvements": improvements, "additions": additions}


def _order(pid: str) -> tuple[int, str]:
    digits = "".join(c for c in pid.split("-", 1)[0] if c.isdigit())
    return (int(digits) if digits else 1 << 30, pid)


def _compare_property(pid: str, old: dict[str, Any], new: dict[str, Any], old_name: str, new_name: str,
                      regressions: list[str], improvements: list[str], additions: list[str]) -> None:
    old_cols, new_cols = _columns(old), _columns(new)
    if old["status"] in HOLDS and new["status"] == "failed":
        failed = [c for c, v in new_cols.items() if v.get("status") == "failed"]
        held_before = [c for c in failed if old_cols.get(c, {}).get("status") in HOLDS]
        where = f" on {', '.join(held_before or failed)}" if (held_before or failed) else ""
        regressions.append(
            f"{pid} held in the baseline ({old_name}: {old['status']} on {old.get('examples', 0)} examples) and "
            f"fails now{where} ({new_name}): {((new.get('message') or '').strip().splitlines() or [''])[0][:700]}."
            f"{_example(new)}"
            + (f" Reproduce: {new['repro']}" if new.get("repro") else ""))
    elif old["status"] == "failed" and new["status"] in HOLDS:
        improvements.append(f"{pid} failed in the baseline ({old_name}) and holds now ({new['status']}).")
    for column, v in new_cols.items():
        was = old_cols.get(column)
        if was is None:
            if old_cols and v.get("status") not in (None, "not-checked"):
                additions.append(f"{pid} is now also checked on {column} ({v.get('status')}).")
            continue
        if was.get("status") in ("passed", "divergence", "known-defect") and v.get("status") == "unsupported":
            conditions = "; ".join(f"{c} ({n} examples)" for c, n in v.get("exclusions", {}).items())
            info = new.get("unsupported", {}).get(column, {})
            regressions.append(
                f"{pid}: a capability became unsupported on {column}. In the baseline ({old_name}) it was checked "
                f"on {was.get('checked', 0)} example(s) ({was.get('status')}); now a known limit excluded every "
                f"example ({conditions or 'no condition recorded'})"
                + (f": {info.get('call')} raised {info.get('error', '')[:300]}" if info else "")
                + ". Integrations that run these configurations on this backend break.")
        elif was.get("status") == "unsupported" and v.get("status") in ("passed", "divergence", "known-defect"):
            improvements.append(f"{pid}: capability gained on {column} (unsupported in the baseline, "
                                f"{v.get('status')} on {v.get('checked', 0)} example(s) now).")
    if "verdicts" not in old:  # schema 2: a backend newly rejecting configurations is all we can see
        for backend in sorted(set(new.get("unsupported", {})) - set(old.get("unsupported", {}))):
            info = new["unsupported"][backend]
            if new_cols.get(backend, {}).get("status") != "unsupported":
                additions.append(f"{pid}: {backend} now rejects some configurations ({info.get('condition') or ''}:"
                                 f" {info.get('call')} raised {str(info.get('error'))[:200]}); the others held.")
    old_div, _ = _legacy_defects(old)
    new_div = new.get("divergences", {})
    for key in sorted(set(new_div) - set(old_div)):
        regressions.append(
            f"{pid}: a divergence appeared that the baseline ({old_name}) did not show: {key}. {new_div[key]} "
            + (f"First seen on {new['divergence_examples'][key]}. " if new.get("divergence_examples", {}).get(key)
               else "")
            + "Integrators relying on the old behaviour must be told; if it is intended, update the baseline.")
    for key in sorted(set(old_div) - set(new_div)):
        regressions.append(
            f"{pid}: the divergence {key} of the baseline ({old_name}) is gone in this run: {old_div[key]} Either "
            f"the APIs now agree (integrator workarounds may now be wrong) or no drawn example reached it; check "
            f"and update the baseline.")
    for key in sorted(set(old_div) & set(new_div)):
        if old_div[key] != new_div[key]:
            regressions.append(f"{pid}: the divergence {key} changed its description. Baseline ({old_name}): "
                               f"{old_div[key]} Now ({new_name}): {new_div[key]}")


def _compare_known_defects(baseline: dict[str, Any], current: dict[str, Any], old_name: str, new_name: str,
                           regressions: list[str], improvements: list[str]) -> None:
    before, now = _known(baseline), _known(current)
    for defect_id, entry in sorted(now.items()):
        was = before.get(defect_id)
        old_status = was.get("status") if was else None
        if entry["status"] == "known-defect" and old_status != "known-defect":
            if old_status in (None, "fixed"):
                regressions.append(
                    f"{entry.get('property')}: known defect {defect_id} is new against the baseline "
                    f"({old_name}: {'not failing, fixed' if old_status == 'fixed' else 'no such failure'}); "
                    f"{new_name} fails as the entry says on {entry.get('failed', 0)} example(s): "
                    f"{entry.get('wrong', '')} Reproduction: {entry.get('reproduction', '')}")
        elif entry["status"] == "fixed" and old_status == "known-defect":
            improvements.append(
                f"{entry.get('property')}: known defect {defect_id} is fixed: it failed in the baseline "
                f"({old_name}); now {entry.get('held', 0)} example(s) met its condition and held. "
                f"Remove the entry from {current.get('known_defects', {}).get('file')}.")


def _params(entry: dict[str, Any]) -> list[str]:
    return [p["name"] for p in entry.get("params", [])]


def _compare_surfaces(baseline: dict[str, Any], current: dict[str, Any], old_name: str, new_name: str,
                      regressions: list[str], additions: list[str]) -> None:
    from conformance.core.api_surface import diff_surface

    old_surfaces, new_surfaces = _surfaces(baseline), _surfaces(current)
    pairs = [(m, old_surfaces[m], new_surfaces[m]) for m in sorted(set(old_surfaces) & set(new_surfaces))]
    if not pairs and len(old_surfaces) == 1 and len(new_surfaces) == 1:  # e.g. the emulation vs the real deep_ep
        (m_old, s_old), (m_new, s_new) = next(iter(old_surfaces.items())), next(iter(new_surfaces.items()))
        pairs = [(f"{m_old} -> {m_new}", s_old, s_new)]
    for module, old, new in pairs:
        changes = diff_surface(old, new)
        breaking = [c for c in changes if c.breaking]
        if breaking:
            listed = "; ".join(f"{c.where}: {c.detail}" for c in breaking[:12])
            regressions.append(
                f"P14-api-surface: the API surface of {module} changed incompatibly from the baseline ({old_name}) "
                f"to {new_name}, {len(breaking)} breaking change(s): {listed}"
                + (f"; and {len(breaking) - 12} more" if len(breaking) > 12 else "")
                + ". Code written against the baseline's API no longer runs unchanged.")
        for c in changes:
            if not c.breaking:
                additions.append(f"P14-api-surface: {module}: {c.where}: {c.detail}.")
