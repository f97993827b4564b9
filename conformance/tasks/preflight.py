"""Rank task of the construction preflight: build one backend's buffer, nothing else."""

from __future__ import annotations

from conformance.tasks.env import RankEnv, rank_task


@rank_task
def construct(env: RankEnv) -> str:
    """Build the buffer of the (single) selected backend for the case's example; return the backend's name."""
    ((name, adapter),) = env.adapters()
    if adapter.api == "v1":
        adapter.buffer  # noqa: B018 - builds the Buffer
    else:
        adapter.buffer(env.example)
    return name
