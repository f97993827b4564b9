"""The version gate: compare this run's report with a baseline report (e.g. the previous DeepEP build).

The gate fails when a property that held in the baseline now fails (or vanished), when a capability
disappeared (a backend now rejects a configuration it accepted: a new ``unsupported`` entry, or a
``passed`` property now ``unsupported``), or when the recorded API surface changed.  Improvements
(a failure fixed, a capability gained) are listed but never fail the gate.
"""

from __future__ import annotations

import json
from typing import Any

#: Statuses in which a property holds.
HOLDS = ("passed", "divergence", "unsupported")


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


def compare(baseline: dict[str, Any], current: dict[str, Any]) -> dict[str, list[str]]:
    """``{"regressions": [...], "improvements": [...]}``, one readable line each."""
    regressions: list[str] = []
    improvements: list[str] = []
    before, now = _by_id(baseline), _by_id(current)
    for pid, old in sorted(before.items()):
        new = now.get(pid)
        if old["status"] == "not-run":
            continue
        if new is None or new["status"] == "not-run":
            regressions.append(f"{pid}: ran in the baseline, {'missing' if new is None else 'not run'} now")
            continue
        if old["status"] in HOLDS and new["status"] == "failed":
            regressions.append(f"{pid}: {old['status']} in the baseline, failed now: {new.get('message') or ''}"[:500])
        elif old["status"] == "failed" and new["status"] in HOLDS:
            improvements.append(f"{pid}: failed in the baseline, {new['status']} now")
        lost = sorted(set(new.get("unsupported", {})) - set(old.get("unsupported", {})))
        gained = sorted(set(old.get("unsupported", {})) - set(new.get("unsupported", {})))
        for backend in lost:
            info = new["unsupported"][backend]
            regressions.append(
                f"{pid}: capability lost on {backend}: {info.get('call')} now raises {info.get('error')}"
            )
        for backend in gained:
            improvements.append(f"{pid}: capability gained on {backend}")
        if old.get("artifacts") and new.get("artifacts") and old["artifacts"] != new["artifacts"]:
            changed = sorted(k for k in set(old["artifacts"]) | set(new["artifacts"])
                             if old["artifacts"].get(k) != new["artifacts"].get(k))
            regressions.append(f"{pid}: recorded API surface changed: {', '.join(changed)}")
    for pid in sorted(set(now) - set(before)):
        improvements.append(f"{pid}: new property (not in the baseline)")
    return {"regressions": regressions, "improvements": improvements}
