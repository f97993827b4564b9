"""Builds a property test from a property id and a strategy: the test body is always the registered check."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance.checks import CHECKS


def property_test(property_id: str, strategy: st.SearchStrategy[Any]) -> Callable[..., None]:
    """A Hypothesis test running ``CHECKS[property_id]`` on examples drawn from ``strategy``."""
    if property_id not in CHECKS:
        raise KeyError(f"no check registered for {property_id!r}")

    @pytest.mark.conformance_property(property_id)
    @given(example=strategy)
    def test(conformance: Any, example: Any) -> None:
        conformance.check(property_id, example)

    test.__doc__ = CHECKS[property_id].__doc__
    return test
