"""What the driver needs of Hypothesis, checked on the installed version without a world
(``conformance/harness/hypothesis_glue.py``: the public API only).  A Hypothesis upgrade that changes one of these
fails here, before a CI run silently loses its stored counterexamples or its reproducibility:

- a stored counterexample comes back first on a seeded run, under its own key only (one key per property, world
  size and mutant: another key replays nothing of it);
- the same seed draws the same cases, with the database on or off;
- a ``--time-budget`` round draws anew (no stored example replayed) and still stores a new failure;
- a state machine run the same way: seeded, keyed, its stored failing sequence replayed first.
"""

from __future__ import annotations

from typing import Any
from unittest import SkipTest

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase, InMemoryExampleDatabase
from hypothesis.stateful import RuleBasedStateMachine, rule

from conformance.harness.hypothesis_glue import (
    KeyedDatabase,
    example_database,
    machine_test,
    new_draws_only,
    property_key,
    seeded,
)

#: A drawn value at or above this fails (shrinks to exactly this).
LIMIT = 1000


def _test(calls: list[int]) -> Any:
    """The same ``@given`` test function (the same source, so the same Hypothesis key) each time, as the driver's
    ``check_one`` for every property."""

    def check_one(n: int) -> None:
        calls.append(n)
        assert n < LIMIT

    return given(n=st.integers(0, 10**6))(check_one)


def _run(database: Any, seed_value: int | None, phases: Any = tuple(Phase)) -> list[int]:
    """The values the test saw on one run (seeded, with ``database``), and whether it failed."""
    calls: list[int] = []
    run = settings(max_examples=30, deadline=None, database=database, phases=phases,
                   suppress_health_check=list(HealthCheck))
    try:
        seeded(_test(calls), run, seed_value)()
    except AssertionError:
        calls.append(-1)  # marks a failure
    except SkipTest:  # Hypothesis had nothing to run (the reuse phase alone, nothing stored under the key)
        assert phases == (Phase.reuse,)
    return calls


def test_a_stored_counterexample_comes_back_first_under_its_own_key_only(tmp_path) -> None:
    shared = DirectoryBasedExampleDatabase(str(tmp_path / "hypothesis"))
    p1 = KeyedDatabase(shared, property_key("P1-x", 2, None))
    first = _run(p1, seed_value=1)
    assert first[-1] == -1 and first[-2] == LIMIT, first[-5:]  # failed, shrunk to LIMIT, stored
    again = _run(example_database(str(tmp_path / "hypothesis"), property_key("P1-x", 2, None)), seed_value=2)
    assert again[0] == LIMIT and again[-1] == -1, again[:5]  # replayed first (seeded: the database stays on)
    for other in (property_key("P2-y", 2, None), property_key("P1-x", 4, None), property_key("P1-x", 2, "m")):
        assert _run(KeyedDatabase(shared, other), seed_value=2, phases=(Phase.reuse,)) == [], other
    replayed = _run(p1, seed_value=2, phases=(Phase.reuse,))  # (the same run does replay it; and reports it again)
    assert set(replayed[:-1]) == {LIMIT} and replayed[-1] == -1, replayed


def test_the_same_seed_draws_the_same_cases_with_or_without_the_database(tmp_path) -> None:
    database = KeyedDatabase(InMemoryExampleDatabase(), property_key("P1-x", 2, None))
    with_database = _run(database, seed_value=7)
    assert -1 in with_database  # (the draws reach the failure: a stored example for the next run)
    fresh = KeyedDatabase(InMemoryExampleDatabase(), property_key("P1-x", 2, None))
    assert _run(fresh, seed_value=7) == with_database
    assert _run(None, seed_value=7) == with_database
    assert _run(None, seed_value=8) != with_database


def test_a_round_of_new_draws_replays_nothing_and_still_stores_a_failure() -> None:
    inner = InMemoryExampleDatabase()
    database = KeyedDatabase(inner, property_key("P1-x", 2, None))
    assert _run(database, seed_value=1)[-1] == -1
    stored = {k: set(v) for k, v in inner.data.items()}
    calls: list[int] = []
    run = settings(max_examples=30, deadline=None, database=database, suppress_health_check=list(HealthCheck))
    with pytest.raises(AssertionError):
        seeded(_test(calls), new_draws_only(run), 5)()
    assert calls[0] != LIMIT and calls[-1] == LIMIT  # drawn anew, shrunk again
    assert Phase.reuse not in new_draws_only(run).phases and new_draws_only(run).database == database
    assert all(k.startswith(property_key("P1-x", 2, None)) for k in inner.data) and stored


class _Machine(RuleBasedStateMachine):
    """Fails once a drawn value reaches LIMIT (a sequence shrinks to one step drawing exactly LIMIT)."""

    seen: list[list[int]] = []

    def __init__(self) -> None:
        super().__init__()
        self.seen.append([])

    @rule(n=st.integers(0, 10**6))
    def step(self, n: int) -> None:
        self.seen[-1].append(n)
        assert n < LIMIT


def _machine_run(database: Any, seed_value: int | None, phases: Any = tuple(Phase)) -> list[list[int]]:
    machine = type("Machine", (_Machine,), {"seen": []})
    run = settings(max_examples=20, stateful_step_count=5, deadline=None, database=database, phases=phases,
                   suppress_health_check=list(HealthCheck))
    try:
        machine_test(machine, run, seed_value)()
    except AssertionError:
        machine.seen.append([-1])
    except SkipTest:  # nothing to run (the reuse phase alone, nothing stored under the key)
        assert phases == (Phase.reuse,)
    return machine.seen


def test_a_state_machine_is_seeded_and_keyed_and_replays_its_failure_first() -> None:
    inner = InMemoryExampleDatabase()
    p30 = KeyedDatabase(inner, property_key("P30-s", 2, None))
    first = _machine_run(p30, seed_value=1)
    assert first[-1] == [-1] and first[-2] == [LIMIT], first[-3:]
    assert _machine_run(None, seed_value=1) == first  # the seed alone decides the sequences
    again = _machine_run(p30, seed_value=2)
    assert again[0] == [LIMIT] and again[-1] == [-1], again[:3]
    other = KeyedDatabase(inner, property_key("P30-s", 4, None))
    assert _machine_run(other, seed_value=2, phases=(Phase.reuse,)) == [], "another key replayed P30's sequence"
    assert _machine_run(p30, seed_value=2, phases=(Phase.reuse,))[0] == [LIMIT]  # (the same run does replay it)
