"""Stateful refusal recipes of the V1 ``get_dispatch_layout`` and ``dispatch`` (intranode, internode, cached): a
destroyed buffer, a buffer sized to a boundary, torch's deterministic mode or an SM count set for the call, a group
of another shape, a handle made with another config."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from conformance.backends.legacy import NUM_RDMA_BYTES
from conformance.tasks.refusals.env import BadCallEnv, V1Call, default_config_values
from conformance.tasks.refusals.helpers import (
    V1_ALIGNMENT,
    StandInGroup,
    align,
    buffer_num_sms,
    deterministic_algorithms,
    local_world_size,
    v1_dispatch_nvl_bytes,
)
from conformance.tasks.refusals.registry import recipe


def after_destroy(env: BadCallEnv, bad: bool, call: Callable[[V1Call], Any]) -> None:
    """A valid dispatch, its buffer destroyed (``bad``), then ``call(dispatch)``."""
    done = env.valid_v1_dispatch()
    if bad:
        done.buffer.destroy()
    call(done)


@recipe("v1_layout_after_destroy")
def _(env: BadCallEnv, bad: bool) -> None:
    """get_dispatch_layout on a destroyed buffer."""
    after_destroy(env, bad, lambda d: d.buffer.get_dispatch_layout(env.inputs.topk_idx, env.example.num_experts))


@recipe("v1_layout_alloc_on_comm_stream")
def _(env: BadCallEnv, bad: bool) -> None:
    """allocate_on_comm_stream=True without previous_event and async_finish."""
    buffer = env.v1_buffer()
    extra = {} if bad else {"previous_event": buffer.capture(), "async_finish": True}
    out = buffer.get_dispatch_layout(env.inputs.topk_idx, env.example.num_experts, allocate_on_comm_stream=True,
                                     **extra)
    out[-1].current_stream_wait()


@recipe("v1_dispatch_after_destroy")
def _(env: BadCallEnv, bad: bool) -> None:
    """dispatch on a destroyed buffer."""
    after_destroy(env, bad, lambda d: d.buffer.dispatch(**d.kwargs))


@recipe("v1_set_num_sms_negative")
def _(env: BadCallEnv, bad: bool) -> None:
    """set_num_sms(-2) (accepted: even), then a dispatch with the default config."""
    call = env.v1_args()
    with buffer_num_sms(env.module, -2 if bad else 20):
        call.buffer.dispatch(**call.kwargs)


@recipe("v1_set_num_sms_float")
def _(env: BadCallEnv, bad: bool) -> None:
    """set_num_sms(20.0) (accepted: 20.0 % 2 == 0), then a dispatch with the default config."""
    call = env.v1_args()
    with buffer_num_sms(env.module, 20.0 if bad else 20):
        call.buffer.dispatch(**call.kwargs)


@recipe("v1_dispatch_deterministic")
def _(env: BadCallEnv, bad: bool) -> None:
    """dispatch with torch's deterministic algorithms on (and uninitialised memory filled)."""
    call = env.v1_args()
    with deterministic_algorithms(fill_uninitialized_memory=bad):
        call.buffer.dispatch(**call.kwargs)


@recipe("v1_dispatch_nvl_bytes_notify")
def _(env: BadCallEnv, bad: bool) -> None:
    """Buffer(group) with num_nvl_bytes=0 (the default); neighbour: the adapter's buffer."""
    call = env.v1_args(env.v1_buffer(num_nvl_bytes=0) if bad else None)
    call.buffer.dispatch(**call.kwargs)


@recipe("v1_dispatch_nvl_bytes_data")
def _(env: BadCallEnv, bad: bool) -> None:
    """num_nvl_bytes one alignment unit below what the channel queues need; neighbour: exactly enough."""
    ex = env.example
    need = align(v1_dispatch_nvl_bytes(env.world_size, default_config_values(env), ex.hidden * 2, ex.num_topk, 0),
                 V1_ALIGNMENT)
    call = env.v1_args(env.v1_buffer(num_nvl_bytes=need - V1_ALIGNMENT if bad else need))
    call.buffer.dispatch(**call.kwargs)


