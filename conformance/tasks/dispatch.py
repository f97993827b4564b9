"""Rank tasks around dispatch: the canonical views of a plain dispatch, of V2's expand mode, of repeated and
deterministic dispatches."""

from __future__ import annotations

from typing import Any

from conformance.core.views import DispatchOptions, DispatchView, Unsupported
from conformance.tasks.env import RankEnv, rank_task

#: Suffix naming the ``deterministic=True`` runs of a V2 backend in :func:`repeated_views`.
DETERMINISTIC = " [deterministic]"


def dispatch_view(env: RankEnv, adapter: Any, options: DispatchOptions = DispatchOptions()) -> DispatchView:
    """This rank's inputs dispatched through ``adapter`` with ``options``: the canonical view."""
    assert env.example is not None
    return adapter.dispatch(env.inputs, env.example, options, env.rank)[0]


@rank_task
def dispatch_views(env: RankEnv) -> dict[str, DispatchView | Unsupported]:
    """One canonical view per backend of dispatching this rank's inputs."""
    return env.each_backend("dispatch", lambda adapter: dispatch_view(env, adapter))


@rank_task
def expand_views(env: RankEnv) -> dict[str, tuple[DispatchView, DispatchView] | Unsupported]:
    """Per V2 backend with expand mode: ``(view of do_expand=True, view of do_expand=False)`` of this rank's
    inputs."""
    expand = DispatchOptions(do_expand=True)
    return env.each_backend("dispatch", lambda adapter: (dispatch_view(env, adapter, expand),
                                                         dispatch_view(env, adapter)), api="v2",
                            capability="expand")


@rank_task
def repeated_views(env: RankEnv, repeats: int = 2) -> dict[str, list[DispatchView] | Unsupported]:
    """``repeats`` identical dispatches per backend, default options; V2 backends also with
    ``deterministic=True`` where they declare it (keyed ``"<backend> [deterministic]"``)."""

    def runs(options: DispatchOptions) -> Any:
        return lambda adapter: [dispatch_view(env, adapter, options) for _ in range(repeats)]

    out = env.each_backend("dispatch", runs(DispatchOptions()))
    deterministic = env.each_backend("dispatch", runs(DispatchOptions(deterministic=True)), api="v2",
                                     capability="deterministic")
    out.update((name + DETERMINISTIC, result) for name, result in deterministic.items())
    return out
