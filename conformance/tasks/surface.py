"""Rank task of P14: the API surface of every selected backend's module."""

from __future__ import annotations

from typing import Any

from conformance.backends.factory import library_module
from conformance.core.api_surface import surface_of
from conformance.tasks.env import RankEnv, rank_task


@rank_task
def surfaces(env: RankEnv) -> dict[str, dict[str, Any]]:
    """``{module: surface}`` for the modules behind the selected backends (under the active mutant)."""
    modules = {library_module(spec) for spec in env.specs(capability="api_surface")}
    return {module: surface_of(module) for module in sorted(m for m in modules if m)}
