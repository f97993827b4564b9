"""Rank task of P27 (buffers on fresh process groups): per built-in backend and per way of making a group the way
integrators do, a group made just before the buffer, no collective run on it (``dist.new_group``; on a GPU also a
lazily initialised NCCL group and a gloo group), a buffer of that backend built on it, one dispatch, then the buffer
destroyed and the group destroyed.  What the dispatch returned, or what it raised, comes back per way."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from conformance.core.views import DispatchOptions, Raised
from conformance.tasks.env import RankEnv, rank_task
from conformance.world.rank import call_context

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
        fresh = type(adapter)(adapter.spec, adapter.module, group, adapter.num_nodes)
        try:
            return fresh.dispatch(env.inputs, env.example, DispatchOptions(), env.rank)[0]
        except Exception as exc:  # a refusal is an outcome here: the check wants it on every rank, with a message
            return Raised.of(exc)
        finally:
            fresh.destroy()
            dist.destroy_process_group(group)


@rank_task
def fresh_group_views(env: RankEnv) -> dict[str, Any]:
    """``{backend: {way: DispatchView or Raised}}`` for every backend declaring ``fresh_groups``."""
    return env.each_backend(
        "dispatch", lambda adapter: {way: on_fresh_group(env, adapter, way) for way in ways(env.device.type)},
        capability="fresh_groups")
