"""Stateful refusal recipes of ``ElasticBuffer`` (V2) and its ``EventOverlap``: a destroyed buffer, torch's
deterministic mode, token counts at a buffer's boundary, a handle made by another buffer (direct or hybrid mode,
deterministic or not), a combine's SM count against its dispatch's, an event waited on or hooked twice."""

from __future__ import annotations

import copy
import math
from typing import Any

import torch

from conformance.tasks.refusals.env import BadCallEnv, V2Call, topk_of_width
from conformance.tasks.refusals.helpers import (
    deterministic_algorithms,
    narrow_hidden,
    v2_direct_combine_bytes,
    v2_direct_dispatch_bytes,
)
from conformance.tasks.refusals.registry import recipe


def _with_field(handle: Any, **fields: Any) -> Any:
    """A copy of ``handle`` with some fields replaced (a foreign or modified handle)."""
    new = copy.copy(handle)
    for name, value in fields.items():
        setattr(new, name, value)
    return new


def _combine(done: V2Call, on: Any = None, **args: Any) -> None:
    """The combine of the dispatch ``done`` (on ``on``, by default its buffer), with ``args`` replacing its own."""
    args = {"x": done.recv_x, "handle": done.handle, "topk_weights": done.recv_topk_weights, **args}
    (done.buffer if on is None else on).combine(**args)


# ------------------------------------------------------------------------------------------------ dispatch
@recipe("v2_dispatch_after_destroy")
def _(env: BadCallEnv, bad: bool) -> None:
    """dispatch on a destroyed buffer."""
    call = env.v2_args()
    if bad:
        call.buffer.destroy()
    call.buffer.dispatch(**call.kwargs)


@recipe("v2_dispatch_deterministic")
def _(env: BadCallEnv, bad: bool) -> None:
    """dispatch with torch's deterministic algorithms on (and uninitialised memory filled)."""
    call = env.v2_args()
    with deterministic_algorithms(fill_uninitialized_memory=bad):
        call.buffer.dispatch(**call.kwargs)


@recipe("v2_dispatch_num_experts_none")
def _(env: BadCallEnv, bad: bool) -> None:
    """A cached dispatch ``dispatch(x, handle=handle)`` without num_experts (automatic SMs), the recorded case;
    neighbour: the same with ``num_experts=handle.num_experts``."""
    first = env.valid_v2_dispatch()
    handle = first.handle
    extra = {} if bad else {"num_experts": handle.num_experts}
    first.buffer.dispatch(env.inputs.x, handle=handle, **extra)


