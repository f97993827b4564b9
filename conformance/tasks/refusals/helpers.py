"""What the refusal recipes build their calls from: the library's constants and size formulas (computed here from
the library's source, independently of ``conformance.emulation``), its recommended legacy configs, tensor edits,
and the context managers that change global state for one call (restored afterwards).

Runs inside rank processes; deterministic and identical on every rank.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

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


@dataclass(frozen=True)
class LLShape:
    """What a low-latency buffer is sized for: ``num_max_dispatch_tokens_per_rank``, hidden, expert count."""

    num_max_tokens: int
    hidden: int
    num_experts: int


# ------------------------------------------------------------------------------------------- tensor edits
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


def longer(t: torch.Tensor) -> torch.Tensor:
    """``t`` with its last entry repeated (a zero when it is empty): one entry too many, still a prefix sum."""
    return torch.cat([t, t[-1:] if t.numel() else torch.zeros(1, dtype=t.dtype, device=t.device)])


def narrow_hidden(x: torch.Tensor, hidden: int) -> torch.Tensor:
    """``x`` cut (or zero-padded) to ``hidden`` columns (its last dimension), contiguous."""
    if hidden <= x.shape[-1]:
        return x[..., :hidden].contiguous()
    return torch.cat([x, x.new_zeros(*x.shape[:-1], hidden - x.shape[-1])], dim=-1)


def fp8(x: torch.Tensor, num_scales: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """An FP8 ``(x, scales)`` pair of the example's tokens (float32 scales, ``hidden // 128`` per token)."""
    num_scales = max(x.shape[1] // 128, 1) if num_scales is None else num_scales
    return x.to(torch.float8_e4m3fn), torch.ones(x.shape[0], num_scales, dtype=torch.float32, device=x.device)


def align(value: int, alignment: int) -> int:
    return (value + alignment - 1) // alignment * alignment


def widened(t: torch.Tensor, width: int, value: float = 0, rows: int | None = None) -> torch.Tensor:
    """``t`` padded with ``value`` to ``width`` columns and, with ``rows``, to that many rows (the example's routing
    widened with -1 slots, "not selecting any expert", and unrouted tokens)."""
    t = torch.cat([t, t.new_full((t.shape[0], width - t.shape[1]), value)], dim=1)
    if rows is not None:
        t = torch.cat([t, t.new_full((rows - t.shape[0], width), value)])
    return t


# --------------------------------------------------------------------------------------- global state
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


# ------------------------------------------------------------------------------------------ legacy configs
#: The library's recommended legacy configs without the SM count, by rank count: ``(nvl_send, nvl_recv,
#: rdma_send, rdma_recv)`` of ``Buffer.get_dispatch_config`` / ``get_combine_config``
#: (``deep_ep/buffers/legacy.py:246`` and ``:274``).  The real ``deep_ep._C.Config`` exposes no fields, so a
#: recipe that needs a default config's numbers cannot read them back from the object.
DISPATCH_CONFIGS = {2: (24, 256, 6, 128), 4: (6, 256, 6, 128), 8: (6, 256, 6, 128), 16: (36, 288, 20, 128)}
COMBINE_CONFIGS = {2: (10, 256, 6, 128), 4: (9, 256, 6, 128), 8: (4, 256, 6, 128), 16: (4, 288, 12, 128)}


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


# ---------------------------------------------------------------------------------- the library's sizes
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


def v2_token_bytes(hidden_bytes: int, sf_bytes: int, num_topk: int, with_metadata: bool, rdma_align: int = 1) -> int:
    """``layout::TokenLayout::get_num_bytes<false>()`` (deep_ep/include/deep_ep/common/layout.cuh:202); DeepEP 2.5.0
    aligns the sum to ``kNumRDMAAlignmentBytes`` (``rdma_align`` 64: deep_ep/include/deep_ep/layout/ep/token.cuh:34-37,
    the version's ``token_rdma_align`` rule)."""
    metadata = num_topk * 8 + ((1 + num_topk) * 4 if with_metadata else 0)
    return align(align(hidden_bytes, TMA_ALIGN) + align(sf_bytes, TMA_ALIGN) + align(metadata, TMA_ALIGN), rdma_align)


def v2_direct_dispatch_bytes(num_ranks: int, n: int, hidden: int, num_topk: int, rdma_align: int = 1) -> int:
    """Single-node (NVLink scale-up) direct dispatch buffer bytes (csrc/elastic/buffer.hpp:594-600), bf16."""
    return v2_token_bytes(hidden * 2, 0, num_topk, True, rdma_align) * num_ranks * n


def v2_direct_combine_bytes(num_ranks: int, n: int, hidden: int, num_topk: int, rdma_align: int = 1) -> int:
    """Single-node direct combine buffer bytes (csrc/elastic/buffer.hpp:623-633), multiple reduction."""
    return v2_token_bytes(hidden * 2, 0, num_topk, False, rdma_align) * min(num_ranks, num_topk) * n
