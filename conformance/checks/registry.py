"""The registry mapping property ids (``P1-per-expert-payloads``) to check functions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

CheckFn = Callable[[Any, Any], None]
CHECKS: dict[str, CheckFn] = {}


def register(property_id: str) -> Callable[[CheckFn], CheckFn]:
    """Decorator registering ``fn(session, example)`` as the check of ``property_id``."""

    def decorate(fn: CheckFn) -> CheckFn:
        if property_id in CHECKS:
            raise ValueError(f"property {property_id!r} registered twice")
        CHECKS[property_id] = fn
        return fn

    return decorate
