"""Stateful refusal recipes of the V1 ``combine`` (intranode, internode): a destroyed buffer, torch's deterministic
mode, and a handle combined on another buffer, one sized to a boundary."""

from __future__ import annotations

from typing import Any

from conformance.tasks.refusals.dispatch import after_destroy
from conformance.tasks.refusals.env import BadCallEnv, default_config_values
from conformance.tasks.refusals.helpers import (
    V1_ALIGNMENT,
    align,
    deterministic_algorithms,
    v1_combine_nvl_bytes,
)
from conformance.tasks.refusals.registry import recipe


@recipe("v1_combine_after_destroy")
def _(env: BadCallEnv, bad: bool) -> None:
    """combine on a destroyed buffer."""
    after_destroy(env, bad, lambda d: d.buffer.combine(d.recv_x, d.handle, topk_weights=d.recv_topk_weights))


@recipe("v1_combine_deterministic")
def _(env: BadCallEnv, bad: bool) -> None:
    """combine with torch's deterministic algorithms on (and uninitialised memory filled)."""
    done = env.valid_v1_dispatch()
    with deterministic_algorithms(fill_uninitialized_memory=bad):
        done.buffer.combine(done.recv_x, done.handle, topk_weights=done.recv_topk_weights)


def _combine_on(env: BadCallEnv, buffer: Any) -> None:
    """A valid dispatch's combine, made on ``buffer`` (built after the dispatch: the handle is from another one)."""
    done = env.valid_v1_dispatch()
    buffer = buffer()
    buffer.combine(x=done.recv_x, handle=tuple(done.handle), topk_weights=done.recv_topk_weights)


def _combine_bytes(env: BadCallEnv) -> int:
    """The NVLink bytes an intranode combine of the example needs with the default config, 128-aligned."""
    ex = env.example
    return align(v1_combine_nvl_bytes(env.world_size, default_config_values(env, True), ex.hidden * 2, ex.num_topk),
                 V1_ALIGNMENT)


@recipe("v1_combine_nvl_bytes_queue")
def _(env: BadCallEnv, bad: bool) -> None:
    """combine on a buffer of 128 bytes (below the queue heads and tails; the handle from another buffer);
    neighbour: a buffer of exactly what the combine needs."""
    _combine_on(env, lambda: env.v1_buffer(num_nvl_bytes=V1_ALIGNMENT if bad else _combine_bytes(env)))


@recipe("v1_combine_nvl_bytes_data")
def _(env: BadCallEnv, bad: bool) -> None:
    """combine on a buffer one alignment unit below what the combine queues need (neighbour: exactly enough; the
    handle from another buffer)."""
    _combine_on(env, lambda: env.v1_buffer(num_nvl_bytes=_combine_bytes(env) - (V1_ALIGNMENT if bad else 0)))


@recipe("v1_internode_cached_notify_1516")
def _(env: BadCallEnv, bad: bool) -> None:
    """combine on a buffer of 128 NVLink bytes (the handle from another buffer); neighbour: on the adapter's."""
    _combine_on(env, lambda: env.v1_buffer(num_nvl_bytes=V1_ALIGNMENT) if bad else env.v1_buffer())
