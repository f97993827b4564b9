"""DeepEP's versions as data: what the suite tests differs by library version here, and only here.

One folder per DeepEP version, ``conformance/versions/<version>/``, holds that version's contract:

- ``contract.toml``: the class of each API (V1 ``Buffer``, V2 ``ElasticBuffer`` / ``EPBuffer``), what the version
  removed (an API, a keyword, a keyword's value, a capability), each with the reason a user reads, its call rules,
  the module of its emulation, and where the data comes from (``provenance``: recorded on the real library, or
  read from its source and still to be confirmed there);
- ``refusals.toml``: every host-side refusal of its public calls (the refusal table: source line, expression,
  exception, message, and how the emulation reproduces it);
- ``known-defects.toml``: the failures the suite expects of it (format: ``conformance/harness/known_defects.py``);
- ``api-surface.json``: its import probe and method signatures (P14's snapshot);
- ``limits.toml``: configurations it rejects cleanly (known limits: ``unsupported``, never a failure);
- ``recorded-errors.json``, where recorded: what the real library raised on bad calls.

This module is the one way to read them, for the adapters, the properties, the harness and the emulation alike.  It
imports nothing of the suite and no torch (the controller and the rank processes both read it).  A version without
a folder has no contract: :func:`contract` raises :class:`UnknownVersion`; :func:`contract_for` picks the nearest one
by the API the module exports and says so.
"""

from __future__ import annotations

import functools
import json
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

#: Where the version folders are.
VERSIONS_DIR = Path(__file__).resolve().parent
#: The version the emulation models when nothing selects another (``--deep-ep emulation`` means it).
DEFAULT_VERSION = "2.1.0"
#: The byte every element of memory the library leaves unwritten (``torch::empty``) reads as where the suite made it
#: recognisable: the emulation hands such memory out filled with it, and on a GPU the worst-case properties fill the
#: caching allocator with it before the call (a huge finite bf16 / float32, NaN in e4m3, a huge positive id in int32 /
#: int64: never a valid expert, never "no expert" -1).
POISON_BYTE = 0x7F
#: The APIs a contract names a class for.
APIS = ("v1", "v2")
#: Exception classes a refusal-table row may name (by name; the emulation maps them to Python's).
EXCEPTIONS = ("RuntimeError", "AssertionError", "ValueError", "TypeError", "IndexError", "AttributeError",
              "ZeroDivisionError")
#: Values of message placeholders nobody can know (the real message carries them; see the row's note).
DEFAULT_VALUES = {"build_root": "<DeepEP build root>"}


class UnknownVersion(ValueError):
    """A DeepEP version with no folder here (the message lists the known ones)."""


class NotInVersion(Exception):  # noqa: N818 - an outcome: the version has no such call, keyword or value
    """A call the selected version does not take (a removed keyword, a refused value): the reason says which version
    removed what, for the ``unsupported`` verdict."""


def version_key(version: str) -> tuple[int, ...]:
    """``"2.5.0"`` -> ``(2, 5, 0)`` (for ordering versions)."""
    return tuple(int(part) for part in re.findall(r"\d+", version))


def base_version(text: str | None) -> str | None:
    """The release a version string names: ``2.1.0+emulation`` -> ``2.1.0``; ``None`` when there is none."""
    if not text:
        return None
    found = re.match(r"\d+(\.\d+)*", str(text))
    return found.group(0) if found else None


def known_versions() -> tuple[str, ...]:
    """Every version with a contract here, oldest first."""
    found = [p.parent.name for p in VERSIONS_DIR.glob("*/contract.toml")]
    return tuple(sorted(found, key=version_key))


@dataclass(frozen=True)
class Removed:
    """A keyword of a call that the version removed (``value`` is ``None``), whose value ``value`` it refuses, or that
    it renamed (``renamed_to``: the same parameter under a new name).

    ``call`` is the method (``__init__``, ``dispatch``, ``combine``, ``barrier``) of the API's class; ``old_default``
    is the value the previous version took when the keyword was not given: a call passing exactly that is the same
    call without it (the keyword is dropped, not refused)."""

    api: str
    call: str
    keyword: str
    reason: str
    value: Any = None
    old_default: Any = None
    renamed_to: str | None = None

    @property
    def where(self) -> str:
        """``dispatch(do_handle_copy=True)`` or ``dispatch(previous_event_before_epilogue)``."""
        return f"{self.call}({self.keyword}" + (f"={self.value!r})" if self.value is not None else ")")


