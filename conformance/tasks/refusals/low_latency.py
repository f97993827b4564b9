"""Stateful refusal recipes of the V1 low-latency calls: ``low_latency_dispatch`` / ``low_latency_combine``,
``get_next_low_latency_combine_buffer``, ``clean_low_latency_buffer``, the shrink-mode mask calls and
``get_local_buffer_tensor``: a destroyed buffer, a buffer without low-latency mode or shrink mode, one sized to a
boundary of the layout or of the QP depth, torch's deterministic mode, a forged handle.

The recipes share the task's low-latency buffer of the example's shape (:meth:`BadCallEnv.ll_buffer`) and its one
valid dispatch (:meth:`BadCallEnv.ll_dispatched`) unless they destroy or resize theirs (a private buffer).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from conformance.tasks.refusals.env import BadCallEnv
from conformance.tasks.refusals.helpers import (
    V1_ALIGNMENT,
    deterministic_algorithms,
    ll_layout_bytes,
    ll_signalling_end,
    ll_size_hint,
)
from conformance.tasks.refusals.registry import recipe


def _short_buffer(env: BadCallEnv, bad: bool) -> Any:
    """A private low-latency buffer of the example's layout rounded down below it (``bad``) or up to 128 bytes."""
    below = (ll_layout_bytes(env.ll_shape()) - 1) // V1_ALIGNMENT * V1_ALIGNMENT
    return env.ll_buffer(num_rdma_bytes=below if bad else below + V1_ALIGNMENT)


def _qp_tokens(env: BadCallEnv, buffer: Any) -> tuple[int, int]:
    """``(the smallest num_max_dispatch_tokens_per_rank the buffer's QP depth refuses, the largest it takes that
    keeps num_ranks * tokens a multiple of 4)`` (legacy.py:609, buffer.hpp:1526)."""
    depth = int(buffer.nvshmem_qp_depth)
    refused, taken = depth // 2, depth // 2 - 1
    while (env.world_size * taken) % 4:
        taken -= 1
    return refused, taken


def _combine(env: BadCallEnv, done: Any, handle: Any = None) -> None:
    """The combine of the low-latency dispatch ``done`` (with ``handle``: by default the dispatch's)."""
    done.buffer.low_latency_combine(done.recv_x, env.inputs.topk_idx, env.inputs.topk_weights,
                                    done.handle if handle is None else handle)


def _combine_args(env: BadCallEnv, done: Any) -> dict[str, Any]:
    """The keyword arguments of the combine of the low-latency dispatch ``done``."""
    return {"x": done.recv_x, "topk_idx": done.kwargs["topk_idx"], "topk_weights": env.inputs.topk_weights,
            "handle": done.handle}


def _combine_on(env: BadCallEnv, build: Callable[[], Any] | None) -> None:
    """The combine of the task's valid low-latency dispatch on its buffer or on ``build()`` (built after the
    dispatch: building an RDMA buffer releases the shared one)."""
    done = env.ll_dispatched()
    args = _combine_args(env, done)
    (done.buffer if build is None else build()).low_latency_combine(**args)


# ------------------------------------------------------------------------------------------------ dispatch
@recipe("v1_ll_dispatch_after_destroy")
def _(env: BadCallEnv, bad: bool) -> None:
    """low_latency_dispatch on a destroyed low-latency buffer (a private one)."""
    call = env.ll_args(env.ll_buffer(private=True))
    if bad:
        call.buffer.destroy()
    call.buffer.low_latency_dispatch(**call.kwargs)


@recipe("v1_ll_dispatch_deterministic")
def _(env: BadCallEnv, bad: bool) -> None:
    """low_latency_dispatch with torch's deterministic algorithms on (and uninitialised memory filled)."""
    call = env.ll_args()
    with deterministic_algorithms(fill_uninitialized_memory=bad):
        call.buffer.low_latency_dispatch(**call.kwargs)


@recipe("v1_ll_dispatch_qp_depth")
def _(env: BadCallEnv, bad: bool) -> None:
    """num_max_dispatch_tokens_per_rank one above what the QP depth allows (512 with the default depth 1024);
    neighbour: the largest the depth allows that keeps num_ranks * tokens a multiple of 4 (510 on 2 ranks), on
    a buffer sized for it."""
    refused, taken = _qp_tokens(env, env.ll_buffer())
    call = env.ll_args() if bad else env.ll_args(shape=env.ll_shape(num_max_tokens=taken))
    if bad:
        call.kwargs["num_max_dispatch_tokens_per_rank"] = refused
    call.buffer.low_latency_dispatch(**call.kwargs)


