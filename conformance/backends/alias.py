"""Opt-in: let ``import deep_ep`` resolve to :mod:`conformance.emulation` (third-party code on a CPU).

Code written as ``from deep_ep import Buffer`` (Megatron-Core's ``fused_a2a``, your own wrapper) runs on the
emulation once ``deep_ep`` names it in ``sys.modules``.  This module does that properly: every submodule is
aliased too (``deep_ep.utils``, ``deep_ep.utils.event``, ...), so that ``from deep_ep.utils.event import EventOverlap``
gets the very same module object, and with it the same deferred-work queue, as ``conformance.emulation``
(a bare ``sys.modules["deep_ep"] = emulation`` makes Python import the ``utils`` package a second time).

Never by default, never silently over a real installation:

- in the suite, ``--deep-ep emulation|emulation:VERSION|real|auto`` (or the environment variable :data:`ENV`) picks
  it for the rank processes (``emulation`` is DeepEP 2.1.0's emulation; ``emulation:2.5.0`` aliases the 2.5.0
  emulation's module tree instead); the controller resolves ``auto`` (the real library where it imports and the
  ranks have GPUs, else the emulation), and the report says which one every backend saw;
- in your own script, call :func:`use_emulation` (``use_emulation("2.5.0")`` for another version; or :func:`use`
  with a mode) before the first import of code that imports deep_ep; it refuses when a deep_ep was already
  imported, and :func:`describe` says what ``deep_ep`` is.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from typing import Any

from conformance import versions

#: Environment variable naming the deep_ep the rank processes resolve (``emulation[:VERSION]``, ``real``, ``auto``).
ENV = "CONFORMANCE_DEEP_EP"
MODES = ("emulation", "real", "auto")
EMULATION = "conformance.emulation"


def parse(mode: str) -> tuple[str, str | None]:
    """``emulation:2.5.0`` -> ``("emulation", "2.5.0")``; ``emulation`` -> ``("emulation", None)`` (the default
    version, :data:`conformance.versions.DEFAULT_VERSION`); ``real`` / ``auto`` -> ``(mode, None)``.  ``ValueError``
    naming the choices for anything else (a version after another mode, a version the emulation does not model)."""
    kind, _, version = mode.strip().partition(":")
    if kind not in MODES or (version and kind != "emulation"):
        raise ValueError(f"deep_ep mode must be one of {', '.join(MODES)} (emulation:VERSION for another version of "
                         f"the emulation), got {mode!r}")
    if version and version not in versions.emulated_versions():
        raise ValueError(f"emulation:{version}: the emulation models DeepEP {', '.join(versions.emulated_versions())}"
                         f", not {version}")
    return kind, version or None


def emulation_module(version: str | None = None) -> str:
    """The module of the emulation of DeepEP ``version`` (``None``: the default version)."""
    name = versions.contract(version).emulation
    if not name:
        raise ValueError(f"DeepEP {versions.contract(version).version} has no emulation")
    return name


def _emulation_modules(version: str | None = None) -> dict[str, Any]:
    """``{suffix: module}`` of the emulation package of ``version`` and every submodule (all imported): the module
    tree ``deep_ep`` names.  Another version's tree inside it (a subpackage) is not part of it."""
    name = emulation_module(version)
    others = {versions.contract(v).emulation for v in versions.emulated_versions()} - {name}
    others = {other for other in others if other and not name.startswith(other + ".")}  # not an enclosing package
    package = importlib.import_module(name)
    found = {"": package}
    for info in pkgutil.walk_packages(package.__path__, prefix=name + "."):
        if any(info.name == other or info.name.startswith(other + ".") for other in others if other):
            continue
        found[info.name[len(name):]] = importlib.import_module(info.name)
    return found


def is_emulation(module: Any) -> bool:
    """Whether ``module`` is an emulation of ``deep_ep`` (:mod:`conformance.emulation`, of any version, under any
    name)."""
    name = getattr(module, "__name__", None) or ""
    return name == EMULATION or name.startswith(EMULATION + ".")


def use_emulation(version: str | None = None) -> dict[str, Any]:
    """Make ``import deep_ep`` (and ``deep_ep.utils`` etc.) resolve to the emulation of DeepEP ``version`` (``None``:
    the default version, 2.1.0) in this process.

    Idempotent.  Raises ``RuntimeError`` when another ``deep_ep`` (the real library, or the emulation of another
    version) was imported already: code holding it would keep using it, and silently mixing the two is never what
    you want.
    """
    name = emulation_module(version)
    current = sys.modules.get("deep_ep")
    if current is not None and getattr(current, "__name__", None) != name:
        what = (f"the emulation of DeepEP {getattr(current, '__version__', '?')}" if is_emulation(current) else
                repr(getattr(current, "__file__", current)))
        raise RuntimeError(
            f"deep_ep is already imported from {what}: the emulation can only stand in for it before the first "
            f"import (call conformance.backends.alias.use_emulation() earlier)"
        )
    for suffix, module in _emulation_modules(version).items():
        sys.modules["deep_ep" + suffix] = module
    return describe()


def use_real() -> dict[str, Any]:
    """Import the real ``deep_ep`` (raises ``ImportError`` when it is not installed or is aliased away)."""
    current = sys.modules.get("deep_ep")
    if current is not None and is_emulation(current):
        raise RuntimeError("deep_ep already names conformance.emulation in this process; the real library cannot "
                           "be imported under the same name now")
    importlib.import_module("deep_ep")
    return describe()


def use(mode: str) -> dict[str, Any]:
    """``emulation`` (``emulation:VERSION``), ``real``, or ``auto`` (the real library where it imports, else the
    emulation)."""
    kind, version = parse(mode)
    if kind == "emulation":
        return use_emulation(version)
    if kind == "real":
        return use_real()
    try:
        return use_real()
    except Exception as exc:  # ImportError, or a broken build raising something else
        info = use_emulation()
        info["reason"] = f"the real deep_ep does not import: {type(exc).__name__}: {exc}"
        return info


def describe() -> dict[str, Any]:
    """What ``deep_ep`` names in this process: ``kind`` (``real``, ``emulation``, or ``None``: not imported),
    ``version`` and ``file``."""
    module = sys.modules.get("deep_ep")
    if module is None:
        return {"kind": None, "version": None, "file": None}
    return {"kind": "emulation" if is_emulation(module) else "real", "version": getattr(module, "__version__", None),
            "file": getattr(module, "__file__", None)}


def apply_from_environment() -> dict[str, Any] | None:
    """Rank start-up: apply :data:`ENV` if it is set (the controller sets it from ``--deep-ep``)."""
    import os

    mode = os.environ.get(ENV, "").strip()
    return use(mode) if mode else None
