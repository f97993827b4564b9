"""The ids the suite's parts exchange: property ids (``P12-bad-input``, their catalog order without importing the
catalog or torch), pair columns (:class:`Pair`: ``"emulated-v1 vs emulated-v2"``) and library call ids
(:class:`CallId`: ``"emulated-v2|ElasticBuffer.dispatch"``).

A pair column or a call id is a string in the tally, the report's JSON and the messages; it is built and read here
only (``tests/cover/test_architecture.py`` fails on a split, partition or join of either anywhere else).
"""

from __future__ import annotations

from typing import NamedTuple

#: Between the two backends of a pair column.
PAIR_SEPARATOR = " vs "
#: Between the backend and the operation of a call id.
CALL_SEPARATOR = "|"


def _split(text: str, separator: str) -> tuple[str, str] | None:
    """``text`` split at its first ``separator``; ``None`` without one."""
    if separator not in text:
        return None
    first, rest = text.split(separator, 1)
    return first, rest


class Pair(NamedTuple):
    """Two backends compared example by example; ``str()`` is the name of their column."""

    first: str
    other: str

    def __str__(self) -> str:
        return f"{self.first}{PAIR_SEPARATOR}{self.other}"

    @classmethod
    def parse(cls, column: str) -> Pair | None:
        """The pair a column name is, or ``None`` for a backend's own column."""
        parts = _split(column, PAIR_SEPARATOR)
        return cls(*parts) if parts else None


def is_pair(column: str) -> bool:
    """Whether ``column`` is a pair column (not a backend's own)."""
    return PAIR_SEPARATOR in column


def members(column: str) -> tuple[str, ...]:
    """The backends a column is about: both of a pair, else the backend itself."""
    pair = Pair.parse(column)
    return tuple(pair) if pair else (column,)


def column_of(backends: tuple[str, ...]) -> str:
    """The column about ``backends``: one backend's own, or the pair of two (the inverse of :func:`members`)."""
    return str(Pair(*backends)) if len(backends) == 2 else backends[0]


class CallId(NamedTuple):
    """A library call made for a backend (``emulated-v2|ElasticBuffer.dispatch``), or an operation of a task."""

    backend: str
    operation: str

    def __str__(self) -> str:
        return f"{self.backend}{CALL_SEPARATOR}{self.operation}"

    @classmethod
    def parse(cls, call: str) -> CallId | None:
        """The call id ``call`` is, or ``None`` for a bare name (a task's, no backend)."""
        parts = _split(call, CALL_SEPARATOR)
        return cls(*parts) if parts else None


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


def backend_of(call: str | None) -> str | None:
    """The backend a call id names (``None`` for a bare name or no call)."""
    parsed = CallId.parse(call or "")
    return parsed.backend if parsed else None