def _dispatch_on(env: BadCallEnv, buffer: Any) -> None:
    """The example's valid low-latency dispatch, made on ``buffer`` (by default the task's shared one)."""
    call = env.ll_args(buffer)
    call.buffer.low_latency_dispatch(**call.kwargs)


@recipe("v1_ll_dispatch_not_ll_buffer")
def _(env: BadCallEnv, bad: bool) -> None:
    """low_latency_dispatch on a one-node buffer built without low_latency_mode (nvshmem_qp_depth never set)."""
    _dispatch_on(env, env.v1_buffer() if bad else None)


@recipe("v1_ll_dispatch_not_ll_mode")
def _(env: BadCallEnv, bad: bool) -> None:
    """low_latency_dispatch on an internode buffer built without low_latency_mode."""
    _dispatch_on(env, env.v1_buffer() if bad else None)


@recipe("v1_ll_dispatch_1503")
def _(env: BadCallEnv, bad: bool) -> None:
    """A low-latency buffer one alignment unit short of the layout (neighbour: the layout rounded up to 128)."""
    _dispatch_on(env, _short_buffer(env, bad))


@recipe("v1_ll_dispatch_1526")
def _(env: BadCallEnv, bad: bool) -> None:
    """num_max_dispatch_tokens_per_rank + 1 (num_ranks * tokens not a multiple of 4), on a buffer sized for it;
    neighbour: the example's bound on that buffer."""
    call = env.ll_args(env.ll_buffer(env.ll_shape(num_max_tokens=env.ll_shape().num_max_tokens + 1)))
    if bad:
        call.kwargs["num_max_dispatch_tokens_per_rank"] += 1
    call.buffer.low_latency_dispatch(**call.kwargs)


# ------------------------------------------------------------------------------------------------- combine
@recipe("v1_ll_combine_after_destroy")
def _(env: BadCallEnv, bad: bool) -> None:
    """low_latency_combine on a destroyed low-latency buffer (a private one, destroyed after its dispatch)."""
    done = env.valid_ll_dispatch(env.ll_buffer(private=True), use_fp8=False)
    if bad:
        done.buffer.destroy()
    _combine(env, done)


@recipe("v1_ll_combine_deterministic")
def _(env: BadCallEnv, bad: bool) -> None:
    """low_latency_combine with torch's deterministic algorithms on (and uninitialised memory filled)."""
    done = env.ll_dispatched()
    with deterministic_algorithms(fill_uninitialized_memory=bad):
        _combine(env, done)


@recipe("v1_ll_combine_qp_depth")
def _(env: BadCallEnv, bad: bool) -> None:
    """A handle whose num_max_dispatch_tokens_per_rank is one above what the QP depth allows (a forged handle)."""
    done = env.ll_dispatched()
    handle = list(done.handle)
    if bad:
        handle[2] = _qp_tokens(env, done.buffer)[0]
    _combine(env, done, handle=tuple(handle))


@recipe("v1_ll_combine_not_ll_buffer")
def _(env: BadCallEnv, bad: bool) -> None:
    """low_latency_combine of a low-latency handle on a one-node buffer built without low_latency_mode."""
    _combine_on(env, env.v1_buffer if bad else None)


@recipe("v1_ll_combine_1612")
def _(env: BadCallEnv, bad: bool) -> None:
    """low_latency_combine of a low-latency handle on an internode buffer built without low_latency_mode."""
    _combine_on(env, env.v1_buffer if bad else None)


@recipe("v1_ll_combine_1643")
def _(env: BadCallEnv, bad: bool) -> None:
    """combine on a low-latency buffer one alignment unit short of the layout (the handle from the shared buffer;
    neighbour: a buffer of the layout rounded up to 128)."""
    _combine_on(env, lambda: _short_buffer(env, bad))


