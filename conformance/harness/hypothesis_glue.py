"""How the suite applies Hypothesis to its properties, through Hypothesis' public API only.

Every property test runs the same function (the driver's ``check_one``, or one state machine per stateful
property), so what Hypothesis keys its example database on (the test function's source) would be shared by every
property.  What holds here, and what ``tests/cover/test_hypothesis_glue.py`` checks on the installed Hypothesis without
a world (so that an upgrade that changes one of them fails there, not silently in a CI run):

- **One database key per property, world size and mutant**: :class:`KeyedDatabase` wraps the report directory's
  database and prefixes every key Hypothesis uses (its primary, secondary and pareto keys alike) with
  :func:`property_key`; a counterexample of P1 is never replayed into P2, nor one of a mutant into a clean run.
  (Subclassing ``hypothesis.database.ExampleDatabase`` is the public way to write a database.)
- **A seeded run still replays the stored counterexamples first**: ``@seed`` switches the database off when it is
  applied; :func:`seeded` applies the run's ``@settings`` (the keyed database among them) *outside* ``@seed``, so
  the settings decorator, applied last, sets the database again.  The seeded draws follow the replayed examples
  unchanged, so ``--conformance-seed N`` reproduces a run.
- **Rounds of new draws** (``--time-budget``): :func:`new_draws_only` is the run's settings with the explicit
  phases ``generate`` and ``shrink``: no stored example replayed again, a new failure still stored and shrunk.
- **State machines** (P30): ``@seed`` on the ``RuleBasedStateMachine`` class (documented) and
  ``run_state_machine_as_test`` with the run's settings, whose keyed database stays on (the machine's test takes its
  settings from the call, not from the seed).

This module is the one place the suite drives Hypothesis (an architecture self-test holds it so): the property
tests' draws (:mod:`conformance.harness.driver`, :mod:`conformance.harness.stateful`), the kill matrix's
(:mod:`conformance.mutation.runner`) and the meta-tests' (``tests/helpers/meta.py``) are built here: :func:`drawing`
(the settings), :func:`drawn` (a test over a strategy, its explicit cases first, seeded), :func:`sample` and
:func:`found`.

Nothing here reads or writes a Hypothesis attribute whose name starts with an underscore.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from hypothesis import HealthCheck, Phase, example, find, given, seed, settings
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

#: The phases of a ``--time-budget`` round after the first: new draws only (and the shrinking of a failure).
NEW_DRAWS = (Phase.generate, Phase.shrink)
#: The phases of the kill matrix's draws: the property's explicit cases, then new draws (no shrinking, no database).
EXPLICIT_THEN_DRAWN = (Phase.explicit, Phase.generate)
#: New draws only, nothing shrunk.
DRAWN_ONLY = (Phase.generate,)
#: The health checks a property test's draws leave off: a world's example is slow, its cases large and filtered.
SUPPRESSED = (HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much)
#: Every health check (the kill matrix's and the meta-tests' draws, which look for one case).
ALL_HEALTH_CHECKS = tuple(HealthCheck)


def drawing(max_examples: int, *, database: ExampleDatabase | None = None, phases: Sequence[Phase] | None = None,
            derandomize: bool = False, health_checks: Sequence[HealthCheck] = SUPPRESSED, **more: Any) -> settings:
    """The settings of one of the suite's draws: ``max_examples`` draws, no deadline (a world's call takes what it
    takes), ``database`` (none unless given), ``phases`` (Hypothesis' default unless given), ``health_checks`` off;
    ``more``: any other setting (``report_multiple_bugs``, ``stateful_step_count``)."""
    chosen: dict[str, Any] = dict(max_examples=max_examples, deadline=None, database=database,
                                  derandomize=derandomize, suppress_health_check=list(health_checks), **more)
    if phases is not None:
        chosen["phases"] = list(phases)
    return settings(**chosen)


def drawn(body: Callable[..., None], strategy: st.SearchStrategy[Any], run: settings, seed_value: int | None = None,
          explicit: Sequence[Any] = ()) -> Callable[[], None]:
    """``body(case=...)`` as a Hypothesis test over ``strategy``: the ``explicit`` cases first (``@example``), then
    the draws, under ``run`` seeded with ``seed_value`` (:func:`seeded`)."""
    test = given(case=strategy)(body)
    for case in reversed(explicit):
        test = example(case=case)(test)
    return seeded(test, run, seed_value)


def sample(strategy: st.SearchStrategy[Any], n: int) -> list[Any]:
    """``n`` deterministic draws from ``strategy`` (derandomized: the same on every run)."""
    out: list[Any] = []

    def collect(case: Any) -> None:
        out.append(case)

    drawn(collect, strategy, drawing(n, phases=DRAWN_ONLY, derandomize=True, health_checks=ALL_HEALTH_CHECKS))()
    return out[:n]


def found(strategy: st.SearchStrategy[Any], condition: Callable[[Any], bool], run: settings) -> Any:
    """The first draw of ``strategy`` (shrunk, where ``run`` shrinks) for which ``condition`` holds
    (``hypothesis.find``; ``NoSuchExample`` where none of ``run``'s draws does)."""
    return find(strategy, condition, settings=run)


def property_key(property_id: str, world_size: int, mutant: str | None) -> bytes:
    """The database key prefix of ``property_id`` on a world of ``world_size`` ranks with ``mutant`` planted."""
    return f"{property_id}|world={world_size}|mutant={mutant}|".encode()


class KeyedDatabase(ExampleDatabase):
    """``inner`` with every key prefixed by ``prefix``: one property's view of a shared example database.

    (Change listening is not offered: Hypothesis needs none of it to replay and store examples.)
    """

    def __init__(self, inner: ExampleDatabase, prefix: bytes) -> None:
        super().__init__()
        self.inner = inner
        self.prefix = prefix

    def __repr__(self) -> str:
        return f"KeyedDatabase({self.inner!r}, {self.prefix!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KeyedDatabase) and (self.inner, self.prefix) == (other.inner, other.prefix)

    def __hash__(self) -> int:
        return hash((KeyedDatabase, self.prefix))

    def save(self, key: bytes, value: bytes) -> None:
        self.inner.save(self.prefix + key, value)

    def fetch(self, key: bytes) -> Iterable[bytes]:
        return self.inner.fetch(self.prefix + key)

    def delete(self, key: bytes, value: bytes) -> None:
        self.inner.delete(self.prefix + key, value)

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        self.inner.move(self.prefix + src, self.prefix + dest, value)


def example_database(directory: str | None, key: bytes) -> ExampleDatabase | None:
    """The database of one property (:func:`property_key`) in ``directory`` (the report directory's
    ``hypothesis``), or ``None`` when the run keeps none."""
    return KeyedDatabase(DirectoryBasedExampleDatabase(directory), key) if directory else None


def seeded(test: Callable[..., Any], run: settings, seed_value: int | None) -> Callable[..., Any]:
    """``test`` (a ``@given`` test, its ``@example`` cases applied, no ``@settings`` yet) under ``run``, seeded with
    ``seed_value`` when it is not ``None``; ``run.database`` stays on either way (applied outside ``@seed``: the
    stored counterexamples are replayed first, then the seeded draws follow)."""
    if seed_value is not None:
        test = seed(seed_value)(test)
    return settings(run)(test)


def new_draws_only(run: settings) -> settings:
    """``run`` for a further round of draws: the generate and shrink phases only (the stored examples were replayed
    in the first round; a new failure is still stored)."""
    return settings(run, phases=NEW_DRAWS)


def machine_test(machine: type[RuleBasedStateMachine], run: settings, seed_value: int | None) -> Callable[[], None]:
    """A call that runs ``machine`` as a test under ``run`` (its database on), seeded with ``seed_value`` when it is
    not ``None``."""
    if seed_value is not None:
        machine = seed(seed_value)(machine)

    def test() -> None:
        __tracebackhide__ = True
        run_state_machine_as_test(machine, settings=run)

    return test
