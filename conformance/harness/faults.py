"""Crashes and hangs get a bounded budget, so that a broken library costs seconds, not an hour.

A rank that dies or hangs costs a world restart (seconds on CPU, tens of seconds with real GPUs), and
Hypothesis, shrinking, would ask for many.  Four rules keep that bounded:

- **Construction preflight.** Before the first example, every backend builds a buffer on the ranks, one
  backend at a time.  A backend that crashes, hangs or raises there is *broken*: every property that uses it
  fails at once with that cause (signal, call, backend) instead of rediscovering it example by example.
- **Per property.** A property may spend ``max_restarts`` world restarts (and :data:`FAULT_SECONDS` of
  examples that crashed or hung).  Beyond that its run stops (:class:`BudgetExhausted`, which Hypothesis does
  not catch) and the property fails with the smallest failing case found so far: during shrinking every new
  failing case is smaller than the one before, so the last one is the smallest.
- **Per run.** A run (one pytest-xdist worker) may spend ``4 * max_restarts`` restarts; after that every
  remaining property fails at once, naming the last cause.
- **A hang is its backend's.** Where the ranks time out inside one backend's calls (the call they were in names
  the backend), the example fails on that backend alone, found within ``--example-timeout`` and costing one world
  restart; the example is checked again on the other backends, and the property goes on without the hung backend
  (:class:`HungBackend`: its later examples are listed as not checked, "hung in <call> on one example"), instead of
  shrinking into the same hang until the budget is spent.  The property fails at its end, naming the backend, the
  call and the example.  A known set-up limit never gets that far: ``core/setup_limits.py`` keeps its call from
  being made.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

from conformance.core.ids import CallId
from conformance.core.outcomes import NotChecked, Why
from conformance.world.errors import RankCrashed, RankFailure, RankTimeout, describe_call

#: Seconds of crashed or hung examples one property may spend before it stops.
FAULT_SECONDS = 60.0
#: How many times the per-property restart budget a whole run may spend.
RUN_BUDGET_FACTOR = 4


def cause_of(failure: RankFailure, backend: str | None = None) -> dict[str, Any]:
    """A JSON-able description of a rank failure: kind, signal, the library call, the backend, one line."""
    call = failure.culprit_call() or ""
    parsed = CallId.parse(call)
    call_backend, call_name = (parsed.backend, parsed.operation) if parsed else ("", call)
    kind = "crash" if isinstance(failure, RankCrashed) else "hang" if isinstance(failure, RankTimeout) else "error"
    signal = next((failure.signals[r] for r in failure.culprits if r in failure.signals), None)
    said = [line.strip() for r in failure.culprits[:1] for line in failure.per_rank.get(r, "").splitlines()
            if line.strip()]
    return {
        "kind": kind,
        "backend": backend or call_backend or None,
        "call": call_name or None,
        "signal": signal,
        "summary": str(failure).splitlines()[0],
        "detail": _exception_line(said)[:400] if kind == "error" and said else None,  # for a rank that raised
    }


def _exception_line(said: list[str]) -> str:
    """The exception's own line of a rank's traceback (``torch.AcceleratorError: CUDA error: an illegal memory
    access was encountered``), not the advice a CUDA error ends with (``Compile with `TORCH_USE_CUDA_DSA` ...``)."""
    return next((line for line in reversed(said) if _EXCEPTION_LINE.match(line)), said[-1])


_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)\b.*:")


def describe_cause(cause: dict[str, Any]) -> str:
    """One line: ``emulated-v2: every rank ... died by SIGSEGV in ElasticBuffer.__init__``."""
    what = {"crash": "a rank died" + (f" by {cause['signal']}" if cause.get("signal") else ""),
            "hang": "the ranks hung",
            "error": "a rank raised" + (f" {cause['detail']}" if cause.get("detail") else "")}[cause["kind"]]
    where = f" in {describe_call(cause['call'])}" if cause.get("call") else ""
    return f"{cause.get('backend') or 'the library'}: {what}{where}"


class BudgetExhausted(BaseException):  # noqa: N818 - a BaseException on purpose: Hypothesis must let it through
    """The crash/hang budget is spent: stop the property now, with the smallest failing case found."""

    def __init__(self, message: str, case: Any, cause: dict[str, Any]) -> None:
        super().__init__(message)
        self.case = case
        self.cause = cause


@dataclass
class FaultBudget:
    """World restarts and seconds spent on crashed or hung examples, per property and per run."""

    max_restarts: int
    run_restarts: int = 0
    property_restarts: int = 0
    property_seconds: float = 0.0
    last_cause: dict[str, Any] | None = None
    smallest: Any = None
    started: float = field(default_factory=time.monotonic)

    @property
    def run_limit(self) -> int:
        """Restarts a whole run may spend."""
        return RUN_BUDGET_FACTOR * self.max_restarts

    def start_property(self) -> None:
        """A new property starts with a full per-property budget."""
        self.property_restarts, self.property_seconds, self.smallest = 0, 0.0, None

    def run_exhausted(self) -> bool:
        """Whether the run spent its restarts (remaining properties then fail at once)."""
        return self.run_restarts > self.run_limit

    def charge(self, failure: RankFailure, case: Any, seconds: float, contained: bool = False) -> None:
        """Account for one crashed or hung example; raise :class:`BudgetExhausted` once the budget is spent.

        ``contained``: a hang charged to one backend, which the property then leaves out (:class:`HungBackend`): it
        costs one restart of the budgets but no seconds rule applies (it cannot repeat on that backend)."""
        self.property_restarts += 1
        self.run_restarts += 1
        if not contained:
            self.property_seconds += seconds
        self.last_cause = cause_of(failure)
        if not contained:
            self.smallest = case
        spent = []
        if self.property_restarts > self.max_restarts:
            spent.append(f"{self.property_restarts} world restarts (--max-restarts {self.max_restarts})")
        elif self.property_seconds > FAULT_SECONDS and self.property_restarts > 1:
            spent.append(f"{self.property_seconds:.0f} s of crashed or hung examples (at most {FAULT_SECONDS:.0f} s)")
        if self.run_exhausted():
            spent.append(f"the run's {self.run_limit} restarts")
        if spent:
            raise BudgetExhausted(
                f"stopped after {' and '.join(spent)}: {describe_cause(self.last_cause)}; the smallest failing case "
                f"found so far is reported (shrinking stopped at the budget). Last failure: {failure}",
                case, self.last_cause,
            )


#: After this many examples on which one known defect retired the world (a crash, a sticky CUDA error), a property
#: stops drawing: every further example would cost a world restart to show the same known defect again.
KNOWN_DEFECT_RESTARTS = 2


class KnownDefectStop(BaseException):  # noqa: N818 - an outcome; a BaseException so that Hypothesis lets it through
    """A known defect that kills the world was seen on :data:`KNOWN_DEFECT_RESTARTS` examples: the property ends
    there, its verdicts as counted (the known defect, and whatever held before)."""

    def __init__(self, defect_id: str, examples: int) -> None:
        super().__init__(f"known defect {defect_id} retired the world on {examples} examples: the property stops "
                         f"drawing (each further example would restart the world to show it again)")
        self.defect_id = defect_id


@dataclass(frozen=True)
class HungBackend:
    """One backend's calls hung on one example of a property (the ranks timed out in ``cause``'s call): that example
    is the backend's failure, the world was restarted once, and the property leaves the backend out of its later
    examples (they would only hang again and restart the world for each) while it goes on with the others."""

    backend: str
    cause: dict[str, Any]
    case: Any
    timeout_s: float

    def not_checked(self) -> NotChecked:
        """What the backend's column lists as not checked: the rest of the property."""
        where = describe_call(self.cause["call"]) if self.cause.get("call") else "its calls"
        return NotChecked.part(self.backend, Why.HUNG, (
            f"hung in {where} on one example (past the {self.timeout_s:g} s example timeout; the world was restarted "
            f"once): its later examples of this property were not checked"))

    def describe(self) -> str:
        """One sentence for the property's failure message."""
        return (f"{describe_cause(self.cause)} on one example, past the {self.timeout_s:g} s example timeout (the "
                f"world was restarted once); its later examples were not checked")


class AllHung(BaseException):  # noqa: N818 - an outcome; a BaseException so that Hypothesis lets it through
    """Every backend the property uses hung once (:class:`HungBackend`): nothing is left to draw for."""