@recipe("v1_ll_combine_layout_150")
def _(env: BadCallEnv, bad: bool) -> None:
    """A handle forged to one expert per rank and num_max_dispatch_tokens_per_rank + 1, x of hidden 128 to match:
    the layout's send buffer (experts * tokens * 260 bytes) is not a multiple of 16.  The forged combine has zero
    expert outputs and empty layout ranges (shapes every earlier check takes); neighbour: the valid combine."""
    done = env.ll_dispatched()
    args = _combine_args(env, done)
    if bad:
        rows = env.world_size * (done.kwargs["num_max_dispatch_tokens_per_rank"] + 1)
        src_info = torch.zeros(1, rows, dtype=torch.int32, device=env.device)
        layout_range = torch.zeros(1, env.world_size, dtype=torch.int64, device=env.device)
        args.update(x=torch.zeros(1, rows, 128, dtype=torch.bfloat16, device=env.device),
                    handle=(src_info, layout_range, rows // env.world_size, 128, env.world_size))
    done.buffer.low_latency_combine(**args)


@recipe("v1_ll_combine_kernel_1182")
def _(env: BadCallEnv, bad: bool) -> None:
    """A zero-copy combine (the expert outputs written into get_next_low_latency_combine_buffer) with LogFMT
    (neighbour: without)."""
    done = env.ll_dispatched()
    done.buffer.get_next_low_latency_combine_buffer(done.handle).copy_(done.recv_x)
    done.buffer.low_latency_combine(done.recv_x, env.inputs.topk_idx, env.inputs.topk_weights, done.handle,
                                    zero_copy=True, use_logfmt=bad)


@recipe("v1_ll_next_buffer_after_destroy")
def _(env: BadCallEnv, bad: bool) -> None:
    """get_next_low_latency_combine_buffer on a destroyed low-latency buffer (a private one, after its dispatch)."""
    done = env.valid_ll_dispatch(env.ll_buffer(private=True), use_fp8=False)
    if bad:
        done.buffer.destroy()
    done.buffer.get_next_low_latency_combine_buffer(done.handle)


# ------------------------------------------------------------------------- clean_low_latency_buffer
# (deep_ep/buffers/legacy.py:550, csrc/legacy/buffer.hpp:1431-1454): a collective (two barriers), made by every
# rank with the same arguments.
def _clean(env: BadCallEnv, buffer: Any | None = None) -> None:
    """clean_low_latency_buffer of the example's low-latency shape (on the task's shared buffer by default)."""
    shape = env.ll_shape()
    buffer = buffer if buffer is not None else env.ll_buffer()
    buffer.clean_low_latency_buffer(shape.num_max_tokens, shape.hidden, shape.num_experts)


@recipe("v1_ll_clean_after_destroy")
def _(env: BadCallEnv, bad: bool) -> None:
    """clean_low_latency_buffer on a destroyed low-latency buffer (a private one)."""
    buffer = env.ll_buffer(private=True)
    if bad:
        buffer.destroy()
    _clean(env, buffer)


@recipe("v1_ll_clean_1432")
def _(env: BadCallEnv, bad: bool) -> None:
    """clean_low_latency_buffer on a buffer built without low_latency_mode (neighbour: on the low-latency buffer)."""
    _clean(env, env.v1_buffer() if bad else None)


def _clean_experts(env: BadCallEnv) -> int:
    """The largest expert count whose two signalling buffers fit in the shared buffer's RDMA bytes."""
    limit = ll_size_hint(env.ll_shape())
    experts = limit // 8
    while ll_signalling_end(experts + 1) <= limit:
        experts += 1
    while ll_signalling_end(experts) > limit:
        experts -= 1
    return experts


@recipe("v1_ll_clean_1440")
def _(env: BadCallEnv, bad: bool) -> None:
    """clean_low_latency_buffer of the example's tokens and hidden size for one expert more than the signalling
    buffers of the shared buffer's RDMA bytes can hold (neighbour: the most that fit, to the byte)."""
    shape = env.ll_shape()
    env.ll_buffer().clean_low_latency_buffer(shape.num_max_tokens, shape.hidden, _clean_experts(env) + int(bad))


# --------------------------------------------------------------------------------- shrink-mode masks
# (legacy.py:672-698, buffer.hpp:1731-1748): a mask buffer exists with enable_shrink=True and RDMA bytes; each rank
# holds its own.  The neighbours leave every rank unmasked.
def _mask_status(env: BadCallEnv, numel: int | None = None) -> torch.Tensor:
    """A ``mask_status`` tensor for low_latency_query_mask_buffer (by default the valid one: int32, one per rank)."""
    return torch.full((env.world_size if numel is None else numel,), -1, dtype=torch.int32, device=env.device)


def _unmask_last(env: BadCallEnv, buffer: Any) -> None:
    buffer.low_latency_update_mask_buffer(env.world_size - 1)  # mask=False: unmask (a no-op on an unmasked rank)


def _query(env: BadCallEnv, buffer: Any) -> None:
    buffer.low_latency_query_mask_buffer(_mask_status(env))


def _clean_mask(env: BadCallEnv, buffer: Any) -> None:
    buffer.low_latency_clean_mask_buffer()


def _after_destroy(env: BadCallEnv, bad: bool, call: Callable[[BadCallEnv, Any], Any]) -> None:
    """``call(env, buffer)`` on a private shrink-mode buffer, destroyed first (``bad``)."""
    buffer = env.ll_buffer(private=True, shrink=True)
    if bad:
        buffer.destroy()
    call(env, buffer)


def _without_shrink(env: BadCallEnv, bad: bool, call: Callable[[BadCallEnv, Any], Any]) -> None:
    """``call(env, buffer)`` on the task's low-latency buffer without a mask buffer (``bad``) or with one."""
    call(env, env.ll_buffer(shrink=not bad))


@recipe("v1_ll_update_mask_after_destroy")
def _(env: BadCallEnv, bad: bool) -> None:
    """low_latency_update_mask_buffer on a destroyed shrink-mode buffer (a private one)."""
    _after_destroy(env, bad, _unmask_last)


@recipe("v1_ll_update_mask_1732")
def _(env: BadCallEnv, bad: bool) -> None:
    """low_latency_update_mask_buffer(num_ranks - 1) on a low-latency buffer built without enable_shrink
    (neighbour: with it)."""
    _without_shrink(env, bad, _unmask_last)


@recipe("v1_ll_update_mask_1733")
def _(env: BadCallEnv, bad: bool) -> None:
    """low_latency_update_mask_buffer(num_ranks): a rank past the last (neighbour: num_ranks - 1)."""
    buffer = env.ll_buffer(shrink=True)
    if bad:
        buffer.low_latency_update_mask_buffer(env.world_size)
    else:
        _unmask_last(env, buffer)


@recipe("v1_ll_query_mask_after_destroy")
def _(env: BadCallEnv, bad: bool) -> None:
    """low_latency_query_mask_buffer on a destroyed shrink-mode buffer (a private one)."""
    _after_destroy(env, bad, _query)


@recipe("v1_ll_query_mask_1738")
def _(env: BadCallEnv, bad: bool) -> None:
    """low_latency_query_mask_buffer on a low-latency buffer built without enable_shrink (neighbour: with it)."""
    _without_shrink(env, bad, _query)


@recipe("v1_ll_query_mask_1739")
def _(env: BadCallEnv, bad: bool) -> None:
    """low_latency_query_mask_buffer into an int32 mask_status of num_ranks + 1 entries (neighbour: num_ranks)."""
    env.ll_buffer(shrink=True).low_latency_query_mask_buffer(_mask_status(env, env.world_size + int(bad)))


@recipe("v1_ll_clean_mask_after_destroy")
def _(env: BadCallEnv, bad: bool) -> None:
    """low_latency_clean_mask_buffer on a destroyed shrink-mode buffer (a private one)."""
    _after_destroy(env, bad, _clean_mask)


@recipe("v1_ll_clean_mask_1746")
def _(env: BadCallEnv, bad: bool) -> None:
    """low_latency_clean_mask_buffer on a low-latency buffer built without enable_shrink (neighbour: with it)."""
    _without_shrink(env, bad, _clean_mask)


# ------------------------------------------------------------------------------ get_local_buffer_tensor
# (legacy.py:201-220, buffer.hpp:215-221)
@recipe("v1_local_buffer_after_destroy")
def _(env: BadCallEnv, bad: bool) -> None:
    """get_local_buffer_tensor(torch.uint8, torch.Size([V1_ALIGNMENT])) on a destroyed buffer of V1_ALIGNMENT
    NVLink bytes (a private one)."""
    buffer = env.v1_buffer(num_nvl_bytes=V1_ALIGNMENT)
    if bad:
        buffer.destroy()
    buffer.get_local_buffer_tensor(torch.uint8, torch.Size([V1_ALIGNMENT]))


@recipe("v1_local_buffer_size")
def _(env: BadCallEnv, bad: bool) -> None:
    """get_local_buffer_tensor(torch.float32, size, use_rdma_buffer=True) of one float more than the shared
    low-latency buffer's RDMA bytes hold (neighbour: all of them)."""
    numel = ll_size_hint(env.ll_shape()) // 4 + int(bad)
    env.ll_buffer().get_local_buffer_tensor(torch.float32, torch.Size([numel]), use_rdma_buffer=True)
