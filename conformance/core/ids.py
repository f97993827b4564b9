"""Property ids (``P12-bad-input``): their catalog order, without importing the catalog (or torch)."""

from __future__ import annotations


def sort_key(property_id: str) -> tuple[int, str]:
    """Catalog order of a property id: ``P2-...`` before ``P10-...``."""
    digits = "".join(c for c in property_id.split("-", 1)[0] if c.isdigit())
    return (int(digits) if digits else 1 << 30, property_id)


def ids_from_source() -> list[str] | None:
    """Every property id, in catalog order, read from the property modules' source (``register(Property(id=...))``)
    without importing them (they import Hypothesis and torch: seconds): what an xdist controller whose workers did
    not report the catalog (an interrupted run) puts in its report.  ``None`` if a module's id is not a literal."""
    import ast
    from pathlib import Path

    ids = []
    for path in sorted((Path(__file__).resolve().parent.parent / "properties").glob("test_p*.py")):
        found = [kw.value.value for node in ast.walk(ast.parse(path.read_text()))
                 if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Property"
                 for kw in node.keywords if kw.arg == "id" and isinstance(kw.value, ast.Constant)]
        if len(found) != 1:
            return None
        ids.append(found[0])
    return sorted(ids, key=sort_key)
