"""Bad calls: for every refusal-table row (conformance/emulation/refusals.toml) a *recipe* that makes exactly
the offending call, and its *neighbour*, the closest valid call.

Runs inside rank processes.  A recipe takes a :class:`BadCallEnv` (the ``deep_ep``-like module, real or
emulated, the group, this rank's inputs of an :class:`~conformance.core.example.Example`) and makes its calls; it
is deterministic and identical on every rank (every rank makes the same sequence of calls, so collectives
such as buffer construction line up).  Buffers a recipe builds through the environment are destroyed when it
ends (:func:`run`), except the low-latency buffer it takes from the task's :class:`SharedBuffers` (kept for the
next recipe of the same module and shape, destroyed when the task ends): building an NVSHMEM buffer per recipe
would dominate the sweep on the real library, and a refusal must leave the buffer usable anyway, which the next
recipe on it then shows.  Global state a recipe changes (``Buffer.num_sms``, torch's deterministic mode,
``LOCAL_WORLD_SIZE``) is restored before it returns.

Registration: ``@recipe("name", requires=..., topology=...)`` registers one callable; ``@pair("row_id", ...)``
registers ``row_id`` (``fn(env, True)``, the offending call) and ``row_id.ok`` (``fn(env, False)``, its
neighbour).  ``requires`` is an ``Example -> bool`` predicate (e.g. every rank has a token); ``topology`` says
which worlds a recipe applies to (see :data:`TOPOLOGIES`).  :func:`applies` combines both, so a strategy can
draw only applicable examples.

Recipes never import the emulation: the sizes they need (buffer-size boundaries) are computed here from the
library's own formulas, independently of ``conformance.emulation``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from conformance.backends.legacy import NUM_NVL_BYTES, NUM_RDMA_BYTES
from conformance.core.example import Example, RankInputs, build_rank_inputs

Recipe = Callable[["BadCallEnv"], Any]

#: name -> callable (offending calls under the row id, neighbours under ``<row id>.ok``).
RECIPES: dict[str, Recipe] = {}

#: Worlds a recipe applies to: ``any``; ``v1-intranode`` (one node of 2, 4 or 8 ranks: the legacy intranode
#: kernels); ``v1-internode`` (several nodes: the legacy internode path); ``single`` (one node);
#: ``hybrid`` (several nodes: V2 hybrid mode); ``one-rank`` (a 1-rank world).
TOPOLOGIES = ("any", "v1-intranode", "v1-internode", "single", "hybrid", "one-rank")

#: The legacy kernels' NVLink peer count and buffer alignment (LEGACY_NUM_MAX_NVL_PEERS, ..._ALIGNMENT_BYTES).
NVL_PEERS = 8
V1_ALIGNMENT = 128
#: The smallest hidden size the low-latency kernels are compiled for (``SWITCH_HIDDEN``,
#: csrc/kernels/legacy/launch.cuh:113) and their top-k limit (``kNumMaxTopK``, internode_ll.cu:493).
LL_HIDDEN = 2048
LL_MAX_TOPK = 11
#: The elastic buffer alignment (2 MiB) and ptx::kNumTMAAlignBytes.
V2_ALIGNMENT = 2 << 20
TMA_ALIGN = 32


def _always(example: Example) -> bool:
    return True


def recipe(name: str, requires: Callable[[Example], bool] = _always, topology: str = "any") -> Callable:
    """Register ``fn(env)`` as recipe ``name``; ``requires(example)`` says which examples it applies to."""
    if topology not in TOPOLOGIES:
        raise ValueError(f"unknown topology {topology!r}")

    def decorate(fn: Recipe) -> Recipe:
        if name in RECIPES:
            raise ValueError(f"recipe {name!r} registered twice")
        fn.requires = requires  # type: ignore[attr-defined]
        fn.topology = topology  # type: ignore[attr-defined]
        RECIPES[name] = fn
        return fn

    return decorate


def pair(row_id: str, requires: Callable[[Example], bool] = _always, topology: str = "any") -> Callable:
    """Register ``fn(env, bad)`` as recipe ``row_id`` (``bad=True``) and neighbour ``row_id.ok`` (``bad=False``)."""

    def decorate(fn: Callable[[BadCallEnv, bool], Any]) -> Callable:
        recipe(row_id, requires, topology)(lambda env: fn(env, True))
        recipe(f"{row_id}.ok", requires, topology)(lambda env: fn(env, False))
        RECIPES[row_id].__doc__ = RECIPES[f"{row_id}.ok"].__doc__ = fn.__doc__
        return fn

    return decorate


def applies(name: str, example: Example, num_nodes: int) -> bool:
    """Whether recipe ``name`` applies to ``example`` on a world of ``num_nodes`` nodes."""
    fn = RECIPES[name]
    topology, size = fn.topology, example.world_size  # type: ignore[attr-defined]
    world_ok = {
        "any": True,
        "v1-intranode": num_nodes == 1 and size in (2, 4, 8),
        "v1-internode": num_nodes > 1,
        "single": num_nodes == 1,
        "hybrid": num_nodes > 1,
        "one-rank": size == 1,
    }[topology]
    return world_ok and bool(fn.requires(example))  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------------------- environment
@dataclass
class V1Call:
    """A V1 dispatch: the buffer, the keyword arguments it was (or will be) called with, and its outputs."""

    buffer: Any
    kwargs: dict[str, Any]
    out: tuple | None = None

    @property
    def handle(self) -> tuple:
        return self.out[4]

    @property
    def recv_x(self) -> torch.Tensor:
        return self.out[0]

    @property
    def recv_topk_weights(self) -> torch.Tensor:
        return self.out[2]


@dataclass
class V2Call:
    """A V2 dispatch: the buffer, its keyword arguments and outputs."""

    buffer: Any
    kwargs: dict[str, Any]
    out: tuple | None = None

    @property
    def handle(self) -> Any:
        return self.out[3]

    @property
    def recv_x(self) -> torch.Tensor:
        return self.out[0]

    @property
    def recv_topk_weights(self) -> torch.Tensor | None:
        return self.out[2]


@dataclass
class LLCall:
    """A V1 low-latency dispatch: the buffer, its keyword arguments and outputs."""

    buffer: Any
    kwargs: dict[str, Any]
    out: tuple | None = None

    @property
    def recv_x(self) -> Any:
        return self.out[0]

    @property
    def handle(self) -> tuple:
        return self.out[2]


@dataclass(frozen=True)
class LLShape:
    """What a low-latency buffer is sized for: ``num_max_dispatch_tokens_per_rank``, hidden, expert count."""

    num_max_tokens: int
    hidden: int
    num_experts: int


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


def make_env(module: Any, example: Example, shared: SharedBuffers | None = None) -> BadCallEnv:
    """The environment of this rank process (inside a :class:`conformance.world.World` task); ``shared``: the
    task's low-latency buffers (without it every recipe builds its own)."""
    from conformance.world.rank import context

    ctx = context()
    device = ctx.torch_device()
    return BadCallEnv(module=module, group=ctx.group, rank=ctx.rank, world_size=ctx.world_size, example=example,
                      inputs=build_rank_inputs(example, ctx.rank).to(device), device=device, num_nodes=ctx.num_nodes,
                      shared=shared)


def run(name: str, env: BadCallEnv) -> tuple[str | None, str | None]:
    """Run recipe ``name``; return ``(exception type name, message)``, ``(None, None)`` when nothing was raised.

    The buffers it built are destroyed afterwards, whatever happened (the shared ones stay for the next recipe).
    """
    from conformance.world.rank import call_context

    try:
        with call_context(f"refusal row {name}"):
            RECIPES[name](env)
    except Exception as exc:  # the refusal under test
        return type(exc).__name__, str(exc)
    finally:
        env.release()
    return None, None


# ------------------------------------------------------------------------------------------------ helpers
def every_rank_has(n: int) -> Callable[[Example], bool]:
    """Examples where every rank sends at least ``n`` tokens."""
    return lambda example: min(example.tokens_per_rank) >= n


def several_ranks(example: Example) -> bool:
    return example.world_size > 1


