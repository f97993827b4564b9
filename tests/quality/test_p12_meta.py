"""Meta-tests of P12: every row of the refusal table is checked on every run, a dropped refusal or a refusal of a
valid call is caught, a refusal that slips through truncated data is caught, and P12 holds on the emulation."""

import pytest

from conformance.core.cases import BadCallCase, p12_rows
from conformance.mutants import refusals as refusal_mutants
from conformance.strategies.calls import bad_call_cases, bad_call_sweep, p12_rows_for
from conformance.world.launcher import WorldShape
from tests.helpers.meta import assert_caught, assert_holds, assert_reaches, fails, sample

P12 = "P12-bad-input"
ONE_NODE, TWO_NODES = WorldShape(1, 2), WorldShape(2, 2)


def case_of(row_id: str, world: WorldShape = ONE_NODE) -> BadCallCase:
    """The sweep's case for ``row_id`` reduced to that one row."""
    (case,) = [c for c in bad_call_sweep(world) if row_id in c.rows]
    return BadCallCase(case.example, (row_id,))


@pytest.mark.parametrize("mutant", sorted(refusal_mutants.TARGETS))
def test_p12_catches_every_refusal_mutant_on_its_row(emulated_session, mutant: str) -> None:
    """A dropped refusal (one per kind of check) fails the row's bad call; a refusal that fires on a valid call
    fails the row's neighbour.  The sweep makes every row's calls on every run, so the kill does not depend on
    the draws."""
    row = refusal_mutants.TARGETS[mutant]
    message = fails(emulated_session, P12, case_of(row), mutant)
    assert message is not None and f"refusal {row}" in message, message
    assert fails(emulated_session, P12, case_of(row), None) is None


def test_p12_catches_too_many_tokens_accepted_and_truncated(emulated_session) -> None:
    rows = ["v2_dispatch_too_many_tokens", "v2_dispatch_weights_dtype"]
    strategy = bad_call_cases(ONE_NODE, among=tuple(rows))
    case, message = assert_caught(emulated_session, P12, "too-many-tokens-truncated", strategy, shrink=False)
    assert "v2_dispatch_too_many_tokens" in case.rows and set(case.rows) <= set(rows)
    assert "returned normally" in message


def test_p12_reports_the_upstream_cached_dispatch_typeerror_as_a_known_defect(emulated_session) -> None:
    """The emulation mimics DeepEP 2.1.0's TypeError on a cached dispatch without num_experts: the known-defects
    entry matches it (known-defect, nothing raised); with the upstream fix planted the same case holds and the
    entry counts it as held (fixed); an unrelated failure of the same case (a flipped byte in the next dispatch) is
    never swallowed by the entry."""
    from conformance.harness.session import Recorder

    case = case_of("v2_dispatch_num_experts_none")
    entry_id = "v2-cached-dispatch-without-num-experts"
    emulated_session.recorder = Recorder()
    assert_holds(emulated_session, P12, [case])
    seen = emulated_session.recorder.known_defects[entry_id]
    assert seen["failed"] == 1 and seen["held"] == 0 and "unsupported operand type(s)" in seen["message"]
    verdict = emulated_session.recorder.tally.as_dict()["emulated-v2"]
    assert verdict["status"] == "known-defect" and verdict["defects"] == {entry_id: 1}
    emulated_session.recorder = Recorder()
    assert_holds(emulated_session, P12, [case], mutant="v2-cached-dispatch-fixed")
    assert emulated_session.recorder.known_defects[entry_id] == {"failed": 0, "held": 1, "example": None,
                                                                "message": None}
    assert emulated_session.recorder.tally.as_dict()["emulated-v2"]["status"] == "passed"
    emulated_session.recorder = Recorder()
    with emulated_session.planted("flip-one-byte"), pytest.raises(AssertionError, match="bytes differ"):
        emulated_session.check(P12, case)
    emulated_session.recorder = Recorder()


def test_p12_holds_on_the_emulation_including_two_nodes(emulated_session, two_node_session) -> None:
    assert_holds(emulated_session, P12, bad_call_sweep(ONE_NODE) + sample(bad_call_cases(ONE_NODE), 4))
    assert_holds(two_node_session, P12, bad_call_sweep(TWO_NODES) + sample(bad_call_cases(TWO_NODES), 3))


def test_the_sweep_covers_every_row_the_world_allows() -> None:
    for world in (ONE_NODE, TWO_NODES):
        swept = [row for case in bad_call_sweep(world) for row in case.rows]
        assert sorted(swept) == sorted(p12_rows_for(world)), world
    assert len(p12_rows_for(ONE_NODE)) == len(p12_rows())  # on one node of two ranks, every P12 row applies


def test_p12_strategy_draws_single_rows_and_several() -> None:
    assert_reaches(bad_call_cases(ONE_NODE), lambda c: len(c.rows) == 1 and c.rows[0].startswith("v1_"), 500)
    assert_reaches(bad_call_cases(ONE_NODE), lambda c: len({r.split("_")[0] for r in c.rows}) == 2, 500)
