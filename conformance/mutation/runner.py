"""The mutation engine: plant each mutant in the emulated backends and run the property catalog on it.

For every (mutant, property) pair, Hypothesis draws up to ``max_examples`` cases from the very strategy
the property test uses, after the property's explicit cases (no shrinking, seeded, no database) and the property's
registered check runs on each until one fails.  A failure is an ``AssertionError`` from the check or a
rank failure (a rank raised, hung past the example timeout, or died).  Each failure is replayed once
without the mutant: only if the property then holds is the failure the mutant's (a kill).
"""

from __future__ import annotations

import importlib
import pkgutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from conformance.harness.hypothesis_glue import ALL_HEALTH_CHECKS, EXPLICIT_THEN_DRAWN, drawing, drawn
from conformance.harness.session import Session
from conformance.mutants import Mutant
from conformance.mutation.killmatrix import mutant_entry, property_outcome
from conformance.properties import Property
from conformance.world.errors import RankFailure, RankTimeout

#: What counts as a property failing on an example.
FAILURES = (AssertionError, RankFailure)
_MESSAGE_CHARS = 600


@dataclass(frozen=True)
class Budget:
    """How hard each property tries: examples per property and the seed of every draw."""

    max_examples: int
    seed: int


def load_catalog() -> tuple[dict[str, Property], dict[str, str]]:
    """Like ``conformance.properties.catalog`` but a property module that fails to import does not stop the
    others: returns (property id -> property, module -> import error)."""
    import conformance.properties as package

    broken = {}
    for module in pkgutil.iter_modules(package.__path__):
        if module.name.startswith("test_p"):
            name = f"{package.__name__}.{module.name}"
            try:
                importlib.import_module(name)
            except Exception as exc:  # reported; the rest of the catalog still runs
                broken[name] = f"{type(exc).__name__}: {exc}"
    return package.catalog(), broken


def first_failure(session: Session, prop: Property, budget: Budget) -> tuple[int, Any, Exception | None]:
    """Run ``property_id`` on up to ``budget.max_examples`` draws; stop at the first failing one.

    Returns ``(examples run, failing case or None, exception or None)``.  Any exception stops the draws
    (the caller tells failures from check crashes).
    """
    state: dict[str, Any] = {"examples": 0, "case": None, "error": None}

    def draw(case: Any) -> None:
        if state["error"] is not None:
            return  # already failed: let Hypothesis run out its remaining (cheap) draws
        state["examples"] += 1
        try:
            session.check(prop.id, case)
        except Exception as exc:  # classified by the caller
            state.update(case=case, error=exc)

    shape = session.config.shape  # the property's explicit cases come first, as in the pytest run
    drawn(draw, prop.strategy(shape), drawing(budget.max_examples, phases=EXPLICIT_THEN_DRAWN,
                                              health_checks=ALL_HEALTH_CHECKS), budget.seed,
          prop.explicit(shape) if prop.explicit else ())()
    return state["examples"], state["case"], state["error"]


def short_message(exc: BaseException) -> str:
    """A one-paragraph failure message (rank failures: headline plus each culprit's last line)."""
    if isinstance(exc, RankFailure):
        lines = [str(exc).splitlines()[0]]
        for rank in exc.culprits:
            text = [line.strip() for line in exc.per_rank.get(rank, "").splitlines() if line.strip()]
            if isinstance(exc, RankTimeout):  # faulthandler stacks, innermost frame first; the task's thread
                current = next((i for i, line in enumerate(text) if line.startswith("Current thread")), 0)
                frames = [line for line in text[current:] if line.startswith("File ")]
                lines.append(f"rank {rank} hung at {frames[0] if frames else '?'}")
            else:  # a traceback or a log tail: the last line says what happened
                lines.append(f"rank {rank}: {text[-1] if text else '?'}")
        text = f"{type(exc).__name__}: " + "; ".join(lines)
    else:
        text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= _MESSAGE_CHARS else text[: _MESSAGE_CHARS - 3] + "..."


def run_property(session: Session, prop: Property, budget: Budget) -> dict:
    """One cell of the kill matrix for the mutant planted in ``session`` (see ``killmatrix.OUTCOMES``)."""
    started = time.monotonic()
    examples, case, error = first_failure(session, prop, budget)
    if error is None:
        return property_outcome("held", examples, wall_s=time.monotonic() - started)
    case_json = case.to_json() if hasattr(case, "to_json") else repr(case)
    outcome, message = "killed", short_message(error)
    if not isinstance(error, FAILURES):
        outcome = "error"
    else:
        with session.planted(None):
            try:
                session.check(prop.id, case)
            except Exception as clean:  # any failure without the mutant means "not the mutant's"
                outcome, message = "unattributed", f"{message} [without the mutant: {short_message(clean)}]"
    return property_outcome(outcome, examples, message, case_json, wall_s=time.monotonic() - started)


def run_mutant(
    session: Session, mutant: Mutant, catalog: dict[str, Property], budget: Budget, first_kill: bool = False,
    order: list[str] | None = None,
) -> dict:
    """Plant ``mutant`` and run the properties of ``catalog`` on it; one kill-matrix entry.

    ``first_kill``: a harmful mutant stops at its first killed cell (the others are not run; a benign mutant always
    runs every property, it must be spared by all).  ``order``: these properties first (e.g. the mutant's killers in
    an earlier matrix), then the rest in catalog order."""
    started = time.monotonic()
    nodes = session.config.shape.nodes
    if nodes < mutant.min_nodes:
        return mutant_entry(mutant.name, mutant.kind, mutant.description, {}, 0.0,
                            not_applicable=f"the code it breaks runs only with --nodes >= {mutant.min_nodes} "
                                           f"(this matrix: --nodes {nodes})")
    ids = list(dict.fromkeys([pid for pid in (order or []) if pid in catalog] + list(catalog)))
    cells: dict[str, dict] = {}
    with session.planted(mutant.name):
        for pid in ids:
            cells[pid] = run_property(session, catalog[pid], budget)
            if first_kill and mutant.kind == "harmful" and cells[pid]["outcome"] == "killed":
                break
    return mutant_entry(mutant.name, mutant.kind, mutant.description, cells, time.monotonic() - started)


def run_mutants(
    session: Session,
    mutants: list[Mutant],
    catalog: dict[str, Property],
    budget: Budget,
    on_entry: Callable[[dict], None] = lambda entry: None,
    first_kill: bool = False,
    orders: dict[str, list[str]] | None = None,
) -> list[dict]:
    """Run every mutant in turn on one session (the world is reused); ``on_entry`` sees each row.

    With ``first_kill``, each harmful mutant tries the properties in order of their kills per second so far in this
    run (after its ``orders`` entry, if any): the properties that catch most, fastest, go first."""
    entries = []
    kills: dict[str, int] = dict.fromkeys(catalog, 0)
    spent: dict[str, float] = dict.fromkeys(catalog, 0.0)
    for mutant in mutants:
        order = list((orders or {}).get(mutant.name, []))
        if first_kill:
            order += sorted(catalog, key=lambda pid: -kills[pid] / (spent[pid] + 1.0))
        entries.append(run_mutant(session, mutant, catalog, budget, first_kill, order))
        for pid, cell in entries[-1]["properties"].items():
            kills[pid] += cell["outcome"] == "killed"
            spent[pid] += cell.get("wall_s") or 0.0
        on_entry(entries[-1])
    return entries
