"""Known defects per DeepEP version: ``known-defects.toml`` in the version's folder ``conformance/versions/<version>/``
(read through :mod:`conformance.versions`; format in that file).

The session asks :meth:`KnownDefects.match` about every failing example: a failure on the entry's property,
charged to the entry's backend, on a case meeting the entry's condition, whose message matches the entry's
expression, is a *known defect* (counted, and Hypothesis goes on drawing, so a new failure of the same property
is still found); any other failure stays a failure.  An entry whose condition was reached on examples that all
held is *fixed*.  The file is chosen by the DeepEP version under test (the real ``deep_ep``'s, or the version the
emulation models: ``--deep-ep emulation:VERSION``), or given with ``--known-defects FILE`` (``none``: no known
defects).
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from conformance import versions
from conformance.core.ids import members

FIELDS = {"id", "property", "backend", "condition", "message", "reproduction", "wrong", "seen", "exercised",
          "why_not_exercised"}
REQUIRED = ("id", "property", "backend", "reproduction", "wrong")


@dataclass(frozen=True)
class KnownDefect:
    """One entry of a known-defects file."""

    id: str
    property: str
    backend: str  # an API ("v1"/"v2"), a backend name ("real-v2"), or a pair ("v1 vs v2")
    reproduction: str
    wrong: str
    condition: dict[str, Any] = field(default_factory=dict)
    message: str | None = None  # regular expression searched in the failure message
    seen: str = ""
    exercised: bool = True
    why_not_exercised: str = ""

    def describe_condition(self) -> str:
        """The condition in words, e.g. ``defect == 'v2_cached...' and the message matches /TypeError.../``."""
        parts = [f"{key} {'in' if isinstance(value, list) else '=='} {value!r}"
                 for key, value in self.condition.items()]
        if self.message:
            parts.append(f"the message matches /{self.message}/")
        return " and ".join(parts) or "any failure"

    def covers_column(self, column: str) -> bool:
        """Whether a failure charged to ``column`` (a backend or ``"a vs b"``) is on this entry's backend."""
        mine, theirs = members(self.backend), members(column)
        if len(mine) != len(theirs):
            return False
        return all(want == got or want == got.rsplit("-", 1)[-1] for want, got in zip(mine, theirs, strict=True))

    def case_meets(self, case: Any) -> bool:
        """Whether ``case`` (any case type; fields of its JSON) meets the condition."""
        if not self.condition:
            return True
        try:
            fields = json.loads(case.to_json())
        except (AttributeError, ValueError):
            return False
        for key, want in self.condition.items():
            value: Any = fields
            for part in key.split("."):
                if not isinstance(value, dict) or part not in value:
                    return False
                value = value[part]
            if value == want or (isinstance(want, list) and value in want):
                continue
            if isinstance(value, list) and not isinstance(want, list) and want in value:
                continue  # a list field (e.g. P12's rows) meets a value it contains
            return False
        return True

    def message_matches(self, message: str) -> bool:
        """Whether the failure ``message`` is this entry's."""
        return self.message is None or re.search(self.message, message) is not None

    def as_dict(self) -> dict[str, Any]:
        """The entry as the report lists it."""
        return {"id": self.id, "property": self.property, "backend": self.backend,
                "condition": self.describe_condition(), "reproduction": self.reproduction, "wrong": self.wrong,
                "seen": self.seen, "exercised": self.exercised, "why_not_exercised": self.why_not_exercised}


