"""What Hypothesis draws for a property: an :class:`~conformance.core.example.Example`, or a richer case.

A case is plain frozen data that travels to the ranks and back into reports.  Every case type has the same
small protocol: ``to_json()``, ``from_json(text)`` (classmethod), ``world_size`` and ``validate()``; the
property registry names each property's case type so that ``conformance.repro`` can rebuild a case from a
report line.  Richer cases hold an example plus how the property calls the library with it
(:class:`ExampleCase` gives them the protocol).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, ClassVar

from conformance.core.api_surface import SNAPSHOT
from conformance.core.example import Example


@dataclass(frozen=True)
class ExampleCase:
    """Base of the cases that hold an ``example`` plus plain call parameters."""

    example: Example

    @property
    def world_size(self) -> int:
        """Number of ranks the case is written for."""
        return self.example.world_size

    def to_json(self) -> str:
        """One-line JSON (the example nested as an object)."""
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Any:
        """Inverse of :meth:`to_json`."""
        fields = json.loads(text)
        fields["example"] = Example.from_json(json.dumps(fields["example"]))
        return cls(**fields)

    def validate(self) -> None:
        """Raise ``ValueError`` unless the case is valid."""
        self.example.validate()


@dataclass(frozen=True)
class CombineCase(ExampleCase):
    """How P5 calls combine: ``num_bias`` bias tensors (0, 1 or 2) and the comparison mode.

    ``exact``: small-integer payloads and biases, every sum exactly representable -> byte-exact.
    ``bounded``: random payloads -> within the derived float32-accumulation bound (``oracle.bounds``).
    """

    MODES: ClassVar[tuple[str, ...]] = ("exact", "bounded")
    num_bias: int = 0
    mode: str = "exact"

    def validate(self) -> None:
        """Raise ``ValueError`` unless the case is valid."""
        super().validate()
        if self.num_bias not in (0, 1, 2):
            raise ValueError(f"num_bias={self.num_bias} must be 0, 1 or 2")
        if self.mode not in self.MODES:
            raise ValueError(f"mode={self.mode!r} must be one of {self.MODES}")
        if self.mode == "exact" and self.example.payload != "integers":
            raise ValueError("mode 'exact' needs payload='integers' (exactly summable values)")
        if self.example.payload == "special":
            raise ValueError("combine sums payloads: NaN/Inf payloads have no meaningful sum to compare")


@dataclass(frozen=True)
class QpCase(ExampleCase):
    """How P11 calls V2: the dispatch SM count (0 = automatic; combine then passes ``num_sms=0``), how many QPs
    above ``num_allocated_qps`` the over-asking dispatch requests, how many tokens above the pinned maximum
    the offending rank sends, and which rank offends (it also disagrees in the preflight)."""

    num_sms: int = 0
    over_qps: int = 1
    over_tokens: int = 1
    offender: int = 0

    def validate(self) -> None:
        """Raise ``ValueError`` unless the case is valid."""
        super().validate()
        if self.num_sms < 0 or self.num_sms % 2:
            raise ValueError(f"num_sms={self.num_sms} must be 0 or a positive even count")
        if self.over_qps < 1 or self.over_tokens < 1 or not 0 <= self.offender < self.world_size:
            raise ValueError(f"over_qps/over_tokens must be >= 1 and offender a rank: {self}")


def p12_rows() -> dict[str, dict[str, Any]]:
    """The rows of the refusal table (``conformance/emulation/refusals.toml``) P12 draws, by id."""
    from conformance.emulation import _refusals

    return {rid: row for rid, row in _refusals.rows().items() if row["drawn_by"] == "P12-bad-input"}


@dataclass(frozen=True)
class BadCallCase(ExampleCase):
    """P12: an example, and the refusal-table rows whose bad calls (and valid neighbours) are made with it."""

    rows: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, text: str) -> Any:
        """Inverse of :meth:`to_json`."""
        case = super().from_json(text)
        return dataclasses.replace(case, rows=tuple(case.rows))

    def validate(self) -> None:
        """Raise ``ValueError`` unless the example is valid and every row is one P12 draws."""
        super().validate()
        unknown = sorted(set(self.rows) - set(p12_rows()))
        if not self.rows or unknown:
            raise ValueError(f"rows must be refusal-table rows drawn by P12; unknown: {unknown or 'none given'}")


@dataclass(frozen=True)
class ApiSurfaceCase:
    """The trivial case of P14: which snapshot to compare against, for a world of ``world_size`` ranks."""

    world_size: int
    snapshot: str = SNAPSHOT.name

    def to_json(self) -> str:
        """One-line JSON."""
        return json.dumps({"world_size": self.world_size, "snapshot": self.snapshot}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> ApiSurfaceCase:
        """Inverse of :meth:`to_json`."""
        return cls(**json.loads(text))

    def validate(self) -> None:
        """Raise ``ValueError`` unless the snapshot exists and the world is not empty."""
        if self.world_size < 1 or not (SNAPSHOT.parent / self.snapshot).is_file():
            raise ValueError(f"invalid API-surface case {self}")


def example_of(case: Any) -> Example | None:
    """The example a case is built on (the case itself when it is an :class:`Example`), or ``None``."""
    return case if isinstance(case, Example) else getattr(case, "example", None)
