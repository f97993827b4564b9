"""Per property: on how many examples each backend (and each compared pair of backends) was checked, and the verdict.

A *column* is one selected backend (checked against the oracle) or one pair of backends (checked against each
other: ``emulated-v1 vs emulated-v2``).  For every example the session tells the :class:`Tally` which
backends the property runs (:meth:`Tally.start`); the checks say which column they are looking at
(:meth:`Tally.checking`, called by :func:`conformance.assertions.for_each_backend` and
:func:`conformance.assertions.per_backend`), a known limit excludes a backend from the example
(:meth:`Tally.exclude`), and the example ends held, failed or on a known defect.  So a failure is charged to
the column that was being checked when it was raised, and a configuration a backend cleanly rejects is counted
beside its verdict, not instead of it.

Verdict of a column, first match wins: ``suite-error`` (the suite's own code raised while checking it: no verdict
on the backend, and the run fails), ``failed`` (an example failed there), ``known-defect`` (only failures a
known-defect entry matches), ``divergence`` (a documented V1/V2 difference was seen), ``passed`` (held on at least
one example), ``unsupported`` (checked on no example: a known limit excluded every one), ``not-checked`` (a pair
the property does not compare).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from conformance.core.ids import Pair, members
from conformance.core.outcomes import Verdict

#: The verdict of a column whose check the suite's own code broke (``conformance.core.raisers``).
SUITE_ERROR = Verdict.SUITE_ERROR.value
#: How much of a column's own failure message is kept.
MESSAGE_CHARS = 4000
NOT_CHECKED = "not-checked"


def pair_name(first: str, other: str) -> str:
    """The column of a compared pair of backends."""
    return str(Pair(first, other))


def pairs_of(backends: tuple[str, ...] | list[str]) -> list[str]:
    """The pair columns of consecutive backends (the pairs ``for_each_backend`` compares)."""
    return [pair_name(a, b) for a, b in zip(backends, backends[1:], strict=False)]


@dataclass
class Column:
    """Counts of one backend or pair, in examples."""

    checked: int = 0  # held + failed + known_defect
    held: int = 0
    failed: int = 0
    known_defect: int = 0
    divergent: int = 0
    excluded: int = 0
    exclusions: dict[str, int] = field(default_factory=dict)  # the known limit's condition -> examples
    defects: dict[str, int] = field(default_factory=dict)  # known-defect id -> examples
    divergences: list[str] = field(default_factory=list)  # divergence keys seen here
    suite_errors: int = 0  # examples on which the suite's own code raised while checking this column
    #: the first failure (or suite error) charged to this column, its own message (a property's message is the
    #: failure pytest raised, which may be another column's)
    message: str | None = None

    def verdict(self) -> str:
        """This column's verdict (module docstring), as its string: a tally travels from the xdist workers in
        ``user_properties``, whose serialisation (execnet) takes plain strings only."""
        if self.suite_errors:
            return SUITE_ERROR
        if self.failed:
            return Verdict.FAILED.value
        if self.known_defect:
            return Verdict.KNOWN_DEFECT.value
        if self.divergent:
            return Verdict.DIVERGENCE.value
        if self.held:
            return Verdict.PASSED.value
        if self.excluded:
            return Verdict.UNSUPPORTED.value
        return NOT_CHECKED

    def as_dict(self) -> dict[str, Any]:
        """JSON-able, with the verdict as ``status``."""
        return {"status": self.verdict(), **asdict(self)}


class Tally:
    """The columns of one property test, fed example by example (see the module docstring)."""

    def __init__(self) -> None:
        self.columns: dict[str, Column] = {}
        self.start(())

    def column(self, name: str) -> Column:
        """The column ``name`` (created empty)."""
        return self.columns.setdefault(name, Column())

    # ------------------------------------------------------------------------------------ one example
    def start(self, backends: tuple[str, ...], pairs: list[tuple[str, str]] | None = None) -> None:
        """A new example on ``backends``, whose checks compare ``pairs`` (default: consecutive backends)."""
        self.backends = tuple(backends)
        self.pairs = [pair_name(a, b) for a, b in pairs] if pairs is not None else pairs_of(self.backends)
        self.current: tuple[str, ...] | None = None
        self.touched: list[str] = []
        self.completed: list[str] = []  # columns whose check ended, held, before the example failed elsewhere
        self.excluded: dict[str, str] = {}
        self.divergent: set[str] = set()
        for name in self.backends:
            self.column(name)

    def checking(self, backends: tuple[str, ...] | None) -> None:
        """The check now looks at one backend, at a pair (``(first, other)``), or at none in particular."""
        self.current = tuple(backends) if backends else None
        if self.current:
            name = self._name(self.current)
            if name not in self.touched:
                self.touched.append(name)

    def complete(self, name: str) -> None:
        """The check of column ``name`` ended on this example and held (counted even if another column then fails)."""
        if name not in self.completed:
            self.completed.append(name)

    def exclude(self, backend: str, condition: str) -> None:
        """A known limit excluded ``backend`` from this example."""
        self.excluded.setdefault(backend, condition)

    def diverged(self, key: str, backends: tuple[str, ...] | None = None) -> None:
        """A documented divergence ``key`` was seen on ``backends`` (default: the column being checked, else
        every compared pair, else the only backend)."""
        for name in self._targets(backends):
            column = self.column(name)
            if key not in column.divergences:
                column.divergences.append(key)
            if name not in self.divergent:
                self.divergent.add(name)
                column.divergent += 1

    def blame(self) -> tuple[str, ...]:
        """The columns a failure raised now is charged to: the one being checked, else every backend checked."""
        if self.current:
            return (self._name(self.current),)
        return tuple(b for b in self.backends if b not in self.excluded)

    def held(self) -> None:
        """The example held: every column it checked (every backend not excluded, if none was named) held."""
        names = self.touched or [b for b in self.backends if b not in self.excluded]
        for name in names:
            if name in self.excluded:
                continue
            column = self.column(name)
            column.checked += 1
            column.held += 1
        self._count_exclusions()

    def failed(self, blame: tuple[str, ...], message: str | None = None,
               messages: dict[str, str] | None = None, known: dict[str, str] | None = None) -> None:
        """The example failed on ``blame`` (``message``: why; ``messages``: a column's own, where several failed;
        ``known``: other columns of the same example that failed as a known defect says, ``{column: defect id}``);
        the other columns were not checked to the end (but those whose check had completed)."""
        for name in blame:
            column = self.column(name)
            column.checked += 1
            column.failed += 1
            own = (messages or {}).get(name) or message
            column.message = column.message or (own and own[:MESSAGE_CHARS])
        for name, defect_id in (known or {}).items():
            self._known(name, defect_id)
        self._count_completed((*blame, *(known or {})))
        self._count_exclusions()

    def suite_error(self, blame: tuple[str, ...], message: str | None = None) -> None:
        """The suite's own code raised while checking ``blame`` on this example: no verdict on them (the other
        columns whose check had completed held)."""
        for name in blame:
            column = self.column(name)
            column.suite_errors += 1
            column.message = column.message or (message and message[:MESSAGE_CHARS])
        self._count_completed(blame)
        self._count_exclusions()

    def known_defect(self, blame: tuple[str, ...], defect_id: str) -> None:
        """The example failed on ``blame`` the way known defect ``defect_id`` says."""
        for name in blame:
            self._known(name, defect_id)
        self._count_completed(blame)
        self._count_exclusions()

    def _known(self, name: str, defect_id: str) -> None:
        column = self.column(name)
        column.checked += 1
        column.known_defect += 1
        column.defects[defect_id] = column.defects.get(defect_id, 0) + 1

    # ---------------------------------------------------------------------------------------- helpers
    def _count_completed(self, blame: tuple[str, ...]) -> None:
        for name in self.completed:  # (a pair with a failed member is not counted as held: it compared nothing)
            if name not in blame and name not in self.excluded and not set(members(name)) & set(blame):
                column = self.column(name)
                column.checked += 1
                column.held += 1

    def _count_exclusions(self) -> None:
        for backend, condition in self.excluded.items():
            column = self.column(backend)
            column.excluded += 1
            column.exclusions[condition] = column.exclusions.get(condition, 0) + 1
        self.excluded = {}

    @staticmethod
    def _name(backends: tuple[str, ...]) -> str:
        return backends[0] if len(backends) == 1 else pair_name(backends[0], backends[1])

    def _targets(self, backends: tuple[str, ...] | None) -> list[str]:
        if backends:
            return [self._name(tuple(backends))]
        if self.current:
            return [self._name(self.current)]
        return self.pairs or list(self.backends)

    def as_dict(self) -> dict[str, dict[str, Any]]:
        """``{column: counts and status}``, backends first, then pairs."""
        return {name: column.as_dict() for name, column in self.columns.items()}
