"""Property ids (``P12-bad-input``): their catalog order, without importing the catalog (or torch)."""

from __future__ import annotations


def sort_key(property_id: str) -> tuple[int, str]:
    """Catalog order of a property id: ``P2-...`` before ``P10-...``."""
    digits = "".join(c for c in property_id.split("-", 1)[0] if c.isdigit())
    return (int(digits) if digits else 1 << 30, property_id)
