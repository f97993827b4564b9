"""The environment a refusal recipe runs in (:class:`BadCallEnv`: the ``deep_ep``-like module, real or emulated,
the group, this rank's inputs of an :class:`~conformance.core.example.Example`), the buffers it builds, and the
valid calls every recipe starts from (``v1_args``, ``valid_v2_dispatch``, ``ll_dispatched``, ...).

Buffers a recipe builds through the environment are destroyed when it ends (:meth:`BadCallEnv.release`), except the
low-latency buffer it takes from the task's :class:`SharedBuffers` (kept for the next recipe of the same module and
shape, destroyed when the task ends): building an NVSHMEM buffer per recipe would dominate the sweep on the real
library, and a refusal must leave the buffer usable anyway, which the next recipe on it then shows.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from conformance.backends.legacy import NUM_NVL_BYTES, NUM_RDMA_BYTES
from conformance.core.example import Example, RankInputs, build_rank_inputs
from conformance.tasks.refusals.helpers import (
    COMBINE_CONFIGS,
    DISPATCH_CONFIGS,
    LL_HIDDEN,
    NVL_PEERS,
    ConfigValues,
    LLShape,
    align,
    ll_size_hint,
    narrow_hidden,
)
from conformance.tasks.setup import refuse_if_limited


@dataclass
class DispatchCall:
    """A dispatch: the buffer, the keyword arguments it was (or will be) called with, and its outputs (``out``:
    the received tokens first, the handle at :attr:`HANDLE_AT`)."""

    buffer: Any
    kwargs: dict[str, Any]
    out: tuple | None = None
    HANDLE_AT: ClassVar[int] = 4

    @property
    def recv_x(self) -> Any:
        return self.out[0]

    @property
    def handle(self) -> Any:
        return self.out[self.HANDLE_AT]


class V1Call(DispatchCall):
    """A V1 dispatch: ``(recv_x, recv_topk_idx, recv_topk_weights, num_recv_tokens_per_expert_list, handle,
    event)``."""

    @property
    def recv_topk_weights(self) -> torch.Tensor | None:
        return self.out[2]


class V2Call(V1Call):
    """A V2 dispatch: ``(recv_x, recv_topk_idx, recv_topk_weights, handle, event)``."""

    HANDLE_AT = 3


class LLCall(DispatchCall):
    """A V1 low-latency dispatch: ``(recv_x, recv_count, handle, event, hook)``."""

    HANDLE_AT = 2


class SharedBuffers:
    """The low-latency buffer the recipes of one task share, for one (module, shape) at a time, and what was made
    on it once for all of them (:meth:`memo`: the valid dispatch the combine recipes start from).

    One at a time because the real low-latency buffers live in NVSHMEM, one instance per process: a buffer of
    another shape replaces it, and so does any other RDMA buffer a recipe builds (:meth:`BadCallEnv.v1_buffer`
    releases it first).  :meth:`release` (or leaving the ``with`` block) destroys it."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._buffer: Any = None
        self._memo: dict[Any, Any] = {}

    def __enter__(self) -> SharedBuffers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def get(self, key: tuple, build: Callable[[], Any]) -> Any:
        if self._buffer is None or key != self._key:
            self.release()
            self._buffer, self._key = build(), key
        return self._buffer

    def memo(self, key: Any, make: Callable[[], Any]) -> Any:
        """``make()``, made once while the current buffer lives (call :meth:`get` first)."""
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    def release(self) -> None:
        buffer, self._buffer, self._key = self._buffer, None, None
        self._memo.clear()
        if buffer is not None:
            with contextlib.suppress(Exception):
                buffer.destroy()


