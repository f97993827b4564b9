"""The controller's view of a run: the world, the backends, and what the current test recorded."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from hypothesis.errors import HypothesisException

from conformance.backends.tracing import drain
from conformance.core.api_coverage import calls_as_json
from conformance.core.example import Example
from conformance.core.ids import backend_of
from conformance.core.outcomes import NotChecked, Span
from conformance.core.raisers import SuiteError
from conformance.harness.config import RunConfig
from conformance.harness.faults import (
    KNOWN_DEFECT_RESTARTS,
    AllHung,
    FaultBudget,
    HungBackend,
    KnownDefectStop,
    cause_of,
)
from conformance.harness.known_defects import KnownDefect, KnownDefects, known_defects_of
from conformance.harness.pairs import compared_pairs
from conformance.harness.verdicts import Tally
from conformance.properties import NotApplicable, Property, Selection, select
from conformance.tasks.env import TaskSettings
from conformance.world.errors import RankCrashed, RankFailure, RankRaised, RankTimeout
from conformance.world.launcher import World, WorldShape


@dataclass
class Recorder:
    """What one property test saw: example count, the last example, divergences, unsupported configs."""

    property_id: str | None = None
    examples: int = 0
    last_example: Any = None  # an Example or another case type (conformance.core.cases)
    divergences: dict[str, str] = field(default_factory=dict)
    divergence_examples: dict[str, str | None] = field(default_factory=dict)  # key -> the first case showing it
    unsupported: dict[str, dict[str, Any]] = field(default_factory=dict)
    artifacts: dict[str, Any] = field(default_factory=dict)  # JSON-able snapshots attached to the report
    rejected: dict[str, set[str]] = field(default_factory=dict)  # backend -> examples it rejected
    cause: dict[str, Any] | None = None  # why the property failed when a crash or hang stopped it
    not_applicable: str | None = None  # why the property could not be checked with the selected backends
    excluded: dict[str, str] = field(default_factory=dict)  # backend -> why the property does not apply to it
    not_checked: dict[str, list[str]] = field(default_factory=dict)  # backend -> parts of the check it cannot take
    why: dict[str, list[str]] = field(default_factory=dict)  # backend -> the kinds of reason of all three (Why)
    seen: dict[str, Any] = field(default_factory=dict)  # backend -> the deep_ep it drove (construction preflight)
    distinct: set[str] = field(default_factory=set)  # the distinct cases checked
    #: the distinct (hidden, top-k, experts, pinned maximum, alignment) of the examples checked: the template
    #: arguments a JIT compiles for (``--shapes``)
    shapes: set[tuple[int, int, int, int, int]] = field(default_factory=set)
    tally: Tally = field(default_factory=Tally)  # per backend / pair: examples checked, held, excluded, failed
    known_defects: dict[str, dict[str, Any]] = field(default_factory=dict)  # entry id -> what this property saw
    first_failure_at: int | None = None  # examples checked when the first one failed (1: the first one did)
    #: known-defect id -> examples on which it retired the world (a crash, a CUDA fault)
    world_retiring_defects: dict[str, int] = field(default_factory=dict)
    stopped: str | None = None  # why the property stopped drawing early (KnownDefectStop, AllHung)
    #: backend -> the hang that took it out of the property's later examples (harness.faults.HungBackend)
    hung: dict[str, HungBackend] = field(default_factory=dict)
    #: the world died outside the property's examples (found by the suite's own task that collects the library
    #: calls: a node or rank lost while idle, or a fault surfacing after the last example); never silent
    world_lost: str | None = None
    failure_detail: dict[str, Any] | None = None  # what differs in the last failing example (assertions.Mismatch)
    failing_example: Any = None  # the last case that failed (or raised a suite error): the counterexample
    #: the first suite error (the suite's own code raised while checking): the property's status is ``suite-error``
    suite_error: str | None = None
    #: (backend, "Class.method", given parameters, returned, enclosing call) of every library call the ranks made
    #: for this property (``backends.tracing``; collected at its end: :meth:`Session.collect_api_calls`)
    api_calls: set[tuple[Any, ...]] = field(default_factory=set)
    started: float = field(default_factory=time.monotonic)

    def as_dict(self) -> dict[str, Any]:
        """JSON-able form, carried from xdist workers to the controller in ``user_properties``."""
        return {
            "id": self.property_id,
            "examples": self.examples,
            "last_example": self.last_example.to_json() if self.last_example else None,
            "divergences": self.divergences,
            "divergence_examples": self.divergence_examples,
            "unsupported": self.unsupported,
            "artifacts": self.artifacts,
            "cause": self.cause,
            "not_applicable": self.not_applicable,
            "excluded": self.excluded,
            "not_checked": self.not_checked,
            "why": self.why,
            "seen": self.seen,
            "distinct_examples": len(self.distinct),
            "shapes": sorted(self.shapes),
            "verdicts": self.tally.as_dict(),
            "known_defects": self.known_defects,
            "first_failure_at": self.first_failure_at,
            "stopped": self.stopped,
            "world_lost": self.world_lost,
            "failure_detail": self.failure_detail,
            "suite_error": self.suite_error,
            "api_calls": calls_as_json(self.api_calls),
            "wall_s": round(time.monotonic() - self.started, 3),
        }

    def known_defect_seen(self, entry: KnownDefect, case: Any, outcome: str, message: str = "") -> None:
        """Count ``case`` reaching ``entry``'s condition: ``failed`` as the entry says, or ``held``."""
        seen = self.known_defects.setdefault(entry.id, {"failed": 0, "held": 0, "example": None, "message": None})
        seen[outcome] += 1
        if outcome == "failed" and seen["example"] is None:
            seen["example"], seen["message"] = case.to_json(), message[:2000]