@recipe("v2_dispatch_too_many_tokens")
def _(env: BadCallEnv, bad: bool) -> None:
    """num_max_tokens_per_rank + 1 tokens on every rank; neighbour: exactly num_max_tokens_per_rank."""
    call = env.v2_args()
    n = env.example.num_max_tokens_per_rank + (1 if bad else 0)
    reps = -(-n // max(env.inputs.x.shape[0], 1))
    ex = env.example
    if env.inputs.x.shape[0]:
        x, idx, w = (t.repeat(reps, 1)[:n] for t in (env.inputs.x, env.inputs.topk_idx, env.inputs.topk_weights))
    else:
        x = torch.zeros(n, ex.hidden, dtype=torch.bfloat16, device=env.device)
        idx = torch.full((n, ex.num_topk), -1, dtype=torch.int64, device=env.device)
        w = torch.zeros(n, ex.num_topk, device=env.device)
    call.kwargs.update(x=x, topk_idx=idx, topk_weights=w)
    call.buffer.dispatch(**call.kwargs)


@recipe("v2_dispatch_buffer_size")
def _(env: BadCallEnv, bad: bool) -> None:
    """A per-call num_max_tokens_per_rank one token above what the buffer holds; neighbour: the most it holds."""
    call = env.v2_args()
    ex = env.example
    per_token = v2_direct_dispatch_bytes(env.world_size, 1, ex.hidden, ex.num_topk, env.token_rdma_align)
    fits = call.buffer.num_bytes // per_token
    call.kwargs["num_max_tokens_per_rank"] = fits + (1 if bad else 0)
    call.buffer.dispatch(**call.kwargs)


@recipe("v2_dispatch_topk_too_large")
def _(env: BadCallEnv, bad: bool) -> None:
    """33 experts per token (the JIT kernel takes at most 32); neighbour: 32."""
    k = 33 if bad else 32
    num_experts = env.world_size * math.ceil(33 / env.world_size)
    buffer = env.v2_buffer(num_topk=33)
    idx, w = topk_of_width(env, k)
    buffer.dispatch(env.inputs.x, topk_idx=idx, topk_weights=w, num_experts=num_experts,
                    num_max_tokens_per_rank=env.example.num_max_tokens_per_rank)


# ----------------------------------------------------------------------------------------- cached dispatch
@recipe("v2_dispatch_handle_not_ephandle")
def _(env: BadCallEnv, bad: bool) -> None:
    """A tuple as the handle (no topk_idx)."""
    done = env.valid_v2_dispatch()
    handle = tuple(vars(done.handle).values()) if bad else done.handle
    done.buffer.dispatch(env.inputs.x, handle=handle, num_experts=done.handle.num_experts)


@recipe("v2_dispatch_cached_hybrid_field_745")
def _(env: BadCallEnv, bad: bool) -> None:
    """A hybrid buffer's cached dispatch of a handle made by a direct-mode buffer (neighbour: on that buffer)."""
    done = env.valid_v2_dispatch(env.v2_buffer(allow_hybrid_mode=False))
    on = env.v2_buffer() if bad else done.buffer
    on.dispatch(env.inputs.x, handle=done.handle, num_experts=done.handle.num_experts)


@recipe("v2_dispatch_cached_dst_slot_dim")
def _(env: BadCallEnv, bad: bool) -> None:
    """A direct-mode buffer's cached dispatch of a hybrid handle (its scale-up prefix sum resized to pass);
    neighbour: the hybrid buffer's."""
    done = env.valid_v2_dispatch()
    handle, on = done.handle, done.buffer
    if bad:
        handle = _with_field(handle, psum_num_recv_tokens_per_scaleup_rank=torch.zeros(
            env.world_size, dtype=torch.int32, device=env.device))
        on = env.v2_buffer(allow_hybrid_mode=False)
    on.dispatch(env.inputs.x, handle=handle, num_experts=done.handle.num_experts)


@recipe("v2_dispatch_deterministic_sort_without_cache")
def _(env: BadCallEnv, bad: bool) -> None:
    """A deterministic buffer's cached dispatch of a handle from a non-deterministic buffer."""
    maker = env.v2_buffer(deterministic=not bad)
    done = env.valid_v2_dispatch(maker)
    user = env.v2_buffer(deterministic=True)
    user.dispatch(env.inputs.x, handle=done.handle, num_experts=done.handle.num_experts)


# ------------------------------------------------------------------------------------------------- combine
@recipe("v2_combine_after_destroy")
def _(env: BadCallEnv, bad: bool) -> None:
    """combine on a destroyed buffer."""
    done = env.valid_v2_dispatch()
    if bad:
        done.buffer.destroy()
    done.buffer.combine(done.recv_x, done.handle, topk_weights=done.recv_topk_weights)


@recipe("v2_combine_deterministic")
def _(env: BadCallEnv, bad: bool) -> None:
    """combine with torch's deterministic algorithms on (and uninitialised memory filled)."""
    done = env.valid_v2_dispatch()
    with deterministic_algorithms(fill_uninitialized_memory=bad):
        done.buffer.combine(done.recv_x, done.handle, topk_weights=done.recv_topk_weights)


@recipe("v2_combine_hybrid_handle_without_metadata")
def _(env: BadCallEnv, bad: bool) -> None:
    """A hybrid buffer's combine of a direct-mode handle (its scale-up prefix sum resized to pass); neighbour: the
    direct-mode buffer's."""
    done = env.valid_v2_dispatch(env.v2_buffer(allow_hybrid_mode=False))
    if not bad:
        _combine(done)
        return
    handle = _with_field(done.handle, psum_num_recv_tokens_per_scaleup_rank=torch.zeros(
        env.world_size // env.num_nodes, dtype=torch.int32, device=env.device))
    _combine(done, env.v2_buffer(), handle=handle)


@recipe("v2_combine_hybrid_smem")
def _(env: BadCallEnv, bad: bool) -> None:
    """Hidden 4096, dispatch on 4 SMs (32 channels), combine on 2 SMs: 32 warps of 8 KiB tokens exceed the
    shared memory; neighbour: combine on 4 SMs."""
    buffer = env.v2_buffer(hidden=4096)
    x = narrow_hidden(env.inputs.x, 4096)
    recv_x, _, recv_w, handle, _ = buffer.dispatch(
        x, topk_idx=env.inputs.topk_idx, topk_weights=env.inputs.topk_weights, num_experts=env.example.num_experts,
        num_sms=4,
    )
    buffer.combine(recv_x, handle, topk_weights=recv_w, num_sms=2 if bad else 4)


@recipe("v2_combine_buffer_size")
def _(env: BadCallEnv, bad: bool) -> None:
    """A handle from a buffer sized for more tokens, combined on the example's buffer: one token more than the
    combine layout holds (neighbour: exactly what it holds)."""
    ex = env.example
    small = env.v2_buffer()
    per_token = v2_direct_combine_bytes(env.world_size, 1, ex.hidden, ex.num_topk, env.token_rdma_align)
    n = small.num_bytes // per_token + (1 if bad else 0)
    done = env.valid_v2_dispatch(env.v2_buffer(num_max_tokens_per_rank=n), num_max_tokens_per_rank=n)
    small.combine(done.recv_x, done.handle, topk_weights=done.recv_topk_weights)


# -------------------------------------------------------------------------------------------- EventOverlap
@recipe("utils_eventoverlap_wait_without_event")
def _(env: BadCallEnv, bad: bool) -> None:
    """current_stream_wait() on the EventOverlap of a synchronous dispatch (neighbour: of an async one)."""
    done = env.valid_v2_dispatch(async_with_compute_stream=not bad)
    done.out[4].current_stream_wait()


@recipe("utils_eventoverlap_hook_twice")
def _(env: BadCallEnv, bad: bool) -> None:
    """A second hook on the EventOverlap of an async deterministic dispatch (which registered the sort)."""
    done = env.valid_v2_dispatch(env.v2_buffer(deterministic=True), async_with_compute_stream=True)
    event = done.out[4]
    if not bad:
        event.current_stream_wait()
    event.register_hook_after_wait(lambda: None)
