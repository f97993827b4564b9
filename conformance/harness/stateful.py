"""Runs a stateful property: a Hypothesis state machine in the controller, each step on the persistent world.

One example is one sequence of steps.  Every step is sent to the ranks as its own task (``Stateful.step_task``:
the ranks keep the sequence's buffers between tasks) and checked at once (``Stateful.check_step``), so a wrong
result, a rank that raised, crashed or hung is caught at the step that caused it; Hypothesis then shrinks the
sequence to the shortest one that still fails.  The session's recorder counts sequences as examples (checked,
held, failed per backend and pair); the failing sequence is the counterexample of the report (its JSON carries
the readable list of calls) and its reproduction line replays it whole (``Property.task``).  A hang inside one
backend's calls (``harness.faults.HungBackend``) ends its sequence there, fails that backend, and the later sequences
run without it.
"""

from __future__ import annotations

import time
from typing import Any

from hypothesis.errors import HypothesisException

from conformance.harness.hypothesis_glue import drawing, example_database, machine_test, property_key
from conformance.properties import BackendsFailed, Property
from conformance.strategies import vocabulary
from conformance.world.errors import RankFailure, RankRaised, RankTimeout

#: Steps per sequence in the pytest run (Hypothesis' ``stateful_step_count``).
STEPS_PER_SEQUENCE = 10


def sequences_for(max_examples: int) -> int:
    """Sequences drawn for ``--max-examples N``: a sequence makes up to ten calls, so fewer of them than cases of a
    single-call property fit the same time (N / 4, at least 4: 6 sequences by default)."""
    return max(4, max_examples // 4)


def stateful_test(session: Any, prop: Property, suppressed: list[Any], database_on: bool = True) -> Any:
    """The Hypothesis test running ``prop``'s state machine against ``session``'s world (call it to run;
    ``database_on=False``: without the example database, the seeded draws only)."""
    assert prop.stateful is not None
    stateful = prop.stateful
    config = session.config
    recorder = session.recorder
    # the backends of the running sequence: every sequence starts without those whose calls hung earlier;
    # deferred: the partial failures of the running sequence (``BackendsFailed``: some backends failed, the others go
    # on), raised at its end; failed: those backends, left out of the later steps' checks
    state: dict[str, Any] = {"started": 0.0, "settings": session.settings_for(prop), "abandoned": False,
                             "deferred": [], "failed": set()}

    def fail(failure: BaseException, case: Any, budgeted: bool) -> None:
        tally = recorder.tally
        tally.failed(session._blame(failure, state["settings"].names), str(failure),
                     getattr(failure, "failed_columns", None))
        session._note_failure(failure)
        if budgeted:
            session.budget.charge(failure, case, time.monotonic() - state["started"])

    def run_step(case: Any, index: int) -> None:
        __tracebackhide__ = True
        recorder.property_id = prop.id
        recorder.last_example = case
        if index == 0:
            state["settings"], state["abandoned"] = session.settings_for(prop), False  # AllHung: nothing left
            recorder.examples += 1
            recorder.tally.start(state["settings"].names)
            state.update(started=time.monotonic(), deferred=[], failed=set())
        elif state["abandoned"]:  # its state on the ranks went with the world a hang retired
            return
        task_settings = state["settings"]
        try:
            per_rank = session.world.run(stateful.step_task, task_settings, (case, index),
                                         timeout=config.example_timeout_s)
            stateful.check_step(session, case, index, per_rank, failed=frozenset(state["failed"]))
        except BackendsFailed as partial:  # the others go on; raised at the sequence's end
            state["deferred"].append(partial)
            state["failed"] |= partial.backends
        except RankTimeout as hang:  # one backend's calls hung: its failure; the sequence ends, the others go on
            hung = session._contain(hang, case, task_settings.names)
            if hung is None:
                fail(hang, case, budgeted=True)
                raise
            recorder.tally.failed((hung,), str(hang))
            session._note_failure(hang)
            state["abandoned"] = True
        except RankFailure as failure:
            if failure.suite:  # the suite's own code raised on the ranks: a suite error, no verdict
                if not failure.in_step:
                    session.budget.charge(failure, case, time.monotonic() - state["started"])
                session.suite_error(session._blame(failure, task_settings.names), failure)
            fail(failure, case, budgeted=not isinstance(failure, RankRaised))  # a crash or hang: a rebuilt world
            raise
        except AssertionError as failure:
            if state["deferred"]:  # no backend left: the earlier partial failures are charged too
                failure.failed_columns = {**ended(), **getattr(failure, "failed_columns", {})}  # type: ignore
            fail(failure, case, budgeted=False)
            raise
        except HypothesisException:
            raise
        except Exception as exc:  # the controller's check raised something else: a suite error
            session.suite_error(recorder.tally.blame(), exc)

    def ended() -> dict[str, str]:
        """Every column a partial failure of the running sequence charged, with its first message."""
        return {column: message for partial in reversed(state["deferred"])
                for column, message in partial.columns.items()}

    def end(case: Any, failed: bool) -> None:
        if failed or state["abandoned"]:
            session.progress(prop.id, recorder.examples)
            return
        if state["deferred"]:  # the sequence ran to its end for the backends that held: now the failure
            session.world.run(stateful.end_task, state["settings"], case, timeout=config.example_timeout_s)
            failure = state["deferred"][0].failure
            failure.failed_columns = ended()
            fail(failure, case, budgeted=False)
            session.progress(prop.id, recorder.examples)
            raise failure
        recorder.distinct.add(case.to_json())
        recorder.tally.held()
        session.world.run(stateful.end_task, state["settings"], case, timeout=config.example_timeout_s)
        session.progress(prop.id, recorder.examples)

    machine = stateful.machine(config.world_size, run_step, end)
    # One database key per property, world size and mutant (as the other properties); seeded with the database on.
    database = example_database(config.database_dir, property_key(prop.id, config.world_size, session.mutant)) \
        if database_on else None
    run = drawing(sequences_for(config.max_examples), database=database, health_checks=suppressed,
                  stateful_step_count=STEPS_PER_SEQUENCE)
    test = machine_test(machine, run, config.seed)
    explicit = prop.explicit(config.shape) if prop.explicit else []
    chosen = vocabulary.active()  # the run's shape vocabulary (set by the driver): the explicit sequences on it too
    if chosen is not None:
        explicit = [vocabulary.snap(case, chosen, prop.shapes == "small") for case in explicit]

    def explicit_then_drawn() -> None:
        """The property's explicit sequences first, step by step as the machine runs them (as ``@example``
        cases come before the draws of a single-call property), then the state machine."""
        __tracebackhide__ = True
        for case in explicit:
            try:
                for index in range(len(case.steps)):
                    run_step(case, index)
            except BaseException:
                end(case, True)
                raise
            end(case, False)
        test()

    return explicit_then_drawn
