"""Runs one property under Hypothesis, with the run's own settings and the crash/hang budget.

The settings (examples, seed, health checks, the example database) are applied to the suite's own tests here,
never through a global Hypothesis profile: a pytest run that also holds other Hypothesis tests keeps their settings.

The example database lives in the report directory (``<report dir>/hypothesis``): every failing example Hypothesis
finds is stored there under a key of the property, the world size and the planted mutant, and the next run with
the same report directory replays the stored counterexamples before drawing new ones, so a red CI stays red on the
same case until it is fixed (and a fixed case is dropped from the database).
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from conformance.core.ids import is_pair, members
from conformance.core.raisers import SuiteError
from conformance.harness.faults import AllHung, BudgetExhausted, KnownDefectStop, describe_cause
from conformance.harness.hypothesis_glue import (
    SUPPRESSED,
    drawing,
    drawn,
    example_database,
    new_draws_only,
    property_key,
)
from conformance.properties import NotApplicable, Property
from conformance.world.errors import RankFailure


def run_property(session: Any, prop: Property) -> None:
    """Draw cases from ``prop.strategy`` and check ``prop`` on each (the body of every property test).

    Not applicable with the selected backends: recorded with the reason (reported ``unsupported``), nothing
    drawn.  Fails at once, without drawing, when a backend the property uses is broken on construction or the
    run's fault budget is spent; stops with the smallest failing case when the property's own budget is spent.
    """
    __tracebackhide__ = True
    recorder = session.recorder
    property_id = recorder.property_id = prop.id
    try:
        task_settings = session.settings_for(prop, include_broken=True)  # (not ``settings``: Hypothesis' decorator)
    except NotApplicable as reason:
        recorder.not_applicable = str(reason)
        return
    configured = prop.configured(session.config) if prop.configured is not None else None
    if isinstance(configured, str):  # an option's mode that is off (--soak): skipped, saying why, whatever else
        pytest.skip(f"{property_id}: {configured}")
    broken = {name: cause for name, cause in session.broken_backends().items() if name in task_settings.names}
    recorder.seen = {name: seen for name, seen in session.seen.items() if name in task_settings.names}
    healthy = [name for name in task_settings.names if name not in broken]
    broken_message = ""
    if broken and not prop.runs_when_broken:
        recorder.cause = {"kind": "construction", "broken": broken}
        broken_message = (
            f"{property_id}: the library is broken on buffer construction (construction preflight, before any "
            f"example): " + "; ".join(describe_cause(c) for c in broken.values())
            + ". Every property using these backends fails with this cause."
            + (f" The other backends ({', '.join(healthy)}) were checked." if healthy else ""))
        if not healthy:
            pytest.fail(broken_message.replace(f"{property_id}:", f"{property_id} not checked:", 1), pytrace=False)
    budget = session.budget
    if budget.run_exhausted():
        recorder.cause = budget.last_cause
        pytest.fail(f"{property_id} not checked: the run spent its crash/hang budget ({budget.run_limit} world "
                    f"restarts); last cause: {describe_cause(budget.last_cause or {'kind': 'error'})}", pytrace=False)
    budget.start_property()
    session.collect_api_calls(keep=False)  # the construction preflight's calls are no property's
    session.contain_hangs = True  # a hang in one backend's calls is that backend's (harness.faults.HungBackend)
    try:
        _draw(session, prop, configured, recorder, budget)
    except (KeyboardInterrupt, SystemExit):  # Ctrl-C or SIGTERM: stop at once, collect nothing
        raise
    except BaseException:  # a failure or pytest's fail/skip: the calls made so far are still this property's
        session.collect_api_calls()
        raise
    finally:
        session.contain_hangs = False
    session.collect_api_calls()  # the library calls this property made (api_calls of its report entry)
    if recorder.hung:
        _fail_hung(property_id, recorder, [name for name in healthy if name not in recorder.hung], broken_message)
    if broken_message:
        pytest.fail(broken_message, pytrace=False)


def _fail_hung(property_id: str, recorder: Any, others: list[str], broken_message: str) -> None:
    """The property ends failed on the backends whose calls hung (each on one example, then left out): the message
    names each backend, its call and the timeout, and the ``others`` checked beside them; the first hung case is the
    counterexample of the report."""
    __tracebackhide__ = True
    first = next(iter(recorder.hung.values()))
    recorder.cause, recorder.last_example = recorder.cause or first.cause, first.case  # (a broken build's stays)
    message = (f"{property_id}: " + "; ".join(hung.describe() for hung in recorder.hung.values()) + "."
               + (f" The other backends ({', '.join(others)}) were checked without it." if others else ""))
    pytest.fail(message + (f" {broken_message}" if broken_message else ""), pytrace=False)


def _draw(session: Any, prop: Property, configured: Any, recorder: Any, budget: Any) -> None:
    """Check ``prop`` on its ``configured`` cases (an option's mode) or on Hypothesis' draws."""
    __tracebackhide__ = True
    property_id = prop.id
    config = session.config

    def check_one(case: Any) -> None:
        started = time.monotonic()
        try:
            session.check(property_id, case)
        except (RankFailure, SuiteError) as failure:
            world = failure if isinstance(failure, RankFailure) else failure.__cause__  # a suite error on the ranks
            if isinstance(world, RankFailure) and not world.in_step:  # a crash, a hang, or a raise that left the
                budget.charge(world, case, time.monotonic() - started)  # ranks out of step: a world restart
            raise
        finally:
            session.progress(property_id, recorder.examples)

    if prop.configured is not None:  # an option's mode (--soak): its chosen cases (the skip was decided above)
        try:
            for case in configured:
                check_one(case)
        except (KnownDefectStop, AllHung) as stopped:  # (a failure here is raised at once: no replay to replace)
            recorder.stopped = str(stopped)
        return

    def draws(database_on: bool = True) -> None:
        # One database key per property, world size and mutant (Hypothesis keys on the function's source otherwise,
        # which every property shares here): the property's view of the report directory's database.
        key = property_key(property_id, config.world_size, session.mutant)
        database = example_database(config.database_dir, key) if database_on else None
        # report_multiple_bugs=False: one failure per property, shrunk, with its own message and counterexample (the
        # report and the repro line name one case; Hypothesis' "found 2 distinct failures" group would hide both).
        started = time.monotonic()
        run = drawing(config.max_examples, database=database, report_multiple_bugs=False)
        strategy, explicit = shaped(prop, config)
        # seeded (--conformance-seed) with the database still on: the stored counterexamples are replayed first, the
        # seeded draws follow them unchanged (conformance.harness.hypothesis_glue)
        body = drawn(check_one, strategy, run, config.seed, explicit)

        if prop.stateful is not None:  # a state machine, one step per rank task (conformance.harness.stateful)
            from conformance.harness.stateful import stateful_test

            body = stateful_test(session, prop, SUPPRESSED, database_on)
        body()
        if prop.stateful is None:
            for round_seed in _more_rounds(config, started):
                drawn(check_one, strategy, new_draws_only(run), round_seed)()  # new draws only

    try:
        try:
            draws()
        except (AssertionError, RankFailure) as failure:
            judge_the_others(session, prop, failure, lambda: draws(database_on=False))
            raise
    except BudgetExhausted as exhausted:
        recorder.last_example = exhausted.case
        recorder.cause = exhausted.cause
        pytest.fail(f"{property_id}: {exhausted}", pytrace=False)
    except (KnownDefectStop, AllHung) as stopped:  # the verdicts stand as counted; the report says why it stopped
        recorder.stopped = str(stopped)
        _failed_before_the_stop(property_id, recorder, stopped)


def _failed_before_the_stop(property_id: str, recorder: Any, stopped: BaseException) -> None:
    """A property that stopped drawing (``stopped``) after an example had failed fails: a known defect that retires
    the world may stop it while Hypothesis is still replaying that failure (shrinking it), and the stop, a
    ``BaseException``, takes the failure's place, so the test would pass while the column says ``failed`` (a real
    run: P23 on real-v1, a crash on its first example, then the known defect twice).  The counterexample is the
    last case that failed; a backend left out after a hang is failed by :func:`_fail_hung` instead."""
    __tracebackhide__ = True
    failed = {name: column for name, column in recorder.tally.columns.items()
              if (column.failed or column.suite_errors) and name not in recorder.hung}
    if not failed:
        return
    if recorder.failing_example is not None:
        recorder.last_example = recorder.failing_example
    first = next(iter(failed.values()))
    pytest.fail(f"{property_id} failed on {', '.join(failed)} before it stopped drawing ({stopped}); the first "
                f"failure:\n{first.message or '(no message kept)'}", pytrace=False)


def judge_the_others(session: Any, prop: Property, failure: BaseException, redraw: Any) -> None:
    """A backend failed ``prop`` (Hypothesis stopped drawing at its first failure and shrank it): the other backends'
    verdicts come from draws of their own.  Their columns are dropped and the property is drawn again, the same
    seeded draws a run without the failed backend(s) makes (no example database), leaving them out; a backend that
    fails there too is left out in turn.  The failure of the first pass is the one the caller raises; what the later
    passes found is counted in the columns.  (A crash or hang, or a suite error, ends it: the verdicts stand.)"""
    recorder = session.recorder
    tally = recorder.tally
    if isinstance(failure, RankFailure) and (not failure.in_step or failure.suite):
        return
    saved = (recorder.last_example, recorder.failure_detail, recorder.first_failure_at, recorder.cause)
    left_out: set[str] = set(session.left_out)
    try:
        while True:
            failed = {name for name, column in tally.columns.items() if not is_pair(name) and column.failed}
            new = failed - left_out
            names = session.settings_for(prop).names
            others = [name for name in names if name not in failed | left_out]
            if not new or not others:
                return
            left_out |= new
            for name in list(tally.columns):  # the others' verdicts: from the draws of the next pass alone
                if not set(members(name)) & left_out:
                    del tally.columns[name]
            with session.leaving_out(left_out):
                try:
                    redraw()
                    return
                except KnownDefectStop as stopped:
                    recorder.stopped = str(stopped)
                    return
                except (AssertionError, RankFailure) as again:  # another backend failed: counted; left out next
                    if isinstance(again, RankFailure) and (not again.in_step or again.suite):
                        return
    finally:
        recorder.last_example, recorder.failure_detail, recorder.first_failure_at, recorder.cause = saved


def shaped(prop: Property, config: Any) -> tuple[Any, list[Any]]:
    """``prop``'s strategy and explicit cases on the run's shape vocabulary (``--shapes``): snapped to its shapes
    unless the property draws freely (``Property.shapes``); the vocabulary is also the one this process's draws
    consult (the call sequences' state machine)."""
    from conformance.harness.jit import explicit_part
    from conformance.strategies import vocabulary

    strategy = prop.strategy(config.shape)
    explicit = explicit_part(prop.explicit(config.shape)) if prop.explicit else []
    # only where a V2 backend (the API whose kernels are compiled per shape) takes the property
    v2_checked = "v2" in prop.apis and any(b.api == "v2" and not b.lacks(prop.needs) for b in config.backends)
    chosen = vocabulary.named(config.shapes) if prop.shapes != "free" and v2_checked else None
    vocabulary.use(chosen)
    if chosen is None or prop.shapes == "own":  # "own": the strategy reads the vocabulary itself
        return strategy, explicit
    small = prop.shapes == "small"
    strategy = strategy.map(lambda case: vocabulary.snap(case, chosen, small)).filter(vocabulary.valid)
    return strategy, [snapped for snapped in (vocabulary.snap(case, chosen, small) for case in explicit)
                      if vocabulary.valid(snapped)]


def _more_rounds(config: Any, started: float) -> Any:
    """``--time-budget``: the seeds of further rounds of ``max_examples`` draws (``seed + 1``, ``seed + 2``, ...) while
    the property's time since ``started`` is under the budget (a round begun runs to its end)."""
    base = config.seed if config.seed is not None else 0
    round_ = 0
    while config.time_budget_s and time.monotonic() - started < config.time_budget_s:
        round_ += 1
        yield (base + round_) % 2**32
