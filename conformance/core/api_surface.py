"""API surface (P14): the import probe and method signatures of an installed deep_ep-like module, a
committed snapshot of the real DeepEP's, and the diff between them.

A surface is plain JSON: ``{"probe": {...}, "classes": {class: {method: {"static": bool, "params":
[{"name", "kind", "default"}]}}}}`` where ``default`` is the ``repr`` of the default (``None`` when the
parameter has none; annotations are ignored).  Each DeepEP version's snapshot is ``api-surface.json`` in its folder
(``conformance/versions/<version>/``, read through :mod:`conformance.versions`), written by
``python -m conformance.core.api_surface --write [--version V]`` from the best evidence there is: 2.1.0's from
``api-surface-signatures.txt`` there (signatures transcribed from the public DeepEP sources, checked against the
surface probed on the real 2.1.0, ``docs/real-runs/api-surface-real-2.1.0.json``); a version without transcribed
signatures from the surface :func:`surface_of` read off the real library (``docs/real-runs/api-surface-real-<version>
.json``: 2.5.0's, probed on one H100 on 2026-12-06, ``confirmed: true``), else derived from its emulation (read from
the source, ``confirmed: false``).

Diff rules: a removed class or method, a removed or renamed parameter, a changed kind, position or default,
or a new required parameter is *breaking*; a new optional parameter or a new method is reported only.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from conformance import versions
from conformance.core.probe import probe_module

#: The coverage exclusions and their README (``conformance/data/api-surface/``).
SNAPSHOT_DIR = Path(__file__).resolve().parents[1] / "data" / "api-surface"
#: DeepEP 2.1.0's snapshot (the default version's) and the signatures it is generated from.
SNAPSHOT = versions.contract("2.1.0").api_surface_path
SIGNATURES = SNAPSHOT.with_name("api-surface-signatures.txt")
#: Where the surfaces probed on the real library are kept (``api-surface-real-<version>.json``: ``{"surface": ...,
#: "recorded": how}``); a checkout's docs, read only to write a snapshot.
RECORDED_SURFACES = Path(__file__).resolve().parents[2] / "docs" / "real-runs"


def snapshot_path(name: str | None = None) -> Path:
    """The snapshot a P14 case names: a DeepEP version (``2.5.0``; ``None``: the default) or, as older reports name
    it, a file ``deep_ep-<version>.json``."""
    if name and name.endswith(".json"):
        name = versions.base_version(name.removeprefix("deep_ep-")) or name
    return versions.contract(name).api_surface_path
CLASSES = ("Buffer", "ElasticBuffer", "EPHandle", "EventOverlap")
#: Dunder methods that are part of the surface (``EventOverlap`` is a context manager and a callable).
DUNDERS = ("__init__", "__call__", "__enter__", "__exit__")
#: Probe keys compared (``EventOverlap`` as the location relative to the package, e.g. ``.utils``).
PROBE_KEYS = ("Buffer", "ElasticBuffer", "EventOverlap")
#: Public methods of the real classes (docs/real-runs/api-surface-real-2.1.0.json) whose signatures are not compared:
#: Engram, PP, AGRS and the deterministic epilogue are outside the contract.  Not snapshotted, and not reported when
#: present; the coverage self-test lists them as methods (conformance/data/api-surface/coverage.toml says why each
#: one is not exercised).
NOT_COVERED = {
    "ElasticBuffer": ["agrs_get_inplace_tensor", "agrs_new_session", "agrs_set_config", "all_gather",
                      "create_agrs_session", "destroy_agrs_session", "engram_fetch", "engram_write",
                      "get_agrs_buffer_size_hint", "get_agrs_num_max_session_bytes", "get_engram_storage_size_hint",
                      "get_pp_buffer_size_hint", "pp_recv", "pp_send", "pp_set_config"],
    "EPHandle": ["deterministic_sort"],
}


@dataclass(frozen=True)
class Change:
    """One difference between the snapshot and the installed surface."""

    where: str  # e.g. "ElasticBuffer.dispatch(num_max_tokens_per_rank)"
    kind: str  # removed-method, removed-param, renamed-param, ... , added-optional-param, added-method
    detail: str
    breaking: bool


# ------------------------------------------------------------------------------------------ extraction
def _public_methods(cls: type) -> list[str]:
    names = [n for n in dir(cls) if not n.startswith("_") or n in DUNDERS]
    return [n for n in names if callable(inspect.getattr_static(cls, n, None)) or
            isinstance(inspect.getattr_static(cls, n, None), staticmethod | classmethod)]


def method_entry(cls: type, name: str) -> dict[str, Any]:
    """Signature of ``cls.name`` without its instance parameter (static methods flagged).  The instance parameter is
    the first one of a plain function, whatever its name: DeepEP 2.5.0 binds module functions as methods
    (``EPBuffer.barrier = comm.barrier``, whose first parameter is ``buffer``)."""
    raw = inspect.getattr_static(cls, name)
    static = isinstance(raw, staticmethod)
    params = list(inspect.signature(getattr(cls, name)).parameters.values())
    if not static and params and (params[0].name == "self" or inspect.isfunction(raw)):
        params = params[1:]
    return {
        "static": static,
        "params": [
            {"name": p.name, "kind": p.kind.name,
             "default": None if p.default is inspect.Parameter.empty else repr(p.default)}
            for p in params
        ],
    }


def _find_class(module: Any, name: str) -> type | None:
    if hasattr(module, name):
        return getattr(module, name)
    if name in ("Buffer", "ElasticBuffer"):  # the buffer classes count only under their own name
        return None
    for owner in ("ElasticBuffer", "EPBuffer", "Buffer"):  # EPHandle lives next to ElasticBuffer
        holder = sys.modules.get(getattr(getattr(module, owner, None), "__module__", ""), None)
        if holder is not None and hasattr(holder, name):
            return getattr(holder, name)
    for where in (".utils", ".utils.event"):
        try:
            sub = importlib.import_module(module.__name__ + where)
        except ImportError:
            continue
        if hasattr(sub, name):
            return getattr(sub, name)
    return None


def surface_of(module_name: str) -> dict[str, Any]:
    """The import probe and the signatures of every public method of the covered classes."""
    probe = probe_module(module_name)
    surface: dict[str, Any] = {"module": module_name, "version": probe.get("version"), "probe": {}, "classes": {}}
    if not probe.get("importable"):
        surface["probe"] = {"importable": False, "error": probe.get("error")}
        return surface
    for key in PROBE_KEYS:
        value = probe.get(key)
        if key == "EventOverlap" and isinstance(value, str):
            value = value[len(module_name):]  # relative location, e.g. ".utils"
        surface["probe"][key] = value
    module = importlib.import_module(module_name)
    for class_name in CLASSES:
        cls = _find_class(module, class_name)
        if cls is not None:
            surface["classes"][class_name] = {m: method_entry(cls, m) for m in _public_methods(cls)}
    exported = sorted(n for n, v in vars(module).items() if isinstance(v, type) and not n.startswith("_"))
    surface["exports"] = exported
    for name in exported:  # a buffer class under another name (e.g. V2.5's EPBuffer): its methods too
        cls = getattr(module, name)
        if name not in surface["classes"] and hasattr(cls, "dispatch") and hasattr(cls, "combine"):
            surface["classes"][name] = {m: method_entry(cls, m) for m in _public_methods(cls)}
    return surface


def snapshot_from_signatures(path: Path = SIGNATURES, include_not_covered: bool = False) -> dict[str, Any]:
    """The snapshot JSON built from a file of transcribed signatures (parsed, never imported); the methods of
    :data:`NOT_COVERED` transcribed there are left out unless ``include_not_covered`` (a self-test compares them
    with the real library's too)."""
    tree = ast.parse(path.read_text())
    classes: dict[str, Any] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        methods: dict[str, Any] = {}
        for fn in node.body:
            if not isinstance(fn, ast.FunctionDef):
                continue
            if fn.name in NOT_COVERED.get(node.name, ()) and not include_not_covered:
                continue
            static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in fn.decorator_list)
            args = fn.args
            positional = args.posonlyargs + args.args
            defaults = [None] * (len(positional) - len(args.defaults)) + [ast.unparse(d) for d in args.defaults]
            params = [{"name": a.arg, "kind": "POSITIONAL_ONLY" if a in args.posonlyargs else "POSITIONAL_OR_KEYWORD",
                       "default": d} for a, d in zip(positional, defaults, strict=True)]
            if args.vararg:
                params.append({"name": args.vararg.arg, "kind": "VAR_POSITIONAL", "default": None})
            for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True):
                params.append({"name": a.arg, "kind": "KEYWORD_ONLY", "default": None if d is None else ast.unparse(d)})
            if args.kwarg:
                params.append({"name": args.kwarg.arg, "kind": "VAR_KEYWORD", "default": None})
            if not static and params and params[0]["name"] == "self":
                params = params[1:]
            methods[fn.name] = {"static": static, "params": params}
        classes[node.name] = methods
    return {
        "module": "deep_ep",
        "version": "2.1.0",
        "source": "deepseek-ai/DeepEP deep_ep/buffers/legacy.py, deep_ep/buffers/elastic.py, deep_ep/utils/event.py",
        # recorded on the real 2.1.0 (docs/real-runs/api-surface-real-2.1.0.json): deep_ep.utils exports EventHandle
        # only; EventOverlap lives in deep_ep.utils.event (and at the top level).
        "probe": {"Buffer": True, "ElasticBuffer": True, "EventOverlap": ".utils.event"},
        "classes": classes,
        "not_covered": NOT_COVERED,
    }


