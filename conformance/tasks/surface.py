"""Rank task of P14: the API surface of every selected backend's module, with the return arity of dispatch and
combine observed on one small call of each (a changed arity breaks every caller that unpacks)."""

from __future__ import annotations

from typing import Any

from conformance.backends.factory import get_adapter, library_module
from conformance.backends.tracing import RETURN_ARITY
from conformance.core.api_surface import surface_of
from conformance.core.example import Example, build_rank_inputs
from conformance.core.views import DispatchOptions
from conformance.tasks.env import RankEnv, rank_task


def _observe_arities(env: RankEnv) -> None:
    """One small dispatch and combine per selected backend (every rank calls; a failure only leaves the arity
    unobserved: the other properties judge the calls)."""
    example = Example(tokens_per_rank=(1,) * env.world_size, hidden=256, num_topk=1, num_experts=env.world_size,
                      num_max_tokens_per_rank=16)
    inputs = build_rank_inputs(example, env.rank).to(env.device)
    for spec in env.specs(capability="api_surface"):
        if spec.name in env.settings.broken:  # its construction crashes or hangs: not called here
            continue
        try:
            adapter = get_adapter(spec)
            _, raw = adapter.dispatch(inputs, example, DispatchOptions(), env.rank)
            adapter.combine(raw, raw.recv_x, topk_weights=raw.recv_topk_weights)
        except Exception:  # noqa: BLE001 - judged by the other properties
            continue


@rank_task
def surfaces(env: RankEnv) -> dict[str, dict[str, Any]]:
    """``{module: surface}`` for the modules behind the selected backends (under the active mutant)."""
    _observe_arities(env)
    out: dict[str, dict[str, Any]] = {}
    for spec in env.specs(capability="api_surface"):
        module = library_module(spec)
        if module is None or module in out:
            continue
        surface = surface_of(module)
        surface["returns"] = {method: n for (owner, method), n in sorted(RETURN_ARITY.items())
                              if owner == spec.impl and method.rpartition(".")[2] in ("dispatch", "combine")}
        out[module] = surface
    return dict(sorted(out.items()))
