"""Helpers for meta-tests: show a property fails on a planted defect and holds without it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample

from conformance.core.example import Example
from conformance.harness.config import DEFAULT_MAX_EXAMPLES
from conformance.harness.hypothesis_glue import (
    ALL_HEALTH_CHECKS,
    DRAWN_ONLY,
    NEW_DRAWS,
    drawing,
    drawn,
    found,
)
from conformance.harness.hypothesis_glue import sample as sample
from conformance.harness.session import Session


def searching(max_examples: int, phases: tuple = NEW_DRAWS) -> Any:
    """The settings of a meta-test's search for one case: ``max_examples`` derandomized draws, ``phases``."""
    return drawing(max_examples, phases=phases, derandomize=True, health_checks=ALL_HEALTH_CHECKS)


#: Generous budget for finding a killing example; mutants are planted to be findable well within it.
FIND_SETTINGS = searching(60)


def assert_reaches(strategy: st.SearchStrategy[Any], condition: Callable[[Any], bool],
                   max_examples: int = FIND_SETTINGS.max_examples) -> Any:
    """A draw of ``strategy`` that meets ``condition``, within ``max_examples`` derandomized draws, not shrunk (a
    strategy's reach needs no minimal case: shrinking cost the meta-tests most of their time); an ``AssertionError``
    naming the strategy when none of the draws does."""
    try:
        return found(strategy, condition, searching(max_examples, DRAWN_ONLY))
    except NoSuchExample:
        raise AssertionError(f"none of {max_examples} draws of {strategy!r:.300} meets the condition "
                             f"{getattr(condition, '__qualname__', condition)}") from None


def fails(session: Session, property_id: str, example: Example, mutant: str | None) -> str | None:
    """The failure message of ``property_id`` on ``example`` with ``mutant`` planted, or ``None`` if it holds."""
    with session.planted(mutant):
        try:
            session.check(property_id, example)
        except AssertionError as failure:
            return str(failure)
    return None


def assert_caught(
    session: Session, property_id: str, mutant: str, strategy: st.SearchStrategy[Example],
    max_examples: int = FIND_SETTINGS.max_examples, shrink: bool = True,
) -> tuple[Example, str]:
    """Find (and shrink) an example on which ``property_id`` fails with ``mutant`` planted (within ``max_examples``
    draws: more for a mutant only a few percent of the draws reach).  ``shrink=False``: the first one found, for a
    meta-test whose assertions hold on any failing example (each shrinking step is a call on the world).

    Also checks the property holds on that very example without the mutant, so the failure is the mutant's.
    Returns the shrunk example and the failure message.
    """
    example = found(strategy, lambda ex: fails(session, property_id, ex, mutant) is not None,
                    searching(max_examples, NEW_DRAWS if shrink else DRAWN_ONLY))
    message = fails(session, property_id, example, mutant)
    assert message is not None
    clean = fails(session, property_id, example, None)
    assert clean is None, f"{property_id} fails without the mutant on {example}: {clean}"
    return example, message


def assert_holds(session: Session, property_id: str, examples: list[Example], mutant: str | None = None) -> None:
    """``property_id`` holds on every example (optionally with a benign mutant planted)."""
    for example in examples:
        message = fails(session, property_id, example, mutant)
        assert message is None, f"{property_id} failed on {example}: {message}"


def examples_to_catch(session: Session, property_id: str, mutant: str, strategy: st.SearchStrategy[Any], seed: int,
                      budget: int = DEFAULT_MAX_EXAMPLES) -> int | None:
    """How many of ``budget`` draws from ``strategy`` (Hypothesis seeded with ``seed``, no shrinking, no database)
    it takes until ``property_id`` fails with ``mutant`` planted; ``None`` if none of them does.  The budget is a
    user's run's (``--max-examples``' default): a planted defect is caught within what a run draws."""
    state: dict[str, Any] = {"drawn": 0, "caught": None}

    def draw(case: Any) -> None:
        if state["caught"] is not None:
            return
        state["drawn"] += 1
        if fails(session, property_id, case, mutant) is not None:
            state["caught"] = state["drawn"]

    drawn(draw, strategy, drawing(budget, phases=DRAWN_ONLY, health_checks=ALL_HEALTH_CHECKS), seed)()
    return state["caught"]


@dataclass
class RecordingContext:
    """A check context for calling a property's ``check`` directly: it keeps the divergences and the values seen
    that the check records, and fails on an unsupported verdict or an artifact (none expected where it is used)."""

    shape: Any = None
    divergences: dict = field(default_factory=dict)
    seen: dict = field(default_factory=dict)

    def record_divergence(self, key: str, message: str, backends: tuple[str, ...] | None = None) -> None:
        self.divergences[key] = message

    def record_seen(self, key: str, backend: str, what: str, value: str) -> None:
        self.seen.setdefault(backend, {}).setdefault(what, []).append(value)

    def not_checked(self, item: object, case: object = None) -> None:
        raise AssertionError(f"unexpected: not checked {item}")

    def record_artifact(self, key: str, value: object) -> None:
        raise AssertionError(f"unexpected artifact {key}")

    def checking(self, backends: tuple[str, ...] | None) -> None:
        pass

    def contract(self, backend: str) -> object:
        from conformance import versions

        return versions.under_test()