def load_snapshot(path: Path = SNAPSHOT) -> dict[str, Any]:
    """The committed snapshot."""
    return json.loads(path.read_text())


# ------------------------------------------------------------------------------------------ diff
def _diff_params(where: str, expected: list[dict], observed: list[dict]) -> list[Change]:
    changes: list[Change] = []
    observed_by_name = {p["name"]: (i, p) for i, p in enumerate(observed)}
    expected_names = {p["name"] for p in expected}
    added = [p for p in observed if p["name"] not in expected_names]
    for index, param in enumerate(expected):
        at = f"{where}({param['name']})"
        if param["name"] not in observed_by_name:
            same_slot = observed[index] if index < len(observed) and observed[index] in added else None
            if same_slot is not None:
                changes.append(Change(at, "renamed-param", f"renamed to {same_slot['name']!r}", True))
            else:
                changes.append(Change(at, "removed-param", "no longer accepted", True))
            continue
        position, got = observed_by_name[param["name"]]
        if got["kind"] != param["kind"]:
            changes.append(Change(at, "kind-changed", f"{param['kind']} -> {got['kind']}", True))
        if got["default"] != param["default"]:
            changes.append(Change(at, "default-changed", f"{param['default']} -> {got['default']}", True))
        if position != index and param["kind"] in ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD"):
            changes.append(Change(at, "moved-param", f"position {index} -> {position}", True))
    for param in added:
        at = f"{where}({param['name']})"
        renamed = any(c.kind == "renamed-param" and c.detail == f"renamed to {param['name']!r}" for c in changes)
        if renamed:
            continue
        if param["default"] is None and param["kind"] not in ("VAR_POSITIONAL", "VAR_KEYWORD"):
            changes.append(Change(at, "added-required-param", "new parameter without a default", True))
        else:
            changes.append(Change(at, "added-optional-param", f"new optional parameter (default {param['default']})",
                                  False))
    return changes


