"""Opt-in: let ``import deep_ep`` resolve to :mod:`conformance.emulation` (third-party code on a CPU).

Code written as ``from deep_ep import Buffer`` (Megatron-Core's ``fused_a2a``, your own wrapper) runs on the
emulation once ``deep_ep`` names it in ``sys.modules``.  This module does that properly: every submodule is
aliased too (``deep_ep.utils``, ``deep_ep.utils.event``, ...), so that ``from deep_ep.utils.event import EventOverlap``
gets the very same module object, and with it the same deferred-work queue, as ``conformance.emulation``
(a bare ``sys.modules["deep_ep"] = emulation`` makes Python import the ``utils`` package a second time).

Never by default, never silently over a real installation:

- in the suite, ``--deep-ep emulation|real|auto`` (or the environment variable :data:`ENV`) picks it for the
  rank processes; the controller resolves ``auto`` (the real library where it imports and the ranks have
  GPUs, else the emulation), and the report says which one every backend saw;
- in your own script, call :func:`use_emulation` (or :func:`use` with a mode) before the first import of
  code that imports deep_ep; it refuses when a deep_ep was already imported, and :func:`describe` says what
  ``deep_ep`` is.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from typing import Any

#: Environment variable naming the deep_ep the rank processes resolve (``emulation``, ``real``, ``auto``).
ENV = "CONFORMANCE_DEEP_EP"
MODES = ("emulation", "real", "auto")
EMULATION = "conformance.emulation"


def _emulation_modules() -> dict[str, Any]:
    """``{suffix: module}`` of the emulation package and every submodule (all imported)."""
    package = importlib.import_module(EMULATION)
    found = {"": package}
    for info in pkgutil.walk_packages(package.__path__, prefix=EMULATION + "."):
        found[info.name[len(EMULATION):]] = importlib.import_module(info.name)
    return found


def is_emulation(module: Any) -> bool:
    """Whether ``module`` is :mod:`conformance.emulation` (under any name)."""
    return getattr(module, "__name__", None) == EMULATION


def use_emulation() -> dict[str, Any]:
    """Make ``import deep_ep`` (and ``deep_ep.utils`` etc.) resolve to the emulation in this process.

    Idempotent.  Raises ``RuntimeError`` when another ``deep_ep`` (the real library) was imported already:
    code holding it would keep using it, and silently mixing the two is never what you want.
    """
    current = sys.modules.get("deep_ep")
    if current is not None and not is_emulation(current):
        raise RuntimeError(
            f"deep_ep is already imported from {getattr(current, '__file__', current)!r}: the emulation can only "
            f"stand in for it before the first import (call conformance.backends.alias.use_emulation() earlier)"
        )
    for suffix, module in _emulation_modules().items():
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
    """``emulation``, ``real``, or ``auto`` (the real library where it imports, else the emulation)."""
    if mode == "emulation":
        return use_emulation()
    if mode == "real":
        return use_real()
    if mode == "auto":
        try:
            return use_real()
        except Exception as exc:  # ImportError, or a broken build raising something else
            info = use_emulation()
            info["reason"] = f"the real deep_ep does not import: {type(exc).__name__}: {exc}"
            return info
    raise ValueError(f"deep_ep mode must be one of {', '.join(MODES)}, got {mode!r}")


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