@dataclass(frozen=True)
class RefusalTable:
    """One version's refusal table (``refusals.toml``): rows by id, and what a row's exception looks like."""

    version: str
    path: Path
    rows: Mapping[str, Mapping[str, Any]]
    emulation_only: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def row(self, row_id: str) -> Mapping[str, Any]:
        """Row ``row_id`` (``KeyError`` naming the version and the file when it has none)."""
        try:
            return self.rows[row_id]
        except KeyError:
            raise KeyError(f"refusal row {row_id!r} is not in the DeepEP {self.version} table ({self.path})") from None

    def message(self, row_id: str, **values: Any) -> str:
        """The row's message with its ``{placeholders}`` filled from ``values``."""
        text = self.row(row_id)["message"]
        return text.format(**{**DEFAULT_VALUES, **values}) if "{" in text else text

    def exception(self, row_id: str) -> str:
        """The name of the exception class the row raises (one of :data:`EXCEPTIONS`)."""
        return str(self.row(row_id)["exception"])

    def message_pattern(self, row_id: str) -> str:
        """A regular expression the message of row ``row_id`` matches: the exact text, the text as a prefix, or the
        text with each ``{placeholder}`` matching anything (the row's ``message_match``)."""
        row = self.row(row_id)
        # The file of an assertion is the path the build compiled it from: relative for some files, absolute (the
        # build directory) for others, e.g. "/tmp/src/DeepEP/csrc/legacy/buffer.hpp:481" on the recorded 2.1.0
        # build.  The path up to csrc/ is not part of the contract; from csrc/ on it is.
        # The path may also go up and down again where a header was included by a relative path: 2.5.0's
        # "csrc/buffers/../kernels/ep/dispatch.hpp:57".
        text = re.escape(row["message"]).replace(re.escape("(csrc/"), r"\((?:[^()\s]*/)?csrc/(?:[^()\s/]+/\.\./)*")
        # A ``{build_root}/`` placeholder likewise: absent once the message went through
        # ``assertions.without_build_directory``; the emulation writes ``<DeepEP build root>`` there.
        text = text.replace(re.escape("({build_root}/"), r"\((?:[^()]*/)?")
        if row["message_match"] == "prefix":
            return text + ".*"
        if row["message_match"] == "pattern":
            return re.sub(r"\\\{[a-z_]+\\\}", ".+?", text)
        return text

    def matches(self, row_id: str, message: str) -> bool:
        """Whether ``message`` is the message of row ``row_id`` (see :meth:`message_pattern`)."""
        return re.fullmatch(self.message_pattern(row_id), message, re.S) is not None


@dataclass(frozen=True)
class Limit:
    """A configuration the version rejects cleanly (``limits.toml``): ``api``'s ``operation`` refuses examples whose
    ``field`` equals ``equals`` (or is not one of ``not_in``) with an exception matching ``message``."""

    api: str
    operation: str
    field: str
    reason: str
    condition: str
    message: str = ""
    equals: Any = None
    not_in: tuple[Any, ...] | None = None

    def applies(self, values: Mapping[str, Any]) -> bool:
        """Whether an example with these field ``values`` is in the limit."""
        value = values.get(self.field)
        if self.not_in is not None:
            return value not in self.not_in
        return value == self.equals