def diff_surface(expected: dict[str, Any], observed: dict[str, Any]) -> list[Change]:
    """Every change from ``expected`` (the snapshot) to ``observed`` (an installed surface)."""
    changes: list[Change] = []
    for key, value in expected["probe"].items():
        got = observed["probe"].get(key)
        if got != value:
            changes.append(Change(f"import {key}", "probe-changed", f"{value!r} -> {got!r}", True))
    added_classes = [c for c in observed["classes"] if c not in expected["classes"]]
    for class_name, methods in expected["classes"].items():
        got_methods = observed["classes"].get(class_name)
        if got_methods is None:
            # judged on the methods the suite covers: the real 2.1.0's ElasticBuffer also has agrs_*, pp_* and
            # engram_* (not covered), which 2.5.0's EPBuffer dropped (the rename is found on the covered ones)
            covered = {m: e for m, e in methods.items()
                       if m not in set(expected.get("not_covered", {}).get(class_name, []))}
            renamed = _renamed_to(covered or methods, {c: observed["classes"][c] for c in added_classes})
            if renamed is not None:
                added_classes.remove(renamed)
                changes.append(Change(class_name, "renamed-class", f"renamed to {renamed!r} (same methods); "
                                      f"{class_name!r} is no longer importable", True))
                changes += _diff_methods(renamed, methods, observed["classes"][renamed], expected)
            else:
                changes.append(Change(class_name, "removed-class", "class not found", True))
            continue
        changes += _diff_methods(class_name, methods, got_methods, expected)
    for class_name in added_classes:
        changes.append(Change(class_name, "added-class", "a class not in the snapshot", False))
    old_returns, new_returns = expected.get("returns") or {}, observed.get("returns") or {}
    for method in sorted(set(old_returns) & set(new_returns)):
        if old_returns[method] != new_returns[method]:
            changes.append(Change(f"{method}()", "return-arity-changed",
                                  f"returns a {new_returns[method]}-tuple, was a {old_returns[method]}-tuple", True))
    return changes


def _renamed_to(methods: dict[str, Any], candidates: dict[str, dict[str, Any]]) -> str | None:
    """The added class that carries (at least 80% of) a removed class' methods, if one does."""
    best, share = None, 0.0
    for name, got in candidates.items():
        overlap = len(set(methods) & set(got)) / max(1, len(methods))
        if overlap > share:
            best, share = name, overlap
    return best if share >= 0.8 else None


