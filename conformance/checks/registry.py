"""The registry mapping property ids (``P1-per-expert-payloads``) to check functions and case types.

A *case* is what Hypothesis draws for a property: usually an :class:`~conformance.example.Example`,
or a richer frozen dataclass (an example plus call variants) with the same small protocol:
``to_json()``, ``from_json(text)`` (classmethod), ``world_size`` and ``validate()``.  The case type lets
``conformance.repro`` rebuild a case from a report.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from conformance.example import Example

CheckFn = Callable[[Any, Any], None]
CHECKS: dict[str, CheckFn] = {}
CASE_TYPES: dict[str, type] = {}


def register(property_id: str, case: type = Example) -> Callable[[CheckFn], CheckFn]:
    """Decorator registering ``fn(session, case)`` as the check of ``property_id``."""

    def decorate(fn: CheckFn) -> CheckFn:
        if property_id in CHECKS:
            raise ValueError(f"property {property_id!r} registered twice")
        CHECKS[property_id] = fn
        CASE_TYPES[property_id] = case
        return fn

    return decorate
