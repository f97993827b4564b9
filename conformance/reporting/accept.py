"""The accepted changes of a version bump (``--accept-bump FILE``): what the gate reports but does not fail on.

A TOML file of ``[[accept]]`` entries, each naming the finding it accepts and why::

    # DeepEP 2.1.0 -> 2.5.0: what we reviewed and accept (PR #123)
    [[accept]]
    finding = "api:Buffer"                 # V1 is removed in 2.5.0: we moved to EPBuffer
    why = "we drive EPBuffer since PR #120"

    [[accept]]
    finding = "P25-clean-exit:*"           # shell-style pattern: every backend of P25
    why = "exit-time behaviour, tracked upstream"

``finding`` is a finding id as the bump report prints it (``bump.md``, the JSON's ``gate.bump.findings``), or a
pattern of them (``fnmatch``: ``*``, ``?``, ``[...]``; case-sensitive).  The ids:

- ``api:<where>``: an API change of the two P14 surfaces (``api:Buffer``, ``api:ElasticBuffer``,
  ``api:EPBuffer.__init__(num_cpu_bytes)``, ``api:import EventOverlap``); a removed class covers the backends of
  that API, whose properties can no longer run;
- ``<property id>:<backend or pair>``: a property that held on that backend and fails (or became unsupported) now;
  ``<property id>:divergence:<key>``: a divergence that appeared, vanished or changed; ``<property id>``: a
  property that vanished;
- ``defect:<known-defect id>``: a known defect that is new against the baseline;
- ``wrapper:<backend>``: a plug-in whose wrapper drove DeepEP in the baseline and does not now (or changed path);
- ``backend:<backend>``: a backend of the baseline checked on nothing now (not in the run, or broken everywhere).

``why`` is required: an acceptance without a reason is not reviewable.  An entry that matches no finding is
reported (``stale``), so that a file outgrown by its bump is noticed; it fails nothing.
"""

from __future__ import annotations

import fnmatch
import sys
from dataclasses import dataclass, field

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


@dataclass
class Entry:
    """One ``[[accept]]`` entry."""

    finding: str
    why: str
    matched: list[str] = field(default_factory=list)  # the finding ids it accepted


@dataclass
class Acceptance:
    """The entries of one accepted-changes file (none: nothing is accepted)."""

    path: str | None = None
    entries: list[Entry] = field(default_factory=list)

    def why(self, finding_id: str) -> str | None:
        """The reason ``finding_id`` is accepted (the first entry that matches it), or ``None``."""
        for entry in self.entries:
            if fnmatch.fnmatchcase(finding_id, entry.finding):
                if finding_id not in entry.matched:
                    entry.matched.append(finding_id)
                return entry.why
        return None

    def stale(self) -> list[Entry]:
        """Entries that matched no finding."""
        return [e for e in self.entries if not e.matched]


def load_acceptance(path: str | None) -> Acceptance:
    """Read an accepted-changes file; ``ValueError`` naming the file, the entry and what is wrong."""
    if not path:
        return Acceptance()
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"--accept-bump {path!r} is not a readable TOML file: {exc}") from None
    unknown = sorted(set(data) - {"accept"})
    if unknown:
        raise ValueError(f"--accept-bump {path!r}: unknown key(s) {unknown}; the file holds [[accept]] entries")
    entries = []
    for index, raw in enumerate(data.get("accept", []), start=1):
        if not isinstance(raw, dict):
            raise ValueError(f"--accept-bump {path!r}: entry {index} is not a table ([[accept]])")
        extra = sorted(set(raw) - {"finding", "why"})
        finding, why = raw.get("finding"), raw.get("why")
        if extra or not isinstance(finding, str) or not finding.strip() or not isinstance(why, str) \
                or not why.strip():
            raise ValueError(f"--accept-bump {path!r}: entry {index} ({raw}) must have exactly 'finding' (a finding "
                             f"id or pattern, as bump.md prints them) and 'why' (the reason, not empty)")
        entries.append(Entry(finding.strip(), why.strip()))
    return Acceptance(path, entries)
