"""Rank task of P27 (buffers on fresh process groups): per built-in backend and per way of making a group the way
integrators do, a group made just before the buffer, no collective run on it (``dist.new_group``; on a GPU also a
lazily initialised NCCL group and a gloo group), a buffer of that backend built on it, one dispatch, then the buffer
destroyed and the group destroyed.  What the dispatch returned, or what it raised, comes back per way (a refusal
counts only when the same dispatch on the world's own group works, and only what the backend raised is a
refusal)."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from conformance.core.views import DispatchOptions, Raised
from conformance.tasks.env import RankEnv, rank_task
from conformance.world.rank import call_context, control_group

#: The ways of making a fresh group, by name: ``dist.new_group`` keyword arguments, and the devices they apply to.
WAYS: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "new_group": ({}, ("cpu", "cuda")),  # the default backend of the world (gloo on CPU and with ranks sharing a GPU)
    "new_group_nccl": ({"backend": "nccl"}, ("cuda",)),  # NCCL initialises lazily: nothing ran on it yet
    "new_group_gloo": ({"backend": "gloo"}, ("cuda",)),  # a CPU group handed to a GPU library by mistake
}


def ways(device_type: str) -> list[str]:
    """The ways that apply on ``device_type``."""
    return [name for name, (_, devices) in WAYS.items() if device_type in devices]


def on_fresh_group(env: RankEnv, adapter: Any, way: str) -> Any:
    """A buffer of ``adapter``'s backend on a group made the ``way`` way: the dispatch's view, or what it raised."""
    with call_context(f"fresh group {way}"):  # a crash in the library names the way
        group = dist.new_group(list(range(env.ctx.world_size)), **WAYS[way][0])
        # every rank has its end of the group before any can close it: a gloo group connects its ranks while it is
        # made, and a rank whose backend refuses at once would destroy its end while a slower peer still connects
        # ("Connection closed by peer" there, not the backend's outcome).  On the suite's own group: nothing runs on
        # the fresh one before the buffer.
        dist.barrier(group=control_group())
        fresh = type(adapter)(adapter.spec, adapter.module, group, adapter.num_nodes)
        try:
            return fresh.dispatch(env.inputs, env.example, DispatchOptions(), env.rank)[0]
        except Exception as exc:  # the backend's refusal is an outcome here (the check wants it on every rank, with a
            return Raised.of(exc)  # message); NotSupported or the suite's own error is raised again (Raised.of)
        finally:
            fresh.destroy()
            dist.destroy_process_group(group)


@rank_task
def fresh_group_views(env: RankEnv) -> dict[str, Any]:
    """``{backend: {way: DispatchView or Raised}}`` for every backend declaring ``fresh_groups``.

    The same dispatch is made first on the backend's buffer of the world's own group: a refusal on a fresh group
    counts only where that one works (a backend whose every dispatch raises fails here, with what it raised, instead
    of passing as "refused on every rank")."""

    def run(adapter: Any) -> dict[str, Any]:
        adapter.dispatch(env.inputs, env.example, DispatchOptions(), env.rank)
        return {way: on_fresh_group(env, adapter, way) for way in ways(env.device.type)}

    return env.each_backend("dispatch", run, capability="fresh_groups")
