"""The recipe registry: the refusal table's recipe columns, the recipes written as code, and which examples and
worlds each recipe applies to.

Every live row of the refusal table (``status`` emulated or emulated-differently) has one recipe, named by the
row id, and its neighbour, ``<row id>.ok``: from the row's ``edit`` columns (:mod:`conformance.tasks.refusals.edits`)
or, for a stateful recipe, a function registered with :func:`recipe`.  Where a recipe applies is data of its row:

  topology        the worlds it applies to (:data:`TOPOLOGIES`; absent: ``any``)
  requires        a name of :data:`REQUIRES`, what every example it is made with must have (absent: any example)

The tables are read through :mod:`conformance.versions` (every version's: a row id names one refusal and one recipe
in each version that has it), never through ``conformance.emulation``: the recipes never import the emulation (they
are made against the real library as well).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from conformance import versions
from conformance.core.cases import LIVE_STATUSES
from conformance.core.example import Example, build_all_inputs

if TYPE_CHECKING:
    from conformance.tasks.refusals.env import BadCallEnv

#: The recipe columns of a row: a row id that more than one version's table has carries the same ones in each.
RECIPE_COLUMNS = ("topology", "requires", "self_test_only", "valid_call", "given", "edit")

#: Worlds a recipe applies to: ``any``; ``v1-intranode`` (one node of 2, 4 or 8 ranks: the legacy intranode
#: kernels); ``v1-internode`` (several nodes: the legacy internode path); ``single`` (one node);
#: ``hybrid`` (several nodes: V2 hybrid mode); ``one-rank`` (a 1-rank world).
TOPOLOGIES = ("any", "v1-intranode", "v1-internode", "single", "hybrid", "one-rank")


def _every_rank_receives(example: Example) -> bool:
    """Every rank receives at least one token (some token selects one of its experts)."""
    per_rank = example.experts_per_rank
    if per_rank == 0:
        return False
    owners: set[int] = set()
    for inputs in build_all_inputs(example):
        ids = inputs.topk_idx[inputs.topk_idx >= 0]
        owners.update(int(r) for r in torch.unique(ids // per_rank))
    return owners >= set(range(example.world_size))


#: What a row's ``requires`` may name: a predicate every example its recipe is made with must satisfy.
REQUIRES: dict[str, Callable[[Example], bool]] = {
    "every_rank_sends_1": lambda ex: min(ex.tokens_per_rank) >= 1,
    "every_rank_sends_2": lambda ex: min(ex.tokens_per_rank) >= 2,  # a strided [tokens, k] view needs 2 rows
    "every_rank_receives": _every_rank_receives,
    "several_ranks": lambda ex: ex.world_size > 1,
    "ranks_not_multiple_of_4": lambda ex: ex.world_size % 4 != 0,
    "two_local_experts": lambda ex: ex.num_experts // ex.world_size >= 2,
    "at_most_7_ranks": lambda ex: ex.world_size <= 7,
    "at_most_3_ranks": lambda ex: ex.world_size <= 3,  # 513 experts per rank within 2048 (DeepEP 2.5.0's limits)
}

#: name -> callable (offending calls under the row id, neighbours under ``<row id>.ok``).
RECIPES: dict[str, Callable[[BadCallEnv], Any]] = {}


@functools.cache
def rows() -> dict[str, dict[str, Any]]:
    """The live rows of every version's refusal table, by id (the oldest version's row where several have it:
    their recipe columns are the same, ``tests/nocover/test_refusals.py`` checks it)."""
    out: dict[str, dict[str, Any]] = {}
    for version in versions.known_versions():
        for row_id, row in versions.contract(version).refusals.rows.items():
            if row["status"] in LIVE_STATUSES:
                out.setdefault(row_id, dict(row))
    return out


def recipe(row_id: str) -> Callable:
    """Register ``fn(env, bad)`` as the recipe of row ``row_id`` (``bad=True``: the offending call) and its neighbour
    ``row_id.ok`` (``bad=False``): a stateful recipe, written as code."""

    def decorate(fn: Callable[[BadCallEnv, bool], Any]) -> Callable:
        add(row_id, functools.partial(fn, bad=True), functools.partial(fn, bad=False))
        return fn

    return decorate


def add(row_id: str, offending: Callable[[BadCallEnv], Any], neighbour: Callable[[BadCallEnv], Any]) -> None:
    """Register the two calls of row ``row_id``; a row has one recipe."""
    if row_id in RECIPES:
        raise ValueError(f"recipe {row_id!r} registered twice")
    RECIPES[row_id], RECIPES[f"{row_id}.ok"] = offending, neighbour


def applies(name: str, example: Example, num_nodes: int) -> bool:
    """Whether recipe (or neighbour) ``name`` applies to ``example`` on a world of ``num_nodes`` nodes: its row's
    ``topology`` admits the world and the example has what its ``requires`` names."""
    if name not in RECIPES:
        raise KeyError(f"no recipe {name!r}")
    row = rows()[name.removesuffix(".ok")]
    size = example.world_size
    world_ok = {
        "any": True,
        "v1-intranode": num_nodes == 1 and size in (2, 4, 8),
        "v1-internode": num_nodes > 1,
        "single": num_nodes == 1,
        "hybrid": num_nodes > 1,
        "one-rank": size == 1,
    }[row.get("topology", "any")]
    return world_ok and ("requires" not in row or REQUIRES[row["requires"]](example))


def run(name: str, env: BadCallEnv) -> tuple[str | None, str | None, str | None]:
    """Run recipe ``name``; return ``(exception type name, message, side effect)``, ``(None, None, ...)`` when
    nothing was raised.  The side effect is ``None`` unless the call left the thread's current CUDA stream switched
    (then it names the streams, and the caller's stream is current again, so later calls are not poisoned).  A call
    a set-up limit names is not made: its ``SetupLimited`` propagates (``tasks.setup``).

    The buffers it built are destroyed afterwards, whatever happened (the shared ones stay for the next recipe).
    """
    from conformance.tasks.setup import SetupLimited
    from conformance.world.rank import call_context, current_cuda_stream, restore_cuda_stream

    before = current_cuda_stream()
    kind = message = None
    try:
        with call_context(f"refusal row {name}"):
            RECIPES[name](env)
    except SetupLimited:  # a call this set-up cannot make was not made: the caller reports it, no refusal
        raise
    except Exception as exc:  # the refusal under test
        kind, message = type(exc).__name__, str(exc)
    finally:
        left = restore_cuda_stream(before)
        env.release()
    side_effect = None if left is None else (
        f"left the caller's current CUDA stream switched (stream {left.stream_id} instead of {before.stream_id}); "
        f"every later call of the thread runs on that stream, and a buffer whose communication stream it is then "
        f"refuses every call (s_0.id() != s_1.id())")
    return kind, message, side_effect


def all_names() -> list[str]:
    """Every registered recipe and neighbour name."""
    return sorted(RECIPES)
