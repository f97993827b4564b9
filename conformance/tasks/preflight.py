"""Rank task of the construction preflight: build one backend's buffer (a plug-in: the backend), nothing else."""

from __future__ import annotations

from typing import Any

from conformance.backends.factory import seen_deep_ep
from conformance.tasks.env import RankEnv, rank_task


@rank_task
def construct(env: RankEnv) -> dict[str, Any]:
    """Build the buffer of the (single) selected backend for the case's example (a plug-in: call its factory);
    return the backend's name and which deep_ep it drives here (``kind``, ``version``, ``file``)."""
    ((name, adapter),) = env.adapters()
    (spec,) = env.specs()
    if not spec.plugin:
        if adapter.api == "v1":
            adapter.buffer  # noqa: B018 - builds the Buffer
        else:
            adapter.buffer(env.example)
    return {"name": name, "deep_ep": seen_deep_ep(spec)}
