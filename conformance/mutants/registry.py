"""The mutant registry and how a mutant is switched on inside the rank processes.

A mutant is a context manager factory that patches the emulation or the adapters while a task runs; the
controller names the active mutant in every task it sends (``TaskSettings.mutant``).
"""

from __future__ import annotations

import contextlib
import importlib
import pkgutil
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Mutant:
    """A planted defect. ``kind`` is ``harmful`` (must be caught) or ``benign`` (must not be flagged).
    ``min_nodes``: the code it breaks runs only in worlds of that many nodes (fewer: not applicable)."""

    name: str
    kind: str
    description: str
    patch: Callable[[], AbstractContextManager[None]]
    min_nodes: int = 1


MUTANTS: dict[str, Mutant] = {}


def register(name: str, kind: str, description: str, *, min_nodes: int = 1) -> Callable:
    """Decorator registering a generator-based context manager as a mutant (``min_nodes``: see :class:`Mutant`)."""
    if kind not in ("harmful", "benign"):
        raise ValueError(f"mutant kind must be 'harmful' or 'benign', got {kind!r}")

    def decorate(fn: Callable[[], Iterator[None]]) -> Callable[[], Iterator[None]]:
        if name in MUTANTS:
            raise ValueError(f"mutant {name!r} registered twice")
        MUTANTS[name] = Mutant(name, kind, description, contextlib.contextmanager(fn), min_nodes)
        return fn

    return decorate


def load_catalog() -> dict[str, Mutant]:
    """Import every catalog module beside this one (each registers its mutants); return the registry."""
    for module in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if module.name not in ("registry", "patching"):
            importlib.import_module(f"{__package__}.{module.name}")
    return MUTANTS


def activate(name: str | None) -> AbstractContextManager[None]:
    """The context in which mutant ``name`` is active (a no-op for ``None``)."""
    if name is None:
        return contextlib.nullcontext()
    load_catalog()
    try:
        return MUTANTS[name].patch()
    except KeyError:
        raise ValueError(f"unknown mutant {name!r}; known: {sorted(MUTANTS)}") from None