def _zero_token_fp8_dispatch(env: BadCallEnv, bad: bool) -> None:
    """A zero-token FP8 dispatch whose scales have a 2**30 column stride (2 columns: 2**31 >= INT_MAX)."""
    call = env.v1_args()
    stride = (1 << 30) if bad else 1
    scales = torch.empty(0, dtype=torch.float32, device=env.device).as_strided((0, 2), (2, stride))
    call.kwargs.update(x=(call.kwargs["x"][:0].to(torch.float8_e4m3fn), scales), topk_idx=call.kwargs["topk_idx"][:0],
                       topk_weights=call.kwargs["topk_weights"][:0],
                       is_token_in_rank=call.kwargs["is_token_in_rank"][:0])
    call.buffer.dispatch(**call.kwargs)


recipe("v1_dispatch_scale_stride")(_zero_token_fp8_dispatch)
recipe("v1_internode_scale_stride")(_zero_token_fp8_dispatch)


@recipe("v1_dispatch_unsupported_ranks")
def _(env: BadCallEnv, bad: bool) -> None:
    """A 1-rank dispatch with an explicit config (no kernel for 1 rank); neighbour: the layout alone."""
    call = env.v1_args()
    if bad:
        call.buffer.dispatch(**call.kwargs, config=env.module.Config(20, 6, 256, 6, 128))


# ----------------------------------------------------------------------------------------------- internode
@recipe("v1_internode_nvl_clean_meta")
def _(env: BadCallEnv, bad: bool) -> None:
    """An internode dispatch on a buffer of 128 NVLink bytes."""
    call = env.v1_args(env.v1_buffer(num_nvl_bytes=V1_ALIGNMENT) if bad else None)
    call.buffer.dispatch(**call.kwargs)


def _stand_in_internode(env: BadCallEnv, num_ranks: int, ranks_per_node: int, low_latency_mode: bool) -> None:
    """An internode dispatch on a stand-in group of ``num_ranks`` ranks in nodes of ``ranks_per_node``."""
    with local_world_size(ranks_per_node):
        buffer = env.v1_buffer(group=StandInGroup(env.rank, num_ranks), num_rdma_bytes=NUM_RDMA_BYTES,
                               low_latency_mode=low_latency_mode)
    t, k = env.inputs.x.shape[0], env.example.num_topk
    i32 = {"dtype": torch.int32, "device": env.device}
    buffer.dispatch(env.inputs.x, num_tokens_per_rank=torch.zeros(num_ranks, **i32),
                    num_tokens_per_rdma_rank=torch.zeros(num_ranks // ranks_per_node, **i32),
                    is_token_in_rank=torch.zeros(t, num_ranks, dtype=torch.bool, device=env.device),
                    num_tokens_per_expert=torch.zeros(num_ranks, **i32),
                    topk_idx=torch.full((t, k), -1, dtype=torch.int64, device=env.device),
                    topk_weights=torch.zeros(t, k, device=env.device),
                    config=env.module.Config(env.module.Buffer.num_sms, 36, 288, 20, 128))


@recipe("v1_internode_rdma_ranks")
def _(env: BadCallEnv, bad: bool) -> None:
    """84 nodes (> 20 RDMA peers): a low-latency buffer on a stand-in group of 168 ranks in nodes of 2."""
    if bad:
        _stand_in_internode(env, 168, 2, low_latency_mode=True)
    else:
        env.valid_v1_dispatch()


@recipe("v1_internode_unsupported_rdma_ranks")
def _(env: BadCallEnv, bad: bool) -> None:
    """5 nodes of 8 (no kernel for 5 RDMA ranks): a stand-in group of 40 ranks with LOCAL_WORLD_SIZE=8."""
    if bad:
        _stand_in_internode(env, 40, 8, low_latency_mode=False)
    else:
        env.valid_v1_dispatch()


@recipe("v1_internode_cached_notify_1519")
def _(env: BadCallEnv, bad: bool) -> None:
    """A dispatch with a 2-SM config, then its cached dispatch with the same config (one channel)."""
    config = env.module.Config(2 if bad else 4, 36, 288, 20, 128)
    done = env.valid_v1_dispatch(config=config)
    done.buffer.dispatch(env.inputs.x, handle=done.handle, config=config)
