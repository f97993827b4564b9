"""Stateful refusal recipes of the constructors, ``destroy`` and ``Buffer.set_num_sms`` (V1 and V2): a buffer
destroyed, a group of another size, an SM count set for the process."""

from __future__ import annotations

from conformance.backends.legacy import NUM_NVL_BYTES
from conformance.tasks.refusals.env import BadCallEnv
from conformance.tasks.refusals.helpers import StandInGroup, buffer_num_sms, local_world_size
from conformance.tasks.refusals.registry import recipe


# ===================================================================================================== V1
@recipe("v1_init_too_many_ranks")
def _(env: BadCallEnv, bad: bool) -> None:
    """A group of 168 ranks (> 8 x 20) without low-latency mode (a stand-in group object)."""
    if bad:
        env.v1_buffer(group=StandInGroup(env.rank, 168))
    else:
        env.v1_buffer()


@recipe("v1_init_ranks_not_multiple_of_8")
def _(env: BadCallEnv, bad: bool) -> None:
    """A group of 12 ranks (>= 8, not a multiple of 8) (a stand-in group object)."""
    if bad:
        env.v1_buffer(group=StandInGroup(env.rank, 12))
    else:
        env.v1_buffer()


@recipe("v1_destroy_not_explicit")
def _(env: BadCallEnv, bad: bool) -> None:
    """destroy() of a buffer built without explicitly_destroy."""
    env.v1_buffer(explicitly_destroy=not bad).destroy()


@recipe("v1_destroy_twice")
def _(env: BadCallEnv, bad: bool) -> None:
    """destroy() called twice."""
    buffer = env.v1_buffer()
    buffer.destroy()
    if bad:
        buffer.destroy()


@recipe("v1_destroy_unsupported_ranks")
def _(env: BadCallEnv, bad: bool) -> None:
    """destroy() of a 1-rank buffer with NVLink bytes (no barrier kernel for 1 rank); neighbour: no NVLink bytes."""
    env.v1_buffer(num_nvl_bytes=NUM_NVL_BYTES if bad else 0).destroy()


@recipe("v1_set_num_sms_odd")
def _(env: BadCallEnv, bad: bool) -> None:
    """Buffer.set_num_sms(21)."""
    with buffer_num_sms(env.module, 21 if bad else 20):
        pass


# ===================================================================================================== V2
@recipe("v2_init_too_many_ranks")
def _(env: BadCallEnv, bad: bool) -> None:
    """A stand-in group of 1026 ranks (> 1024) in nodes of 2."""
    if bad:
        with local_world_size(2):
            env.v2_buffer(group=StandInGroup(env.rank, 1026))
    else:
        env.v2_buffer()


@recipe("v2_destroy_not_explicit")
def _(env: BadCallEnv, bad: bool) -> None:
    """destroy() of a buffer built without explicitly_destroy."""
    env.v2_buffer(explicitly_destroy=not bad).destroy()