def every_rank_receives(example: Example) -> bool:
    """Examples where every rank receives at least one token (some token selects one of its experts)."""
    from conformance.core.example import build_all_inputs

    per_rank = example.experts_per_rank
    if per_rank == 0:
        return False
    owners: set[int] = set()
    for inputs in build_all_inputs(example):
        ids = inputs.topk_idx[inputs.topk_idx >= 0]
        owners.update(int(r) for r in torch.unique(ids // per_rank))
    return owners >= set(range(example.world_size))


def strided(t: torch.Tensor) -> torch.Tensor:
    """The same values as a non-contiguous view (for ``[rows, cols]``: needs cols >= 2 and rows >= 1, or
    rows >= 2)."""
    if t.dim() >= 1 and t.shape[-1] >= 2:
        return torch.stack([t, t], dim=-1)[..., 0]
    return torch.cat([t, t])[::2]


def extra_row(t: torch.Tensor, value: float = 0) -> torch.Tensor:
    """``t`` with one more row (any row count works, also 0)."""
    return torch.cat([t, torch.full((1,) + tuple(t.shape[1:]), value, dtype=t.dtype, device=t.device)])


def extra_col(t: torch.Tensor, value: float = 0) -> torch.Tensor:
    """``t`` with one more column."""
    return torch.cat([t, torch.full((t.shape[0], 1), value, dtype=t.dtype, device=t.device)], dim=1)


def narrow_hidden(x: torch.Tensor, hidden: int) -> torch.Tensor:
    """``x`` cut (or zero-padded) to ``hidden`` columns, contiguous."""
    if hidden <= x.shape[1]:
        return x[:, :hidden].contiguous()
    return torch.cat([x, x.new_zeros(x.shape[0], hidden - x.shape[1])], dim=1)


def fp8(x: torch.Tensor, num_scales: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """An FP8 ``(x, scales)`` pair of the example's tokens (float32 scales, ``hidden // 128`` per token)."""
    num_scales = max(x.shape[1] // 128, 1) if num_scales is None else num_scales
    return x.to(torch.float8_e4m3fn), torch.ones(x.shape[0], num_scales, dtype=torch.float32, device=x.device)


def align(value: int, alignment: int) -> int:
    return (value + alignment - 1) // alignment * alignment


class StandInGroup:
    """A group-like object reporting ``size`` ranks: only ``rank()`` / ``size()`` are used before the
    constructor refusals it reaches (emulation self-test only; the real library also talks to the group)."""

    def __init__(self, rank: int, size: int) -> None:
        self._rank, self._size = rank, size

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size


@contextlib.contextmanager
def local_world_size(value: int) -> Iterator[None]:
    """Temporarily set ``LOCAL_WORLD_SIZE`` (what the emulation splits a group into nodes by)."""
    old = os.environ.get("LOCAL_WORLD_SIZE")
    os.environ["LOCAL_WORLD_SIZE"] = str(value)
    try:
        yield
    finally:
        if old is None:
            del os.environ["LOCAL_WORLD_SIZE"]
        else:
            os.environ["LOCAL_WORLD_SIZE"] = old


@contextlib.contextmanager
def buffer_num_sms(module: Any, value: Any) -> Iterator[None]:
    """Call ``Buffer.set_num_sms(value)`` for the block; the previous SM count is restored after it."""
    old = module.Buffer.num_sms
    try:
        module.Buffer.set_num_sms(value)
        yield
    finally:
        module.Buffer.num_sms = old


def _set_deterministic(mode: bool) -> None:
    """torch's deterministic mode as DeepEP reads it (``torch.are_deterministic_algorithms_enabled()``, in C++
    ``at::globalContext().deterministicAlgorithms()``): the flag ``torch.use_deterministic_algorithms`` sets, without
    its other effect, ``torch._inductor.config.deterministic``, which imports inductor, dynamo and sympy (~800
    modules, 1.2-1.6 s per rank process on 2 cores) and which no DeepEP code reads."""
    setter = getattr(torch._C, "_set_deterministic_algorithms", None)
    if setter is None:  # a torch without the private setter: the public function, slow import and all
        torch.use_deterministic_algorithms(mode)
    else:
        setter(mode)


@contextlib.contextmanager
def deterministic_algorithms(fill_uninitialized_memory: bool) -> Iterator[None]:
    """torch's deterministic mode on (:func:`_set_deterministic`) with the given ``fill_uninitialized_memory``
    (both restored)."""
    import torch.utils.deterministic as det

    old_mode, old_fill = torch.are_deterministic_algorithms_enabled(), det.fill_uninitialized_memory
    _set_deterministic(True)
    det.fill_uninitialized_memory = fill_uninitialized_memory
    try:
        yield
    finally:
        _set_deterministic(old_mode)
        det.fill_uninitialized_memory = old_fill


#: The library's recommended legacy configs without the SM count, by rank count: ``(nvl_send, nvl_recv,
#: rdma_send, rdma_recv)`` of ``Buffer.get_dispatch_config`` / ``get_combine_config``
#: (``deep_ep/buffers/legacy.py:246`` and ``:274``).  The real ``deep_ep._C.Config`` exposes no fields, so a
#: recipe that needs a default config's numbers cannot read them back from the object.
_DISPATCH_CONFIGS = {2: (24, 256, 6, 128), 4: (6, 256, 6, 128), 8: (6, 256, 6, 128), 16: (36, 288, 20, 128)}
_COMBINE_CONFIGS = {2: (10, 256, 6, 128), 4: (9, 256, 6, 128), 8: (4, 256, 6, 128), 16: (4, 288, 12, 128)}


@dataclass(frozen=True)
class ConfigValues:
    """The five numbers of a legacy ``Config`` (kept beside the object, which hides them)."""

    num_sms: int
    nvl_send: int
    nvl_recv: int
    rdma_send: int
    rdma_recv: int

    def build(self, module: Any) -> Any:
        return module.Config(self.num_sms, self.nvl_send, self.nvl_recv, self.rdma_send, self.rdma_recv)


def default_config_values(env: BadCallEnv, combine: bool = False, num_sms: int | None = None) -> ConfigValues:
    """The numbers of the library's default dispatch (or combine) config for this group."""
    config_ranks = env.world_size if env.num_nodes == 1 else env.num_nodes * NVL_PEERS
    table = _COMBINE_CONFIGS if combine else _DISPATCH_CONFIGS
    if config_ranks not in table:
        raise ValueError(f"no recommended legacy config for {config_ranks} ranks in the recipe table")
    return ConfigValues(env.module.Buffer.num_sms if num_sms is None else num_sms, *table[config_ranks])


def default_config(env: BadCallEnv, combine: bool = False, num_sms: int | None = None) -> Any:
    """The library's default dispatch (or combine) config for this group, optionally with another SM count."""
    return default_config_values(env, combine, num_sms).build(env.module)


def v1_dispatch_nvl_bytes(num_ranks: int, config: ConfigValues, hidden_bytes: int, num_topk: int,
                          num_scales: int) -> int:
    """NVLink bytes an intranode dispatch needs (the library's formula, csrc/legacy/buffer.hpp:627)."""
    c, q = config.num_sms // 2, config.nvl_recv
    queue = c * num_ranks * q
    return (num_ranks * num_ranks * 4 + c * num_ranks * 16 + queue * hidden_bytes + queue * 4 + queue * num_topk * 12
            + queue * 4 * num_scales)


def v1_combine_nvl_bytes(num_ranks: int, config: ConfigValues, hidden_bytes: int, num_topk: int) -> int:
    """NVLink bytes an intranode combine needs (csrc/legacy/buffer.hpp:807)."""
    c, q = config.num_sms // 2, config.nvl_recv
    queue = c * num_ranks * q
    return c * num_ranks * 8 + queue * hidden_bytes + queue * 4 + queue * num_topk * 4


def ll_layout_bytes(shape: LLShape) -> int:
    """``LowLatencyLayout::total_bytes`` (csrc/legacy/config.hpp:131-166): an odd and an even copy of the send
    buffer (one token's dispatch message each, or every expert's combine messages), of the receive buffer (every
    expert's messages) and of the 128-aligned per-expert signal counters."""
    t, hidden, experts = shape.num_max_tokens, shape.hidden, shape.num_experts
    scale_bytes = hidden // 128 * 4
    dispatch_msg = 16 + max(hidden * 2, hidden + scale_bytes)  # int4 header + bf16 row, or FP8 row + float scales
    combine_msg = hidden * 2 + scale_bytes  # bf16 row + a bf16 min/max pair per 128 channels
    copy = max(t * dispatch_msg, experts * t * combine_msg)
    copy += experts * t * max(dispatch_msg, combine_msg)
    copy += align(experts * 4, V1_ALIGNMENT)
    return 2 * copy


def ll_signalling_end(num_experts: int) -> int:
    """One past the last byte ``clean_low_latency_buffer`` zeroes (its boundary check, csrc/legacy/buffer.hpp:
    1438-1443): the second signalling buffer starts at ``align_up(4 * num_experts, 128)`` and holds ``num_experts``
    ints (config.hpp:161-175)."""
    return align(num_experts * 4, V1_ALIGNMENT) + num_experts * 4


def ll_size_hint(shape: LLShape) -> int:
    """``get_low_latency_rdma_size_hint`` (config.hpp:185-188): the layout rounded past the next multiple of 128."""
    return (ll_layout_bytes(shape) // V1_ALIGNMENT + 1) * V1_ALIGNMENT


def v2_token_bytes(hidden_bytes: int, sf_bytes: int, num_topk: int, with_metadata: bool) -> int:
    """``layout::TokenLayout::get_num_bytes<false>()`` (deep_ep/include/deep_ep/common/layout.cuh:202)."""
    metadata = num_topk * 8 + ((1 + num_topk) * 4 if with_metadata else 0)
    return align(hidden_bytes, TMA_ALIGN) + align(sf_bytes, TMA_ALIGN) + align(metadata, TMA_ALIGN)


def v2_direct_dispatch_bytes(num_ranks: int, n: int, hidden: int, num_topk: int) -> int:
    """Single-node (NVLink scale-up) direct dispatch buffer bytes (csrc/elastic/buffer.hpp:594-600), bf16."""
    return v2_token_bytes(hidden * 2, 0, num_topk, True) * num_ranks * n


def v2_direct_combine_bytes(num_ranks: int, n: int, hidden: int, num_topk: int) -> int:
    """Single-node direct combine buffer bytes (csrc/elastic/buffer.hpp:623-633), multiple reduction."""
    return v2_token_bytes(hidden * 2, 0, num_topk, False) * min(num_ranks, num_topk) * n


def topk_of_width(env: BadCallEnv, num_topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[tokens, num_topk]`` routing over the first ``num_topk`` experts (distinct), and unit weights."""
    t = env.inputs.x.shape[0]
    idx = torch.arange(num_topk, dtype=torch.int64, device=env.device).expand(t, num_topk).contiguous()
    return idx, torch.ones(t, num_topk, dtype=torch.float32, device=env.device)


V1_INTRA = "v1-intranode"
V1_INTER = "v1-internode"


# ===================================================================================================== V1
# ------------------------------------------------------------------------------------------- constructor
@pair("v1_init_no_group_no_comm")
def _(env: BadCallEnv, bad: bool) -> None:
    """Buffer(None) without a communicator."""
    env.v1_buffer(group=None) if bad else env.v1_buffer()


@pair("v1_init_nvl_bytes_alignment")
def _(env: BadCallEnv, bad: bool) -> None:
    """num_nvl_bytes not a multiple of 128 (neighbour: the next multiple)."""
    env.v1_buffer(num_nvl_bytes=NUM_NVL_BYTES + (64 if bad else V1_ALIGNMENT))


@pair("v1_init_rdma_bytes_alignment")
def _(env: BadCallEnv, bad: bool) -> None:
    """num_rdma_bytes not a multiple of 128."""
    valid = NUM_RDMA_BYTES if env.num_nodes > 1 else 0
    env.v1_buffer(num_rdma_bytes=valid + 64 if bad else valid)


@pair("v1_init_nvl_bytes_too_large")
def _(env: BadCallEnv, bad: bool) -> None:
    """num_nvl_bytes of 32 GiB (num_nvl_bytes / 16 reaches INT_MAX) without RDMA bytes (with them, the alignment
    check at buffer.hpp:107 refuses first); neighbour: the adapter's 1 GiB."""
    env.v1_buffer(num_nvl_bytes=(1 << 35) if bad else NUM_NVL_BYTES, num_rdma_bytes=0)


@pair("v1_init_rdma_bytes_too_large")
def _(env: BadCallEnv, bad: bool) -> None:
    """A low-latency buffer (which may exceed 2 GiB of RDMA) with 32 GiB of RDMA buffer."""
    env.v1_buffer(num_rdma_bytes=(1 << 35) if bad else (1 << 31), low_latency_mode=True)


@pair("v1_init_too_many_ranks")
def _(env: BadCallEnv, bad: bool) -> None:
    """A group of 168 ranks (> 8 x 20) without low-latency mode (a stand-in group object)."""
    if bad:
        env.v1_buffer(group=StandInGroup(env.rank, 168))
    else:
        env.v1_buffer()


@pair("v1_init_ranks_not_multiple_of_8")
def _(env: BadCallEnv, bad: bool) -> None:
    """A group of 12 ranks (>= 8, not a multiple of 8) (a stand-in group object)."""
    if bad:
        env.v1_buffer(group=StandInGroup(env.rank, 12))
    else:
        env.v1_buffer()


@pair("v1_init_rdma_bytes_single_node", topology="single")
def _(env: BadCallEnv, bad: bool) -> None:
    """RDMA bytes on one node without low-latency mode."""
    env.v1_buffer(num_rdma_bytes=NUM_RDMA_BYTES if bad else 0)


@pair("v1_init_qps_per_rank")
def _(env: BadCallEnv, bad: bool) -> None:
    """A low-latency buffer with num_qps_per_rank=0."""
    env.v1_buffer(low_latency_mode=True, num_qps_per_rank=0 if bad else 1)


# ----------------------------------------------------------------------------------- destroy / set_num_sms
@pair("v1_destroy_not_explicit")
def _(env: BadCallEnv, bad: bool) -> None:
    """destroy() of a buffer built without explicitly_destroy."""
    env.v1_buffer(explicitly_destroy=not bad).destroy()


@pair("v1_destroy_twice")
def _(env: BadCallEnv, bad: bool) -> None:
    """destroy() called twice."""
    buffer = env.v1_buffer()
    buffer.destroy()
    if bad:
        buffer.destroy()


@pair("v1_destroy_unsupported_ranks", topology="one-rank")
def _(env: BadCallEnv, bad: bool) -> None:
    """destroy() of a 1-rank buffer with NVLink bytes (no barrier kernel for 1 rank); neighbour: no NVLink bytes."""
    env.v1_buffer(num_nvl_bytes=NUM_NVL_BYTES if bad else 0).destroy()


def _after_destroy(env: BadCallEnv, bad: bool, call: Callable[[V1Call], Any]) -> None:
    done = env.valid_v1_dispatch()
    if bad:
        done.buffer.destroy()
    call(done)


@pair("v1_layout_after_destroy", topology=V1_INTRA)
def _(env: BadCallEnv, bad: bool) -> None:
    """get_dispatch_layout on a destroyed buffer."""
    _after_destroy(env, bad, lambda d: d.buffer.get_dispatch_layout(env.inputs.topk_idx, env.example.num_experts))


@pair("v1_dispatch_after_destroy", topology=V1_INTRA)
def _(env: BadCallEnv, bad: bool) -> None:
    """dispatch on a destroyed buffer."""
    _after_destroy(env, bad, lambda d: d.buffer.dispatch(**d.kwargs))


@pair("v1_combine_after_destroy", topology=V1_INTRA)
def _(env: BadCallEnv, bad: bool) -> None:
    """combine on a destroyed buffer."""
    _after_destroy(env, bad, lambda d: d.buffer.combine(d.recv_x, d.handle, topk_weights=d.recv_topk_weights))


@pair("v1_set_num_sms_odd")
def _(env: BadCallEnv, bad: bool) -> None:
    """Buffer.set_num_sms(21)."""
    with buffer_num_sms(env.module, 21 if bad else 20):
        pass


@pair("v1_set_num_sms_negative", topology=V1_INTRA)
def _(env: BadCallEnv, bad: bool) -> None:
    """set_num_sms(-2) (accepted: even), then a dispatch with the default config."""
    call = env.v1_args()
    with buffer_num_sms(env.module, -2 if bad else 20):
        call.buffer.dispatch(**call.kwargs)


@pair("v1_set_num_sms_float", topology=V1_INTRA)
def _(env: BadCallEnv, bad: bool) -> None:
    """set_num_sms(20.0) (accepted: 20.0 % 2 == 0), then a dispatch with the default config."""
    call = env.v1_args()
    with buffer_num_sms(env.module, 20.0 if bad else 20):
        call.buffer.dispatch(**call.kwargs)


@pair("v1_dispatch_config_unsupported_ranks")
def _(env: BadCallEnv, bad: bool) -> None:
    """The default-config lookup for a 3-rank group."""
    env.module.Buffer.get_dispatch_config(3 if bad else 2)


@pair("v1_combine_config_unsupported_ranks")
def _(env: BadCallEnv, bad: bool) -> None:
    """The default combine-config lookup for a 3-rank group."""
    env.module.Buffer.get_combine_config(3 if bad else 2)


_CONFIGS = {  # row -> (bad Config arguments, neighbour arguments)
    "v1_config_negative_sms": ((-2, 6, 256, 6, 128), (0, 6, 256, 6, 128)),
    "v1_config_nvl_nonpositive": ((20, 0, 256, 6, 128), (20, 1, 256, 6, 128)),
    "v1_config_nvl_send_ge_recv": ((20, 256, 256, 6, 128), (20, 255, 256, 6, 128)),
    "v1_config_rdma_nonpositive": ((20, 6, 256, 0, 128), (20, 6, 256, 1, 128)),
    "v1_config_rdma_send_ge_recv": ((20, 6, 256, 8, 8), (20, 6, 256, 8, 16)),
    "v1_config_rdma_send_gt_half_recv": ((20, 6, 256, 6, 10), (20, 6, 256, 6, 12)),
}


def _config_pair(row: str, bad_args: tuple, ok_args: tuple) -> None:
    @pair(row)
    def _(env: BadCallEnv, bad: bool) -> None:
        """Config(...) with one out-of-range field (the constructor refuses)."""
        env.module.Config(*(bad_args if bad else ok_args))


for _row, (_bad, _ok) in _CONFIGS.items():
    _config_pair(_row, _bad, _ok)


# ------------------------------------------------------------------------------------------------- layout
@pair("v1_layout_topk_dim", topology=V1_INTRA)
def _(env: BadCallEnv, bad: bool) -> None:
    """get_dispatch_layout with a 1-D topk_idx."""
    idx = env.inputs.topk_idx
    env.v1_buffer().get_dispatch_layout(idx[:, 0] if bad else idx, env.example.num_experts)


@pair("v1_layout_topk_contiguous", requires=every_rank_has(2), topology=V1_INTRA)
def _(env: BadCallEnv, bad: bool) -> None:
    """get_dispatch_layout with a non-contiguous topk_idx."""
    idx = env.inputs.topk_idx
    env.v1_buffer().get_dispatch_layout(strided(idx) if bad else idx, env.example.num_experts)


@pair("v1_layout_num_experts_positive", topology=V1_INTRA)
def _(env: BadCallEnv, bad: bool) -> None:
    """get_dispatch_layout with num_experts=0 (neighbour: 1)."""
    env.v1_buffer().get_dispatch_layout(env.inputs.topk_idx, 0 if bad else 1)


@pair("v1_layout_alloc_on_comm_stream", topology=V1_INTRA)
def _(env: BadCallEnv, bad: bool) -> None:
    """allocate_on_comm_stream=True without previous_event and async_finish."""
    buffer = env.v1_buffer()
    extra = {} if bad else {"previous_event": buffer.capture(), "async_finish": True}
    out = buffer.get_dispatch_layout(env.inputs.topk_idx, env.example.num_experts, allocate_on_comm_stream=True,
                                     **extra)
    out[-1].current_stream_wait()


@pair("v1_layout_topk_dtype", topology=V1_INTRA)
def _(env: BadCallEnv, bad: bool) -> None:
    """get_dispatch_layout with an int32 topk_idx."""
    idx = env.inputs.topk_idx
    env.v1_buffer().get_dispatch_layout(idx.int() if bad else idx, env.example.num_experts)


# -------------------------------------------------------------------------------------- intranode dispatch
def _dispatch_edit(row: str, edit: Callable[[BadCallEnv, V1Call], None], requires: Callable = _always,
                   topology: str = V1_INTRA, neighbour: Callable[[BadCallEnv, V1Call], None] | None = None,
                   doc: str = "") -> None:
    """Register a V1 dispatch recipe: a valid non-cached dispatch with ``edit`` applied to its arguments."""

    @pair(row, requires, topology)
    def _(env: BadCallEnv, bad: bool) -> None:
        call = env.v1_args()
        if bad:
            edit(env, call)
        elif neighbour is not None:
            neighbour(env, call)
        call.buffer.dispatch(**call.kwargs)

    RECIPES[row].__doc__ = RECIPES[f"{row}.ok"].__doc__ = doc


def _set(**changes: Callable[[BadCallEnv, V1Call], Any]) -> Callable[[BadCallEnv, V1Call], None]:
    """An edit replacing dispatch keyword arguments by ``change(env, call)``."""

    def edit(env: BadCallEnv, call: V1Call) -> None:
        new = {k: f(env, call) for k, f in changes.items()}
        call.kwargs.update(new)

    return edit


def _kw(name: str) -> Callable[[BadCallEnv, V1Call], Any]:
    return lambda env, call: call.kwargs[name]


def _deterministic_dispatch(env: BadCallEnv, bad: bool) -> None:
    call = env.v1_args()
    with deterministic_algorithms(fill_uninitialized_memory=bad):
        call.buffer.dispatch(**call.kwargs)


pair("v1_dispatch_deterministic", topology=V1_INTRA)(_deterministic_dispatch)

_dispatch_edit("v1_dispatch_x_tuple_arity", _set(x=lambda e, c: fp8(c.kwargs["x"]) + (None,)),
               neighbour=_set(x=lambda e, c: fp8(c.kwargs["x"])), doc="x a 3-tuple (neighbour: (x_fp8, scales))")
_dispatch_edit("v1_dispatch_missing_layout", _set(num_tokens_per_rank=lambda e, c: None),
               doc="no handle and num_tokens_per_rank=None")
_dispatch_edit("v1_dispatch_config_odd_sms", _set(config=lambda e, c: default_config(e, num_sms=21)),
               neighbour=_set(config=lambda e, c: default_config(e, num_sms=22)), doc="explicit config with 21 SMs")
_dispatch_edit("v1_dispatch_is_token_in_rank_dtype",
               _set(is_token_in_rank=lambda e, c: _kw("is_token_in_rank")(e, c).int()),
               doc="is_token_in_rank as int32")
_dispatch_edit("v1_dispatch_tokens_per_expert_dtype",
               _set(num_tokens_per_expert=lambda e, c: _kw("num_tokens_per_expert")(e, c).long()),
               doc="num_tokens_per_expert as int64")
_dispatch_edit("v1_dispatch_tokens_per_rank_dtype",
               _set(num_tokens_per_rank=lambda e, c: _kw("num_tokens_per_rank")(e, c).long()),
               doc="num_tokens_per_rank as int64")
_dispatch_edit("v1_dispatch_x_dim_contiguous", _set(x=lambda e, c: c.kwargs["x"].unsqueeze(0)), doc="a 3-D x")
_dispatch_edit("v1_dispatch_hidden_bytes", _set(x=lambda e, c: narrow_hidden(c.kwargs["x"], 12)),
               neighbour=_set(x=lambda e, c: narrow_hidden(c.kwargs["x"], 16)),
               doc="x with 12 columns (24 bytes, not a multiple of 16); neighbour: 16 columns")
_dispatch_edit("v1_dispatch_is_token_in_rank_dim_contiguous",
               _set(is_token_in_rank=lambda e, c: c.kwargs["is_token_in_rank"].unsqueeze(0)),
               doc="a 3-D is_token_in_rank")
_dispatch_edit("v1_dispatch_is_token_in_rank_shape",
               _set(is_token_in_rank=lambda e, c: extra_col(c.kwargs["is_token_in_rank"], False)),
               doc="is_token_in_rank with one column too many")
_dispatch_edit("v1_dispatch_tokens_per_expert_dim",
               _set(num_tokens_per_expert=lambda e, c: c.kwargs["num_tokens_per_expert"].unsqueeze(0)),
               doc="a 2-D num_tokens_per_expert")
_dispatch_edit("v1_dispatch_experts_not_divisible",
               _set(num_tokens_per_expert=lambda e, c: extra_row(c.kwargs["num_tokens_per_expert"])),
               requires=several_ranks, doc="num_tokens_per_expert of num_experts + 1 entries")
_dispatch_edit("v1_dispatch_too_many_local_experts_1024",
               _set(num_tokens_per_expert=lambda e, c: torch.zeros(e.world_size * 1025, dtype=torch.int32,
                                                                   device=e.device)),
               neighbour=_set(num_tokens_per_expert=lambda e, c: torch.zeros(e.world_size * 128, dtype=torch.int32,
                                                                             device=e.device)),
               doc="1025 local experts (neighbour: 128)")
_dispatch_edit("v1_dispatch_tokens_per_rank_dim",
               _set(num_tokens_per_rank=lambda e, c: c.kwargs["num_tokens_per_rank"].unsqueeze(0)),
               doc="a 2-D num_tokens_per_rank")
_dispatch_edit("v1_dispatch_tokens_per_rank_size",
               _set(num_tokens_per_rank=lambda e, c: extra_row(c.kwargs["num_tokens_per_rank"])),
               doc="num_tokens_per_rank with num_ranks + 1 entries")
_dispatch_edit("v1_dispatch_topk_pairing", _set(topk_weights=lambda e, c: None),
               neighbour=_set(topk_weights=lambda e, c: None, topk_idx=lambda e, c: None),
               doc="topk_idx without topk_weights (neighbour: neither)")
_dispatch_edit("v1_dispatch_topk_1d", _set(topk_idx=lambda e, c: c.kwargs["topk_idx"][:, 0].contiguous()),
               doc="a 1-D topk_idx")
_dispatch_edit("v1_dispatch_num_experts_positive",
               _set(num_tokens_per_expert=lambda e, c: torch.zeros(0, dtype=torch.int32, device=e.device)),
               doc="top-k given with an empty num_tokens_per_expert")
_dispatch_edit("v1_dispatch_topk_dim_contiguous", _set(topk_idx=lambda e, c: c.kwargs["topk_idx"].unsqueeze(-1)),
               doc="a 3-D topk_idx")
_dispatch_edit("v1_dispatch_weights_dim_contiguous",
               _set(topk_weights=lambda e, c: c.kwargs["topk_weights"].unsqueeze(-1)), doc="3-D topk_weights")
_dispatch_edit("v1_dispatch_topk_rows",
               _set(topk_idx=lambda e, c: extra_row(c.kwargs["topk_idx"], -1),
                    topk_weights=lambda e, c: extra_row(c.kwargs["topk_weights"])),
               doc="topk_idx / topk_weights with one row more than x")
_dispatch_edit("v1_dispatch_weights_cols", _set(topk_weights=lambda e, c: extra_col(c.kwargs["topk_weights"])),
               doc="topk_weights with num_topk + 1 columns")
_dispatch_edit("v1_dispatch_weights_dtype", _set(topk_weights=lambda e, c: c.kwargs["topk_weights"].bfloat16()),
               doc="bfloat16 topk_weights")
_dispatch_edit("v1_dispatch_topk_dtype", _set(topk_idx=lambda e, c: c.kwargs["topk_idx"].int()),
               doc="int32 topk_idx (with an int64 layout)")
_dispatch_edit("v1_dispatch_fp8_x_elem_size", _set(x=lambda e, c: (c.kwargs["x"], fp8(c.kwargs["x"])[1])),
               neighbour=_set(x=lambda e, c: fp8(c.kwargs["x"])), doc="a (bf16 x, scales) tuple")
_dispatch_edit("v1_dispatch_fp8_scales_dtype",
               _set(x=lambda e, c: (fp8(c.kwargs["x"])[0], fp8(c.kwargs["x"])[1].double())),
               neighbour=_set(x=lambda e, c: (fp8(c.kwargs["x"])[0], fp8(c.kwargs["x"])[1].int())),
               doc="float64 FP8 scales (neighbour: int32, packed UE8M0)")
_dispatch_edit("v1_dispatch_fp8_scales_dim",
               _set(x=lambda e, c: (fp8(c.kwargs["x"])[0], fp8(c.kwargs["x"])[1].unsqueeze(0))),
               neighbour=_set(x=lambda e, c: fp8(c.kwargs["x"])), doc="3-D FP8 scales")
_dispatch_edit("v1_dispatch_fp8_scales_rows",
               _set(x=lambda e, c: (fp8(c.kwargs["x"])[0], extra_row(fp8(c.kwargs["x"])[1]))),
               neighbour=_set(x=lambda e, c: fp8(c.kwargs["x"])), doc="FP8 scales with one row too many")
_dispatch_edit("v1_dispatch_alloc_on_comm_stream", _set(allocate_on_comm_stream=lambda e, c: True),
               neighbour=_set(allocate_on_comm_stream=lambda e, c: True, async_finish=lambda e, c: True,
                              previous_event=lambda e, c: c.buffer.capture()),
               doc="allocate_on_comm_stream=True without previous_event / async_finish")
_dispatch_edit("v1_dispatch_too_many_local_experts_128",
               _set(num_tokens_per_expert=lambda e, c: torch.zeros(e.world_size * 129, dtype=torch.int32,
                                                                   device=e.device)),
               neighbour=_set(num_tokens_per_expert=lambda e, c: torch.zeros(e.world_size * 128, dtype=torch.int32,
                                                                             device=e.device)),
               doc="129 local experts (the notify kernel's limit; neighbour: 128)")
_dispatch_edit("v1_dispatch_worst_tokens_needs_topk",
               _set(num_worst_tokens=lambda e, c: e.example.num_max_tokens_per_rank * e.world_size,
                    topk_idx=lambda e, c: None, topk_weights=lambda e, c: None),
               neighbour=_set(num_worst_tokens=lambda e, c: e.example.num_max_tokens_per_rank * e.world_size),
               doc="num_worst_tokens without top-k (neighbour: with it)")
_dispatch_edit("v1_dispatch_zero_sms_launch", _set(config=lambda e, c: default_config(e, num_sms=0)),
               neighbour=_set(config=lambda e, c: default_config(e, num_sms=2)), doc="a config of 0 SMs")
_dispatch_edit("v1_dispatch_too_many_sms_launch", _set(config=lambda e, c: default_config(e, num_sms=134)),
               neighbour=_set(config=lambda e, c: default_config(e, num_sms=132)),
               doc="a config of 134 SMs (more cooperative blocks than an H200 has SMs; neighbour: 132)")


@pair("v1_dispatch_nvl_bytes_notify", topology=V1_INTRA)
def _(env: BadCallEnv, bad: bool) -> None:
    """Buffer(group) with num_nvl_bytes=0 (the default); neighbour: the adapter's buffer."""
    call = env.v1_args(env.v1_buffer(num_nvl_bytes=0) if bad else None)
    call.buffer.dispatch(**call.kwargs)


def _nvl_bytes_for_dispatch(env: BadCallEnv) -> int:
    ex = env.example
    return align(v1_dispatch_nvl_bytes(env.world_size, default_config_values(env), ex.hidden * 2, ex.num_topk, 0),
                 V1_ALIGNMENT)


@pair("v1_dispatch_nvl_bytes_data", topology=V1_INTRA)
def _(env: BadCallEnv, bad: bool) -> None:
    """num_nvl_bytes one alignment unit below what the channel queues need; neighbour: exactly enough."""
    need = _nvl_bytes_for_dispatch(env)
    call = env.v1_args(env.v1_buffer(num_nvl_bytes=need - V1_ALIGNMENT if bad else need))
    call.buffer.dispatch(**call.kwargs)


@pair("v1_dispatch_scale_stride", topology=V1_INTRA)
def _(env: BadCallEnv, bad: bool) -> None:
    """A zero-token FP8 dispatch whose scales have a 2**30 column stride (2 columns: 2**31 >= INT_MAX)."""
    call = env.v1_args()
    x = call.kwargs["x"][:0]
    stride = (1 << 30) if bad else 1
    scales = torch.empty(0, dtype=torch.float32, device=env.device).as_strided((0, 2), (2, stride))
    call.kwargs.update(x=(x.to(torch.float8_e4m3fn), scales), topk_idx=call.kwargs["topk_idx"][:0],
                       topk_weights=call.kwargs["topk_weights"][:0],
                       is_token_in_rank=call.kwargs["is_token_in_rank"][:0])
    call.buffer.dispatch(**call.kwargs)


@pair("v1_dispatch_unsupported_ranks", topology="one-rank")
def _(env: BadCallEnv, bad: bool) -> None:
    """A 1-rank dispatch with an explicit config (no kernel for 1 rank); neighbour: the layout alone."""
    call = env.v1_args()
    if bad:
        call.buffer.dispatch(**call.kwargs, config=env.module.Config(20, 6, 256, 6, 128))


# ---------------------------------------------------------------------------------------- cached dispatch
def _cached_edit(row: str, edit: Callable[[BadCallEnv, V1Call, list], None], doc: str,
                 requires: Callable = _always) -> None:
    """Register a cached V1 dispatch recipe: a valid dispatch, then a cached one with ``edit`` applied to
    ``[handle as list, kwargs]``."""

    @pair(row, requires, V1_INTRA)
    def _(env: BadCallEnv, bad: bool) -> None:
        done = env.valid_v1_dispatch()
        state = [list(done.handle), {"x": env.inputs.x}]
        if bad:
            edit(env, done, state)
        done.buffer.dispatch(handle=tuple(state[0]), **state[1])

    RECIPES[row].__doc__ = RECIPES[f"{row}.ok"].__doc__ = doc


def _handle_entry(i: int, change: Callable[[torch.Tensor], torch.Tensor]) -> Callable:
    def edit(env: BadCallEnv, done: V1Call, state: list) -> None:
        state[0][i] = change(state[0][i])

    return edit


_cached_edit("v1_dispatch_cached_with_topk",
             lambda e, d, s: s[1].update(topk_idx=e.inputs.topk_idx, topk_weights=e.inputs.topk_weights),
             "a cached dispatch given topk_idx / topk_weights")
_cached_edit("v1_dispatch_cached_handle_arity", lambda e, d, s: s.__setitem__(0, s[0][:5]),
             "a cached dispatch with the first 5 entries of the handle")
_cached_edit("v1_dispatch_cached_rank_prefix_dtype", _handle_entry(0, lambda t: t.long()),
             "handle[0] (rank_prefix_matrix) as int64")
_cached_edit("v1_dispatch_cached_channel_prefix_dtype", _handle_entry(1, lambda t: t.long()),
             "handle[1] (channel_prefix_matrix) as int64")
_cached_edit("v1_dispatch_cached_rank_prefix_shape", _handle_entry(0, lambda t: t.unsqueeze(0)),
             "handle[0] 3-D")
_cached_edit("v1_dispatch_cached_rank_prefix_size", _handle_entry(0, lambda t: extra_row(t)),
             "handle[0] with num_ranks + 1 rows (a foreign handle)")
_cached_edit("v1_dispatch_cached_channel_prefix_shape", _handle_entry(1, lambda t: t.unsqueeze(0)),
             "handle[1] 3-D")
_cached_edit("v1_dispatch_cached_channel_count",
             lambda e, d, s: s[1].update(config=default_config(e, num_sms=e.module.Buffer.num_sms + 2)),
             "a cached dispatch with 2 SMs more than the dispatch that made the handle")


# ------------------------------------------------------------------------------------------------ combine
def _combine_edit(row: str, edit: Callable[[BadCallEnv, V1Call, dict], None], doc: str,
                  requires: Callable = _always, topology: str = V1_INTRA,
                  neighbour: Callable[[BadCallEnv, V1Call, dict], None] | None = None,
                  buffer: Callable[[BadCallEnv, bool], Any] | None = None) -> None:
    """Register a V1 combine recipe: a valid dispatch, then its combine with ``edit`` applied to a dict of
    ``x``, ``handle`` (a list), ``topk_weights`` and the other keyword arguments."""

    @pair(row, requires, topology)
    def _(env: BadCallEnv, bad: bool) -> None:
        done = env.valid_v1_dispatch()
        args = {"x": done.recv_x, "handle": list(done.handle), "topk_weights": done.recv_topk_weights}
        if bad:
            edit(env, done, args)
        elif neighbour is not None:
            neighbour(env, done, args)
        args["handle"] = tuple(args["handle"])
        target = buffer(env, bad) if buffer is not None else done.buffer
        target.combine(**args)

    RECIPES[row].__doc__ = RECIPES[f"{row}.ok"].__doc__ = doc


def _arg(name: str, change: Callable[[BadCallEnv, V1Call, dict], Any]) -> Callable:
    return lambda env, done, args: args.__setitem__(name, change(env, done, args))


def _hentry(i: int, change: Callable[[torch.Tensor], torch.Tensor]) -> Callable:
    def edit(env: BadCallEnv, done: V1Call, args: dict) -> None:
        args["handle"][i] = change(args["handle"][i])

    return edit


def _bias(env: BadCallEnv, done: V1Call, rows_delta: int = 0, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.zeros(env.inputs.x.shape[0] + rows_delta, env.example.hidden, dtype=dtype, device=env.device)


@pair("v1_combine_deterministic", topology=V1_INTRA)
def _(env: BadCallEnv, bad: bool) -> None:
    """combine with torch's deterministic algorithms on (and uninitialised memory filled)."""
    done = env.valid_v1_dispatch()
    with deterministic_algorithms(fill_uninitialized_memory=bad):
        done.buffer.combine(done.recv_x, done.handle, topk_weights=done.recv_topk_weights)


_combine_edit("v1_combine_handle_arity", lambda e, d, a: a.__setitem__("handle", a["handle"][:5]),
              "combine with the first 5 entries of the handle")
_combine_edit("v1_combine_bias_tuple", _arg("bias", lambda e, d, a: (_bias(e, d),) * 3),
              "a 3-tuple bias", neighbour=_arg("bias", lambda e, d, a: (_bias(e, d),) * 2))
_combine_edit("v1_combine_x_dim_contiguous", _arg("x", lambda e, d, a: a["x"].unsqueeze(0)), "a 3-D x")
_combine_edit("v1_combine_handle_tensor_733", _hentry(3, lambda t: t.long()), "handle[3] (recv_src_idx) as int64")
_combine_edit("v1_combine_handle_tensor_734", _hentry(5, lambda t: t.long()), "handle[5] (send_head) as int64")
_combine_edit("v1_combine_handle_tensor_735", _hentry(0, lambda t: t.long()), "handle[0] as int64")
_combine_edit("v1_combine_handle_tensor_737", _hentry(2, lambda t: t.long()), "handle[2] as int64")
_combine_edit("v1_combine_config_odd_sms", _arg("config", lambda e, d, a: default_config(e, True, 21)),
              "a combine config of 21 SMs",
              neighbour=_arg("config", lambda e, d, a: default_config(e, True, e.module.Buffer.num_sms)))
_combine_edit("v1_combine_x_rows", _arg("x", lambda e, d, a: extra_row(a["x"])), "x with one row too many")
_combine_edit("v1_combine_send_head_ranks", _hentry(5, lambda t: extra_col(t, -1)),
              "handle[5] with num_ranks + 1 columns (a foreign handle)")
_combine_edit("v1_combine_rank_prefix_shape", _hentry(0, lambda t: extra_row(t)),
              "handle[0] with num_ranks + 1 rows (a foreign handle)")
_combine_edit("v1_combine_channel_count",
              _arg("config", lambda e, d, a: default_config(e, True, e.module.Buffer.num_sms + 2)),
              "a combine config with 2 SMs more than the dispatch",
              neighbour=_arg("config", lambda e, d, a: default_config(e, True, e.module.Buffer.num_sms)))
_combine_edit("v1_combine_hidden_bytes", _arg("x", lambda e, d, a: narrow_hidden(a["x"], 12)),
              "x with 12 columns (24 bytes)")
_combine_edit("v1_combine_alloc_on_comm_stream", _arg("allocate_on_comm_stream", lambda e, d, a: True),
              "allocate_on_comm_stream=True without previous_event / async_finish",
              neighbour=lambda e, d, a: a.update(allocate_on_comm_stream=True, async_finish=True,
                                                 previous_event=d.buffer.capture()))
_combine_edit("v1_combine_weights_dim_contiguous", _arg("topk_weights", lambda e, d, a: a["topk_weights"].unsqueeze(0)),
              "3-D topk_weights")
_combine_edit("v1_combine_weights_rows", _arg("topk_weights", lambda e, d, a: extra_row(a["topk_weights"])),
              "topk_weights with one row too many")
_combine_edit("v1_combine_weights_dtype", _arg("topk_weights", lambda e, d, a: a["topk_weights"].bfloat16()),
              "bfloat16 topk_weights")
_combine_edit("v1_combine_bias_dim", _arg("bias", lambda e, d, a: _bias(e, d).unsqueeze(0)), "a 3-D bias",
              neighbour=_arg("bias", lambda e, d, a: _bias(e, d)))
_combine_edit("v1_combine_bias_dtype", _arg("bias", lambda e, d, a: _bias(e, d, dtype=torch.float32)),
              "a float32 bias", neighbour=_arg("bias", lambda e, d, a: _bias(e, d)))
_combine_edit("v1_combine_bias_shape", _arg("bias", lambda e, d, a: _bias(e, d, rows_delta=1)),
              "a bias with one row too many", neighbour=_arg("bias", lambda e, d, a: _bias(e, d)))
_combine_edit("v1_combine_x_dtype", _arg("x", lambda e, d, a: a["x"].float()), "float32 expert outputs")


def _combine_buffer(need: Callable[[BadCallEnv], int], short: int) -> Callable[[BadCallEnv, bool], Any]:
    return lambda env, bad: env.v1_buffer(num_nvl_bytes=need(env) - (short if bad else 0))


def _combine_bytes(env: BadCallEnv) -> int:
    ex = env.example
    return align(v1_combine_nvl_bytes(env.world_size, default_config_values(env, True), ex.hidden * 2, ex.num_topk),
                 V1_ALIGNMENT)


_combine_edit("v1_combine_nvl_bytes_queue", lambda e, d, a: None,
              "combine on a buffer of 128 bytes (below the queue heads and tails; the handle from another buffer)",
              buffer=lambda env, bad: env.v1_buffer(num_nvl_bytes=V1_ALIGNMENT) if bad else env.v1_buffer(
                  num_nvl_bytes=_combine_bytes(env)))
_combine_edit("v1_combine_nvl_bytes_data", lambda e, d, a: None,
              "combine on a buffer one alignment unit below what the combine queues need (neighbour: exactly "
              "enough; the handle from another buffer)", buffer=_combine_buffer(_combine_bytes, V1_ALIGNMENT))


# -------------------------------------------------------------------------------------- internode (V1)
def _inter_edit(row: str, edit: Callable[[BadCallEnv, V1Call], None], doc: str, requires: Callable = _always,
                neighbour: Callable[[BadCallEnv, V1Call], None] | None = None) -> None:
    _dispatch_edit(row, edit, requires, V1_INTER, neighbour, doc)


_inter_edit("v1_internode_worst_tokens", _set(num_worst_tokens=lambda e, c: 64),
            "num_worst_tokens on an internode buffer")
_inter_edit("v1_internode_missing_layout", _set(num_tokens_per_expert=lambda e, c: None),
            "no handle and num_tokens_per_expert=None")
_inter_edit("v1_internode_odd_sms", _set(config=lambda e, c: default_config(e, num_sms=21)), "a config of 21 SMs",
            neighbour=_set(config=lambda e, c: default_config(e, num_sms=22)))
_inter_edit("v1_internode_missing_rdma_layout", _set(num_tokens_per_rdma_rank=lambda e, c: None),
            "num_tokens_per_rdma_rank=None")
_inter_edit("v1_internode_dtype_num_tokens_per_rank",
            _set(num_tokens_per_rank=lambda e, c: c.kwargs["num_tokens_per_rank"].long()), "int64 num_tokens_per_rank")
_inter_edit("v1_internode_dtype_num_tokens_per_rdma_rank",
            _set(num_tokens_per_rdma_rank=lambda e, c: c.kwargs["num_tokens_per_rdma_rank"].long()),
            "int64 num_tokens_per_rdma_rank")
_inter_edit("v1_internode_dtype_num_tokens_per_expert",
            _set(num_tokens_per_expert=lambda e, c: c.kwargs["num_tokens_per_expert"].long()),
            "int64 num_tokens_per_expert")
_inter_edit("v1_internode_x_dim_contiguous", _set(x=lambda e, c: c.kwargs["x"].unsqueeze(0)), "a 3-D x")
_inter_edit("v1_internode_hidden_bytes", _set(x=lambda e, c: narrow_hidden(c.kwargs["x"], 12)),
            "x of 12 columns (24 bytes)", neighbour=_set(x=lambda e, c: narrow_hidden(c.kwargs["x"], 16)))
_inter_edit("v1_internode_layout_943",
            _set(num_tokens_per_rank=lambda e, c: c.kwargs["num_tokens_per_rank"].unsqueeze(0)),
            "2-D num_tokens_per_rank")
_inter_edit("v1_internode_layout_944",
            _set(num_tokens_per_rdma_rank=lambda e, c: c.kwargs["num_tokens_per_rdma_rank"].unsqueeze(0)),
            "2-D num_tokens_per_rdma_rank")
_inter_edit("v1_internode_layout_945",
            _set(num_tokens_per_expert=lambda e, c: c.kwargs["num_tokens_per_expert"].unsqueeze(0)),
            "2-D num_tokens_per_expert")
_inter_edit("v1_internode_layout_946",
            _set(num_tokens_per_rank=lambda e, c: extra_row(c.kwargs["num_tokens_per_rank"])),
            "num_tokens_per_rank with num_ranks + 1 entries")
_inter_edit("v1_internode_layout_947",
            _set(num_tokens_per_rdma_rank=lambda e, c: extra_row(c.kwargs["num_tokens_per_rdma_rank"])),
            "num_tokens_per_rdma_rank with one entry per node + 1")
_inter_edit("v1_internode_experts_not_divisible",
            _set(num_tokens_per_expert=lambda e, c: extra_row(c.kwargs["num_tokens_per_expert"])),
            "num_experts + 1 entries in num_tokens_per_expert")
_inter_edit("v1_internode_layout_949",
            _set(num_tokens_per_expert=lambda e, c: torch.zeros(e.world_size * 1025, dtype=torch.int32,
                                                                device=e.device)),
            "1025 local experts")
_inter_edit("v1_internode_topk_pairing", _set(topk_weights=lambda e, c: None), "topk_idx without topk_weights",
            neighbour=_set(topk_weights=lambda e, c: None, topk_idx=lambda e, c: None))
_inter_edit("v1_internode_topk_1d", _set(topk_idx=lambda e, c: c.kwargs["topk_idx"][:, 0].contiguous()), "1-D topk_idx")
_inter_edit("v1_internode_topk_963",
            _set(num_tokens_per_expert=lambda e, c: torch.zeros(0, dtype=torch.int32, device=e.device)),
            "top-k with an empty num_tokens_per_expert")
_inter_edit("v1_internode_topk_964", _set(topk_idx=lambda e, c: c.kwargs["topk_idx"].unsqueeze(-1)), "3-D topk_idx")
_inter_edit("v1_internode_topk_965", _set(topk_weights=lambda e, c: c.kwargs["topk_weights"].unsqueeze(-1)),
            "3-D topk_weights")
_inter_edit("v1_internode_topk_966", _set(topk_idx=lambda e, c: extra_row(c.kwargs["topk_idx"], -1),
                                          topk_weights=lambda e, c: extra_row(c.kwargs["topk_weights"])),
            "top-k with one row more than x")
_inter_edit("v1_internode_topk_967", _set(topk_weights=lambda e, c: extra_col(c.kwargs["topk_weights"])),
            "topk_weights with num_topk + 1 columns")
_inter_edit("v1_internode_weights_dtype", _set(topk_weights=lambda e, c: c.kwargs["topk_weights"].bfloat16()),
            "bfloat16 topk_weights")
_inter_edit("v1_internode_topk_dtype", _set(topk_idx=lambda e, c: c.kwargs["topk_idx"].int()), "int32 topk_idx")
_inter_edit("v1_internode_fp8_977", _set(x=lambda e, c: (c.kwargs["x"], fp8(c.kwargs["x"])[1])),
            "a (bf16 x, scales) tuple", neighbour=_set(x=lambda e, c: fp8(c.kwargs["x"])))
_inter_edit("v1_internode_fp8_978", _set(x=lambda e, c: (fp8(c.kwargs["x"])[0], fp8(c.kwargs["x"])[1].double())),
            "float64 scales", neighbour=_set(x=lambda e, c: fp8(c.kwargs["x"])))
_inter_edit("v1_internode_fp8_979", _set(x=lambda e, c: (fp8(c.kwargs["x"])[0], fp8(c.kwargs["x"])[1].unsqueeze(0))),
            "3-D scales", neighbour=_set(x=lambda e, c: fp8(c.kwargs["x"])))
_inter_edit("v1_internode_fp8_980", _set(x=lambda e, c: (fp8(c.kwargs["x"])[0], extra_row(fp8(c.kwargs["x"])[1]))),
            "scales with one row too many", neighbour=_set(x=lambda e, c: fp8(c.kwargs["x"])))
_inter_edit("v1_internode_alloc_on_comm_stream", _set(allocate_on_comm_stream=lambda e, c: True),
            "allocate_on_comm_stream=True without previous_event / async_finish",
            neighbour=_set(allocate_on_comm_stream=lambda e, c: True, async_finish=lambda e, c: True,
                           previous_event=lambda e, c: c.buffer.capture()))
_inter_edit("v1_internode_rdma_clean_meta", _set(x=lambda e, c: fp8(c.kwargs["x"], num_scales=2048)),
            "FP8 x with 2048 scale columns: the RDMA clean metadata outgrows the RDMA size hint",
            neighbour=_set(x=lambda e, c: fp8(c.kwargs["x"])))
_inter_edit("v1_internode_rdma_bytes_int",
            _set(config=lambda e, c: e.module.Config(e.module.Buffer.num_sms, 36, 288, 20, 40000)),
            "an RDMA receive queue of 40000 tokens: the RDMA size hint reaches INT_MAX",
            neighbour=_set(config=lambda e, c: e.module.Config(e.module.Buffer.num_sms, 36, 288, 20, 128)))


@pair("v1_internode_nvl_clean_meta", topology=V1_INTER)
def _(env: BadCallEnv, bad: bool) -> None:
    """An internode dispatch on a buffer of 128 NVLink bytes."""
    call = env.v1_args(env.v1_buffer(num_nvl_bytes=V1_ALIGNMENT) if bad else None)
    call.buffer.dispatch(**call.kwargs)


@pair("v1_internode_scale_stride", topology=V1_INTER)
def _(env: BadCallEnv, bad: bool) -> None:
    """A zero-token FP8 internode dispatch whose scales have a 2**30 column stride."""
    call = env.v1_args()
    stride = (1 << 30) if bad else 1
    scales = torch.empty(0, dtype=torch.float32, device=env.device).as_strided((0, 2), (2, stride))
    call.kwargs.update(x=(call.kwargs["x"][:0].to(torch.float8_e4m3fn), scales), topk_idx=call.kwargs["topk_idx"][:0],
                       topk_weights=call.kwargs["topk_weights"][:0],
                       is_token_in_rank=call.kwargs["is_token_in_rank"][:0])
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


@pair("v1_internode_rdma_ranks", topology=V1_INTER)
def _(env: BadCallEnv, bad: bool) -> None:
    """84 nodes (> 20 RDMA peers): a low-latency buffer on a stand-in group of 168 ranks in nodes of 2."""
    if bad:
        _stand_in_internode(env, 168, 2, low_latency_mode=True)
    else:
        env.valid_v1_dispatch()


@pair("v1_internode_unsupported_rdma_ranks", topology=V1_INTER)
def _(env: BadCallEnv, bad: bool) -> None:
    """5 nodes of 8 (no kernel for 5 RDMA ranks): a stand-in group of 40 ranks with LOCAL_WORLD_SIZE=8."""
    if bad:
        _stand_in_internode(env, 40, 8, low_latency_mode=False)
    else:
        env.valid_v1_dispatch()


def _inter_cached(row: str, edit: Callable[[BadCallEnv, V1Call, list], None], doc: str) -> None:
    @pair(row, topology=V1_INTER)
    def _(env: BadCallEnv, bad: bool) -> None:
        done = env.valid_v1_dispatch()
        state = [list(done.handle), {"x": env.inputs.x}]
        if bad:
            edit(env, done, state)
        done.buffer.dispatch(handle=tuple(state[0]), **state[1])

    RECIPES[row].__doc__ = RECIPES[f"{row}.ok"].__doc__ = doc


_inter_cached("v1_internode_cached_with_topk",
              lambda e, d, s: s[1].update(topk_idx=e.inputs.topk_idx, topk_weights=e.inputs.topk_weights),
              "a cached internode dispatch given top-k")
_inter_cached("v1_internode_cached_handle_arity", lambda e, d, s: s.__setitem__(0, s[0][:6]),
              "a cached internode dispatch with a 6-entry handle")
for _i, _row in ((1, "918"), (4, "919"), (2, "920"), (6, "921")):
    _inter_cached(f"v1_internode_cached_dtype_{_row}", _handle_entry(_i, lambda t: t.long()),
                  f"handle[{_i}] as int64")
for _i, _row in ((1, "932"), (4, "935"), (2, "937"), (6, "940")):
    _inter_cached(f"v1_internode_cached_shape_{_row}", _handle_entry(_i, lambda t: t.unsqueeze(0)),
                  f"handle[{_i}] with an extra dimension")
for _i, _row in ((4, "936"), (6, "941")):
    _inter_cached(f"v1_internode_cached_shape_{_row}", _handle_entry(_i, lambda t: extra_row(t)),
                  f"handle[{_i}] with one entry too many (a foreign handle)")
_inter_cached("v1_internode_cached_shape_933",
              lambda e, d, s: s[1].update(config=default_config(e, num_sms=e.module.Buffer.num_sms + 2)),
              "a cached internode dispatch with 2 SMs more than the dispatch")
_inter_cached("v1_internode_cached_shape_938",
              lambda e, d, s: (s[0].__setitem__(1, torch.zeros(e.num_nodes, e.module.Buffer.num_sms // 2 + 1,
                                                               dtype=torch.int32, device=e.device)),
                               s[1].update(config=default_config(e, num_sms=e.module.Buffer.num_sms + 2))),
              "a cached internode dispatch with 2 SMs more, and handle[1] edited to match it")
_inter_cached("v1_internode_cached_notify_1515",
              lambda e, d, s: s[1].update(x=fp8(e.inputs.x, num_scales=2048)),
              "a cached internode dispatch of FP8 x with 2048 scale columns (RDMA clean metadata > hint)")


@pair("v1_internode_cached_notify_1519", topology=V1_INTER)
def _(env: BadCallEnv, bad: bool) -> None:
    """A dispatch with a 2-SM config, then its cached dispatch with the same config (one channel)."""
    num_sms = 2 if bad else 4
    config = env.module.Config(num_sms, 36, 288, 20, 128)
    done = env.valid_v1_dispatch(config=config)
    done.buffer.dispatch(env.inputs.x, handle=done.handle, config=config)


def _inter_combine(row: str, edit: Callable[[BadCallEnv, V1Call, dict], None], doc: str,
                   neighbour: Callable | None = None, buffer: Callable | None = None) -> None:
    _combine_edit(row, edit, doc, topology=V1_INTER, neighbour=neighbour, buffer=buffer)


def _combine_config(*values: int) -> Callable:
    return _arg("config", lambda e, d, a: e.module.Config(e.module.Buffer.num_sms, *values))


_inter_combine("v1_internode_combine_handle_arity", lambda e, d, a: a.__setitem__("handle", a["handle"][:6]),
               "combine with a 6-entry handle")
_inter_combine("v1_internode_combine_odd_sms", _arg("config", lambda e, d, a: default_config(e, True, 21)),
               "a combine config of 21 SMs")
_inter_combine("v1_internode_combine_x", _arg("x", lambda e, d, a: a["x"].unsqueeze(0)), "3-D x")
_inter_combine("v1_internode_combine_handle_1269", _hentry(7, lambda t: t.view(torch.int32)),
               "handle[7] (SourceMeta bytes) as int32")
_inter_combine("v1_internode_combine_handle_1270", _hentry(0, lambda t: t.int()), "handle[0] as int32")
for _i, _row in ((3, "1272"), (4, "1274"), (5, "1276"), (8, "1278"), (9, "1280")):
    _inter_combine(f"v1_internode_combine_handle_{_row}", _hentry(_i, lambda t: t.long()), f"handle[{_i}] as int64")
_inter_combine("v1_internode_combine_hidden_bytes", _arg("x", lambda e, d, a: narrow_hidden(a["x"], 12)),
               "x of 12 columns")
_inter_combine("v1_internode_combine_handle_1286", _hentry(7, lambda t: extra_col(t)),
               "handle[7] with 9 bytes per row")
_inter_combine("v1_internode_combine_handle_1287", _hentry(0, lambda t: extra_col(t, False)),
               "handle[0] with num_ranks + 1 columns")
_inter_combine("v1_internode_combine_handle_1289", _hentry(4, lambda t: extra_row(t)),
               "handle[4] with one entry per node + 1")
_inter_combine("v1_internode_combine_handle_1291", _hentry(8, lambda t: extra_row(t)),
               "handle[8] with one row too many")
_inter_combine("v1_internode_combine_handle_1293", _hentry(9, lambda t: extra_col(t, -1)),
               "handle[9] with 9 columns")
_inter_combine("v1_internode_combine_channel_count_1288",
               _arg("config", lambda e, d, a: default_config(e, True, e.module.Buffer.num_sms + 2)),
               "a combine config with 2 SMs more than the dispatch")
_inter_combine("v1_internode_combine_channel_count_1290",
               lambda e, d, a: (a["handle"].__setitem__(3, torch.zeros(e.num_nodes, e.module.Buffer.num_sms // 2 + 1,
                                                                       dtype=torch.int32, device=e.device)),
                                a.update(config=default_config(e, True, e.module.Buffer.num_sms + 2))),
               "a combine config with 2 SMs more, handle[3] edited to match it")
_inter_combine("v1_internode_combine_alloc_on_comm_stream", _arg("allocate_on_comm_stream", lambda e, d, a: True),
               "allocate_on_comm_stream=True without previous_event / async_finish")
_inter_combine("v1_internode_combine_weights_1316",
               _arg("topk_weights", lambda e, d, a: a["topk_weights"].unsqueeze(0)), "3-D topk_weights")
_inter_combine("v1_internode_combine_weights_1317",
               _arg("topk_weights", lambda e, d, a: extra_row(a["topk_weights"])), "topk_weights with a row too many")
_inter_combine("v1_internode_combine_weights_dtype",
               _arg("topk_weights", lambda e, d, a: a["topk_weights"].bfloat16()), "bfloat16 topk_weights")
_inter_combine("v1_internode_combine_nvl_recv_divisible", _combine_config(4, 287, 12, 128),
               "nvl receive queue of 287 tokens (not a multiple of the node count)",
               neighbour=_combine_config(4, 288, 12, 128))
_inter_combine("v1_internode_combine_nvl_send_bound", _combine_config(200, 288, 12, 128),
               "nvl send chunk of 200 (> 288 / 2 nodes)", neighbour=_combine_config(4, 288, 12, 128))
_inter_combine("v1_internode_combine_bias_1359", _arg("bias", lambda e, d, a: _bias(e, d).unsqueeze(0)), "3-D bias",
               neighbour=_arg("bias", lambda e, d, a: _bias(e, d)))
_inter_combine("v1_internode_combine_bias_1360", _arg("bias", lambda e, d, a: _bias(e, d, dtype=torch.float32)),
               "float32 bias", neighbour=_arg("bias", lambda e, d, a: _bias(e, d)))
_inter_combine("v1_internode_combine_bias_1361", _arg("bias", lambda e, d, a: _bias(e, d, rows_delta=1)),
               "bias with one row too many", neighbour=_arg("bias", lambda e, d, a: _bias(e, d)))
_inter_combine("v1_internode_combine_chunk_bound", _combine_config(4, 16, 12, 128),
               "nvl receive queue of 16 tokens: 16 / 2 nodes <= the RDMA send chunk (12)",
               neighbour=_combine_config(4, 288, 12, 128))
_inter_combine("v1_internode_combine_forwarder_room", _combine_config(5, 32, 12, 128),
               "nvl receive queue of 32 tokens: 32 / 2 - 12 forwarder warps < the nvl send chunk (5)",
               neighbour=_combine_config(4, 32, 12, 128))
_inter_combine("v1_internode_combine_rdma_send_min", _combine_config(4, 288, 8, 128),
               "an RDMA send chunk of 8 tokens (< 12 warps per forwarder with 2 nodes)",
               neighbour=_combine_config(4, 288, 12, 128))
_inter_combine("v1_internode_combine_x_dtype", _arg("x", lambda e, d, a: a["x"].float()), "float32 expert outputs")
_inter_combine("v1_internode_cached_notify_1516", lambda e, d, a: None,
               "combine on a buffer of 128 NVLink bytes (the handle from another buffer)",
               buffer=lambda env, bad: env.v1_buffer(num_nvl_bytes=V1_ALIGNMENT) if bad else env.v1_buffer())
_inter_combine("v1_internode_cached_notify_1517", _combine_config(4, 288, 12, 40000),
               "an RDMA receive queue of 40000 tokens in the combine config: the RDMA hint reaches INT_MAX",
               neighbour=_combine_config(4, 288, 12, 128))


# ------------------------------------------------------------------------------------------- low latency (V1)
def _ll_dispatch(row: str, edit: Callable[[BadCallEnv, LLCall], None], doc: str, requires: Callable = _always,
                 topology: str = "any", neighbour: Callable[[BadCallEnv, LLCall], None] | None = None,
                 buffer: Callable[[BadCallEnv, bool], Any] | None = None) -> None:
    """Register a low-latency dispatch recipe: a valid ``low_latency_dispatch`` of the example (on the task's
    shared low-latency buffer, or on ``buffer(env, bad)``) with ``edit`` applied to its arguments."""

    @pair(row, requires, topology)
    def _(env: BadCallEnv, bad: bool) -> None:
        call = env.ll_args(buffer(env, bad) if buffer is not None else None)
        if bad:
            edit(env, call)
        elif neighbour is not None:
            neighbour(env, call)
        call.buffer.low_latency_dispatch(**call.kwargs)

    RECIPES[row].__doc__ = RECIPES[f"{row}.ok"].__doc__ = doc


def _ll_short_buffer(env: BadCallEnv, bad: bool) -> Any:
    """A private low-latency buffer of the example's layout rounded down below it (``bad``) or up to 128 bytes."""
    below = (ll_layout_bytes(env.ll_shape()) - 1) // V1_ALIGNMENT * V1_ALIGNMENT
    return env.ll_buffer(num_rdma_bytes=below if bad else below + V1_ALIGNMENT)


def _ll_cost(env: BadCallEnv, *shape: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """A ``*_wait_recv_cost_stats`` tensor (by default the valid one: int64, one per rank)."""
    return torch.zeros(shape or (env.world_size,), dtype=dtype, device=env.device)


def _ll_topk_of(env: BadCallEnv, num_topk: int, rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The example's routing and weights widened (-1 / 0 slots: "not selecting any expert") to ``num_topk``
    columns and, with ``rows``, padded with unrouted tokens to that many rows."""
    idx, w = env.inputs.topk_idx, env.inputs.topk_weights
    pad_cols = num_topk - idx.shape[1]
    idx = torch.cat([idx, idx.new_full((idx.shape[0], pad_cols), -1)], dim=1)
    w = torch.cat([w, w.new_zeros((w.shape[0], pad_cols))], dim=1)
    if rows is not None:
        idx = torch.cat([idx, idx.new_full((rows - idx.shape[0], num_topk), -1)])
        w = torch.cat([w, w.new_zeros((rows - w.shape[0], num_topk))])
    return idx, w


def _qp_tokens(env: BadCallEnv, buffer: Any) -> tuple[int, int]:
    """``(the smallest num_max_dispatch_tokens_per_rank the buffer's QP depth refuses, the largest it takes that
    keeps num_ranks * tokens a multiple of 4)`` (legacy.py:609, buffer.hpp:1526)."""
    depth = int(buffer.nvshmem_qp_depth)
    refused, taken = depth // 2, depth // 2 - 1
    while (env.world_size * taken) % 4:
        taken -= 1
    return refused, taken


@pair("v1_ll_dispatch_after_destroy")
def _(env: BadCallEnv, bad: bool) -> None:
    """low_latency_dispatch on a destroyed low-latency buffer (a private one)."""
    call = env.ll_args(env.ll_buffer(private=True))
    if bad:
        call.buffer.destroy()
    call.buffer.low_latency_dispatch(**call.kwargs)


@pair("v1_ll_dispatch_deterministic")
def _(env: BadCallEnv, bad: bool) -> None:
    """low_latency_dispatch with torch's deterministic algorithms on (and uninitialised memory filled)."""
    call = env.ll_args()
    with deterministic_algorithms(fill_uninitialized_memory=bad):
        call.buffer.low_latency_dispatch(**call.kwargs)


@pair("v1_ll_dispatch_qp_depth")
def _(env: BadCallEnv, bad: bool) -> None:
    """num_max_dispatch_tokens_per_rank one above what the QP depth allows (512 with the default depth 1024);
    neighbour: the largest the depth allows that keeps num_ranks * tokens a multiple of 4 (510 on 2 ranks), on
    a buffer sized for it."""
    refused, taken = _qp_tokens(env, env.ll_buffer())
    call = env.ll_args() if bad else env.ll_args(shape=env.ll_shape(num_max_tokens=taken))
    if bad:
        call.kwargs["num_max_dispatch_tokens_per_rank"] = refused
    call.buffer.low_latency_dispatch(**call.kwargs)


_ll_dispatch("v1_ll_dispatch_not_ll_buffer", lambda e, c: None,
             "low_latency_dispatch on a one-node buffer built without low_latency_mode (nvshmem_qp_depth never set)",
             topology="single", buffer=lambda env, bad: env.v1_buffer() if bad else None)
_ll_dispatch("v1_ll_dispatch_not_ll_mode", lambda e, c: None,
             "low_latency_dispatch on an internode buffer built without low_latency_mode",
             topology=V1_INTER, buffer=lambda env, bad: env.v1_buffer() if bad else None)
_ll_dispatch("v1_ll_dispatch_1478", _set(x=lambda e, c: c.kwargs["x"].float()), "float32 x")
_ll_dispatch("v1_ll_dispatch_1479", _set(x=lambda e, c: narrow_hidden(c.kwargs["x"], LL_HIDDEN - 16)),
             f"x of {LL_HIDDEN - 16} columns (a multiple of 16, not of 128)")
_ll_dispatch("v1_ll_dispatch_1480", _set(topk_idx=lambda e, c: c.kwargs["topk_idx"][:, 0].contiguous()),
             "a 1-D topk_idx")
_ll_dispatch("v1_ll_dispatch_1481", _set(topk_idx=lambda e, c: extra_row(c.kwargs["topk_idx"], -1)),
             "topk_idx with one row more than x (a rank-local check, refused after the verdict exchange)")
_ll_dispatch("v1_ll_dispatch_1482", _set(topk_idx=lambda e, c: c.kwargs["topk_idx"].int()), "int32 topk_idx")
_ll_dispatch("v1_ll_dispatch_1483", _set(num_experts=lambda e, c: c.kwargs["num_experts"] + 1),
             "num_experts + 1 experts", requires=several_ranks)
_ll_dispatch("v1_ll_dispatch_1487", _set(cumulative_local_expert_recv_stats=lambda e, c: _stats(e, dtype=torch.int64)),
             "int64 expert statistics", neighbour=_set(cumulative_local_expert_recv_stats=lambda e, c: _stats(e)))
_ll_dispatch("v1_ll_dispatch_1488",
             _set(cumulative_local_expert_recv_stats=lambda e, c: _stats(e).unsqueeze(0)), "2-D expert statistics",
             neighbour=_set(cumulative_local_expert_recv_stats=lambda e, c: _stats(e)))
_ll_dispatch("v1_ll_dispatch_1489",
             _set(cumulative_local_expert_recv_stats=lambda e, c: _stats(e, e.example.num_experts // e.world_size
                                                                             + 1)),
             "expert statistics of num_local_experts + 1 entries",
             neighbour=_set(cumulative_local_expert_recv_stats=lambda e, c: _stats(e)))
_ll_dispatch("v1_ll_dispatch_1492", _set(dispatch_wait_recv_cost_stats=lambda e, c: _ll_cost(e, dtype=torch.int32)),
             "int32 wait-cost statistics", neighbour=_set(dispatch_wait_recv_cost_stats=lambda e, c: _ll_cost(e)))
_ll_dispatch("v1_ll_dispatch_1493",
             _set(dispatch_wait_recv_cost_stats=lambda e, c: _ll_cost(e, e.world_size, e.world_size)),
             "[num_ranks, num_ranks] wait-cost statistics (the docstring's shape; the code wants 1-D)",
             neighbour=_set(dispatch_wait_recv_cost_stats=lambda e, c: _ll_cost(e)))
_ll_dispatch("v1_ll_dispatch_1494", _set(dispatch_wait_recv_cost_stats=lambda e, c: _ll_cost(e, e.world_size + 1)),
             "wait-cost statistics of num_ranks + 1 entries",
             neighbour=_set(dispatch_wait_recv_cost_stats=lambda e, c: _ll_cost(e)))
_ll_dispatch("v1_ll_dispatch_layout_150",
             _set(x=lambda e, c: narrow_hidden(c.kwargs["x"], 128), num_experts=lambda e, c: e.world_size,
                  num_max_dispatch_tokens_per_rank=lambda e, c: c.kwargs["num_max_dispatch_tokens_per_rank"] + 1),
             "hidden 128, one expert per rank and num_max_dispatch_tokens_per_rank + 1: the layout's send buffer "
             "(experts * tokens * 260 bytes) is not a multiple of 16", requires=lambda ex: ex.world_size % 4 != 0)
_ll_dispatch("v1_ll_dispatch_1503", lambda e, c: None,
             "a low-latency buffer one alignment unit short of the layout (neighbour: the layout rounded up to 128)",
             buffer=_ll_short_buffer)
_ll_dispatch("v1_ll_dispatch_1511", _set(async_finish=lambda e, c: True, return_recv_hook=lambda e, c: True),
             "async_finish=True with return_recv_hook=True (neighbour: the hook alone)",
             neighbour=_set(return_recv_hook=lambda e, c: True))
_ll_dispatch("v1_ll_dispatch_1526",
             _set(num_max_dispatch_tokens_per_rank=lambda e, c: c.kwargs["num_max_dispatch_tokens_per_rank"] + 1),
             "num_max_dispatch_tokens_per_rank + 1 (num_ranks * tokens not a multiple of 4), on a buffer sized for it",
             requires=lambda ex: ex.world_size % 4 != 0,
             buffer=lambda env, bad: env.ll_buffer(env.ll_shape(num_max_tokens=env.ll_shape().num_max_tokens + 1)))
_ll_dispatch("v1_ll_dispatch_1530", _set(x=lambda e, c: narrow_hidden(c.kwargs["x"], LL_HIDDEN - 128)),
             f"an FP8 dispatch of {LL_HIDDEN - 128} columns (a multiple of 128, not of 512)")
_ll_dispatch("v1_ll_dispatch_1535", _set(use_ue8m0=lambda e, c: True),
             "use_ue8m0=True without round_scale (neighbour: with it)",
             neighbour=_set(use_ue8m0=lambda e, c: True, round_scale=lambda e, c: True))
_ll_dispatch("v1_ll_dispatch_kernel_496", _set(num_experts=lambda e, c: 0), "num_experts=0 (no warp group)")
_ll_dispatch("v1_ll_dispatch_kernel_501", _set(topk_idx=lambda e, c: _ll_topk_of(e, LL_MAX_TOPK + 1)[0]),
             f"a top-k of {LL_MAX_TOPK + 1} columns (the example's, padded with -1; neighbour: {LL_MAX_TOPK})",
             neighbour=_set(topk_idx=lambda e, c: _ll_topk_of(e, LL_MAX_TOPK)[0]))
_ll_dispatch("v1_ll_dispatch_unsupported_hidden", _set(x=lambda e, c: narrow_hidden(c.kwargs["x"], LL_HIDDEN // 2)),
             f"x of {LL_HIDDEN // 2} columns (FP8-castable, but no kernel is compiled for it)")


def _ll_combine(row: str, edit: Callable[[BadCallEnv, LLCall, dict], None], doc: str, requires: Callable = _always,
                topology: str = "any", neighbour: Callable[[BadCallEnv, LLCall, dict], None] | None = None,
                target: Callable[[BadCallEnv, LLCall, bool], Any] | None = None) -> None:
    """Register a low-latency combine recipe: the task's valid bf16 ``low_latency_dispatch``
    (:meth:`BadCallEnv.ll_dispatched`), then its ``low_latency_combine`` (on the same buffer, or on ``target(env,
    done, bad)``) with ``edit`` applied to a dict of ``x``, ``topk_idx``, ``topk_weights``, ``handle`` and keyword
    arguments."""

    @pair(row, requires, topology)
    def _(env: BadCallEnv, bad: bool) -> None:
        done = env.ll_dispatched()
        args = {"x": done.recv_x, "topk_idx": done.kwargs["topk_idx"], "topk_weights": env.inputs.topk_weights,
                "handle": done.handle}
        if bad:
            edit(env, done, args)
        elif neighbour is not None:
            neighbour(env, done, args)
        on = target(env, done, bad) if target is not None else done.buffer
        on.low_latency_combine(**args)

    RECIPES[row].__doc__ = RECIPES[f"{row}.ok"].__doc__ = doc


def _ll_handle(i: int, change: Callable[[BadCallEnv, Any], Any]) -> Callable[[BadCallEnv, LLCall, dict], None]:
    """An edit replacing entry ``i`` of the handle ``(src_info, layout_range, num_max_dispatch_tokens_per_rank,
    hidden, num_experts)`` by ``change(env, entry)`` (a forged handle)."""

    def edit(env: BadCallEnv, done: LLCall, args: dict) -> None:
        handle = list(args["handle"])
        handle[i] = change(env, handle[i])
        args["handle"] = tuple(handle)

    return edit


def _ll_forged_layout(env: BadCallEnv, done: LLCall) -> dict:
    """Combine arguments of a handle forged to ``num_experts = num_ranks`` and one token more than the dispatch's
    bound (odd), with zero expert outputs of hidden 128 and empty layout ranges (shapes every earlier check takes)."""
    rows = env.world_size * (done.kwargs["num_max_dispatch_tokens_per_rank"] + 1)
    src_info = torch.zeros(1, rows, dtype=torch.int32, device=env.device)
    layout_range = torch.zeros(1, env.world_size, dtype=torch.int64, device=env.device)
    return {"x": torch.zeros(1, rows, 128, dtype=torch.bfloat16, device=env.device),
            "handle": (src_info, layout_range, rows // env.world_size, 128, env.world_size)}


def _ll_out(env: BadCallEnv, rows_delta: int = 0, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """An ``out=`` tensor for the combine (by default the valid one: ``[num_tokens, hidden]`` bf16)."""
    return torch.empty(env.inputs.x.shape[0] + rows_delta, LL_HIDDEN, dtype=dtype, device=env.device)


@pair("v1_ll_combine_after_destroy")
def _(env: BadCallEnv, bad: bool) -> None:
    """low_latency_combine on a destroyed low-latency buffer (a private one, destroyed after its dispatch)."""
    done = env.valid_ll_dispatch(env.ll_buffer(private=True), use_fp8=False)
    if bad:
        done.buffer.destroy()
    done.buffer.low_latency_combine(done.recv_x, env.inputs.topk_idx, env.inputs.topk_weights, done.handle)


@pair("v1_ll_combine_deterministic")
def _(env: BadCallEnv, bad: bool) -> None:
    """low_latency_combine with torch's deterministic algorithms on (and uninitialised memory filled)."""
    done = env.ll_dispatched()
    with deterministic_algorithms(fill_uninitialized_memory=bad):
        done.buffer.low_latency_combine(done.recv_x, env.inputs.topk_idx, env.inputs.topk_weights, done.handle)


@pair("v1_ll_combine_qp_depth")
def _(env: BadCallEnv, bad: bool) -> None:
    """A handle whose num_max_dispatch_tokens_per_rank is one above what the QP depth allows (a forged handle)."""
    done = env.ll_dispatched()
    handle = list(done.handle)
    if bad:
        handle[2] = _qp_tokens(env, done.buffer)[0]
    done.buffer.low_latency_combine(done.recv_x, env.inputs.topk_idx, env.inputs.topk_weights, tuple(handle))


_ll_combine("v1_ll_combine_handle_arity", _arg("handle", lambda e, d, a: a["handle"][:4]),
            "the first 4 entries of the handle")
_ll_combine("v1_ll_combine_not_ll_buffer", lambda e, d, a: None,
            "low_latency_combine of a low-latency handle on a one-node buffer built without low_latency_mode",
            topology="single", target=lambda env, done, bad: env.v1_buffer() if bad else done.buffer)
_ll_combine("v1_ll_combine_1612", lambda e, d, a: None,
            "low_latency_combine of a low-latency handle on an internode buffer built without low_latency_mode",
            topology=V1_INTER, target=lambda env, done, bad: env.v1_buffer() if bad else done.buffer)
_ll_combine("v1_ll_combine_1615", _arg("x", lambda e, d, a: a["x"].float()), "float32 expert outputs")
_ll_combine("v1_ll_combine_1616", _arg("x", lambda e, d, a: torch.cat([a["x"], a["x"][:1]])),
            "x with one local expert too many")
_ll_combine("v1_ll_combine_1617", _arg("x", lambda e, d, a: a["x"][:, 1:].contiguous()),
            "x with one row per expert too few")
_ll_combine("v1_ll_combine_1618", _arg("x", lambda e, d, a: a["x"][:, :, :LL_HIDDEN - 16].contiguous()),
            f"x of {LL_HIDDEN - 16} columns (a multiple of 16, not of 128)")
_ll_combine("v1_ll_combine_1619", _arg("topk_idx", lambda e, d, a: a["topk_idx"][:, 0].contiguous()), "a 1-D topk_idx")
_ll_combine("v1_ll_combine_1620", _arg("topk_weights", lambda e, d, a: extra_col(a["topk_weights"])),
            "topk_weights with num_topk + 1 columns")
_ll_combine("v1_ll_combine_1621", _arg("topk_idx", lambda e, d, a: a["topk_idx"].int()), "int32 topk_idx")
_ll_combine("v1_ll_combine_1622", _arg("topk_weights", lambda e, d, a: a["topk_weights"].unsqueeze(-1)),
            "3-D topk_weights")
_ll_combine("v1_ll_combine_1623",
            lambda e, d, a: a.update(zip(("topk_idx", "topk_weights"),
                                         _ll_topk_of(e, e.example.num_topk, d.kwargs["num_max_dispatch_tokens_per_rank"]
                                                     + 1), strict=True)),
            "topk_idx / topk_weights padded with unrouted tokens to num_max_dispatch_tokens_per_rank + 1 rows (a "
            "rank-local check, refused after the verdict exchange); neighbour: padded to exactly that many",
            neighbour=lambda e, d, a: a.update(zip(("topk_idx", "topk_weights"),
                                                   _ll_topk_of(e, e.example.num_topk,
                                                               d.kwargs["num_max_dispatch_tokens_per_rank"]),
                                                   strict=True)))
_ll_combine("v1_ll_combine_1624", _arg("topk_weights", lambda e, d, a: a["topk_weights"].bfloat16()),
            "bfloat16 topk_weights")
_ll_combine("v1_ll_combine_1625", _ll_handle(0, lambda e, t: t.flatten()), "a handle with a 1-D src_info")
_ll_combine("v1_ll_combine_1626", _ll_handle(0, lambda e, t: t.long()), "a handle with an int64 src_info")
_ll_combine("v1_ll_combine_1627", _ll_handle(1, lambda e, t: t.unsqueeze(0)), "a handle with a 3-D layout_range")
_ll_combine("v1_ll_combine_1628", _ll_handle(1, lambda e, t: t.int()), "a handle with an int32 layout_range")
_ll_combine("v1_ll_combine_1629", _ll_handle(1, lambda e, t: extra_col(t)),
            "a handle whose layout_range has num_ranks + 1 columns (a foreign handle)")
_ll_combine("v1_ll_combine_1632", _arg("combine_wait_recv_cost_stats", lambda e, d, a: _ll_cost(e, dtype=torch.int32)),
            "int32 wait-cost statistics",
            neighbour=_arg("combine_wait_recv_cost_stats", lambda e, d, a: _ll_cost(e)))
_ll_combine("v1_ll_combine_1633",
            _arg("combine_wait_recv_cost_stats", lambda e, d, a: _ll_cost(e, e.world_size, e.world_size)),
            "[num_ranks, num_ranks] wait-cost statistics (the docstring's shape; the code wants 1-D)",
            neighbour=_arg("combine_wait_recv_cost_stats", lambda e, d, a: _ll_cost(e)))
_ll_combine("v1_ll_combine_1634", _arg("combine_wait_recv_cost_stats", lambda e, d, a: _ll_cost(e, e.world_size + 1)),
            "wait-cost statistics of num_ranks + 1 entries",
            neighbour=_arg("combine_wait_recv_cost_stats", lambda e, d, a: _ll_cost(e)))
_ll_combine("v1_ll_combine_layout_150", lambda e, d, a: a.update(_ll_forged_layout(e, d)),
            "a handle forged to one expert per rank and num_max_dispatch_tokens_per_rank + 1, x of hidden 128 to "
            "match: the layout's send buffer (experts * tokens * 260 bytes) is not a multiple of 16",
            requires=lambda ex: ex.world_size % 4 != 0)
_ll_combine("v1_ll_combine_1643", lambda e, d, a: None,
            "combine on a low-latency buffer one alignment unit short of the layout (the handle from the shared "
            "buffer; neighbour: a buffer of the layout rounded up to 128)",
            target=lambda env, done, bad: _ll_short_buffer(env, bad))
_ll_combine("v1_ll_combine_1651", lambda e, d, a: a.update(async_finish=True, return_recv_hook=True),
            "async_finish=True with return_recv_hook=True (neighbour: the hook alone)",
            neighbour=lambda e, d, a: a.update(return_recv_hook=True))
_ll_combine("v1_ll_combine_1658", _arg("out", lambda e, d, a: _ll_out(e).unsqueeze(0)), "a 3-D out",
            neighbour=_arg("out", lambda e, d, a: _ll_out(e)))
_ll_combine("v1_ll_combine_1659", _arg("out", lambda e, d, a: _ll_out(e, rows_delta=1)), "out with one row too many",
            neighbour=_arg("out", lambda e, d, a: _ll_out(e)))
_ll_combine("v1_ll_combine_1660", _arg("out", lambda e, d, a: _ll_out(e, dtype=torch.float32)), "a float32 out",
            neighbour=_arg("out", lambda e, d, a: _ll_out(e)))
_ll_combine("v1_ll_combine_kernel_1170",
            lambda e, d, a: a.update(x=a["x"][:0], handle=(a["handle"][0][:0], a["handle"][1][:0], *a["handle"][2:4],
                                                           0)),
            "a handle forged to 0 experts, with x, src_info and layout_range of 0 local experts (no warp group)")
_ll_combine("v1_ll_combine_kernel_1179",
            lambda e, d, a: a.update(zip(("topk_idx", "topk_weights"), _ll_topk_of(e, LL_MAX_TOPK + 1), strict=True)),
            f"a top-k of {LL_MAX_TOPK + 1} columns (the example's, padded with -1; neighbour: {LL_MAX_TOPK})",
            neighbour=lambda e, d, a: a.update(zip(("topk_idx", "topk_weights"), _ll_topk_of(e, LL_MAX_TOPK),
                                                   strict=True)))


@pair("v1_ll_combine_kernel_1182")
def _(env: BadCallEnv, bad: bool) -> None:
    """A zero-copy combine (the expert outputs written into get_next_low_latency_combine_buffer) with LogFMT
    (neighbour: without)."""
    done = env.ll_dispatched()
    done.buffer.get_next_low_latency_combine_buffer(done.handle).copy_(done.recv_x)
    done.buffer.low_latency_combine(done.recv_x, env.inputs.topk_idx, env.inputs.topk_weights, done.handle,
                                    zero_copy=True, use_logfmt=bad)


@pair("v1_ll_next_buffer_handle_arity")
def _(env: BadCallEnv, bad: bool) -> None:
    """get_next_low_latency_combine_buffer with the first 4 entries of the handle."""
    done = env.ll_dispatched()
    done.buffer.get_next_low_latency_combine_buffer(done.handle[:4] if bad else done.handle)


@pair("v1_ll_next_buffer_after_destroy")
def _(env: BadCallEnv, bad: bool) -> None:
    """get_next_low_latency_combine_buffer on a destroyed low-latency buffer (a private one, after its dispatch)."""
    done = env.valid_ll_dispatch(env.ll_buffer(private=True), use_fp8=False)
    if bad:
        done.buffer.destroy()
    done.buffer.get_next_low_latency_combine_buffer(done.handle)


_ll_combine("v1_ll_combine_unsupported_hidden", _arg("x", lambda e, d, a: a["x"][:, :, :LL_HIDDEN // 2].contiguous()),
            f"expert outputs of {LL_HIDDEN // 2} columns (no kernel is compiled for it)")



# clean_low_latency_buffer (deep_ep/buffers/legacy.py:550, csrc/legacy/buffer.hpp:1431-1454): a collective (two
# barriers), made by every rank with the same arguments.
def _ll_clean_shape(env: BadCallEnv, buffer: Any | None = None) -> None:
    """clean_low_latency_buffer of the example's low-latency shape (on the task's shared buffer by default)."""
    shape = env.ll_shape()
    buffer = buffer if buffer is not None else env.ll_buffer()
    buffer.clean_low_latency_buffer(shape.num_max_tokens, shape.hidden, shape.num_experts)


@pair("v1_ll_clean_after_destroy")
def _(env: BadCallEnv, bad: bool) -> None:
    """clean_low_latency_buffer on a destroyed low-latency buffer (a private one)."""
    buffer = env.ll_buffer(private=True)
    if bad:
        buffer.destroy()
    _ll_clean_shape(env, buffer)


@pair("v1_ll_clean_1432")
def _(env: BadCallEnv, bad: bool) -> None:
    """clean_low_latency_buffer on a buffer built without low_latency_mode (neighbour: on the low-latency buffer)."""
    _ll_clean_shape(env, env.v1_buffer() if bad else None)


#: ``(num_max_dispatch_tokens_per_rank, hidden, num_experts)`` that fail each host assert of ``LowLatencyLayout``
#: (csrc/legacy/config.hpp:142, :150, :158; ``size_t`` arithmetic), the closest that pass, and why.
LL_LAYOUT_CASES = {
    142: ((1, -128, 1), (1, 0, 1), "hidden=-128: num_scales = -1, so num_scales * sizeof(float) is 2**64 - 4 as a "
                                   "size_t, above the hidden it is compared with (neighbour: hidden=0, no scales)"),
    150: ((1, 100, 1), (2, 100, 1), "1 token of hidden 100 for 1 expert: the send buffer is one dispatch message, "
                                    "16 + 2 * 100 = 216 bytes, not a multiple of 16 (neighbour: 2 tokens, 432 bytes; "
                                    "the receive buffer is the same size)"),
    158: ((1, 130, 2), (2, 130, 2), "1 token of hidden 130 for 2 experts: the send buffer holds both experts' combine "
                                    "messages, 2 * (4 + 260) = 528 bytes (a multiple of 16), the receive buffer their "
                                    "dispatch messages, 2 * (16 + 260) = 552 bytes (not one); neighbour: 2 tokens, "
                                    "1056 and 1104 bytes"),
}


def _ll_next_buffer_of(env: BadCallEnv, tokens: int, hidden: int, num_experts: int) -> Any:
    """get_next_low_latency_combine_buffer of the task's dispatch handle forged to these sizes."""
    done = env.ll_dispatched()
    return done.buffer.get_next_low_latency_combine_buffer((*done.handle[:2], tokens, hidden, num_experts))


#: The calls that build a ``LowLatencyLayout`` from sizes of the caller's, with no check of their own first: each
#: gets a recipe per :data:`LL_LAYOUT_CASES` entry (the dispatch and combine check hidden % 128 first).
_LL_LAYOUT_CALLS: dict[str, tuple[str, Callable[[BadCallEnv, int, int, int], Any]]] = {
    "clean": ("clean_low_latency_buffer on the task's low-latency buffer",
              lambda env, t, h, e: env.ll_buffer().clean_low_latency_buffer(t, h, e)),
    "next_buffer": ("get_next_low_latency_combine_buffer of the task's dispatch handle forged to these sizes",
                    _ll_next_buffer_of),
    "size_hint": ("Buffer.get_low_latency_rdma_size_hint(tokens, hidden, num_ranks, experts)",
                  lambda env, t, h, e: env.module.Buffer.get_low_latency_rdma_size_hint(t, h, env.world_size, e)),
}


def _ll_layout_pair(row: str, call: Callable[[BadCallEnv, int, int, int], Any], bad_args: tuple[int, int, int],
                    ok_args: tuple[int, int, int], doc: str) -> None:
    @pair(row)
    def _(env: BadCallEnv, bad: bool) -> None:
        call(env, *(bad_args if bad else ok_args))

    RECIPES[row].__doc__ = RECIPES[f"{row}.ok"].__doc__ = doc


for _name, (_what, _call) in _LL_LAYOUT_CALLS.items():
    for _line, (_bad, _ok, _why) in LL_LAYOUT_CASES.items():
        _ll_layout_pair(f"v1_ll_{_name}_layout_{_line}", _call, _bad, _ok, f"{_what}: {_why}")


def _ll_clean_experts(env: BadCallEnv) -> int:
    """The largest expert count whose two signalling buffers fit in the shared buffer's RDMA bytes."""
    limit = ll_size_hint(env.ll_shape())
    experts = limit // 8
    while ll_signalling_end(experts + 1) <= limit:
        experts += 1
    while ll_signalling_end(experts) > limit:
        experts -= 1
    return experts


@pair("v1_ll_clean_1440")
def _(env: BadCallEnv, bad: bool) -> None:
    """clean_low_latency_buffer of the example's tokens and hidden size for one expert more than the signalling
    buffers of the shared buffer's RDMA bytes can hold (neighbour: the most that fit, to the byte)."""
    shape = env.ll_shape()
    env.ll_buffer().clean_low_latency_buffer(shape.num_max_tokens, shape.hidden, _ll_clean_experts(env) + int(bad))


# the shrink-mode mask calls (legacy.py:672-698, buffer.hpp:1731-1748): a mask buffer exists with enable_shrink=True
# and RDMA bytes; each rank holds its own.  The neighbours leave every rank unmasked.
def _ll_mask_status(env: BadCallEnv, numel: int | None = None, dtype: torch.dtype = torch.int32) -> torch.Tensor:
    """A ``mask_status`` tensor for low_latency_query_mask_buffer (by default the valid one: int32, one per rank)."""
    return torch.full((env.world_size if numel is None else numel,), -1, dtype=dtype, device=env.device)


def _ll_after_destroy(env: BadCallEnv, bad: bool, call: Callable[[Any], Any]) -> None:
    buffer = env.ll_buffer(private=True, shrink=True)
    if bad:
        buffer.destroy()
    call(buffer)


def _ll_mask_call(row: str, bad_call: Callable[[BadCallEnv, Any], Any], doc: str,
                  ok_call: Callable[[BadCallEnv, Any], Any] | None = None, shrink_when_bad: bool = True) -> None:
    """Register a mask-call recipe: ``bad_call(env, buffer)`` on the shared shrink-mode buffer (or, without
    ``shrink_when_bad``, on the shared buffer without a mask buffer); the neighbour makes ``ok_call`` (by default
    the same call) on the shrink-mode buffer."""

    @pair(row)
    def _(env: BadCallEnv, bad: bool) -> None:
        buffer = env.ll_buffer(shrink=shrink_when_bad or not bad)
        (bad_call if bad or ok_call is None else ok_call)(env, buffer)

    RECIPES[row].__doc__ = RECIPES[f"{row}.ok"].__doc__ = doc


def _unmask_last(env: BadCallEnv, buffer: Any) -> None:
    buffer.low_latency_update_mask_buffer(env.world_size - 1)  # mask=False: unmask (a no-op on an unmasked rank)


@pair("v1_ll_update_mask_after_destroy")
def _(env: BadCallEnv, bad: bool) -> None:
    """low_latency_update_mask_buffer on a destroyed shrink-mode buffer (a private one)."""
    _ll_after_destroy(env, bad, lambda buffer: _unmask_last(env, buffer))


_ll_mask_call("v1_ll_update_mask_1732", _unmask_last,
              "low_latency_update_mask_buffer(num_ranks - 1) on a low-latency buffer built without enable_shrink "
              "(neighbour: with it)", shrink_when_bad=False)
_ll_mask_call("v1_ll_update_mask_1733", lambda env, buffer: buffer.low_latency_update_mask_buffer(env.world_size),
              "low_latency_update_mask_buffer(num_ranks): a rank past the last (neighbour: num_ranks - 1)",
              ok_call=_unmask_last)


@pair("v1_ll_query_mask_after_destroy")
def _(env: BadCallEnv, bad: bool) -> None:
    """low_latency_query_mask_buffer on a destroyed shrink-mode buffer (a private one)."""
    _ll_after_destroy(env, bad, lambda buffer: buffer.low_latency_query_mask_buffer(_ll_mask_status(env)))


_ll_mask_call("v1_ll_query_mask_1738", lambda env, buffer: buffer.low_latency_query_mask_buffer(_ll_mask_status(env)),
              "low_latency_query_mask_buffer on a low-latency buffer built without enable_shrink (neighbour: with it)",
              shrink_when_bad=False)
_ll_mask_call("v1_ll_query_mask_1739",
              lambda env, buffer: buffer.low_latency_query_mask_buffer(_ll_mask_status(env, env.world_size + 1)),
              "low_latency_query_mask_buffer into an int32 mask_status of num_ranks + 1 entries (neighbour: num_ranks)",
              ok_call=lambda env, buffer: buffer.low_latency_query_mask_buffer(_ll_mask_status(env)))


@pair("v1_ll_clean_mask_after_destroy")
def _(env: BadCallEnv, bad: bool) -> None:
    """low_latency_clean_mask_buffer on a destroyed shrink-mode buffer (a private one)."""
    _ll_after_destroy(env, bad, lambda buffer: buffer.low_latency_clean_mask_buffer())


_ll_mask_call("v1_ll_clean_mask_1746", lambda env, buffer: buffer.low_latency_clean_mask_buffer(),
              "low_latency_clean_mask_buffer on a low-latency buffer built without enable_shrink (neighbour: with it)",
              shrink_when_bad=False)


# get_local_buffer_tensor (legacy.py:201-220, buffer.hpp:215-221)
@pair("v1_local_buffer_after_destroy")
def _(env: BadCallEnv, bad: bool) -> None:
    """get_local_buffer_tensor(torch.uint8, torch.Size([V1_ALIGNMENT])) on a destroyed buffer of V1_ALIGNMENT
    NVLink bytes (a private one)."""
    buffer = env.v1_buffer(num_nvl_bytes=V1_ALIGNMENT)
    if bad:
        buffer.destroy()
    buffer.get_local_buffer_tensor(torch.uint8, torch.Size([V1_ALIGNMENT]))


@pair("v1_local_buffer_size")
def _(env: BadCallEnv, bad: bool) -> None:
    """get_local_buffer_tensor(torch.float32, size, use_rdma_buffer=True) of one float more than the shared
    low-latency buffer's RDMA bytes hold (neighbour: all of them)."""
    numel = ll_size_hint(env.ll_shape()) // 4 + int(bad)
    env.ll_buffer().get_local_buffer_tensor(torch.float32, torch.Size([numel]), use_rdma_buffer=True)


# ===================================================================================================== V2
@pair("v2_init_cpu_bytes_without_num_bytes")
def _(env: BadCallEnv, bad: bool) -> None:
    """num_cpu_bytes without num_bytes."""
    env.v2_buffer(num_cpu_bytes=V2_ALIGNMENT) if bad else env.v2_buffer(num_bytes=2 * V2_ALIGNMENT,
                                                                         num_cpu_bytes=V2_ALIGNMENT)


@pair("v2_init_cpu_handle_alignment")
def _(env: BadCallEnv, bad: bool) -> None:
    """A hybrid-mode buffer with 1 MiB of CPU bytes (not 2 MiB aligned)."""
    env.v2_buffer(num_bytes=2 * V2_ALIGNMENT, num_cpu_bytes=V2_ALIGNMENT // (2 if bad else 1))


@pair("v2_init_size_args")
def _(env: BadCallEnv, bad: bool) -> None:
    """ElasticBuffer(group) with every size argument left at its default."""
    env.v2_buffer(num_max_tokens_per_rank=0, hidden=0, num_topk=0) if bad else env.v2_buffer()


@pair("v2_init_hidden_tiny")
def _(env: BadCallEnv, bad: bool) -> None:
    """hidden=2 (the worst-case SF bytes exceed the hidden bytes); neighbour: hidden=16."""
    env.v2_buffer(hidden=2 if bad else 16)


@pair("v2_init_hidden_tma")
def _(env: BadCallEnv, bad: bool) -> None:
    """hidden=24 (48 bytes, not a multiple of 32); neighbour: hidden=32."""
    env.v2_buffer(hidden=24 if bad else 32)


@pair("v2_init_too_many_ranks")
def _(env: BadCallEnv, bad: bool) -> None:
    """A stand-in group of 1026 ranks (> 1024) in nodes of 2."""
    if bad:
        with local_world_size(2):
            env.v2_buffer(group=StandInGroup(env.rank, 1026))
    else:
        env.v2_buffer()


@pair("v2_init_num_bytes_alignment")
def _(env: BadCallEnv, bad: bool) -> None:
    """num_bytes of 3 MiB (not a multiple of 2 MiB)."""
    env.v2_buffer(num_bytes=3 * V2_ALIGNMENT // 2 if bad else 2 * V2_ALIGNMENT)


@pair("v2_init_cpu_bytes_alignment")
def _(env: BadCallEnv, bad: bool) -> None:
    """num_cpu_bytes=-2 MiB."""
    env.v2_buffer(num_bytes=2 * V2_ALIGNMENT, num_cpu_bytes=-V2_ALIGNMENT if bad else 0)


@pair("v2_init_cpu_bytes_exceed")
def _(env: BadCallEnv, bad: bool) -> None:
    """More CPU bytes than buffer bytes (direct mode, so no CPU handle is created first)."""
    env.v2_buffer(num_bytes=V2_ALIGNMENT, num_cpu_bytes=2 * V2_ALIGNMENT if bad else V2_ALIGNMENT,
                  allow_hybrid_mode=False)


@pair("v2_destroy_not_explicit")
def _(env: BadCallEnv, bad: bool) -> None:
    """destroy() of a buffer built without explicitly_destroy."""
    env.v2_buffer(explicitly_destroy=not bad).destroy()


@pair("v2_dispatch_after_destroy")
def _(env: BadCallEnv, bad: bool) -> None:
    """dispatch on a destroyed buffer."""
    call = env.v2_args()
    if bad:
        call.buffer.destroy()
    call.buffer.dispatch(**call.kwargs)


@pair("v2_combine_after_destroy")
def _(env: BadCallEnv, bad: bool) -> None:
    """combine on a destroyed buffer."""
    done = env.valid_v2_dispatch()
    if bad:
        done.buffer.destroy()
    done.buffer.combine(done.recv_x, done.handle, topk_weights=done.recv_topk_weights)


def _v2_edit(row: str, edit: Callable[[BadCallEnv, V2Call], None], doc: str, requires: Callable = _always,
             topology: str = "any", neighbour: Callable[[BadCallEnv, V2Call], None] | None = None) -> None:
    """Register a V2 dispatch recipe: a valid dispatch of the example with ``edit`` applied to its arguments."""

    @pair(row, requires, topology)
    def _(env: BadCallEnv, bad: bool) -> None:
        call = env.v2_args()
        if bad:
            edit(env, call)
        elif neighbour is not None:
            neighbour(env, call)
        call.buffer.dispatch(**call.kwargs)

    RECIPES[row].__doc__ = RECIPES[f"{row}.ok"].__doc__ = doc


def _v2set(**changes: Callable[[BadCallEnv, V2Call], Any]) -> Callable[[BadCallEnv, V2Call], None]:
    def edit(env: BadCallEnv, call: V2Call) -> None:
        call.kwargs.update({k: f(env, call) for k, f in changes.items()})

    return edit


def _v2kw(name: str, change: Callable[[torch.Tensor], Any]) -> Callable[[BadCallEnv, V2Call], None]:
    return _v2set(**{name: lambda e, c: change(c.kwargs[name])})


def _stats(env: BadCallEnv, n: int | None = None, dtype: torch.dtype = torch.int32) -> torch.Tensor:
    n = env.example.num_experts // env.world_size if n is None else n
    return torch.zeros(n, dtype=dtype, device=env.device)


def _deterministic_v2(env: BadCallEnv, bad: bool) -> None:
    call = env.v2_args()
    with deterministic_algorithms(fill_uninitialized_memory=bad):
        call.buffer.dispatch(**call.kwargs)


pair("v2_dispatch_deterministic")(_deterministic_v2)

_v2_edit("v2_dispatch_no_topk_no_handle", _v2set(topk_idx=lambda e, c: None), "neither topk_idx nor a handle")
_v2_edit("v2_dispatch_topk_1d", _v2kw("topk_idx", lambda t: t[:, 0].contiguous()), "a 1-D topk_idx")


@pair("v2_dispatch_num_experts_none")
def _v2_cached_without_num_experts(env: BadCallEnv, bad: bool) -> None:
    """A cached dispatch ``dispatch(x, handle=handle)`` without num_experts (automatic SMs), the recorded case;
    neighbour: the same with ``num_experts=handle.num_experts``."""
    first = env.valid_v2_dispatch()
    handle = first.handle
    extra = {} if bad else {"num_experts": handle.num_experts}
    first.buffer.dispatch(env.inputs.x, handle=handle, **extra)


_v2_edit("v2_dispatch_experts_not_divisible_auto", _v2set(num_experts=lambda e, c: e.example.num_experts + 1),
         "num_experts + 1 experts (automatic SMs)", requires=several_ranks)
_v2_edit("v2_dispatch_topk_zero_auto",
         _v2set(topk_idx=lambda e, c: c.kwargs["topk_idx"][:, :0].contiguous(),
                topk_weights=lambda e, c: c.kwargs["topk_weights"][:, :0].contiguous()),
         "num_topk=0 (automatic SMs)")
_v2_edit("v2_dispatch_topk_exceeds_experts_auto", _v2set(num_experts=lambda e, c: 0), "num_experts=0 (automatic SMs)")
_v2_edit("v2_dispatch_negative_experts_auto", _v2set(num_experts=lambda e, c: -e.world_size),
         "num_experts=-num_ranks (automatic SMs)")
_v2_edit("v2_dispatch_qps", _v2set(num_qps=lambda e, c: c.buffer.num_allocated_qps + 1),
         "num_qps one above the allocation", neighbour=_v2set(num_qps=lambda e, c: c.buffer.num_allocated_qps))
_v2_edit("v2_dispatch_x_tuple_arity", _v2set(x=lambda e, c: (c.kwargs["x"], None, None)), "x a 3-tuple")
_v2_edit("v2_dispatch_num_experts_none_explicit_sms", _v2set(num_experts=lambda e, c: None, num_sms=lambda e, c: 4),
         "num_experts=None with an explicit num_sms", neighbour=_v2set(num_sms=lambda e, c: 4))
_v2_edit("v2_dispatch_event_type",
         _v2set(previous_event=lambda e, c: e.module.EventOverlap(c.buffer.capture()),
                allocate_on_comm_stream=lambda e, c: True),
         "an EventOverlap as previous_event",
         neighbour=_v2set(previous_event=lambda e, c: c.buffer.capture(), allocate_on_comm_stream=lambda e, c: True))
_v2_edit("v2_dispatch_num_sms_positive", _v2set(num_sms=lambda e, c: -2), "num_sms=-2",
         neighbour=_v2set(num_sms=lambda e, c: 2))
_v2_edit("v2_dispatch_zero_padding_without_expand", _v2set(do_zero_padding=lambda e, c: True),
         "do_zero_padding without do_expand", neighbour=_v2set(do_zero_padding=lambda e, c: True,
                                                               do_expand=lambda e, c: True))
_v2_edit("v2_dispatch_x_dim", _v2kw("x", lambda t: t.unsqueeze(0)), "a 3-D x")
_v2_edit("v2_dispatch_x_cuda_contiguous", _v2kw("x", strided), "a non-contiguous x", requires=every_rank_has(1))
_v2_edit("v2_dispatch_hidden_bytes", _v2kw("x", lambda t: narrow_hidden(t, 4)), "x of 4 columns (8 bytes)",
         neighbour=_v2kw("x", lambda t: narrow_hidden(t, 16)))
_v2_edit("v2_dispatch_sf_dim", _v2kw("x", lambda t: (t, torch.ones(t.shape[0], device=t.device))),
         "a 1-D sf", neighbour=_v2kw("x", lambda t: (t, torch.ones(t.shape[0], 1, device=t.device))))
_v2_edit("v2_dispatch_sf_rows", _v2kw("x", lambda t: (t, torch.ones(t.shape[0] + 1, 1, device=t.device))),
         "sf with one row too many", neighbour=_v2kw("x", lambda t: (t, torch.ones(t.shape[0], 1, device=t.device))))
_v2_edit("v2_dispatch_sf_elem_size",
         _v2kw("x", lambda t: (t, torch.ones(t.shape[0], 1, dtype=torch.float64, device=t.device))),
         "float64 sf",
         neighbour=_v2kw("x", lambda t: (t, torch.ones(t.shape[0], 1, dtype=torch.int32, device=t.device))))
_v2_edit("v2_dispatch_topk_dim", _v2kw("topk_idx", lambda t: t.unsqueeze(-1)), "a 3-D topk_idx")
_v2_edit("v2_dispatch_topk_rows", _v2set(topk_idx=lambda e, c: extra_row(c.kwargs["topk_idx"], -1)),
         "topk_idx with one row more than x")
_v2_edit("v2_dispatch_topk_dtype", _v2kw("topk_idx", lambda t: t.int()), "int32 topk_idx")
_v2_edit("v2_dispatch_topk_cuda_contiguous", _v2kw("topk_idx", strided), "a non-contiguous topk_idx",
         requires=every_rank_has(2))
_v2_edit("v2_dispatch_weights_dim", _v2kw("topk_weights", lambda t: t.unsqueeze(-1)), "3-D topk_weights")
_v2_edit("v2_dispatch_weights_rows", _v2kw("topk_weights", extra_row), "topk_weights with one row too many")
_v2_edit("v2_dispatch_weights_cuda_contiguous", _v2kw("topk_weights", strided), "non-contiguous topk_weights",
         requires=every_rank_has(2))
_v2_edit("v2_dispatch_weights_dtype", _v2kw("topk_weights", lambda t: t.bfloat16()), "bfloat16 topk_weights")
_v2_edit("v2_dispatch_stats_dim",
         _v2set(cumulative_local_expert_recv_stats=lambda e, c: _stats(e).unsqueeze(0)), "2-D expert stats",
         neighbour=_v2set(cumulative_local_expert_recv_stats=lambda e, c: _stats(e)))
_v2_edit("v2_dispatch_stats_cuda_contiguous",
         _v2set(cumulative_local_expert_recv_stats=lambda e, c: _stats(
             e, 2 * (e.example.num_experts // e.world_size))[::2]),
         "non-contiguous expert stats", neighbour=_v2set(cumulative_local_expert_recv_stats=lambda e, c: _stats(e)),
         requires=lambda ex: ex.num_experts // ex.world_size >= 2)
_v2_edit("v2_dispatch_stats_len",
         _v2set(cumulative_local_expert_recv_stats=lambda e, c: _stats(e, e.example.num_experts // e.world_size + 1)),
         "expert stats of num_local_experts + 1 entries",
         neighbour=_v2set(cumulative_local_expert_recv_stats=lambda e, c: _stats(e)))
_v2_edit("v2_dispatch_stats_dtype",
         _v2set(cumulative_local_expert_recv_stats=lambda e, c: _stats(e, dtype=torch.int64)), "int64 expert stats",
         neighbour=_v2set(cumulative_local_expert_recv_stats=lambda e, c: _stats(e)))
_v2_edit("v2_dispatch_previous_event_without_comm_alloc", _v2set(previous_event=lambda e, c: c.buffer.capture()),
         "previous_event without allocate_on_comm_stream",
         neighbour=_v2set(previous_event=lambda e, c: c.buffer.capture(), allocate_on_comm_stream=lambda e, c: True))
_v2_edit("v2_dispatch_experts_not_divisible_explicit",
         _v2set(num_experts=lambda e, c: e.example.num_experts + 1, num_sms=lambda e, c: 4),
         "num_experts + 1 experts with an explicit num_sms", requires=several_ranks,
         neighbour=_v2set(num_sms=lambda e, c: 4))
_v2_edit("v2_dispatch_too_many_experts",
         _v2set(num_experts=lambda e, c: e.world_size * math.ceil(2049 / e.world_size)),
         "more than 2048 experts",
         neighbour=_v2set(num_experts=lambda e, c: e.world_size * min(2048 // e.world_size, 256)))
_v2_edit("v2_dispatch_too_many_local_experts", _v2set(num_experts=lambda e, c: e.world_size * 257),
         "257 local experts", requires=lambda ex: ex.world_size <= 7,
         neighbour=_v2set(num_experts=lambda e, c: e.world_size * 256))
_v2_edit("v2_dispatch_num_sms_device", _v2set(num_sms=lambda e, c: 134), "num_sms=134 (> an H200's 132 SMs)",
         neighbour=_v2set(num_sms=lambda e, c: 132))
_v2_edit("v2_dispatch_hidden_tma", _v2kw("x", lambda t: narrow_hidden(t, 8)),
         "x of 8 columns (16 bytes: not a multiple of 32)", neighbour=_v2kw("x", lambda t: narrow_hidden(t, 16)))
_v2_edit("v2_dispatch_hybrid_sms", _v2set(num_sms=lambda e, c: 162), "num_sms=162 on a hybrid buffer (> 160)",
         topology="hybrid", neighbour=_v2set(num_sms=lambda e, c: 132))


@pair("v2_dispatch_too_many_tokens")
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


@pair("v2_dispatch_buffer_size", topology="single")
def _(env: BadCallEnv, bad: bool) -> None:
    """A per-call num_max_tokens_per_rank one token above what the buffer holds; neighbour: the most it holds."""
    call = env.v2_args()
    ex = env.example
    per_token = v2_direct_dispatch_bytes(env.world_size, 1, ex.hidden, ex.num_topk)
    fits = call.buffer.num_bytes // per_token
    call.kwargs["num_max_tokens_per_rank"] = fits + (1 if bad else 0)
    call.buffer.dispatch(**call.kwargs)


@pair("v2_dispatch_topk_too_large")
def _(env: BadCallEnv, bad: bool) -> None:
    """33 experts per token (the JIT kernel takes at most 32); neighbour: 32."""
    k = 33 if bad else 32
    num_experts = env.world_size * math.ceil(33 / env.world_size)
    buffer = env.v2_buffer(num_topk=33)
    idx, w = topk_of_width(env, k)
    buffer.dispatch(env.inputs.x, topk_idx=idx, topk_weights=w, num_experts=num_experts,
                    num_max_tokens_per_rank=env.example.num_max_tokens_per_rank)


def _v2_cached(row: str, edit: Callable[[BadCallEnv, V2Call, dict, Any], Any], doc: str,
               topology: str = "any", buffer: Callable[[BadCallEnv], Any] | None = None,
               target: Callable[[BadCallEnv, V2Call], Any] | None = None) -> None:
    """Register a cached V2 dispatch recipe: a valid dispatch, then a cached one (``num_experts`` given) with
    ``edit(env, done, kwargs, handle)`` returning the (possibly replaced) handle; ``target`` (the offending
    call only) is the buffer the cached dispatch runs on, by default the dispatch's own."""

    @pair(row, topology=topology)
    def _(env: BadCallEnv, bad: bool) -> None:
        done = env.valid_v2_dispatch(buffer(env) if buffer is not None else None)
        handle = done.handle
        kwargs = {"num_experts": handle.num_experts}
        if bad:
            handle = edit(env, done, kwargs, handle)
        on = target(env, done) if target is not None and bad else done.buffer
        on.dispatch(env.inputs.x, handle=handle, **kwargs)

    RECIPES[row].__doc__ = RECIPES[f"{row}.ok"].__doc__ = doc


def _replaced(handle: Any, **fields: Any) -> Any:
    """A copy of ``handle`` with some fields replaced (a foreign or modified handle)."""
    new = copy.copy(handle)
    for name, value in fields.items():
        setattr(new, name, value)
    return new


def _longer(t: torch.Tensor) -> torch.Tensor:
    return torch.cat([t, t[-1:] if t.numel() else torch.zeros(1, dtype=t.dtype, device=t.device)])


_v2_cached("v2_dispatch_handle_not_ephandle",
           lambda e, d, kw, h: tuple(vars(h).values()), "a tuple as the handle (no topk_idx)")
_v2_cached("v2_dispatch_cached_with_topk", lambda e, d, kw, h: kw.update(topk_idx=e.inputs.topk_idx) or h,
           "a cached dispatch given topk_idx")
_v2_cached("v2_dispatch_cached_cpu_sync", lambda e, d, kw, h: kw.update(do_cpu_sync=True) or h,
           "a cached dispatch with do_cpu_sync=True")
_v2_cached("v2_dispatch_cached_param_mismatch",
           lambda e, d, kw, h: kw.update(expert_alignment=h.expert_alignment + 1) or h,
           "a cached dispatch with another expert_alignment")
_v2_cached("v2_dispatch_cached_handle_809",
           lambda e, d, kw, h: _replaced(h, psum_num_recv_tokens_per_expert=_longer(h.psum_num_recv_tokens_per_expert)),
           "a handle whose psum_num_recv_tokens_per_expert has one entry too many (a foreign handle)")
_v2_cached("v2_dispatch_cached_handle_824",
           lambda e, d, kw, h: _replaced(
               h, num_unaligned_recv_tokens_per_expert=_longer(h.num_unaligned_recv_tokens_per_expert)),
           "a handle whose num_unaligned_recv_tokens_per_expert has one entry too many")
_v2_cached("v2_dispatch_cached_handle_838",
           lambda e, d, kw, h: _replaced(
               h, psum_num_recv_tokens_per_scaleup_rank=_longer(h.psum_num_recv_tokens_per_scaleup_rank)),
           "a handle from a buffer with one scale-up rank more")
_v2_cached("v2_dispatch_cached_stats",
           lambda e, d, kw, h: kw.update(cumulative_local_expert_recv_stats=_stats(e)) or h,
           "a cached dispatch with cumulative_local_expert_recv_stats")
_v2_cached("v2_dispatch_cached_hybrid_field_745", lambda e, d, kw, h: h,
           "a hybrid buffer's cached dispatch of a handle made by a direct-mode buffer", topology="hybrid",
           buffer=lambda env: env.v2_buffer(allow_hybrid_mode=False),
           target=lambda env, done: env.v2_buffer())
_v2_cached("v2_dispatch_cached_hybrid_field_746", lambda e, d, kw, h: _replaced(h, channel_linked_list=None),
           "a hybrid handle without its channel linked list", topology="hybrid")
_v2_cached("v2_dispatch_cached_dst_slot_dim",
           lambda e, d, kw, h: _replaced(h, psum_num_recv_tokens_per_scaleup_rank=torch.zeros(
               e.world_size, dtype=torch.int32, device=e.device)),
           "a direct-mode buffer's cached dispatch of a hybrid handle (its scale-up prefix sum resized to pass)",
           topology="hybrid", target=lambda env, done: env.v2_buffer(allow_hybrid_mode=False))
_v2_cached("v2_dispatch_cached_hybrid_channels", lambda e, d, kw, h: kw.update(num_sms=h.num_sms + 2) or h,
           "a hybrid cached dispatch with 2 SMs more than the dispatch (other channel count)", topology="hybrid")


@pair("v2_dispatch_deterministic_sort_without_cache")
def _(env: BadCallEnv, bad: bool) -> None:
    """A deterministic buffer's cached dispatch of a handle from a non-deterministic buffer."""
    maker = env.v2_buffer(deterministic=not bad)
    done = env.valid_v2_dispatch(maker)
    user = env.v2_buffer(deterministic=True)
    user.dispatch(env.inputs.x, handle=done.handle, num_experts=done.handle.num_experts)


# ---------------------------------------------------------------------------------------------- V2 combine
def _v2_combine(row: str, edit: Callable[[BadCallEnv, V2Call, dict], None], doc: str, requires: Callable = _always,
                topology: str = "any", neighbour: Callable | None = None, dispatch: dict | None = None,
                buffer: Callable[[BadCallEnv], Any] | None = None,
                target: Callable[[BadCallEnv, V2Call, bool], Any] | None = None) -> None:
    """Register a V2 combine recipe: a valid dispatch, then its combine with ``edit`` applied to a dict of
    ``x``, ``handle``, ``topk_weights`` and keyword arguments."""

    @pair(row, requires, topology)
    def _(env: BadCallEnv, bad: bool) -> None:
        done = env.valid_v2_dispatch(buffer(env) if buffer is not None else None, **(dispatch or {}))
        args = {"x": done.recv_x, "handle": done.handle, "topk_weights": done.recv_topk_weights}
        if bad:
            edit(env, done, args)
        elif neighbour is not None:
            neighbour(env, done, args)
        on = target(env, done, bad) if target is not None else done.buffer
        on.combine(**args)

    RECIPES[row].__doc__ = RECIPES[f"{row}.ok"].__doc__ = doc


def _v2bias(env: BadCallEnv, rows_delta: int = 0, dtype: torch.dtype = torch.bfloat16, hidden: int | None = None):
    hidden = env.example.hidden if hidden is None else hidden
    return torch.zeros(env.inputs.x.shape[0] + rows_delta, hidden, dtype=dtype, device=env.device)


@pair("v2_combine_deterministic")
def _(env: BadCallEnv, bad: bool) -> None:
    """combine with torch's deterministic algorithms on (and uninitialised memory filled)."""
    done = env.valid_v2_dispatch()
    with deterministic_algorithms(fill_uninitialized_memory=bad):
        done.buffer.combine(done.recv_x, done.handle, topk_weights=done.recv_topk_weights)


_v2_combine("v2_combine_handle_type", _arg("handle", lambda e, d, a: None), "combine with handle=None")
_v2_combine("v2_combine_qps", _arg("num_qps", lambda e, d, a: d.buffer.num_allocated_qps + 1),
            "num_qps one above the allocation", neighbour=_arg("num_qps", lambda e, d, a: d.buffer.num_allocated_qps))
_v2_combine("v2_combine_bias_tuple", _arg("bias", lambda e, d, a: (_v2bias(e),) * 3), "a 3-tuple bias",
            neighbour=_arg("bias", lambda e, d, a: (_v2bias(e),) * 2))
_v2_combine("v2_combine_event_type",
            lambda e, d, a: a.update(previous_event=e.module.EventOverlap(d.buffer.capture()),
                                     allocate_on_comm_stream=True),
            "an EventOverlap as previous_event",
            neighbour=lambda e, d, a: a.update(previous_event=d.buffer.capture(), allocate_on_comm_stream=True))
_v2_combine("v2_combine_num_sms_positive", _arg("num_sms", lambda e, d, a: -2), "num_sms=-2")
_v2_combine("v2_combine_x_dim", _arg("x", lambda e, d, a: a["x"].unsqueeze(0)), "a 3-D x")
_v2_combine("v2_combine_x_cuda_contiguous", _arg("x", lambda e, d, a: strided(a["x"])), "a non-contiguous x",
            requires=every_rank_receives)
_v2_combine("v2_combine_x_dtype", _arg("x", lambda e, d, a: a["x"].float()), "float32 expert outputs")
_v2_combine("v2_combine_hidden_bytes", _arg("x", lambda e, d, a: narrow_hidden(a["x"], 4)), "x of 4 columns (8 bytes)",
            neighbour=_arg("x", lambda e, d, a: narrow_hidden(a["x"], 256)))
_v2_combine("v2_combine_hidden_tma", _arg("x", lambda e, d, a: narrow_hidden(a["x"], 8)),
            "x of 8 columns (16 bytes: not a multiple of 32)",
            neighbour=_arg("x", lambda e, d, a: narrow_hidden(a["x"], 256)))
_v2_combine("v2_combine_hidden_jit", _arg("x", lambda e, d, a: narrow_hidden(a["x"], 128)),
            "x of 128 columns (the JIT kernel needs a multiple of 256)",
            neighbour=_arg("x", lambda e, d, a: narrow_hidden(a["x"], 256)))
_v2_combine("v2_combine_handle_scaleup",
            _arg("handle", lambda e, d, a: _replaced(a["handle"], psum_num_recv_tokens_per_scaleup_rank=_longer(
                a["handle"].psum_num_recv_tokens_per_scaleup_rank))),
            "a handle from a buffer with one scale-up rank more")
_v2_combine("v2_combine_x_rows", _arg("x", lambda e, d, a: extra_row(a["x"])), "x with one row too many")
_v2_combine("v2_combine_expand_weights_dim", _arg("topk_weights", lambda e, d, a: a["topk_weights"].unsqueeze(-1)),
            "2-D weights for an expand-mode handle", dispatch={"do_expand": True})
_v2_combine("v2_combine_expand_weights_rows", _arg("topk_weights", lambda e, d, a: extra_row(a["topk_weights"])),
            "expand-mode weights with one row too many", dispatch={"do_expand": True})
_v2_combine("v2_combine_weights_dim", _arg("topk_weights", lambda e, d, a: a["topk_weights"].reshape(-1)),
            "1-D weights for a non-expand handle")
_v2_combine("v2_combine_weights_shape", _arg("topk_weights", lambda e, d, a: extra_col(a["topk_weights"])),
            "weights with num_topk + 1 columns")
_v2_combine("v2_combine_weights_cuda_contiguous", _arg("topk_weights", lambda e, d, a: strided(a["topk_weights"])),
            "non-contiguous weights", requires=every_rank_receives)
_v2_combine("v2_combine_weights_dtype", _arg("topk_weights", lambda e, d, a: a["topk_weights"].bfloat16()),
            "bfloat16 weights")
_v2_combine("v2_combine_bias_dim", _arg("bias", lambda e, d, a: _v2bias(e).unsqueeze(0)), "a 3-D bias",
            neighbour=_arg("bias", lambda e, d, a: _v2bias(e)))
_v2_combine("v2_combine_bias_dtype", _arg("bias", lambda e, d, a: _v2bias(e, dtype=torch.float32)), "a float32 bias",
            neighbour=_arg("bias", lambda e, d, a: _v2bias(e)))
_v2_combine("v2_combine_bias_shape", _arg("bias", lambda e, d, a: _v2bias(e, rows_delta=1)),
            "a bias with one row too many", neighbour=_arg("bias", lambda e, d, a: _v2bias(e)))
_v2_combine("v2_combine_previous_event_without_comm_alloc", _arg("previous_event", lambda e, d, a: d.buffer.capture()),
            "previous_event without allocate_on_comm_stream",
            neighbour=lambda e, d, a: a.update(previous_event=d.buffer.capture(), allocate_on_comm_stream=True))
_v2_combine("v2_combine_hybrid_handle_without_metadata",
            _arg("handle", lambda e, d, a: _replaced(a["handle"], psum_num_recv_tokens_per_scaleup_rank=torch.zeros(
                e.world_size // e.num_nodes, dtype=torch.int32, device=e.device))),
            "a hybrid buffer's combine of a direct-mode handle (its scale-up prefix sum resized to pass)",
            topology="hybrid", buffer=lambda env: env.v2_buffer(allow_hybrid_mode=False),
            target=lambda env, done, bad: env.v2_buffer() if bad else done.buffer)
_v2_combine("v2_combine_hybrid_channels",
            lambda e, d, a: a.update(num_sms=d.handle.token_metadata_at_forward.shape[0] + 1),
            "a hybrid combine with one SM more than the dispatch has channels (channels % num_sms != 0)",
            topology="hybrid")
_v2_combine("v2_combine_hybrid_channels_per_sm", _arg("num_sms", lambda e, d, a: 1),
            "a hybrid combine on 1 SM (more than 16 channels per SM)", topology="hybrid")


@pair("v2_combine_hybrid_smem", topology="hybrid")
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


@pair("v2_combine_buffer_size", topology="single")
def _(env: BadCallEnv, bad: bool) -> None:
    """A handle from a buffer sized for more tokens, combined on the example's buffer: one token more than the
    combine layout holds (neighbour: exactly what it holds)."""
    ex = env.example
    small = env.v2_buffer()
    per_token = v2_direct_combine_bytes(env.world_size, 1, ex.hidden, ex.num_topk)
    n = small.num_bytes // per_token + (1 if bad else 0)
    done = env.valid_v2_dispatch(env.v2_buffer(num_max_tokens_per_rank=n), num_max_tokens_per_rank=n)
    small.combine(done.recv_x, done.handle, topk_weights=done.recv_topk_weights)


# ---------------------------------------------------------------------------------------- EventOverlap
@pair("utils_eventoverlap_wait_without_event")
def _(env: BadCallEnv, bad: bool) -> None:
    """current_stream_wait() on the EventOverlap of a synchronous dispatch (neighbour: of an async one)."""
    done = env.valid_v2_dispatch(async_with_compute_stream=not bad)
    done.out[4].current_stream_wait()


@pair("utils_eventoverlap_hook_twice")
def _(env: BadCallEnv, bad: bool) -> None:
    """A second hook on the EventOverlap of an async deterministic dispatch (which registered the sort)."""
    done = env.valid_v2_dispatch(env.v2_buffer(deterministic=True), async_with_compute_stream=True)
    event = done.out[4]
    if not bad:
        event.current_stream_wait()
    event.register_hook_after_wait(lambda: None)


def all_names() -> list[str]:
    """Every registered recipe and neighbour name."""
    return sorted(RECIPES)


__all__ = ["RECIPES", "BadCallEnv", "LLCall", "LLShape", "SharedBuffers", "V1Call", "V2Call", "all_names", "applies",
           "make_env", "pair", "recipe", "run"]