@dataclass
class BadCallEnv:
    """What a recipe needs: the module under test, the world, and this rank's inputs of the example."""

    module: Any
    group: Any
    rank: int
    world_size: int
    example: Example
    inputs: RankInputs
    device: torch.device
    num_nodes: int = 1
    shared: SharedBuffers | None = None
    #: whether ``module`` is the real library: its constructors then consult the set-up limits first
    #: (``core/setup_limits.py``; a limited one raises ``SetupLimited`` instead of being made)
    real: bool = False
    _buffers: list[Any] = field(default_factory=list, repr=False)

    # buffers, built the way the suite's adapters build them (conformance/backends/legacy.py, elastic.py)
    def v1_buffer(self, **overrides: Any) -> Any:
        """``Buffer(group, num_nvl_bytes=1 << 30, num_rdma_bytes=..., explicitly_destroy=True)`` with overrides."""
        kwargs = {
            "num_nvl_bytes": NUM_NVL_BYTES,
            "num_rdma_bytes": NUM_RDMA_BYTES if self.num_nodes > 1 else 0,
            "explicitly_destroy": True,
        }
        kwargs.update(overrides)
        group = kwargs.pop("group", self.group)
        refuse_if_limited(self.real, "Buffer.__init__", kwargs)
        if self.shared is not None and kwargs["num_rdma_bytes"]:
            self.shared.release()  # one NVSHMEM buffer at a time (see SharedBuffers)
        buffer = self.module.Buffer(group, **kwargs)
        self._buffers.append(buffer)
        return buffer

    def v2_buffer(self, **overrides: Any) -> Any:
        """``ElasticBuffer(group, num_max_tokens_per_rank, hidden, num_topk, num_allocated_qps=0,
        explicitly_destroy=True)`` for the example, with overrides."""
        ex = self.example
        kwargs = {
            "num_max_tokens_per_rank": ex.num_max_tokens_per_rank,
            "hidden": ex.hidden,
            "num_topk": ex.num_topk,
            "num_allocated_qps": 0,
            "explicitly_destroy": True,
        }
        kwargs.update(overrides)
        group = kwargs.pop("group", self.group)
        refuse_if_limited(self.real, "ElasticBuffer.__init__", kwargs)
        buffer = self.module.ElasticBuffer(group, **kwargs)
        self._buffers.append(buffer)
        return buffer

    def ll_shape(self, **changes: int) -> LLShape:
        """The low-latency shape of the example: its token bound rounded up to a multiple of 4 (TMA, buffer.hpp:1526),
        the smallest compiled hidden size, its experts; ``changes`` replace fields."""
        ex = self.example
        shape = LLShape(align(ex.num_max_tokens_per_rank, 4), LL_HIDDEN, ex.num_experts)
        return dataclasses.replace(shape, **changes)

    def ll_buffer(self, shape: LLShape | None = None, private: bool = False, shrink: bool = False,
                  **overrides: Any) -> Any:
        """``Buffer(group, 0, <the low-latency size hint of shape>, low_latency_mode=True, num_qps_per_rank=<local
        experts>, explicitly_destroy=True)``, as the library's own test builds it (``enable_shrink=True`` too with
        ``shrink``: a buffer with a mask buffer): the task's shared buffer of that shape and mode, or a private one
        (destroyed when the recipe ends) with ``private`` or any override."""
        shape = shape if shape is not None else self.ll_shape()
        kwargs = {
            "num_nvl_bytes": 0,
            "num_rdma_bytes": ll_size_hint(shape),
            "low_latency_mode": True,
            "num_qps_per_rank": max(shape.num_experts // self.world_size, 1),
            "explicitly_destroy": True,
        }
        if shrink:
            kwargs["enable_shrink"] = True
        kwargs.update(overrides)
        if private or overrides or self.shared is None:
            return self.v1_buffer(**kwargs)
        refuse_if_limited(self.real, "Buffer.__init__", kwargs)
        return self.shared.get((id(self.module), shape, shrink), lambda: self.module.Buffer(self.group, **kwargs))

    def release(self) -> None:
        """Destroy every buffer the recipe built (in construction order on every rank; failures ignored)."""
        while self._buffers:
            buffer = self._buffers.pop(0)
            with contextlib.suppress(Exception):
                buffer.destroy()

    # valid calls
    def v1_args(self, buffer: Any = None, topk_idx: torch.Tensor | None = None) -> V1Call:
        """A V1 buffer and the arguments of a valid non-cached dispatch of the example (layout included)."""
        buffer = buffer if buffer is not None else self.v1_buffer()
        ex, inp = self.example, self.inputs
        topk_idx = inp.topk_idx if topk_idx is None else topk_idx
        per_rank, per_rdma, per_expert, in_rank, _ = buffer.get_dispatch_layout(topk_idx, ex.num_experts)
        kwargs = {
            "x": inp.x,
            "num_tokens_per_rank": per_rank,
            "num_tokens_per_rdma_rank": per_rdma,
            "is_token_in_rank": in_rank,
            "num_tokens_per_expert": per_expert,
            "topk_idx": topk_idx,
            "topk_weights": inp.topk_weights,
            "expert_alignment": ex.expert_alignment,
        }
        return V1Call(buffer, kwargs)

    def valid_v1_dispatch(self, buffer: Any = None, **overrides: Any) -> V1Call:
        """A valid V1 dispatch of the example (its outputs and handle)."""
        call = self.v1_args(buffer)
        call.kwargs.update(overrides)
        call.out = call.buffer.dispatch(**call.kwargs)
        return call

    def v2_args(self, buffer: Any = None) -> V2Call:
        """A V2 buffer and the arguments of a valid dispatch of the example."""
        buffer = buffer if buffer is not None else self.v2_buffer()
        ex, inp = self.example, self.inputs
        kwargs = {
            "x": inp.x,
            "topk_idx": inp.topk_idx,
            "topk_weights": inp.topk_weights,
            "num_experts": ex.num_experts,
            "num_max_tokens_per_rank": ex.num_max_tokens_per_rank,
            "expert_alignment": ex.expert_alignment,
        }
        return V2Call(buffer, kwargs)

    def valid_v2_dispatch(self, buffer: Any = None, **overrides: Any) -> V2Call:
        """A valid V2 dispatch of the example (its outputs and handle)."""
        call = self.v2_args(buffer)
        call.kwargs.update(overrides)
        call.out = call.buffer.dispatch(**call.kwargs)
        return call

    def ll_args(self, buffer: Any = None, shape: LLShape | None = None) -> LLCall:
        """A low-latency buffer (by default the shared one of ``shape``) and the arguments of a valid
        ``low_latency_dispatch`` of the example's tokens (zero-padded or cut to the shape's hidden size)."""
        shape = shape if shape is not None else self.ll_shape()
        buffer = buffer if buffer is not None else self.ll_buffer(shape)
        kwargs = {
            "x": narrow_hidden(self.inputs.x, shape.hidden),
            "topk_idx": self.inputs.topk_idx,
            "num_max_dispatch_tokens_per_rank": shape.num_max_tokens,
            "num_experts": shape.num_experts,
        }
        return LLCall(buffer, kwargs)

    def valid_ll_dispatch(self, buffer: Any = None, **overrides: Any) -> LLCall:
        """A valid low-latency dispatch of the example (its outputs and handle)."""
        call = self.ll_args(buffer)
        call.kwargs.update(overrides)
        call.out = call.buffer.low_latency_dispatch(**call.kwargs)
        return call

    def ll_dispatched(self) -> LLCall:
        """The valid bf16 low-latency dispatch of the example on the shared buffer, made once per task and buffer:
        the combine recipes read its outputs and handle (tensors the library allocates outside the buffer, which a
        low-latency combine may reuse, as the library's own test does)."""
        if self.shared is None:
            return self.valid_ll_dispatch(use_fp8=False)
        buffer = self.ll_buffer()
        return self.shared.memo((id(self.module), self.example),
                                lambda: self.valid_ll_dispatch(buffer, use_fp8=False))


def make_env(module: Any, example: Example, shared: SharedBuffers | None = None, real: bool = False) -> BadCallEnv:
    """The environment of this rank process (inside a :class:`conformance.world.World` task); ``shared``: the
    task's low-latency buffers (without it every recipe builds its own); ``real``: ``module`` is the real library
    (its constructors consult the set-up limits)."""
    from conformance.world.rank import context

    ctx = context()
    device = ctx.torch_device()
    return BadCallEnv(module=module, group=ctx.group, rank=ctx.rank, world_size=ctx.world_size, example=example,
                      inputs=build_rank_inputs(example, ctx.rank).to(device), device=device, num_nodes=ctx.num_nodes,
                      shared=shared, real=real)


def default_config_values(env: BadCallEnv, combine: bool = False, num_sms: int | None = None) -> ConfigValues:
    """The numbers of the library's default dispatch (or combine) config for this group."""
    config_ranks = env.world_size if env.num_nodes == 1 else env.num_nodes * NVL_PEERS
    table = COMBINE_CONFIGS if combine else DISPATCH_CONFIGS
    if config_ranks not in table:
        raise ValueError(f"no recommended legacy config for {config_ranks} ranks in the recipe table")
    return ConfigValues(env.module.Buffer.num_sms if num_sms is None else num_sms, *table[config_ranks])


def default_config(env: BadCallEnv, combine: bool = False, num_sms: int | None = None) -> Any:
    """The library's default dispatch (or combine) config for this group, optionally with another SM count."""
    return default_config_values(env, combine, num_sms).build(env.module)


def topk_of_width(env: BadCallEnv, num_topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[tokens, num_topk]`` routing over the first ``num_topk`` experts (distinct), and unit weights."""
    t = env.inputs.x.shape[0]
    idx = torch.arange(num_topk, dtype=torch.int64, device=env.device).expand(t, num_topk).contiguous()
    return idx, torch.ones(t, num_topk, dtype=torch.float32, device=env.device)