@dataclass(frozen=True)
class Contract:
    """What one DeepEP version is, for the suite (``contract.toml`` and the files beside it)."""

    version: str
    folder: Path
    #: Where the data comes from: recorded on the real library, or read from its source (to be confirmed there).
    provenance: str
    #: Whether the contract was checked on the real library (``False``: derived from the source only).
    confirmed: bool
    #: The module of the emulation of this version (``None``: none).
    emulation: str | None
    #: ``{api: class name}`` of the APIs the version has.
    classes: Mapping[str, str]
    #: ``{api: why}`` of the APIs the version removed.
    removed_apis: Mapping[str, str]
    #: Keywords it removed and values it refuses (:class:`Removed`).
    removed: tuple[Removed, ...]
    #: ``{capability: why}``: what a backend of this version can no longer do (the properties needing it are
    #: ``unsupported`` there, with the reason).
    lost_capabilities: Mapping[str, str]
    #: The version's call rules (``num_sms_multiple``, the SM model's constants, ...).
    rules: Mapping[str, Any]

    # ------------------------------------------------------------------------------------------ the API
    def class_name(self, api: str) -> str | None:
        """The class of ``api`` (``v1`` / ``v2``) in this version, ``None`` when it removed the API."""
        return self.classes.get(api)

    def api_removed(self, api: str) -> str | None:
        """Why this version has no ``api`` (``None``: it has it)."""
        return self.removed_apis.get(api)

    def capability_lost(self, capability: str) -> str | None:
        """Why a backend of this version lacks ``capability`` (``None``: it may have it)."""
        return self.lost_capabilities.get(str(capability))

    def rule(self, name: str, default: Any = None) -> Any:
        """One call rule (``default`` when the version states none)."""
        return self.rules.get(name, default)

    def call_kwargs(self, api: str, call: str, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """``kwargs`` of ``api``'s ``call`` as this version takes them: a renamed keyword under its new name; a keyword
        it removed is dropped where its value is the old default (the same call without it); any other use of a
        removed keyword, or a value it refuses, raises :class:`NotInVersion` with the reason."""
        out = dict(kwargs)
        for removed in self.removed:
            if removed.api != api or removed.call != call or removed.keyword not in out:
                continue
            if removed.renamed_to:
                out[removed.renamed_to] = out.pop(removed.keyword)
                continue
            given = out[removed.keyword]
            if removed.value is None:
                if given is removed.old_default or (type(given) is type(removed.old_default)
                                                    and given == removed.old_default):
                    del out[removed.keyword]
                    continue
                raise NotInVersion(removed.reason)
            if type(given) is type(removed.value) and given == removed.value:
                raise NotInVersion(removed.reason)
        return out

    # ------------------------------------------------------------------------------------------ the files
    @functools.cached_property
    def refusals(self) -> RefusalTable:
        """The version's refusal table (``refusals.toml``)."""
        path = self.folder / "refusals.toml"
        with open(path, "rb") as f:
            table = tomllib.load(f)
        return RefusalTable(self.version, path, {row["id"]: row for row in table.get("refusal", [])},
                            {row["id"]: row for row in table.get("emulation_only", [])})

    @property
    def known_defects_path(self) -> Path | None:
        """The version's known-defects file, if it has one."""
        path = self.folder / "known-defects.toml"
        return path if path.is_file() else None

    @property
    def api_surface_path(self) -> Path:
        """The version's API-surface snapshot (P14)."""
        return self.folder / "api-surface.json"

    def api_surface(self) -> dict[str, Any]:
        """The snapshot itself."""
        return json.loads(self.api_surface_path.read_text())

    @functools.cached_property
    def limits(self) -> tuple[Limit, ...]:
        """The configurations the version rejects cleanly (``limits.toml``; none without the file)."""
        path = self.folder / "limits.toml"
        if not path.is_file():
            return ()
        with open(path, "rb") as f:
            raw = tomllib.load(f).get("limit", [])
        return tuple(Limit(api=r["api"], operation=r["operation"], field=r["field"], reason=r["reason"],
                           condition=r["condition"], message=r.get("message", ""), equals=r.get("equals"),
                           not_in=tuple(r["not_in"]) if "not_in" in r else None) for r in raw)

    @functools.cached_property
    def recorded_errors(self) -> dict[str, tuple[str, str]]:
        """``{name: (exception type, message)}`` the real library raised on bad calls (``recorded-errors.json``;
        empty where nothing was recorded)."""
        path = self.folder / "recorded-errors.json"
        if not path.is_file():
            return {}
        errors = json.loads(path.read_text())["errors"]
        return {name: (kind, message) for name, (kind, message) in errors.items()}

    def describe(self) -> str:
        """One line: the version, its classes, what it removed, where the data comes from."""
        apis = ", ".join(f"{api} {name}" for api, name in sorted(self.classes.items()))
        gone = "; ".join(f"no {api}: {why}" for api, why in sorted(self.removed_apis.items()))
        return f"DeepEP {self.version} ({apis}{'; ' + gone if gone else ''}; {self.provenance})"


@functools.cache  # one per version, whatever its spelling (``2.1.0``, ``2.1.0+emulation``): its tables parsed once
def _load(version: str) -> Contract:
    folder = VERSIONS_DIR / version
    path = folder / "contract.toml"
    if not path.is_file():
        raise UnknownVersion(f"DeepEP {version}: the suite has no contract for this version (known: "
                             f"{', '.join(known_versions())}; a contract is a folder conformance/versions/<version>/)")
    with open(path, "rb") as f:
        data = tomllib.load(f)
    if data.get("version") != version:
        raise ValueError(f"{path}: version {data.get('version')!r}, expected {version!r} (the folder's name)")
    removed = tuple(Removed(api=r["api"], call=r["call"], keyword=r["keyword"], reason=r["reason"],
                            value=r.get("value"), old_default=r.get("old_default"), renamed_to=r.get("renamed_to"))
                    for r in data.get("removed", []))
    classes = dict(data.get("classes", {}))
    removed_apis = dict(data.get("removed_apis", {}))
    unknown = sorted((set(classes) | set(removed_apis)) - set(APIS))
    if unknown or set(classes) & set(removed_apis):
        raise ValueError(f"{path}: APIs must be {APIS}, each either a class or removed (got {sorted(classes)}, "
                         f"removed {sorted(removed_apis)})")
    return Contract(version=version, folder=folder, provenance=str(data.get("provenance", "")),
                    confirmed=bool(data.get("confirmed", False)), emulation=data.get("emulation"),
                    classes=classes, removed_apis=removed_apis, removed=removed,
                    lost_capabilities=dict(data.get("lost_capabilities", {})), rules=dict(data.get("rules", {})))


@functools.cache
def contract(version: str | None = None) -> Contract:
    """The contract of DeepEP ``version`` (``2.5.0``, ``2.1.0+emulation``; ``None``: :data:`DEFAULT_VERSION`).
    Raises :class:`UnknownVersion` for a version without a folder."""
    base = base_version(version) if version else DEFAULT_VERSION
    if base is None:
        raise UnknownVersion(f"{version!r} names no DeepEP version (known: {', '.join(known_versions())})")
    return _load(base)


def preload() -> None:
    """Every known version's refusal table parsed (what the emulation raises from, in every rank: about 0.1 s of CPU
    each): the fork server does it once for the ranks it forks (``conformance.serve.forkserver.PRELOAD``)."""
    for version in known_versions():
        _ = contract(version).refusals


def contract_for(version: str | None, exports: Iterable[str] = ()) -> tuple[Contract, str | None]:
    """The contract for a ``deep_ep`` of ``version`` that exports ``exports``, and a note when it is not that
    version's own: an unknown (or missing) version gets the newest known contract whose classes the module exports
    (the API it finds decides: ``EPBuffer`` -> 2.5.0's, ``ElasticBuffer`` -> 2.1.0's), else the default."""
    try:
        return contract(version), None
    except UnknownVersion:
        pass
    found = set(exports)
    for known in reversed(known_versions()):
        candidate = contract(known)
        if candidate.classes and set(candidate.classes.values()) <= found:
            return candidate, (f"deep_ep {version or '(no __version__)'} has no contract here; the suite drives it "
                               f"with DeepEP {known}'s (it exports {', '.join(sorted(candidate.classes.values()))})")
    fallback = contract(None)
    return fallback, (f"deep_ep {version or '(no __version__)'} has no contract here and exports none of a known "
                      f"version's classes; the suite drives it with DeepEP {fallback.version}'s")


def emulated_versions() -> tuple[str, ...]:
    """The versions the emulation models (``--deep-ep emulation:VERSION``)."""
    return tuple(v for v in known_versions() if contract(v).emulation)


# ---------------------------------------------------------------------------- the version a run tests
_under_test: list[str] = [DEFAULT_VERSION]


def set_under_test(version: str | None) -> None:
    """The version the controller's draws and checks read (the harness sets it from the run's configuration, as
    the shape vocabulary: ``conformance.strategies.vocabulary.use``)."""
    _under_test[0] = contract(version).version


def under_test() -> Contract:
    """The contract of the version this run tests (default :data:`DEFAULT_VERSION`)."""
    return contract(_under_test[0])
