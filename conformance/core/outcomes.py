"""The outcomes the suite reports, as types: a column's :class:`Verdict` (on a backend or a compared pair), a
property's :class:`Status` (its worst column's verdict, or what kept it from having one) and :class:`NotChecked`: what
a backend was not checked on, over what span (:class:`Span`) and why (:class:`Why`).

The enums are ``StrEnum``: a member *is* its string, so the report's JSON, Markdown and HTML are unchanged (a
column's ``why`` lists :class:`Why` members) and the members compare equal to the strings older reports hold.
``conformance.harness.verdicts`` (the tally), ``conformance.reporting.report`` (severity) and
``conformance.reporting.matrix`` (display order) read their lists from here: one definition.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Verdict(StrEnum):
    """A column's verdict, worst first (``not-checked`` is not a verdict on anything)."""

    SUITE_ERROR = "suite-error"  # the suite's own code broke the check (conformance.core.raisers)
    FAILED = "failed"
    KNOWN_DEFECT = "known-defect"
    DIVERGENCE = "divergence"
    UNSUPPORTED = "unsupported"
    PASSED = "passed"


class Status(StrEnum):
    """A property's status, in the order the summary and the matrix list them: a verdict, ``skipped`` (not asked
    for, e.g. the soak) or ``not-run`` (an interrupted or partial run)."""

    PASSED = "passed"
    FAILED = "failed"
    SUITE_ERROR = "suite-error"
    KNOWN_DEFECT = "known-defect"
    SKIPPED = "skipped"
    DIVERGENCE = "divergence"
    UNSUPPORTED = "unsupported"
    NOT_RUN = "not-run"


#: Column verdicts, worst first, as plain strings (the report's values).
VERDICTS: tuple[str, ...] = tuple(v.value for v in Verdict)
#: Property statuses in display order, as plain strings.
STATUSES: tuple[str, ...] = tuple(s.value for s in Status)


class Why(StrEnum):
    """The kind of reason a backend (or a part of a check) was not checked."""

    API = "api"  # the property is about another API than the backend's (or a mode the backend has no part in)
    REMOVED = "removed"  # the backend's DeepEP version removed the API, or a capability the property needs
    CAPABILITY = "capability"  # the backend does not declare a capability the property (or the part) needs
    DECLINED = "declined"  # the backend cleanly declined the configuration (NotSupported, an undeclared class's
    #                        NotImplementedError)
    LIMIT = "limit"  # a known limit of the backend's DeepEP version excludes the configuration (backends.limits)
    SETUP = "setup"  # the run's set-up cannot make the call on the real library (core.setup_limits)
    HUNG = "hung"  # the backend's calls hung on an earlier example: its later examples are left out


class Span(StrEnum):
    """How much a :class:`NotChecked` leaves out."""

    PROPERTY = "property"  # the whole property, for the backend (the report: ``excluded``, an ``unsupported`` column)
    EXAMPLE = "example"  # one example (the report: ``unsupported``, the column's ``exclusions``)
    PART = "part"  # a part of the check, on the examples the backend was checked on (the report: ``not_checked``)


@dataclass(frozen=True)
class NotChecked:
    """What ``backend`` was not checked on, over what span, and why: the one value every path that leaves something
    unchecked hands the check context (``CheckContext.not_checked``), from a property's check or as a rank task's
    result for a backend (a configuration it declined, instead of its outcome).

    Attributes:
        backend: the backend's name.
        why: the kind of reason.
        span: how much is left out.
        reason: the reason in words (a declined call: what it raised, ``Type: message``).
        call: the call that declined (``Span.EXAMPLE``), e.g. ``Buffer.dispatch(num_worst_tokens=W)``.
        condition: the configurations a limit excludes, in words (``hidden == 128``).
    """

    backend: str
    why: Why
    span: Span
    reason: str
    call: str = ""
    condition: str = ""

    @classmethod
    def example(cls, backend: str, why: Why, call: str, error: str, condition: str = "") -> NotChecked:
        """``backend`` declined ``call`` on this example (it raised ``error``), for the reason ``why``."""
        return cls(backend, why, Span.EXAMPLE, error, call, condition)

    @classmethod
    def part(cls, backend: str, why: Why, what: str) -> NotChecked:
        """A part of the check (``what``, with its reason in words) that ``backend`` cannot take."""
        return cls(backend, why, Span.PART, what)

    @classmethod
    def excluded(cls, backend: str, why: Why, reason: str) -> NotChecked:
        """The property does not check ``backend`` at all."""
        return cls(backend, why, Span.PROPERTY, reason)


#: The kinds of reason, in declaration order, as plain strings (the report's ``why`` lists).
WHYS: tuple[str, ...] = tuple(w.value for w in Why)
