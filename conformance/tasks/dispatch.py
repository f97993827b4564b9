"""Rank tasks around dispatch."""

from __future__ import annotations

from conformance.backends.views import DispatchOptions, DispatchView, Unsupported
from conformance.example import Example, build_rank_inputs
from conformance.mutation import activate
from conformance.tasks.settings import TaskSettings, backend_calls
from conformance.world.rank import context


def dispatch_views(
    settings: TaskSettings, example: Example, options: DispatchOptions = DispatchOptions()
) -> dict[str, DispatchView | Unsupported]:
    """Dispatch this rank's inputs through every backend; one canonical view per backend."""
    ctx = context()
    inputs = build_rank_inputs(example, ctx.rank).to(ctx.torch_device())
    with activate(settings.mutant):
        calls = backend_calls(
            settings, example, "dispatch", lambda adapter: adapter.dispatch(inputs, example, options, ctx.rank)[0]
        )
        return dict(calls)