def examples_in(case: Any) -> list[Example]:
    """The examples a case dispatches (a call sequence: its steps')."""
    from conformance.core.cases import example_of

    steps = getattr(case, "steps", None)
    if steps is not None:
        return [step.example for step in steps if getattr(step, "example", None) is not None]
    example = example_of(case)
    return [example] if example is not None else []


class Session:
    """One per pytest(-xdist) worker: owns the world and runs checks against it."""

    def __init__(self, config: RunConfig) -> None:
        # The controller's oracle work is many small tensor ops; with torch's default threads it competes with the
        # rank processes (which use one thread each) for the same cores: a 2-core machine with 4 ranks took 8.5 s
        # for what one thread does in 0.2 s.  One thread here too (only in a process that runs the suite).
        torch.set_num_threads(1)
        self.config = config
        from conformance import versions

        versions.set_under_test(config.library_version)  # what the draws and checks read of the version under test
        self.recorder = Recorder()
        self.mutant = config.mutant
        self.budget = FaultBudget(config.max_restarts)
        self._world: World | None = None
        self._broken: dict[str | None, dict[str, dict[str, Any]]] = {}  # mutant -> backend -> cause
        self.seen: dict[str, Any] = {}  # backend -> which deep_ep it drove on rank 0 (construction preflight)
        self.known_defects: KnownDefects = known_defects_of(config)
        self._memo: dict[tuple[Any, ...], list[Any]] = {}  # (property, settings, case) -> results (Property.memo)
        #: Backends left out of the property being drawn again for the others (``driver.judge_the_others``).
        self.left_out: frozenset[str] = frozenset()
        #: Called after every example with (property id, examples so far): the run's progress reporting.
        self.on_progress: Callable[[str, int], None] | None = None
        #: A hang inside one backend's calls is contained (:meth:`_contain`): charged to that backend, which the
        #: property then leaves out, instead of raised.  On while the pytest run draws a property
        #: (``harness.driver``); off for direct callers of :meth:`check` (meta-tests, the kill matrix), which see
        #: every hang raised.
        self.contain_hangs = False

    @contextlib.contextmanager
    def leaving_out(self, backends: set[str]) -> Iterator[None]:
        """Run the property without ``backends`` (they failed it: the others are drawn again on their own)."""
        previous, self.left_out = self.left_out, frozenset(backends)
        try:
            yield
        finally:
            self.left_out = previous

    @contextlib.contextmanager
    def planted(self, mutant: str | None) -> Iterator[None]:
        """Run with ``mutant`` planted in the ranks (self-tests); the world is reused."""
        previous, self.mutant = self.mutant, mutant
        try:
            yield
        finally:
            self.mutant = previous

    @property
    def world(self) -> World:
        """The rank world, started on first use and restarted after a failure."""
        if self._world is None:
            self._world = World(
                self.config.shape, device=self.config.device, gpu_ids=self.config.gpu_ids, env=self.config.rank_env,
                rank_setup=self.config.rank_setup, rdzv_endpoint=self.config.rdzv_endpoint,
                remote_nodes=self.config.remote_nodes, token_file=self.config.world_token_file,
                node_wait_s=self.config.node_wait_s,
            )
        return self._world

    def abandon(self) -> None:
        """Kill the world at once (the run was interrupted: nothing it would still say is read)."""
        if self._world is not None:
            self._world.kill()
            self._world = None

    def close(self) -> None:
        """Shut the world down."""
        if self._world is not None:
            self._world.close()
            self._world = None

    @property
    def shape(self) -> WorldShape:
        """The world's shape (nodes x ranks per node)."""
        return self.config.shape

    def excluded(self, prop: Property) -> dict[str, NotChecked]:
        """The selected backends ``prop`` does not apply to, with the reason (:meth:`Property.exclusions`)."""
        return prop.exclusions(self.config.backends)

    def contract(self, backend: str) -> Any:
        """The contract of the DeepEP version ``backend`` is driven by (``conformance.versions.Contract``): what a check
        reads of that version (its refusal table, its rules)."""
        spec = next((b for b in self.config.backends if b.name == backend), None)
        from conformance import versions

        return spec.contract if spec is not None else versions.under_test()

    def settings_for(self, prop: Property, include_broken: bool = False,
                     excluded: dict[str, NotChecked] | None = None) -> TaskSettings:
        """The task settings of ``prop``: the selected backends of the APIs it exercises that declare the capabilities
        it needs, the planted mutant.  The others are recorded (:meth:`not_checked`, span ``property``) with the
        reason.  Backends the construction preflight found broken are left out too (their failure is reported by the
        driver), unless ``include_broken`` or the property runs on a broken build (``runs_when_broken``: it then gets
        their names in ``TaskSettings.broken`` and makes no call on them).

        Raises :class:`NotApplicable` when no selected backend is left.  ``excluded``: :meth:`excluded`'s answer,
        where the caller has it already."""
        excluded = self.excluded(prop) if excluded is None else excluded
        found = self._broken.get(self.mutant, {})
        leave_out = () if include_broken or prop.runs_when_broken else found
        hung = self.recorder.hung  # backends whose calls hung on an earlier example of this property
        specs = tuple(b for b in self.config.backends if b.name not in excluded and b.name not in leave_out
                      and b.name not in hung and b.name not in self.left_out)
        self.recorder.excluded = {}  # (this property's: a session may be asked for several)
        for item in excluded.values():
            self.not_checked(item)
        if not specs and hung:
            raise AllHung(f"every backend of {prop.id} hung once ({', '.join(hung)}): nothing is left to check")
        if not specs:
            raise NotApplicable("; ".join(item.reason for item in excluded.values())
                                or f"{prop.id}: --backends selected no backend")
        return TaskSettings(specs, self.mutant, tuple(b.name for b in specs if b.name in found))

    def run(self, task: Callable[..., Any], case: Any, settings: TaskSettings | None = None) -> list[Any]:
        """Run the rank ``task`` on ``case`` with the per-example timeout; per-rank results."""
        settings = settings or TaskSettings(tuple(self.config.backends), self.mutant)
        return self.world.run(task, settings, case, timeout=self.config.example_timeout_s)

    def check(self, property_id: str, case: Any) -> None:
        """Run property ``property_id`` on one case: its task on the ranks, then its check here.

        The recorder's tally learns which backends held, failed or were excluded; a failure that a known-defect
        entry explains is counted as that known defect and does not raise (Hypothesis goes on drawing, so any
        other failure of the property is still found).  With :attr:`contain_hangs`, a hang inside one backend's calls
        fails that backend's column, costs one world restart, and the case is checked again without it
        (:meth:`_contain`); the backend is then left out of the property's later cases."""
        __tracebackhide__ = True
        selection = select(property_id, self.config.backends)
        prop = selection.prop
        settings = self.settings_for(prop, excluded=selection.excluded)
        recorder = self.recorder
        recorder.property_id = property_id
        recorder.examples += 1
        recorder.last_example = case
        recorder.distinct.add(case.to_json())
        for example in examples_in(case):
            recorder.shapes.add((example.hidden, example.num_topk, example.num_experts,
                                 example.num_max_tokens_per_rank, example.expert_alignment))
        while True:
            try:
                self._check_on(selection, settings, case)
                return
            except RankTimeout as hang:  # one backend's calls hung: that backend's failure, the others checked again
                backend = self._contain(hang, case, settings.names)
                if backend is None:
                    raise
                settings = dataclasses.replace(settings, backends=tuple(
                    spec for spec in settings.backends if spec.name != backend))
                if not settings.backends:
                    return

    def _check_on(self, selection: Selection, settings: TaskSettings, case: Any) -> None:
        """:meth:`check` of the selected property on ``case`` with the backends of ``settings``."""
        __tracebackhide__ = True
        prop = selection.prop
        property_id, recorder = prop.id, self.recorder
        tally = recorder.tally
        tally.start(settings.names, self.pairs(settings.names))
        try:
            prop.check(self, case, self._results(prop, settings, case))
        except (AssertionError, RankRaised, RankCrashed) as failure:  # a known defect may be a crash (SIGFPE...)
            blame = self._blame(failure, settings.names)
            if isinstance(failure, RankRaised) and failure.in_step:
                self._check_the_others(selection, settings, case, blame)
            if isinstance(failure, RankFailure) and failure.suite:
                self.suite_error(blame, failure)
            message = str(failure)
            apart = self._known_apart(property_id, failure, case)
            known: dict[str, str] = {}
            entry = None if apart is not None else self.known_defects.match(property_id, blame, case, message)
            if apart:  # several backends failed, some of them as their known defects say: those counted apart
                for column, seen in apart.items():
                    known[column] = seen.id
                    recorder.known_defect_seen(seen, case, "failed", failure.failed_columns[column])
                left = [column for column in blame if column not in apart]
                if not left:
                    done = set(blame) | set(tally.completed)
                    tally.failed((), known=known)
                    self._check_the_rest(selection, settings, case, done)
                    return
                messages = {column: failure.failed_columns[column] for column in left}
                failure = failure.column_failures[left[0]]
                failure.failed_columns = messages
                blame, message = tuple(left), messages[left[0]]
            if entry is not None:
                done = set(blame) | set(tally.completed)  # the columns this example has a verdict for
                tally.known_defect(blame, entry.id)
                recorder.known_defect_seen(entry, case, "failed", message)
                if isinstance(failure, AssertionError):  # the check stopped there: the others are checked now
                    self._check_the_rest(selection, settings, case, done)
                if isinstance(failure, RankFailure) and not failure.in_step:
                    seen = recorder.world_retiring_defects[entry.id] = recorder.world_retiring_defects.get(entry.id,
                                                                                                          0) + 1
                    if seen >= KNOWN_DEFECT_RESTARTS:
                        raise KnownDefectStop(entry.id, seen) from None
                return
            messages = getattr(failure, "failed_columns", None) or {}
            for column in blame:
                note = self._library_beneath(property_id, column, case, messages.get(column) or message)
                if note and column in messages:
                    messages[column] += "\n" + note
                if note and column == blame[0]:
                    message += "\n" + note
                    if hasattr(failure, "add_note"):  # Python >= 3.11: pytest shows it under the failure
                        failure.add_note(note)
            tally.failed(blame, message, messages or None, known=known)
            self._note_failure(failure)
            if apart:
                raise failure from None  # (the failure of the first backend that is not a known defect)
            raise
        except RankFailure as failure:  # a crash or hang
            tally.failed(self._blame(failure, settings.names), str(failure))
            self._note_failure(failure)
            raise
        except HypothesisException:
            raise
        except Exception as exc:  # the controller's own check code raised (an oracle, a helper): a suite error
            self.suite_error(self._blame(exc, settings.names), exc)
        checked = tuple(b for b in settings.names if b not in tally.excluded)
        for entry in self.known_defects.reached(property_id, checked, case):
            recorder.known_defect_seen(entry, case, "held")
        tally.held()

    def _known_apart(self, property_id: str, failure: BaseException, case: Any) -> dict[str, KnownDefect] | None:
        """For a failure of several backends judged one by one (``column_failures``, :func:`conformance.assertions.
        for_each_backend`): the known defect each column's own failure matches (``{column: entry}``, those that
        match one); ``None`` for a failure of one backend or charged to several together."""
        failures = getattr(failure, "column_failures", None)
        if not isinstance(failure, AssertionError) or not failures or len(failures) < 2:
            return None
        apart = {column: self.known_defects.match(property_id, (column,), case, str(f))
                 for column, f in failures.items()}
        return {column: entry for column, entry in apart.items() if entry is not None}

    def _library_beneath(self, property_id: str, column: str, case: Any, message: str) -> str:
        """For a failure of a class backend (``v1=pkg.mod:Class``, not the library's own class): the library's known
        defect it looks like, in words (:meth:`KnownDefects.beneath`), or ``""``."""
        spec = next((spec for spec in self.config.backends if spec.name == column), None)
        if spec is None or not spec.substitute or spec.library:
            return ""
        entry = self.known_defects.beneath(property_id, case, message)
        if entry is None:
            return ""
        return (f"Beneath it, the library's own known defect {entry.id} ({entry.backend.upper()} API): {entry.wrong} "
                f"The class passes it on to its users: the failure is the class's (the library's known defects are "
                f"the verdicts of the library's own backends only).")

    def suite_error(self, blame: tuple[str, ...], error: BaseException) -> None:
        """The suite's own code raised while checking ``blame`` (on a rank: ``RankFailure.suite``; here: any exception
        of a check that is not an assertion): counted as a suite error of those columns, never their failure nor a
        pass, and raised as :class:`~conformance.core.raisers.SuiteError` (the property test fails, the run exits
        non-zero, the kill matrix says ``error``)."""
        where = (f" at {error.suite[min(error.suite)]} (rank {min(error.suite)})"
                 if isinstance(error, RankFailure) and error.suite else "")
        message = (f"SUITE ERROR{where} while checking {', '.join(blame) or 'the example'}: the suite's own code "
                   f"raised {type(error).__name__}; no verdict on the backend(s) for this example.\n{error}")
        self.recorder.tally.suite_error(blame, message)
        if self.recorder.suite_error is None:
            self.recorder.suite_error = message[:4000]
        self._note_failure(error)
        raise SuiteError(message) from error

    def _check_the_rest(self, selection: Selection, settings: TaskSettings, case: Any, done: set[str]) -> None:
        """A known defect of one backend ended the check of an example before the backends after it had their turn
        (a known defect of real-v2 would leave emulated-v2 unchecked on every example): check those on the same case,
        as an example of their own (their task is run again without the others; their known defects, failures and
        hangs counted as any example's)."""
        rest = tuple(spec for spec in settings.backends if spec.name not in done)
        if rest:
            self._check_on(selection, dataclasses.replace(settings, backends=rest), case)


    def _check_the_others(self, selection: Selection, settings: TaskSettings, case: Any, blame: tuple[str, ...]
                          ) -> None:
        """A backend's call raised in step (the world is intact): the task ended on every rank before the other
        backends' results were checked.  Run it again without the backend(s) blamed and check the others, so each
        backend's verdict is about its own calls (a wrapper that always raises leaves the raw APIs beside it
        checked); where another backend's call raises in step there too, it is charged and left out in turn.  Their
        outcome is counted here; a failure of theirs is counted too, and the first blamed backend's failure is the
        one raised (a crash or hang of theirs is raised instead: the world must be rebuilt)."""
        rest = tuple(spec for spec in settings.backends if spec.name not in blame)
        if not rest or len(rest) == len(settings.backends):
            return
        tally = self.recorder.tally
        prop = selection.prop
        while rest:
            names = tuple(spec.name for spec in rest)
            tally.start(names, self.pairs(names))
            try:
                prop.check(self, case, self._results(prop, dataclasses.replace(settings, backends=rest), case))
            except (AssertionError, RankRaised) as other:
                if isinstance(other, RankRaised) and not other.in_step:
                    raise
                charged = self._blame(other, names)
                if isinstance(other, RankRaised) and other.suite:
                    tally.suite_error(charged, str(other))
                else:
                    tally.failed(charged, str(other), getattr(other, "failed_columns", None))
                left = tuple(spec for spec in rest if spec.name not in charged)
                if not (isinstance(other, RankRaised) and other.in_step) or len(left) == len(rest):
                    break
                rest = left
            except RankTimeout as hang:  # one of the others hung: its failure, contained (the blamed one's is raised)
                hung = self._contain(hang, case, names)
                if hung is None:
                    raise
                tally.failed((hung,), str(hang))
                break
            else:
                tally.held()
                break
        tally.start(blame, [])

    def _contain(self, hang: RankTimeout, case: Any, names: tuple[str, ...]) -> str | None:
        """The backend of ``names`` whose calls hung (``hang`` names it), now left out of the property's later
        examples and charged one world restart (:class:`~conformance.harness.faults.HungBackend`); ``None`` where
        hangs are not contained (:attr:`contain_hangs`) or the hang is no one backend's (then it is raised)."""
        backend = hang.backend or backend_of(hang.culprit_call())
        if not self.contain_hangs or backend not in names:
            return None
        cause = {**cause_of(hang, backend), "contained": True}  # (the report: no budget was spent on it)
        hung = HungBackend(backend, cause, case, self.config.example_timeout_s)
        self.recorder.hung[backend] = hung
        self.not_checked(hung.not_checked())
        self.budget.charge(hang, case, self.config.example_timeout_s, contained=True)
        return backend

    def _results(self, prop: Property, settings: TaskSettings, case: Any) -> list[Any]:
        """The per-rank results of ``prop``'s task on ``case`` (a ``memo`` property: once per case and property)."""
        if not prop.memo:
            return self.world.run(prop.task, settings, case, timeout=self.config.example_timeout_s)
        key = (prop.id, settings, case.to_json())
        if key not in self._memo:
            self._memo = {k: v for k, v in self._memo.items() if k[0] == prop.id}  # one property's at a time
            self._memo[key] = self.world.run(prop.task, settings, case, timeout=self.config.example_timeout_s)
        return self._memo[key]

    def _blame(self, failure: BaseException, backends: tuple[str, ...]) -> tuple[str, ...]:
        """Who a failure is charged to: a rank failure to the backend whose library call it was in, a failed
        check to the backend or pair being checked (else every backend checked)."""
        if isinstance(failure, RankFailure):
            backend = failure.backend or backend_of(failure.culprit_call())
            if backend in backends:
                return (backend,)
        several = getattr(failure, "failed_columns", None)  # a check that judged every column before raising
        if several:
            return tuple(several)
        return self.recorder.tally.blame()

    def _note_failure(self, failure: BaseException) -> None:
        recorder = self.recorder
        if recorder.first_failure_at is None:
            recorder.first_failure_at = recorder.examples
        recorder.failure_detail = getattr(failure, "detail", None)
        recorder.failing_example = recorder.last_example

    def progress(self, property_id: str, examples: int) -> None:
        """Report progress (see :attr:`on_progress`); never fails the example."""
        if self.on_progress is not None:
            try:
                self.on_progress(property_id, examples)
            except Exception:  # noqa: BLE001 - progress is best effort
                pass

    def complete(self, backends: tuple[str, ...]) -> None:
        """The check of ``backends`` (one, or a pair) ended on this example and held: counted as held even when
        another backend of the example then fails."""
        self.recorder.tally.complete(self.recorder.tally._name(tuple(backends)))

    def pairs(self, names: Any) -> list[tuple[str, str]]:
        """The pairs of ``names`` (backends with results) a check compares (``harness.pairs.compared_pairs``): the check
        context's answer, which ``conformance.assertions.for_each_backend`` and P30 look up (a context without it
        compares consecutive backends)."""
        return compared_pairs(list(names), self.config.backends)

    def checking(self, backends: tuple[str, ...] | None) -> None:
        """The check now looks at ``backends`` (one, or a pair); a failure raised now is charged to them."""
        self.recorder.tally.checking(backends)

    def run_property(self, prop: Property) -> None:
        """The body of every property test: draw cases and check them (see :mod:`conformance.harness.driver`)."""
        from conformance.harness.driver import run_property

        run_property(self, prop)

    def broken_backends(self) -> dict[str, dict[str, Any]]:
        """Backends whose buffer construction crashes, hangs or raises (backend -> cause), found once per mutant
        by building one small buffer per backend on the ranks (see :mod:`conformance.harness.faults`)."""
        if self.mutant not in self._broken:
            from conformance.tasks.preflight import construct

            world_size = self.config.world_size
            example = Example(tokens_per_rank=(0,) * world_size, hidden=256, num_topk=1, num_experts=world_size,
                              num_max_tokens_per_rank=16)
            broken: dict[str, dict[str, Any]] = {}
            for backend in self.config.backends:
                if backend.removed:  # its version has no such API: unsupported everywhere, nothing to build
                    continue
                try:
                    built = self.run(construct, example, TaskSettings((backend,), self.mutant))
                    self.seen[backend.name] = built[0]["deep_ep"]
                except RankFailure as failure:
                    if not getattr(failure, "in_step", False):  # a raise every rank took in step kept the world
                        self.budget.run_restarts += 1
                    broken[backend.name] = cause_of(failure, backend.name)
            self._broken[self.mutant] = broken
        return self._broken[self.mutant]

    def collect_api_calls(self, keep: bool = True) -> None:
        """Hand over the library calls the ranks recorded since the last collection (``backends.tracing``, one small
        task): into the recorder (``keep``), or forgotten (the construction preflight's, before a property draws).
        A world that is not running has nothing to hand over; calls of ranks lost in a crash or hang are lost."""
        world = self._world
        if world is None or not world.alive:
            return
        try:
            per_rank = world.run(drain, timeout=self.config.example_timeout_s)
        except RankFailure as failure:  # the world is retired (the next task starts a fresh one): said, not lost
            if not failure.in_step:
                self.budget.run_restarts += 1
            when = ("after the property's examples, while the suite collected the library calls they made (those "
                    "calls are missing from api_calls)" if keep else
                    "before the property's first example (its examples ran on a fresh world)")
            lost = f"the world was lost {when}: {str(failure).splitlines()[0]}"
            self.recorder.world_lost = "; ".join(filter(None, (self.recorder.world_lost, lost)))
            return
        if keep:
            for calls in per_rank:
                self.recorder.api_calls.update(calls)

    # ------------------------------------------------------------------------------------- recording
    def not_checked(self, item: NotChecked, case: Any = None) -> None:
        """Remember what ``item.backend`` was not checked on, and why: the one way the checks, the harness and a
        rank task's result (a configuration the backend declined) say it.  By its span: the whole property
        (``excluded``: an ``unsupported`` column with the reason), one example (``case``, rejected: ``unsupported``
        with the call and what it raised, counted in the column's exclusions beside its verdict; called once per
        rank, ``count`` is the number of distinct cases) or a part of the check (``not_checked``, listed with the
        backend's verdict).  The kind of reason goes into the column's ``why``."""
        recorder = self.recorder
        kinds = recorder.why.setdefault(item.backend, [])
        if item.why.value not in kinds:
            kinds.append(item.why.value)
        if item.span is Span.PROPERTY:
            recorder.excluded[item.backend] = item.reason
        elif item.span is Span.PART:
            reasons = recorder.not_checked.setdefault(item.backend, [])
            if item.reason not in reasons:
                reasons.append(item.reason)
        else:  # (the example being checked, unless the caller names it)
            text = (case if case is not None else recorder.last_example).to_json()
            entry = recorder.unsupported.setdefault(
                item.backend, {"call": item.call, "error": item.reason, "condition": item.condition, "count": 0,
                               "example": text}
            )
            recorder.tally.exclude(item.backend, item.condition or f"{item.call} raised {item.reason[:80]}")
            seen = recorder.rejected.setdefault(item.backend, set())
            if text not in seen:
                seen.add(text)
                entry["count"] += 1

    def record_artifact(self, key: str, value: Any) -> None:
        """Attach a JSON-able artifact (e.g. an API-surface snapshot) to the property's report entry."""
        self.recorder.artifacts[key] = value

    def record_seen(self, key: str, backend: str, what: str, value: str) -> None:
        """Add ``value`` to the distinct values seen for ``what`` on ``backend`` over the property's examples: the
        artifact ``key`` of its report entry, ``{backend: {what: [values, in the order first seen]}}``."""
        seen = self.recorder.artifacts.setdefault(key, {}).setdefault(backend, {}).setdefault(what, [])
        if value not in seen:
            seen.append(value)

    def record_divergence(self, key: str, message: str, backends: tuple[str, ...] | None = None) -> None:
        """Remember a documented behavioural divergence (reported as ``divergence``, not a failure) seen on
        ``backends`` (default: the backend or pair being checked, else every compared pair)."""
        self.recorder.divergences[key] = message
        self.recorder.divergence_examples.setdefault(key, self.recorder.last_example.to_json()
                                                     if self.recorder.last_example is not None else None)
        self.recorder.tally.diverged(key, backends)
