"""Draws of P27-fresh-groups: the shared examples (routing, payloads, empty ranks): the group is what varies
between its ways, and every way gets the same example."""

from __future__ import annotations

from hypothesis import strategies as st

from conformance.core.example import Example
from conformance.strategies import examples


def fresh_groups_examples(world_size: int) -> st.SearchStrategy[Example]:
    """Examples for P27-fresh-groups on a world of ``world_size`` ranks (the shared draws)."""
    return examples(world_size)
