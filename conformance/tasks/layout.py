"""Rank tasks for the layout properties: V2 expand mode (P8) and repeated / deterministic dispatch (P13)."""

from __future__ import annotations

from dataclasses import replace

from conformance.backends.spec import BackendSpec
from conformance.backends.views import DispatchOptions, DispatchView, Unsupported
from conformance.example import Example, build_rank_inputs
from conformance.mutation import activate
from conformance.tasks.settings import TaskSettings, backend_calls
from conformance.world.rank import context

#: Suffix naming the ``deterministic=True`` runs of a V2 backend in :func:`repeated_views`.
DETERMINISTIC = " [deterministic]"


def v2_only(settings: TaskSettings) -> TaskSettings:
    """The same settings restricted to the ``ElasticBuffer`` (V2) backends."""
    return replace(settings, backends=tuple(b for b in settings.backends if BackendSpec.parse(b).api == "v2"))


def expand_views(
    settings: TaskSettings, example: Example
) -> dict[str, tuple[DispatchView, DispatchView] | Unsupported]:
    """Per V2 backend: ``(view of do_expand=True, view of do_expand=False)`` of this rank's inputs."""
    ctx = context()
    inputs = build_rank_inputs(example, ctx.rank).to(ctx.torch_device())
    expand, plain = DispatchOptions(do_expand=True), DispatchOptions()
    with activate(settings.mutant):
        calls = backend_calls(
            v2_only(settings),
            example,
            "dispatch",
            lambda adapter: (
                adapter.dispatch(inputs, example, expand, ctx.rank)[0],
                adapter.dispatch(inputs, example, plain, ctx.rank)[0],
            ),
        )
        return dict(calls)


def repeated_views(
    settings: TaskSettings, example: Example, repeats: int = 2
) -> dict[str, list[DispatchView] | Unsupported]:
    """``repeats`` identical dispatches per backend, default options; V2 backends also with
    ``deterministic=True`` (keyed ``"<backend> [deterministic]"``)."""
    ctx = context()
    inputs = build_rank_inputs(example, ctx.rank).to(ctx.torch_device())
    deterministic = DispatchOptions(deterministic=True)

    def runs(adapter, options: DispatchOptions) -> list[DispatchView]:  # noqa: ANN001 - an adapter
        return [adapter.dispatch(inputs, example, options, ctx.rank)[0] for _ in range(repeats)]

    out: dict[str, list[DispatchView] | Unsupported] = {}
    with activate(settings.mutant):
        out.update(backend_calls(settings, example, "dispatch", lambda adapter: runs(adapter, DispatchOptions())))
        det = backend_calls(v2_only(settings), example, "dispatch", lambda adapter: runs(adapter, deterministic))
        out.update((name + DETERMINISTIC, result) for name, result in det)
    return out
