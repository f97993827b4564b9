"""The outcomes the suite reports, as types: a column's :class:`Verdict` (on a backend or a compared pair) and a
property's :class:`Status` (its worst column's verdict, or what kept it from having one).

Both are ``StrEnum``: a member *is* its string, so the report's JSON, Markdown and HTML (schema 3) are unchanged and
the members compare equal to the strings older reports hold.  ``conformance.harness.verdicts`` (the tally),
``conformance.reporting.report`` (severity) and ``conformance.reporting.matrix`` (display order) read their lists from
here: one definition.
"""

from __future__ import annotations

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
