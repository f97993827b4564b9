"""Rank task of P12 (bad calls): for each drawn row of the refusal table, make its bad call and its valid
neighbour with every selected backend of the row's API, then the next valid dispatch on the suite's own buffer.
What each call raised comes back as :class:`~conformance.core.views.Raised` per rank (an
:class:`~conformance.core.outcomes.NotChecked` where a set-up limit kept the call from being made); letting an exception
escape would retire the world."""

from __future__ import annotations

from typing import Any

from conformance.backends.factory import get_adapter
from conformance.core.cases import BadCallCase, row_api
from conformance.core.outcomes import NotChecked, Why
from conformance.core.spec import BackendSpec
from conformance.core.views import DispatchOptions, Raised
from conformance.tasks import refusals
from conformance.tasks.env import RankEnv, rank_task
from conformance.tasks.setup import SetupLimited
from conformance.world.rank import backend_context


def _raised(name: str, spec: BackendSpec, env: RankEnv, shared: refusals.SharedBuffers) -> Raised | NotChecked:
    """What recipe (or neighbour) ``name`` raised with ``spec``'s module; :class:`NotChecked` (with the limit's
    reason) where a set-up limit kept its call from being made (``core/setup_limits.py``)."""
    module = get_adapter(spec).module
    try:
        kind, message, side_effect = refusals.run(name, refusals.make_env(module, env.example, shared, spec.real))
    except SetupLimited as limited:
        return NotChecked.example(spec.name, Why.SETUP, f"refusal row {name}", str(limited), limited.condition)
    return Raised(kind, message, side_effect)


@rank_task
def bad_call_results(env: RankEnv) -> dict[str, Any]:
    """``{"rows": {row: {backend: {"raised", "neighbour"}}}, "after": {backend: view of the next dispatch}}``.

    A row of the ``utils`` API (``EventOverlap``) is made once per implementation, with its first V2 backend (the
    recipes get their events from ``ElasticBuffer`` dispatches).  The recipes share their low-latency buffers (one
    per backend and shape, destroyed before the next valid dispatch)."""
    with refusals.SharedBuffers() as shared:
        rows, used = _bad_calls(env, env.case, shared)
    after = {name: env.call(spec, "dispatch", lambda adapter: adapter.dispatch(
        env.inputs, env.example, DispatchOptions(), env.rank)[0]) for name, spec in used.items()}
    return {"rows": rows, "after": after}


def _bad_calls(env: RankEnv, case: BadCallCase, shared: refusals.SharedBuffers) -> tuple[dict, dict]:
    """Each row's bad call and neighbour with every selected backend of its API: ``(rows, the backends used by
    name)``."""
    rows: dict[str, dict[str, Any]] = {}
    used: dict[str, Any] = {}  # backend name -> its spec
    for row_id in case.rows:
        api = row_api(refusals.rows()[row_id])
        done_impls: set[str] = set()
        per_backend = rows.setdefault(row_id, {})
        for spec in env.specs(capability="bad_input"):
            if api == "utils":
                if spec.api != "v2" or spec.impl in done_impls:
                    continue
                done_impls.add(spec.impl)
            elif spec.api != api:
                continue
            used[spec.name] = spec
            # the backend's calls: a crash or hang in them is charged to it (its cell), naming the row
            with backend_context(spec.name, f"refusal row {row_id}"):
                per_backend[spec.name] = {"raised": _raised(row_id, spec, env, shared),
                                          "neighbour": _raised(f"{row_id}.ok", spec, env, shared)}
    return rows, used
