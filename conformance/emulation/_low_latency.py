"""The legacy low-latency (IBGDA) kernels: per-128-channel FP8 cast, UE8M0 packing, LogFMT-10, buffer layout.

Followed from DeepEP 2.1.0 ``csrc/kernels/legacy/internode_ll.cu`` (dispatch send phase: the FP8 cast; receive
phase: the per-expert packing and the column-major scales), ``csrc/kernels/legacy/utils.cuh``
(``calculate_fp8_scales``, ``fast_log2_ceil``, ``extract_required_scale_format``) and ``csrc/legacy/config.hpp``
(``LowLatencyLayout``).  Pure functions of tensors; the ``Buffer`` methods (``legacy.py``) do the exchange.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from . import _checks, _exchange, _ll_buffer, _refusals, _sizing
from ._ll_buffer import LowLatencyBuffer, barrier, exchange_with_masks, fits, layout
from ._refusals import check, refuse
from ._uninit import uninitialised
from .seams import seam
from .utils.event import EventHandle, EventOverlap, defer

#: ``SWITCH_HIDDEN`` of the low-latency launchers (internode_ll.cu:552 and :1236).
SUPPORTED_HIDDEN = (2048, 2560, 3072, 4096, 5120, 6144, 7168, 8192)
#: ``kNumMaxTopK`` of the low-latency kernels (internode_ll.cu:501 and :1179).
NUM_MAX_TOPK = 11
#: ``kFP8Margin``, ``kFinfoAmaxE4M3`` (utils.cuh:477-479).
FP8_MARGIN = 1e-4
E4M3_MAX = 448.0
#: Channels per FP8 scale; scales per packed UE8M0 int32.
CHANNELS_PER_SCALE = 128
UE8M0_PER_PACK = 4
#: LogFMT-10 constants (internode_ll.cu:559-562): log threshold, min clip, magnitude values.
LOGFMT_THRESHOLD = 0.0
LOGFMT_MIN_CLIP = 32.0
LOGFMT_VALUES = 1 << 9
#: ``LEGACY_NUM_BUFFER_ALIGNMENT_BYTES``.
ALIGNMENT = 128


#: The refusal rows of ``LowLatencyLayout``'s host asserts (config.hpp:142, :150, :158) on each path that builds one
#: (the low-latency calls, the size hint).
LAYOUT_ROWS = {call: (f"v1_ll_{call}_layout_142", f"v1_ll_{call}_layout_150", f"v1_ll_{call}_layout_158")
               for call in ("dispatch", "combine", "clean", "next_buffer", "size_hint")}


@seam("ll_layout_total_bytes")
def layout_total_bytes(num_max_dispatch_tokens_per_rank: int, hidden: int, num_ranks: int, num_experts: int) -> int:
    """``LowLatencyLayout::total_bytes`` (csrc/legacy/config.hpp:131-166): two send, two receive and two
    signalling buffers (``_ll_buffer.layout``)."""
    del num_ranks  # the layout does not depend on it
    return layout(num_max_dispatch_tokens_per_rank, hidden, num_experts).total_bytes


def rdma_size_hint(num_max_dispatch_tokens_per_rank: int, hidden: int, num_ranks: int, num_experts: int) -> int:
    """``get_low_latency_rdma_size_hint`` (config.hpp:185-188): the total, rounded up past the next 128."""
    layout(num_max_dispatch_tokens_per_rank, hidden, num_experts, LAYOUT_ROWS["size_hint"])  # config.hpp:186
    total = layout_total_bytes(num_max_dispatch_tokens_per_rank, hidden, num_ranks, num_experts)
    return (total + ALIGNMENT) // ALIGNMENT * ALIGNMENT


def _log2_ceil(value: torch.Tensor) -> torch.Tensor:
    """``fast_log2_ceil`` on float32 bits: exponent - 127, plus one if any mantissa bit is set."""
    bits = value.to(torch.float32).view(torch.int32)
    exponent = (bits >> 23) & 0xFF
    return exponent - 127 + ((bits & 0x7FFFFF) != 0).to(torch.int32)


def _pow2(exponent: torch.Tensor) -> torch.Tensor:
    """``fast_pow2``: the float32 whose exponent field is ``exponent + 127``."""
    return ((exponent.to(torch.int32) + 127) << 23).view(torch.float32)


@seam("ll_fp8_cast")
def fp8_cast(x: torch.Tensor, round_scale: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The dispatch send phase's cast of bf16 ``x [n, hidden]``: ``(float8_e4m3fn [n, hidden], scale_inv float32
    [n, hidden // 128])``, per 128 channels: ``amax = max(1e-4, max |x|)``; ``scale_inv = amax * (1/448)`` and
    ``scale = 448 / amax``, or with ``round_scale`` both powers of two (``2^ceil(log2(amax / 448))``); each value
    ``x * scale`` rounded to nearest-even E4M3, saturated to +-448 (``__NV_SATFINITE``)."""
    n, hidden = x.shape
    values = x.to(torch.float32).reshape(n, hidden // CHANNELS_PER_SCALE, CHANNELS_PER_SCALE)
    amax = torch.clamp_min(values.abs().amax(dim=-1), FP8_MARGIN)  # fmaxf(kFP8Margin, ...)
    inv_max = torch.tensor(1 / E4M3_MAX, dtype=torch.float32)
    if round_scale:
        exponent = _log2_ceil(amax * inv_max)
        scale, scale_inv = _pow2(-exponent), _pow2(exponent)
    else:
        scale_inv = amax * inv_max
        scale = torch.tensor(E4M3_MAX, dtype=torch.float32) / amax
    scaled = torch.clamp(values * scale.unsqueeze(-1), -E4M3_MAX, E4M3_MAX)
    return scaled.to(torch.float8_e4m3fn).reshape(n, hidden), scale_inv


@seam("ll_ue8m0_bytes")
def ue8m0_bytes(scale_inv: torch.Tensor) -> torch.Tensor:
    """``extract_required_scale_format<true>``: bits 23..30 of each float32 scale, as uint8."""
    return ((scale_inv.to(torch.float32).view(torch.int32) >> 23) & 0xFF).to(torch.uint8)


def pack_ue8m0(exponents: torch.Tensor) -> torch.Tensor:
    """Four UE8M0 bytes per int32, scale ``4 * p + j`` in byte ``j`` (little-endian): ``[..., S] -> [..., S / 4]``."""
    shape = tuple(exponents.shape[:-1])
    grouped = exponents.to(torch.int64).reshape(shape + (exponents.shape[-1] // UE8M0_PER_PACK, UE8M0_PER_PACK))
    packed = sum(grouped[..., j] << (8 * j) for j in range(UE8M0_PER_PACK))
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def column_major(rows: torch.Tensor) -> torch.Tensor:
    """``[E, T, S]`` values laid out as the library allocates its scales: ``[E, S, T]`` transposed (TMA)."""
    return rows.transpose(1, 2).contiguous().transpose(1, 2)


def logfmt_roundtrip(x: torch.Tensor) -> torch.Tensor:
    """What the combine receiver decodes of bf16 rows ``x [n, hidden]`` sent as LogFMT-10 (float32 values).

    Per 128 channels (``logfmt_encode``): ``amax`` / ``amin`` of ``|x|``; the block is cast only when
    ``log2(amax) < 0`` and ``log2(amin) < log2(amax)`` (``amin`` clipped to ``amax * 2^-32``), else sent as bf16.
    A cast value is ``floor(log2|x| / step - log2(amin) / step + rounding)`` (at least 0), ``step = (log2 amax -
    log2 amin) / 510``, decoded as ``2^((code - 1) * step + log2 amin)`` (code 0: zero), with its sign.  The
    kernels use ``lg2.approx`` / ``ex2.approx``; the emulation exact ``log2`` / ``exp2`` (see DIVERGENCES.md).
    """
    n, hidden = x.shape
    values = x.to(torch.float32).reshape(n, hidden // 128, 128)
    magnitude = values.abs()
    amax = magnitude.amax(dim=-1, keepdim=True)
    amin = magnitude.amin(dim=-1, keepdim=True)
    log_amax = torch.log2(amax)
    log_amin = torch.maximum(torch.log2(amin), log_amax - LOGFMT_MIN_CLIP)
    cast = (log_amax < LOGFMT_THRESHOLD) & (log_amin < log_amax)
    step = torch.where(cast, (log_amax - log_amin) / (LOGFMT_VALUES - 2), torch.ones_like(log_amax))
    rounding = 2.0 - torch.log2((1.0 + torch.exp2(step)) * 0.5) / step
    code = torch.floor(torch.clamp_min(torch.log2(magnitude) / step + (rounding - log_amin / step), 0))
    decoded = torch.where(code == 0, torch.zeros_like(magnitude), torch.exp2((code - 1) * step + log_amin))
    decoded = torch.where(torch.signbit(values), -decoded, decoded)
    return torch.where(cast, decoded, values).reshape(n, hidden)


# ------------------------------------------------------------------------------------------ the Buffer side

@seam("ll_deliver")
def _deliver(receive: Callable[[], None], return_recv_hook: bool, async_finish: bool,
             device: torch.device) -> EventOverlap:
    """The receive phase of a low-latency call: left to the hook (``return_recv_hook``); with ``async_finish`` on CPU,
    deferred work the returned event covers (the kernel still running on the communication stream: the outputs are
    unwritten until the event is waited on, see DIVERGENCES.md); otherwise done now."""
    if return_recv_hook:
        return EventOverlap(None)
    if async_finish and device.type == "cpu":
        defer(receive)
        return EventOverlap(EventHandle(device))
    receive()
    return EventOverlap(EventHandle(device) if async_finish else None)

class LowLatencyMixin:
    """``Buffer.low_latency_dispatch`` / ``low_latency_combine`` / ``get_next_low_latency_combine_buffer`` /
    ``clean_low_latency_buffer`` and the shrink-mode mask calls (deep_ep/buffers/legacy.py:538-712,
    csrc/legacy/buffer.hpp:1431-1748, csrc/kernels/legacy/internode_ll.cu).

    The receive layout is the library's: per local expert ``num_ranks * num_max_dispatch_tokens_per_rank`` rows,
    the rows of source rank ``s`` at ``[begin, begin + count)`` with ``layout_range[e, s] = begin << 32 | count``,
    ``recv_count[e]`` valid rows in all.  The emulation packs source ranks in ascending order and each rank's
    tokens in ascending order (the real order is arrival order; see DIVERGENCES.md).

    The signalling is the library's too (``_ll_buffer``): a dispatch receiver takes a source's block when the
    source's count word arrives in the signalling buffer of this call's index, a combine receiver takes an
    expert's rows when its flag arrives; each call zeroes the other index's words.  A word already non-zero when
    the call starts (a dirty buffer: ``clean_low_latency_buffer`` exists for it) is read as if it had arrived.
    With a mask buffer (``enable_shrink``) a rank neither sends to nor waits for the ranks it masked; a wait
    whose sender masked this rank times out and masks the sender.
    """

    group: Any
    group_size: int
    rank: int
    runtime: object | None
    low_latency_mode: bool
    num_rdma_bytes: int
    num_qps_per_rank: int
    enable_shrink: bool

    def _ll(self) -> LowLatencyBuffer:
        """This buffer's RDMA memory, double-buffer index and mask buffer."""
        state = self.__dict__.get("_ll_buffer")
        if state is None:
            state = LowLatencyBuffer(self.num_rdma_bytes, self.group_size, self.enable_shrink, _device())
            self.__dict__["_ll_buffer"] = state
        return state

    def _ll_qp_depth_check(self, num_max_dispatch_tokens_per_rank: int, row_not_ll: str, row_qp: str) -> None:
        """``assert self.nvshmem_qp_depth >= (num_max_dispatch_tokens_per_rank + 1) * 2`` (legacy.py:609 / :665):
        an ``AttributeError`` on a buffer that never set the depth (no low-latency mode, one RDMA rank)."""
        depth = self.__dict__.get("nvshmem_qp_depth")
        if depth is None and _refusals.enforced(row_not_ll):
            refuse(row_not_ll)
        check(depth is None or depth >= (num_max_dispatch_tokens_per_rank + 1) * 2, row_qp)

    def _ll_dispatch_arguments(self, x: torch.Tensor, topk_idx: torch.Tensor, t_max: int, num_experts: int,
                               stats: torch.Tensor | None, cost: torch.Tensor | None) -> BaseException | None:
        """The checks of ``Buffer::low_latency_dispatch`` up to the layout (csrc/legacy/buffer.hpp:1474-1503, with
        ``LowLatencyLayout``'s at :1502), in the library's order.  A token count only this rank may get wrong
        (:1481) comes back unraised and ends the checks: the caller raises it after the verdict-only preflight, so
        that the peers raise ``PeerRefused`` instead of waiting in the kernel."""
        num_ranks = self.group_size
        check(self.low_latency_mode, "v1_ll_dispatch_not_ll_mode")
        check(x.dim() == 2 and x.is_contiguous() and x.dtype == torch.bfloat16, "v1_ll_dispatch_1478")
        check(x.shape[1] % 16 == 0 and x.shape[1] % 128 == 0, "v1_ll_dispatch_1479")
        check(topk_idx.dim() == 2 and topk_idx.is_contiguous(), "v1_ll_dispatch_1480")
        if _refusals.violated(x.shape[0] == topk_idx.shape[0] and x.shape[0] <= t_max, "v1_ll_dispatch_1481"):
            return _refusals.error("v1_ll_dispatch_1481")
        check(topk_idx.dtype == torch.int64, "v1_ll_dispatch_1482")
        check(num_experts % num_ranks == 0, "v1_ll_dispatch_1483")
        if stats is not None:
            check(stats.dtype == torch.int32, "v1_ll_dispatch_1487")
            check(stats.dim() == 1 and stats.is_contiguous(), "v1_ll_dispatch_1488")
            check(stats.shape[0] == num_experts // num_ranks, "v1_ll_dispatch_1489")
        if cost is not None:
            check(cost.dtype == torch.int64, "v1_ll_dispatch_1492")
            check(cost.dim() == 1 and cost.is_contiguous(), "v1_ll_dispatch_1493")
            check(cost.shape[0] == num_ranks, "v1_ll_dispatch_1494")
        layout(t_max, x.shape[1], num_experts, LAYOUT_ROWS["dispatch"])  # :1502, config.hpp:142/150/158
        check(layout_total_bytes(t_max, x.shape[1], num_ranks, num_experts) <= self.num_rdma_bytes,
              "v1_ll_dispatch_1503")
        return None

    def _ll_combine_arguments(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor,
                              src_info: torch.Tensor, layout_range: torch.Tensor, t_max: int, num_experts: int,
                              cost: torch.Tensor | None) -> BaseException | None:
        """The checks of ``Buffer::low_latency_combine`` up to the layout (buffer.hpp:1612-1643, ``LowLatencyLayout``'s
        at :1642), in the library's order; a token count only this rank may get wrong (:1623) comes back unraised (see
        :meth:`_ll_dispatch_arguments`)."""
        num_ranks = self.group_size
        num_local = num_experts // num_ranks
        check(self.low_latency_mode, "v1_ll_combine_1612")
        check(x.dim() == 3 and x.is_contiguous() and x.dtype == torch.bfloat16, "v1_ll_combine_1615")
        check(x.shape[0] == num_local, "v1_ll_combine_1616")
        check(x.shape[1] == num_ranks * t_max, "v1_ll_combine_1617")
        check(x.shape[2] % 16 == 0 and x.shape[2] % 128 == 0, "v1_ll_combine_1618")
        check(topk_idx.dim() == 2 and topk_idx.is_contiguous(), "v1_ll_combine_1619")
        check(topk_idx.shape[0] == topk_weights.shape[0] and topk_idx.shape[1] == topk_weights.shape[1],
              "v1_ll_combine_1620")
        check(topk_idx.dtype == torch.int64, "v1_ll_combine_1621")
        check(topk_weights.dim() == 2 and topk_weights.is_contiguous(), "v1_ll_combine_1622")
        if _refusals.violated(topk_weights.shape[0] <= t_max, "v1_ll_combine_1623"):
            return _refusals.error("v1_ll_combine_1623")
        check(topk_weights.dtype == torch.float32, "v1_ll_combine_1624")
        check(src_info.dim() == 2 and src_info.is_contiguous(), "v1_ll_combine_1625")
        check(src_info.dtype == torch.int32 and x.shape[0] == src_info.shape[0], "v1_ll_combine_1626")
        check(layout_range.dim() == 2 and layout_range.is_contiguous(), "v1_ll_combine_1627")
        check(layout_range.dtype == torch.int64, "v1_ll_combine_1628")
        check(layout_range.shape[0] == num_local and layout_range.shape[1] == num_ranks, "v1_ll_combine_1629")
        if cost is not None:
            check(cost.dtype == torch.int64, "v1_ll_combine_1632")
            check(cost.dim() == 1 and cost.is_contiguous(), "v1_ll_combine_1633")
            check(cost.shape[0] == num_ranks, "v1_ll_combine_1634")
        layout(t_max, x.shape[2], num_experts, LAYOUT_ROWS["combine"])  # :1642, config.hpp:142/150/158
        check(layout_total_bytes(t_max, x.shape[2], num_ranks, num_experts) <= self.num_rdma_bytes,
              "v1_ll_combine_1643")
        return None

    def clean_low_latency_buffer(self, num_max_dispatch_tokens_per_rank: int, hidden: int, num_experts: int) -> None:
        """Zero both signalling buffers of the layout of (tokens, hidden, experts), between two barriers
        (csrc/legacy/buffer.hpp:1431-1455, internode_ll.cu:71-99); nothing else of the buffer changes, not the
        double-buffer index either.  In shrink mode the barriers skip masked ranks and mask a rank that never
        answers."""
        check(self.runtime is not None, "v1_ll_clean_after_destroy")
        check(self.low_latency_mode, "v1_ll_clean_1432")
        lay = layout(num_max_dispatch_tokens_per_rank, hidden, num_experts, LAYOUT_ROWS["clean"])  # buffer.hpp:1434
        check(fits(lay, 0, self.num_rdma_bytes) and fits(lay, 1, self.num_rdma_bytes), "v1_ll_clean_1440")
        state = self._ll()
        barrier(self.group, state, state.device)
        _clean_signals(state, lay)
        barrier(self.group, state, state.device)

    def low_latency_update_mask_buffer(self, rank_to_mask: int, mask: bool = False) -> None:
        """Mask (``mask=True``) or unmask a rank in this rank's mask buffer (csrc/legacy/buffer.hpp:1731-1735)."""
        check(self.runtime is not None, "v1_ll_update_mask_after_destroy")
        state = self._ll()
        check(state.mask is not None, "v1_ll_update_mask_1732")
        check(0 <= rank_to_mask < self.group_size, "v1_ll_update_mask_1733")
        assert state.mask is not None
        state.mask[rank_to_mask] = 1 if mask else 0

    def low_latency_query_mask_buffer(self, mask_status: torch.Tensor) -> None:
        """Write this rank's mask (1 = masked) into ``mask_status`` (csrc/legacy/buffer.hpp:1737-1743: the kernel
        writes ``num_ranks`` ints from its data pointer on)."""
        check(self.runtime is not None, "v1_ll_query_mask_after_destroy")
        state = self._ll()
        check(state.mask is not None, "v1_ll_query_mask_1738")
        check(mask_status.numel() == self.group_size and mask_status.dtype == torch.int32, "v1_ll_query_mask_1739")
        assert state.mask is not None
        mask_status.as_strided((self.group_size,), (1,)).copy_(state.mask)

    def low_latency_clean_mask_buffer(self) -> None:
        """Unmask every rank (csrc/legacy/buffer.hpp:1745-1748)."""
        check(self.runtime is not None, "v1_ll_clean_mask_after_destroy")
        state = self._ll()
        check(state.mask is not None, "v1_ll_clean_mask_1746")
        assert state.mask is not None
        state.mask.zero_()

    def low_latency_dispatch(
        self,
        x: torch.Tensor,
        topk_idx: torch.Tensor,
        num_max_dispatch_tokens_per_rank: int,
        num_experts: int,
        cumulative_local_expert_recv_stats: torch.Tensor | None = None,
        dispatch_wait_recv_cost_stats: torch.Tensor | None = None,
        use_fp8: bool = True,
        round_scale: bool = False,
        use_ue8m0: bool = False,
        async_finish: bool = False,
        return_recv_hook: bool = False,
    ) -> tuple[Any, torch.Tensor, tuple, EventOverlap, Callable[[], None] | None]:
        """Send each (token, top-k slot) to its expert, FP8-cast per 128 channels when ``use_fp8``.

        Returns ``(recv_x or (recv_x, scales), recv_count, handle, event, hook)``; with ``return_recv_hook`` the
        received tensors (and the statistics) are written only when ``hook()`` is called.
        """
        check(not _checks.deterministic_fill_enabled(), "v1_ll_dispatch_deterministic")  # legacy.py:607
        self._ll_qp_depth_check(num_max_dispatch_tokens_per_rank, "v1_ll_dispatch_not_ll_buffer",
                                "v1_ll_dispatch_qp_depth")
        check(self.runtime is not None, "v1_ll_dispatch_after_destroy")
        num_ranks, me = self.group_size, self.rank
        t_max = num_max_dispatch_tokens_per_rank
        stats, cost = cumulative_local_expert_recv_stats, dispatch_wait_recv_cost_stats
        error = self._ll_dispatch_arguments(x, topk_idx, t_max, num_experts, stats, cost)
        hidden = x.shape[1]
        num_local = num_experts // num_ranks
        state = self._ll()
        index = state.index
        if error is None:
            index = state.flip()  # buffer.hpp:1504-1505: this call's buffer; the index flips before the checks below
            check(not (async_finish and return_recv_hook), "v1_ll_dispatch_1511")
            check((num_ranks * t_max) % 4 == 0, "v1_ll_dispatch_1526")
            if use_fp8:
                check(hidden % 512 == 0, "v1_ll_dispatch_1530")
                if use_ue8m0:
                    check(round_scale, "v1_ll_dispatch_1535")
            _kernel_checks(num_experts, topk_idx.shape[1], hidden, "v1_ll_dispatch_kernel_496",
                           "v1_ll_dispatch_kernel_501", "v1_ll_dispatch_unsupported_hidden")
            error = _qp_error(self.num_qps_per_rank, num_local)
        # the send phase: the cast at the source, one message per (token, slot) with an expert, then per (expert,
        # destination) the count word -count - 1 (into this call's signalling buffer; the other one is zeroed)
        def send_fields() -> dict[str, torch.Tensor | None]:  # only where this rank's arguments passed the checks
            payload, scales = fp8_cast(x, round_scale) if use_fp8 else (x, None)
            return {"x": payload, "scales": scales, "topk_idx": topk_idx}

        exchanged, masks = exchange_with_masks(self.group, state, x.device, x.shape[0], error,
                                               "Buffer.low_latency_dispatch", send_fields)
        received = exchanged.fields
        payload_dtype = received["x"][me].dtype  # the cast's (this rank's own rows came back too)
        lay = layout(t_max, hidden, num_experts)
        sent = [not row[me] for row in masks]  # did source s send to me
        orders = [[_slot_order(received["topk_idx"][s], me * num_local + e) for s in range(num_ranks)]
                  for e in range(num_local)]
        words = state.words(lay, index).view(num_local, num_ranks)
        sizes = torch.tensor([[len(o) for o in row] for row in orders], dtype=torch.int64,
                             device=words.device).reshape(num_local, num_ranks)
        state.words(lay, index ^ 1).zero_()
        before = words.to(torch.int64).clone()
        words.copy_(_wrap32(before - (sizes + 1) * torch.tensor(sent, dtype=torch.int64, device=words.device)))

        device = x.device
        rows_per_expert = num_ranks * t_max
        num_scales = hidden // CHANNELS_PER_SCALE
        shapes = [((num_local, rows_per_expert, hidden), payload_dtype),
                  ((num_local, rows_per_expert, num_scales // UE8M0_PER_PACK if use_ue8m0 else num_scales),
                   torch.int32 if use_ue8m0 else torch.float32),
                  ((num_local,), torch.int32), ((num_local, rows_per_expert), torch.int32),
                  ((num_local, num_ranks), torch.int64)]
        outputs = [torch.full(shape, _POISON[dtype], dtype=dtype, device=device) for shape, dtype in shapes]
        if use_fp8:
            outputs[1] = column_major(outputs[1])
        else:
            outputs[1] = None

        def receive() -> None:
            """The receive phase: per (local expert, source) the block the count word announces, the statistics."""
            masked = state.masked()  # read by every receiving warp group before any of them times out
            # torch::empty in the library (csrc/legacy/buffer.hpp, low_latency_dispatch): the kernel writes each local
            # expert's first recv_count rows only; the rows past them stay uninitialised (0x7F bytes here, _uninit)
            recv_x = uninitialised((num_local, rows_per_expert, hidden), payload_dtype, device)
            recv_scales = uninitialised((num_local, rows_per_expert, num_scales), torch.float32, device)
            src_info = uninitialised((num_local, rows_per_expert), torch.int32, device)
            layout_range = torch.zeros((num_local, num_ranks), dtype=torch.int64, device=device)
            recv_count = torch.zeros(num_local, dtype=torch.int32, device=device)
            timed_out: set[int] = set()
            for e in range(num_local):
                begin = 0
                for s in range(num_ranks):
                    wait, rows = 0, None
                    if masked[s]:
                        count = 0
                    elif int(before[e, s]) != 0:  # a stale word: taken as the count without waiting
                        count = _ll_buffer.int32(-int(before[e, s]) - 1)
                    elif sent[s]:
                        count, wait, rows = len(orders[e][s]), _ll_buffer.nominal_wait_cycles(), orders[e][s]
                    else:  # the source masked me: nothing comes
                        count, wait = 0, _ll_buffer.TIMEOUT_CYCLES + 1
                        timed_out.add(s)
                    lo, hi = max(begin, 0), min(begin + count, rows_per_expert)  # rows inside the tensor only
                    if hi > lo and rows is None:  # the stale rows a dirty count points at
                        recv_x[e, lo:hi] = torch.full((), _POISON[payload_dtype], dtype=payload_dtype)
                        recv_scales[e, lo:hi] = float("nan")
                        src_info[e, lo:hi] = -1
                    elif hi > lo:
                        order = rows[lo - begin:hi - begin]
                        recv_x[e, lo:hi] = received["x"][s][order]
                        if use_fp8:
                            recv_scales[e, lo:hi] = received["scales"][s][order]
                        src_info[e, lo:hi] = order.to(torch.int32)
                    layout_range[e, s] = (begin << 32) | (count & 0xFFFFFFFF)
                    begin = _ll_buffer.int32(begin + count)
                    if stats is not None:
                        stats[e] = _ll_buffer.int32(int(stats[e]) + count)
                    if cost is not None:
                        cost[s] += wait
                recv_count[e] = begin
            for s in sorted(timed_out):
                state.time_out(s)
            if use_fp8 and use_ue8m0:
                packed_scales = column_major(pack_ue8m0(ue8m0_bytes(recv_scales)))
                for e in range(num_local):  # the packed bytes of the unwritten rows: unwritten too
                    past = packed_scales[e, min(max(int(recv_count[e]), 0), rows_per_expert):]
                    past.copy_(uninitialised(tuple(past.shape), past.dtype, device))
            else:
                packed_scales = column_major(recv_scales) if use_fp8 else None
            for out, value in zip(outputs, [recv_x, packed_scales, recv_count, src_info, layout_range], strict=True):
                if out is not None:
                    out.copy_(value)

        hook = receive if return_recv_hook else None
        event = _deliver(receive, return_recv_hook, async_finish, device)
        recv_x_out = (outputs[0], outputs[1]) if use_fp8 else outputs[0]
        handle = (outputs[3], outputs[4], t_max, hidden, num_experts)
        return recv_x_out, outputs[2], handle, event, hook

    def low_latency_combine(
        self,
        x: torch.Tensor,
        topk_idx: torch.Tensor,
        topk_weights: torch.Tensor,
        handle: tuple,
        use_logfmt: bool = False,
        zero_copy: bool = False,
        async_finish: bool = False,
        return_recv_hook: bool = False,
        out: torch.Tensor | None = None,
        combine_wait_recv_cost_stats: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, EventOverlap, Callable[[], None] | None]:
        """Send every expert row back to its token's rank; each token sums ``weight * row`` over its top-k slots
        in slot order, in float32, rounded once to bf16 (rows decoded from LogFMT-10 with ``use_logfmt``; rows
        read from :meth:`get_next_low_latency_combine_buffer` with ``zero_copy``), into ``out`` when given (left
        as it is until the receive phase).  Slots of experts on masked ranks are skipped."""
        check(not _checks.deterministic_fill_enabled(), "v1_ll_combine_deterministic")  # legacy.py:662
        src_info, layout_range, t_max, hidden, num_experts = handle  # legacy.py:664 (Python's own unpacking error)
        self._ll_qp_depth_check(t_max, "v1_ll_combine_not_ll_buffer", "v1_ll_combine_qp_depth")
        check(self.runtime is not None, "v1_ll_combine_after_destroy")
        num_ranks = self.group_size
        num_local = num_experts // num_ranks
        cost = combine_wait_recv_cost_stats
        error = self._ll_combine_arguments(x, topk_idx, topk_weights, src_info, layout_range, t_max, num_experts, cost)
        hidden = x.shape[2]
        num_tokens, num_topk = topk_weights.shape
        state = self._ll()
        index = state.index
        if error is None:
            index = state.flip()  # buffer.hpp:1644-1645: this call's buffer; the index flips before the checks below
            check(not (async_finish and return_recv_hook), "v1_ll_combine_1651")
            if out is not None:
                check(out.dim() == 2 and out.is_contiguous(), "v1_ll_combine_1658")
                check(out.shape[0] == num_tokens and out.shape[1] == hidden, "v1_ll_combine_1659")
                check(out.dtype == x.dtype, "v1_ll_combine_1660")
            _kernel_checks(num_experts, num_topk, hidden, "v1_ll_combine_kernel_1170", "v1_ll_combine_kernel_1179",
                           "v1_ll_combine_unsupported_hidden",
                           between=((not (zero_copy and use_logfmt), "v1_ll_combine_kernel_1182"),))
        lay = layout(t_max, hidden, num_experts)
        me = self.rank
        device = x.device
        empty = torch.empty(0, dtype=torch.int64, device=device)
        mine = state.masked()  # this rank's mask as it sends (every rank's arrives with the rows)

        def send_phase() -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            """Every valid row of a block goes back to its source rank (unless this rank masked it); only where this
            rank's arguments passed the checks."""
            source = state.staging(lay, index, num_local, num_ranks * t_max, hidden) if zero_copy else x
            rows, tokens, experts, dst = [], [], [], []
            for e in range(num_local):
                for s in range(num_ranks):
                    packed = int(layout_range[e, s])
                    begin, count = packed >> 32, _ll_buffer.int32(packed)  # unpack2: (int count, int offset)
                    end = min(begin + count, num_ranks * t_max)
                    begin, count = max(begin, 0), end - max(begin, 0)  # a garbage layout: rows of the tensor only
                    if count > 0 and not mine[s]:
                        rows.append(source[e, begin:begin + count])
                        tokens.append(src_info[e, begin:begin + count].to(torch.int64))
                        experts.append(torch.full((count,), me * num_local + e, dtype=torch.int64, device=device))
                        dst.append(torch.full((count,), s, dtype=torch.int64, device=device))
            send_rows = torch.cat(rows) if rows else torch.empty((0, hidden), dtype=x.dtype, device=device)
            values = logfmt_roundtrip(send_rows) if use_logfmt else send_rows  # bf16 rows: widened on arrival
            return torch.cat(dst) if dst else empty, {
                "x": values, "token": torch.cat(tokens) if tokens else empty,
                "expert": torch.cat(experts) if experts else empty}

        # the send phase, then per (expert, destination) a flag into this call's signalling buffer (the other one
        # is zeroed); the call's preflight (verdict, masks) travels with the rows
        dst, fields = send_phase() if error is None else (empty, {})
        parts, table = _exchange.return_to_sources(self.group, device, dst, fields, error,
                                                   "Buffer.low_latency_combine", [int(m) for m in mine])
        masks = _ll_buffer.masks_of(table)
        got_x = torch.cat([p["x"] for p in parts]).to(torch.float32)  # exact: bf16 and LogFMT-decoded rows alike
        key = torch.cat([p["token"] for p in parts]) * max(num_experts, 1) + torch.cat([p["expert"] for p in parts])
        flags = state.words(lay, index)
        state.words(lay, index ^ 1).zero_()
        before = flags.to(torch.int64).clone()
        owners = torch.arange(num_experts, dtype=torch.int64) // max(num_local, 1)
        arrived = torch.tensor([not masks[o][me] for o in owners.tolist()], dtype=torch.bool, device=flags.device)
        flags.copy_(_wrap32(before + arrived.to(torch.int64)))
        combined = out if out is not None else \
            torch.full((num_tokens, hidden), _POISON[torch.bfloat16], dtype=torch.bfloat16, device=device)

        def receive() -> None:
            """The receive phase: wait for every expert's flag, then per token add up its slots in slot order."""
            masked = state.masked()
            stale = torch.zeros(num_experts, dtype=torch.bool)
            timed_out: set[int] = set()
            for expert, owner in enumerate(owners.tolist()):
                wait = 0
                if masked[owner]:
                    pass
                elif int(before[expert]) != 0:  # a stale flag: the rows are read before (if ever) they arrive
                    stale[expert] = True
                elif bool(arrived[expert]):
                    wait = _ll_buffer.nominal_wait_cycles()
                else:
                    wait = _ll_buffer.TIMEOUT_CYCLES + 1
                    timed_out.add(owner)
                if cost is not None:
                    cost[owner] += wait
            for owner in sorted(timed_out):
                state.time_out(owner)
            skip = torch.tensor(state.masked() + [False], dtype=torch.bool)  # [num_ranks]: an owner out of range
            combined.copy_(_reduce(got_x, key, topk_idx, topk_weights, hidden, num_experts, num_local, skip,
                                   stale.to(device)).to(torch.bfloat16))

        hook = receive if return_recv_hook else None
        return combined, _deliver(receive, return_recv_hook, async_finish, device), hook

    def get_next_low_latency_combine_buffer(self, handle: object) -> torch.Tensor:
        """The bf16 ``[num_local_experts, num_ranks * num_max_dispatch_tokens_per_rank, hidden]`` rows of the send
        buffer the next ``low_latency_combine(..., zero_copy=True)`` sends (a strided view of the RDMA buffer,
        one combine message per row, csrc/legacy/buffer.hpp:1716-1727)."""
        _, _, t_max, hidden, num_experts = handle  # type: ignore[misc]  # legacy.py:712
        check(self.runtime is not None, "v1_ll_next_buffer_after_destroy")  # legacy.py:713
        lay = layout(t_max, hidden, num_experts, LAYOUT_ROWS["next_buffer"])  # buffer.hpp:1718
        state = self._ll()
        return state.staging(lay, state.index, num_experts // self.group_size, self.group_size * t_max, hidden)


@seam("ll_clean_signals")
def _clean_signals(state: LowLatencyBuffer, lay: _ll_buffer.Layout) -> None:
    """``clean_low_latency_buffer``'s kernel between its barriers: both signalling buffers of layout ``lay`` zeroed
    (internode_ll.cu:71-99)."""
    for index in (0, 1):
        state.words(lay, index).zero_()


def _slot_order(topk_idx: torch.Tensor, expert: int) -> torch.Tensor:
    """A source's messages to ``expert``: one per top-k slot naming it, as source token indices (ascending)."""
    hits = (topk_idx == expert).sum(dim=1)
    return torch.repeat_interleave(torch.arange(topk_idx.shape[0], device=topk_idx.device), hits)


def _wrap32(values: torch.Tensor) -> torch.Tensor:
    """int64 values as the int32 words they become (two's complement wrap)."""
    return ((values + 2**31) % 2**32 - 2**31).to(torch.int32)


@seam("ll_combine_reduce")
def _reduce(got_x: torch.Tensor, key: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, hidden: int,
            num_experts: int, num_local: int, skip: torch.Tensor, stale: torch.Tensor) -> torch.Tensor:
    """float32 ``sum over slots k of weight[t, k] * row(t, topk_idx[t, k])`` in slot order (the kernel's
    accumulation); slots with ``-1`` or an expert of a ``skip`` (masked) rank are left out; a row that did not
    arrive (a ``stale`` expert's, or one its owner never sent) is the stale buffer memory the kernel reads: NaN."""
    num_tokens, num_topk = topk_idx.shape
    device = topk_idx.device
    acc = torch.zeros((num_tokens, hidden), dtype=torch.float32, device=device)
    sorted_key, order = torch.sort(key)
    stride = max(num_experts, 1)
    for k in range(num_topk):
        idx = topk_idx[:, k]
        owner = torch.where(idx >= 0, idx // max(num_local, 1), skip.numel() - 1).clamp(0, skip.numel() - 1)
        take = (idx >= 0) & ~skip.to(device)[owner]
        if not bool(take.any()):
            continue
        want = torch.arange(num_tokens, device=device) * stride + idx
        pos = torch.searchsorted(sorted_key, want).clamp_max(max(sorted_key.numel() - 1, 0))
        found = take & (sorted_key.numel() > 0)
        if sorted_key.numel():
            found &= sorted_key[pos] == want
        if num_experts:
            found &= ~stale[idx.clamp(0, num_experts - 1)]
        rows = torch.full((num_tokens, hidden), float("nan"), dtype=torch.float32, device=device)
        if bool(found.any()):
            rows[found] = got_x[order[pos[found]]]
        acc[take] += rows[take] * topk_weights[take, k].unsqueeze(1)
    return acc


#: What an output holds before its receive phase ran (the real tensors are uninitialised): NaN bytes for floats,
#: -1 for integers (see DIVERGENCES.md).
_POISON: dict[torch.dtype, Any] = {
    torch.bfloat16: float("nan"), torch.float32: float("nan"), torch.float8_e4m3fn: float("nan"),
    torch.int32: -1, torch.int64: -1,
}


def _device() -> torch.device:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _kernel_checks(num_experts: int, num_topk: int, hidden: int, row_warps: str, row_topk: str,
                   row_hidden: str, between: tuple[tuple[bool, str], ...] = ()) -> None:
    """The launchers' host checks, in their order: warp groups (an expert count 0 or above 32 per SM), top-k,
    the launcher's own checks ``between`` (combine: zero-copy with LogFMT, internode_ll.cu:1182), then
    ``SWITCH_HIDDEN``."""
    sms = _sizing.device_num_sms()
    check(0 < num_experts and -(-num_experts // sms) <= 32, row_warps)
    check(num_topk <= NUM_MAX_TOPK, row_topk)
    for ok, row in between:
        check(ok, row)
    check(hidden in SUPPORTED_HIDDEN, row_hidden)


def _qp_error(num_qps_per_rank: int, num_local_experts: int) -> BaseException | None:
    """The dispatch kernel's device assertion ``num_rc_per_pe >= num_local_experts`` (internode_ll.cu:286): the
    real kernel traps; the emulation refuses (an emulation refusal, DIVERGENCES.md)."""
    if num_qps_per_rank >= num_local_experts:
        return None
    return RuntimeError(f"deep_ep emulation: num_qps_per_rank={num_qps_per_rank} < {num_local_experts} local experts "
                        "(the real dispatch kernel traps on EP_DEVICE_ASSERT(num_rc_per_pe >= num_local_experts))")

