"""Builds a property test from a property id and a strategy: the test body is always the registered check.

Every strategy passed here is also remembered in :data:`STRATEGIES`, so tools that drive the catalog
outside pytest (``python -m conformance.mutation``) draw exactly what the property tests draw.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import strategies as st

from conformance.checks import CHECKS
from conformance.harness.driver import run_property

#: property id -> the strategy its property test draws from.
STRATEGIES: dict[str, st.SearchStrategy[Any]] = {}


def property_test(property_id: str, strategy: st.SearchStrategy[Any]) -> Callable[..., None]:
    """A Hypothesis test running ``CHECKS[property_id]`` on examples drawn from ``strategy``."""
    if property_id not in CHECKS:
        raise KeyError(f"no check registered for {property_id!r}")
    STRATEGIES[property_id] = strategy

    @pytest.mark.conformance_property(property_id)
    def test(conformance: Any) -> None:
        run_property(conformance, property_id, strategy)

    test.__doc__ = CHECKS[property_id].__doc__
    return test


def load_catalog() -> dict[str, st.SearchStrategy[Any]]:
    """Import every property test module; return the property id -> strategy map."""
    import conformance.properties as package

    for module in pkgutil.iter_modules(package.__path__):
        if module.name.startswith("test_"):
            importlib.import_module(f"{package.__name__}.{module.name}")
    return dict(STRATEGIES)