@dataclass(frozen=True)
class KnownDefects:
    """The entries of one file (empty when none applies)."""

    path: str | None = None
    version: str | None = None
    entries: tuple[KnownDefect, ...] = ()

    def for_property(self, property_id: str) -> list[KnownDefect]:
        """The exercised entries of ``property_id``."""
        return [e for e in self.entries if e.exercised and e.property == property_id]

    def match(self, property_id: str, blame: tuple[str, ...], case: Any, message: str) -> KnownDefect | None:
        """The entry that explains a failure of ``property_id`` charged to ``blame`` on ``case``, or ``None``.

        Every blamed column must be the entry's backend: a failure charged to several backends at once (no
        column was being checked) matches only an entry naming each of them, so it is never swallowed."""
        for entry in self.for_property(property_id):
            if blame and all(entry.covers_column(c) for c in blame) and entry.case_meets(case) \
                    and entry.message_matches(message):
                return entry
        return None

    def beneath(self, property_id: str, case: Any, message: str) -> KnownDefect | None:
        """The library's own known defect a failure of a class backend (``v1=pkg.mod:Class``, not the library's own
        class) looks like: an entry of ``property_id`` on one of the library's APIs (whichever the class is built
        on: a V1 facade over V2 passes V2's defects on), whose condition ``case`` meets and whose message
        expression (required here) ``message`` matches.  Named in the class's failure, never its verdict: the
        class's failure stays its own."""
        for api in versions.APIS:
            entry = self.match(property_id, (api,), case, message)
            if entry is not None and entry.message:
                return entry
        return None

    def reached(self, property_id: str, columns: tuple[str, ...], case: Any) -> list[KnownDefect]:
        """The entries of ``property_id`` whose condition ``case`` meets on one of ``columns``."""
        return [e for e in self.for_property(property_id)
                if e.case_meets(case) and any(e.covers_column(c) for c in columns)]


def default_path(version: str | None) -> Path | None:
    """The file of DeepEP ``version`` (``2.1.0+emulation`` -> ``conformance/versions/2.1.0/known-defects.toml``), if
    the suite has a contract for the version and the contract has known defects."""
    if not version:
        return None
    try:
        return versions.contract(version).known_defects_path
    except versions.UnknownVersion:
        return None


def load(path: str | Path | None) -> KnownDefects:
    """The entries of ``path``; ``ValueError`` naming the problem when it is not a valid known-defects file."""
    if path is None:
        return KnownDefects()
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"--known-defects {path}: not a readable TOML file: {exc}") from None
    entries = []
    seen_ids: set[str] = set()
    for index, raw in enumerate(data.get("defect", [])):
        where = f"--known-defects {path}: defect #{index + 1}"
        unknown = set(raw) - FIELDS
        missing = [k for k in REQUIRED if k not in raw]
        if unknown or missing:
            raise ValueError(f"{where}: " + "; ".join(
                ([f"unknown field(s) {sorted(unknown)}"] if unknown else [])
                + ([f"missing field(s) {missing}"] if missing else [])))
        if raw["id"] in seen_ids:
            raise ValueError(f"{where}: id {raw['id']!r} used twice")
        seen_ids.add(raw["id"])
        if raw.get("message"):
            try:
                re.compile(raw["message"])
            except re.error as exc:
                raise ValueError(f"{where}: message is not a regular expression: {exc}") from None
        if raw.get("exercised", True) and not raw["property"]:
            raise ValueError(f"{where}: an exercised entry must name its property (or set exercised = false)")
        entries.append(KnownDefect(**{k: v for k, v in raw.items()}))
    return KnownDefects(str(path), data.get("deep_ep"), tuple(entries))


def modelled_version(config: Any) -> str | None:
    """The DeepEP version under test: the real ``deep_ep``'s where a real backend is selected (the version whose
    contract drives it: a version without a folder is driven, and judged, by its nearest known one), else the version
    the emulation models."""
    real = [b for b in config.backends if b.real]
    if real:
        return real[0].version or (config.deep_ep_probe or {}).get("version")
    return getattr(config, "emulation_version", None) or versions.DEFAULT_VERSION


def resolve(config: Any) -> str | None:
    """The known-defects file of ``config`` (``auto``: by :func:`modelled_version`; ``none``: none)."""
    choice = getattr(config, "known_defects", "auto") or "auto"
    if choice == "none":
        return None
    if choice == "auto":
        path = default_path(modelled_version(config))
        return str(path) if path else None
    return choice


def known_defects_of(config: Any) -> KnownDefects:
    """The loaded known defects of ``config``."""
    return load(resolve(config))
