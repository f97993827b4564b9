"""Tasks that run inside the rank processes; the controller calls them through :meth:`World.run`.

Every task takes :class:`TaskSettings` (backends, active mutant) and a plain :class:`Example`, builds this
rank's inputs from the example, drives the backends, and returns canonical views.
"""

from __future__ import annotations

from dataclasses import dataclass

from conformance.backends.factory import get_adapter
from conformance.backends.limits import known_limit
from conformance.backends.spec import BackendSpec
from conformance.backends.views import DispatchOptions, DispatchView, Unsupported
from conformance.example import Example, build_rank_inputs
from conformance.mutation import activate
from conformance.world.rank import context


@dataclass(frozen=True)
class TaskSettings:
    """What every task needs besides the example."""

    backends: tuple[str, ...]
    mutant: str | None = None


def dispatch_views(
    settings: TaskSettings, example: Example, options: DispatchOptions = DispatchOptions()
) -> dict[str, DispatchView | Unsupported]:
    """Dispatch this rank's inputs through every backend; one canonical view per backend."""
    ctx = context()
    inputs = build_rank_inputs(example, ctx.rank).to(ctx.torch_device())
    views: dict[str, DispatchView | Unsupported] = {}
    with activate(settings.mutant):
        for name in settings.backends:
            spec = BackendSpec.parse(name)
            adapter = get_adapter(spec)
            try:
                views[name] = adapter.dispatch(inputs, example, options, ctx.rank)[0]
            except Exception as exc:
                limit = known_limit(spec.api, "dispatch", example)
                if limit is None:
                    raise
                views[name] = Unsupported(name, f"{spec.class_name}.dispatch", f"{type(exc).__name__}: {exc}")
    return views
