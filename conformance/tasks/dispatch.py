"""Rank tasks around dispatch: the canonical views of a plain dispatch, of V2's expand mode, of repeated and
deterministic dispatches."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from conformance.core.outcomes import NotChecked
from conformance.core.views import DispatchOptions, DispatchView
from conformance.tasks.env import RankEnv, rank_task


@dataclass
class RepeatedRuns:
    """One backend's repeated identical dispatches: with the default options, and (V2 backends that declare
    ``deterministic``) on a ``deterministic=True`` buffer, or the :class:`NotChecked` that refused it."""

    default: list[DispatchView]
    deterministic: list[DispatchView] | NotChecked | None = None


def dispatch_view(env: RankEnv, adapter: Any, options: DispatchOptions = DispatchOptions()) -> DispatchView:
    """This rank's inputs dispatched through ``adapter`` with ``options``: the canonical view."""
    assert env.example is not None
    return adapter.dispatch(env.inputs, env.example, options, env.rank)[0]


@rank_task
def dispatch_views(env: RankEnv) -> dict[str, DispatchView | NotChecked]:
    """One canonical view per backend of dispatching this rank's inputs."""
    return env.each_backend("dispatch", lambda adapter: dispatch_view(env, adapter))


@rank_task
def expand_views(env: RankEnv) -> dict[str, tuple[DispatchView, DispatchView] | NotChecked]:
    """Per V2 backend with expand mode: ``(view of do_expand=True, view of do_expand=False)`` of this rank's
    inputs."""
    expand = DispatchOptions(do_expand=True)
    return env.each_backend("dispatch", lambda adapter: (dispatch_view(env, adapter, expand),
                                                         dispatch_view(env, adapter)), api="v2",
                            capability="expand")


@rank_task
def repeated_views(env: RankEnv, repeats: int = 2) -> dict[str, RepeatedRuns | NotChecked]:
    """Per backend, ``repeats`` identical dispatches with the default options; V2 backends also with
    ``deterministic=True`` where they declare it (:class:`RepeatedRuns`)."""

    def runs(options: DispatchOptions) -> Any:
        return lambda adapter: [dispatch_view(env, adapter, options) for _ in range(repeats)]

    out: dict[str, RepeatedRuns | NotChecked] = {}
    for name, result in env.each_backend("dispatch", runs(DispatchOptions())).items():
        out[name] = result if isinstance(result, NotChecked) else RepeatedRuns(result)
    deterministic = env.each_backend("dispatch", runs(DispatchOptions(deterministic=True)), api="v2",
                                     capability="deterministic")
    for name, result in deterministic.items():
        if isinstance(out[name], RepeatedRuns):
            out[name].deterministic = result
    return out
