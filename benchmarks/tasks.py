"""Rank-side tasks of the benchmark (module-level, so the controller sends them by reference)."""

from __future__ import annotations

from typing import Any


def echo(case: Any, result: Any) -> Any:
    """The no-op backend: receive a case, return a canonical-sized result unchanged (the harness' round trip)."""
    return result
