"""Rank task of the construction preflight: build one backend's buffer, nothing else."""

from __future__ import annotations

from conformance.backends.factory import get_adapter
from conformance.backends.spec import BackendSpec
from conformance.example import Example
from conformance.mutation import activate
from conformance.tasks.settings import TaskSettings


def construct(settings: TaskSettings, example: Example) -> str:
    """Build the buffer of the (single) backend in ``settings`` for ``example``; return the backend's name."""
    (name,) = settings.backends
    spec = BackendSpec.parse(name)
    with activate(settings.mutant):
        adapter = get_adapter(spec)
        if spec.api == "v1":
            adapter.buffer  # noqa: B018 - builds the Buffer
        else:
            adapter.buffer(example)
    return name