def _diff_methods(class_name: str, methods: dict[str, Any], got_methods: dict[str, Any],
                  expected: dict[str, Any]) -> list[Change]:
    changes: list[Change] = []
    not_covered = set(expected.get("not_covered", {}).get(class_name, []))
    for name, entry in methods.items():
        where = f"{class_name}.{name}"
        if name not in got_methods:
            changes.append(Change(where, "removed-method", "method not found", True))
            continue
        if got_methods[name]["static"] != entry["static"]:
            changes.append(Change(where, "static-changed", f"static {entry['static']} -> "
                                  f"{got_methods[name]['static']}", True))
        changes += _diff_params(where, entry["params"], got_methods[name]["params"])
    for name in sorted(set(got_methods) - set(methods) - not_covered):
        changes.append(Change(f"{class_name}.{name}", "added-method", "not in the snapshot", False))
    return changes


def changes_as_json(changes: list[Change]) -> list[dict[str, Any]]:
    """JSON-able changes (for the report)."""
    return [asdict(c) for c in changes]


def derived_snapshot(contract: versions.Contract) -> dict[str, Any]:
    """A version's snapshot derived from its emulation (a version without transcribed signatures: read from its
    source, modelled by the emulation, to be confirmed on the real library): the surface :func:`surface_of` reads off
    the emulation module, as the real module would be read (``deep_ep``), with :data:`NOT_COVERED` left out."""
    surface = surface_of(contract.emulation or "")
    surface["module"], surface["version"] = "deep_ep", contract.version
    for class_name, names in NOT_COVERED.items():
        for name in names:
            surface["classes"].get(class_name, {}).pop(name, None)
    return {**surface, "source": f"derived from conformance's emulation of DeepEP {contract.version} "
                                 f"({contract.emulation}), modelled from the library's source: {contract.provenance}",
            "confirmed": contract.confirmed, "not_covered": NOT_COVERED}


def recorded_surface_path(version: str) -> Path:
    """Where the surface probed on the real DeepEP ``version`` is kept (it may not exist)."""
    return RECORDED_SURFACES / f"api-surface-real-{version}.json"


def recorded_snapshot(contract: versions.Contract, recorded: dict[str, Any]) -> dict[str, Any]:
    """A version's snapshot from the surface probed on the real library (``recorded``: the file of
    :func:`recorded_surface_path`), :data:`NOT_COVERED` left out: ``confirmed``, with the evidence in ``source``."""
    surface = json.loads(json.dumps(recorded["surface"]))
    if surface.get("version") != contract.version or surface.get("module") != "deep_ep":
        raise ValueError(f"the recorded surface is of {surface.get('module')} {surface.get('version')}, not "
                         f"deep_ep {contract.version}")
    for class_name, names in NOT_COVERED.items():
        for name in names:
            surface["classes"].get(class_name, {}).pop(name, None)
    path = recorded_surface_path(contract.version).relative_to(RECORDED_SURFACES.parents[1])
    return {**surface, "source": f"recorded on the real DeepEP {contract.version}: {recorded['recorded']} ({path})",
            "confirmed": True, "not_covered": NOT_COVERED}


def main(argv: list[str] | None = None) -> int:
    """``--write``: regenerate a version's snapshot; default: print the emulation's diff against it."""
    parser = argparse.ArgumentParser(prog="python -m conformance.core.api_surface")
    parser.add_argument("--write", action="store_true",
                        help="regenerate the snapshot (2.1.0: from its signatures file; a version without one: from "
                             "the surface recorded on the real library, else derived from its emulation)")
    parser.add_argument("--version", default=versions.DEFAULT_VERSION, help="the DeepEP version (default %(default)s)")
    parser.add_argument("--module", default=None, help="the module to diff (default: the version's emulation)")
    args = parser.parse_args(argv)
    contract = versions.contract(args.version)
    if args.write:
        signatures = contract.api_surface_path.with_name("api-surface-signatures.txt")
        recorded = recorded_surface_path(contract.version)
        if signatures.is_file():
            snapshot = snapshot_from_signatures(signatures)
        elif recorded.is_file():
            snapshot = recorded_snapshot(contract, json.loads(recorded.read_text()))
        else:
            snapshot = derived_snapshot(contract)
        contract.api_surface_path.write_text(json.dumps(snapshot, indent=1) + "\n")
        print(f"wrote {contract.api_surface_path}")
        return 0
    changes = diff_surface(load_snapshot(contract.api_surface_path), surface_of(args.module or contract.emulation))
    for change in changes:
        print(("BREAKING " if change.breaking else "reported ") + f"{change.where}: {change.kind} ({change.detail})")
    return 1 if any(c.breaking for c in changes) else 0


if __name__ == "__main__":
    sys.exit(main())
