"""Meta-tests of P30 (call sequences) and P31 (soak mode).

P30 must catch the four sequence-only mutants with a short sequence, hold on the emulation (one and two nodes),
and its draws must reach the sequences the contract cares about; its state machine must only make calls the
model allows.  P31 must hold on the emulation at a small size and report its figures.
"""

from __future__ import annotations

from typing import Any

import pytest

from conformance.core.cases import SequenceCase, SoakCase
from conformance.harness.hypothesis_glue import ALL_HEALTH_CHECKS, drawing, machine_test
from conformance.properties.test_p31_soak import soak_examples
from conformance.strategies.sequences import SequenceModel, sequence_cases, sequence_machine
from conformance.world.errors import RankRaised
from tests.helpers.meta import assert_reaches, sample

P30 = "P30-call-sequences"
#: Replaying a shrink candidate runs a whole sequence on the world: the meta-tests find without shrinking (the
#: pytest run's state machine shrinks; see P30's docstring (docs/properties.md)).
SEQUENCE_MUTANTS = ("stale-handle-after-newer-dispatch", "event-misses-own-work-when-busy",
                    "async-calls-share-receive-slot", "destroyed-buffer-revived-by-new-buffer")


def _fails(session: Any, case: SequenceCase, mutant: str | None) -> str | None:
    with session.planted(mutant):
        try:
            session.check(P30, case)
        except (AssertionError, RankRaised) as failure:
            return str(failure)
    return None


@pytest.mark.parametrize("mutant", SEQUENCE_MUTANTS)
def test_p30_catches_a_sequence_only_mutant_with_a_short_sequence(emulated_session, mutant: str) -> None:
    case = assert_reaches(sequence_cases(2), lambda c: _fails(emulated_session, c, mutant) is not None)
    message = _fails(emulated_session, case, mutant)
    assert message is not None and "the call sequence" in message or "raised" in message
    assert _fails(emulated_session, case, None) is None, f"P30 fails without {mutant} on {case.calls()}"


def test_p30_failure_message_lists_the_calls(emulated_session) -> None:
    case = assert_reaches(sequence_cases(2), lambda c: _fails(emulated_session, c,
                                                              "destroyed-buffer-revived-by-new-buffer") is not None)
    message = _fails(emulated_session, case, "destroyed-buffer-revived-by-new-buffer")
    assert "the call sequence" in message and "destroy" in message and "returned normally" in message
    assert SequenceCase.from_json(case.to_json()) == case  # the report's counterexample replays


def test_p30_holds_on_the_emulation_including_two_nodes(emulated_session, two_node_session) -> None:
    for case in sample(sequence_cases(2), 6):
        assert _fails(emulated_session, case, None) is None, case.calls()
    for case in sample(sequence_cases(4), 3):
        assert _fails(two_node_session, case, None) is None, case.calls()


def _out_of_order(refs: list[int]) -> bool:
    return any(a > b for i, a in enumerate(refs) for b in refs[i + 1:])


def test_p30_strategy_reaches_its_corners() -> None:
    # reached is enough: no shrinking of what was found
    strategy = sequence_cases(2)
    # a combine chained on the event of its dispatch still in flight
    assert_reaches(strategy, lambda c: any(s.op == "combine" and s.after == s.ref for s in c.steps), 1000)
    # two dispatches in flight, waited newest first
    assert_reaches(strategy, lambda c: sum(s.op == "dispatch" and s.async_op for s in c.steps) >= 2
                   and any(s.op == "wait" for s in c.steps), 1000)
    # combine out of dispatch order: a later combine reads an older dispatch than an earlier one (2-3% of draws)
    assert_reaches(strategy, lambda c: _out_of_order([s.ref for s in c.steps if s.op == "combine"]), 3000)
    # a destroyed buffer used after a re-create; an autograd round trip
    assert_reaches(strategy, lambda c: [s.op for s in c.steps].count("create") >= 2
                   and any(s.op == "use_destroyed" for s in c.steps), 1000)
    assert_reaches(strategy, lambda c: any(s.op == "grad" for s in c.steps), 1000)


def test_p30_state_machine_only_makes_allowed_calls() -> None:
    """The machine's steps, checked against the model's rules (no world: ``run_step`` records)."""
    seen: list[int] = []

    def run_step(case: SequenceCase, index: int) -> None:
        case.validate()
        model = SequenceModel(SequenceCase(case.world_size, case.hidden, case.num_topk, case.num_experts,
                                           case.num_max_tokens_per_rank))
        for step in case.steps[:index]:
            model.apply(step)
        step = case.steps[index]
        assert index == 0 or step.op in model.ops(), (step, model.ops())
        if step.op == "combine" and step.ref in model.in_flight:
            assert step.after == step.ref, "a combine read the rows of a dispatch still in flight"
        seen.append(index)

    def end(case: SequenceCase, failed: bool) -> None:
        model = SequenceModel(SequenceCase(case.world_size, case.hidden, case.num_topk, case.num_experts,
                                           case.num_max_tokens_per_rank))
        for step in case.steps:
            model.apply(step)
        assert not model.in_flight, "a sequence ended with calls in flight, unread"

    machine_test(sequence_machine(2, run_step, end), drawing(30, stateful_step_count=10,
                                                             health_checks=ALL_HEALTH_CHECKS), None)()
    assert len(seen) > 30


def test_p31_soak_holds_on_the_emulation_and_reports_figures(emulated_session) -> None:
    case = SoakCase(soak_examples(2, large=False)[0], repetitions=3)
    emulated_session.check("P31-soak", case)
    figures = [v for k, v in emulated_session.recorder.artifacts.items() if k.startswith("soak ")]
    assert len(figures) == 2  # one per backend
    for entry in figures:
        assert entry["repetitions"] == 3 and entry["rows_compared"] > 0 and entry["corrupted_rows"] == 0


def test_p31_soak_is_single_call_and_spares_a_sequence_only_mutant(emulated_session) -> None:
    """Soak repeats synchronous calls: a defect only a sequence shows is not its to find (the kill matrix agrees)."""
    case = SoakCase(soak_examples(2, large=False)[0], repetitions=2)
    with emulated_session.planted("async-calls-share-receive-slot"):
        emulated_session.check("P31-soak", case)  # synchronous calls: this sequence-only mutant is invisible
