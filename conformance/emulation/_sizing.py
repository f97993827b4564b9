"""SM / QP / buffer-size heuristics of the elastic (V2) API, with CPU stand-ins for device properties.

The constants that differ between DeepEP versions (the SM model's margin and rounding, the default per-SM bandwidths,
the token layout's RDMA alignment, the per-rank expert limit) are the ``rules`` of the version being emulated now
(``conformance/versions/<version>/contract.toml``, the version ``_refusals`` raises for): :func:`rule`.

Stand-ins (used when the tensors are on CPU, so no GPU is queried): an H200, i.e. 132 SMs and 18 NVLink
links of 26.5625 GB/s read by ``nvidia-smi nvlink -s``, times the library's 0.9 efficiency factor
(430.3125 GB/s), and a 400 Gb/s (50 GB/s) RDMA NIC.  With these the real formula gives 22 SMs for two
ranks with 8 or 16 experts, which is what the recordings show.
"""

from __future__ import annotations

import math
import os

from conformance import versions

from . import _refusals
from .seams import seam

H200_NUM_SMS = 132
#: ``sharedMemPerBlockOptin`` of an H100/H200 (227 KiB), what ``get_num_smem_bytes()`` reads.
H200_SMEM_BYTES = 232448
H200_NVLINK_GBS = 18 * 26.5625 * 0.9
DEFAULT_RDMA_GBS = 400 / 8
ELASTIC_BUFFER_ALIGNMENT = 2 << 20


def align(value: int, alignment: int) -> int:
    """Round ``value`` up to a multiple of ``alignment``."""
    return (value + alignment - 1) // alignment * alignment


def rule(name: str, default: float) -> float:
    """The version being emulated now's rule ``name`` (its contract's ``[rules]``), ``default`` where it has none."""
    return versions.contract(_refusals.current()).rule(name, default)


def nvlink_gbs() -> float:
    """NVLink bandwidth stand-in (override with ``DEEP_EP_EMULATION_NVLINK_GBS``)."""
    return float(os.environ.get("DEEP_EP_EMULATION_NVLINK_GBS", H200_NVLINK_GBS))


def rdma_gbs() -> float:
    """RDMA bandwidth stand-in (override with ``DEEP_EP_EMULATION_RDMA_GBS``)."""
    return float(os.environ.get("DEEP_EP_EMULATION_RDMA_GBS", DEFAULT_RDMA_GBS))


@seam("device_num_sms")
def device_num_sms() -> int:
    """SM count stand-in (override with ``DEEP_EP_EMULATION_NUM_SMS``)."""
    return int(os.environ.get("DEEP_EP_EMULATION_NUM_SMS", H200_NUM_SMS))


def device_smem_bytes() -> int:
    """Shared-memory-per-block stand-in (override with ``DEEP_EP_EMULATION_SMEM_BYTES``)."""
    return int(os.environ.get("DEEP_EP_EMULATION_SMEM_BYTES", H200_SMEM_BYTES))


def fast_rdma_atomics() -> bool:
    """Whether to model fast RDMA atomics (``DEEP_EP_EMULATION_FAST_RDMA_ATOMICS=1``); default no."""
    return os.environ.get("DEEP_EP_EMULATION_FAST_RDMA_ATOMICS", "0") == "1"


def auto_num_allocated_qps(allow_hybrid_mode: bool) -> int:
    """The automatic QP cap: 129 hybrid (65 with fast RDMA atomics), 17 direct."""
    if allow_hybrid_mode:
        return 65 if fast_rdma_atomics() else 129
    return 17


def theoretical_num_qps(num_sms: int, allow_hybrid_mode: bool, num_allocated_qps: int) -> int:
    """``min(num_sms, 9)`` direct, ``num_sms * 16 + 1`` hybrid, capped by the allocation."""
    num_qps = min(num_sms, 8 + 1)
    if allow_hybrid_mode:
        num_qps = num_sms * 16 + 1
    return min(num_qps, num_allocated_qps)


def theoretical_num_sms(
    num_experts: int,
    num_topk: int,
    num_ranks: int,
    num_scaleout_ranks: int,
    num_scaleup_ranks: int,
    num_rdma_ranks: int,
    num_nvlink_ranks: int,
    prefer_overlap_with_compute: bool,
    num_scaleout_topk: int = 0,
    rdma_bw: float = 0,
    nvlink_bw: float = 0,
    sm_read_gbs: float = 200,
    sm_write_gbs: float = 50,
) -> int:
    """The real bandwidth model (balanced gate): the SMs wanted times the version's margin, rounded up to its
    multiple (at least 4), at most the device's (rounded down to even where the version does)."""
    assert num_scaleout_topk == 0
    if rdma_bw == 0 and num_rdma_ranks > 1:
        rdma_bw = rdma_gbs()
    if nvlink_bw == 0:
        nvlink_bw = nvlink_gbs()

    def expected_topk(num_groups: int) -> float:
        assert num_experts % num_groups == 0
        miss = math.comb(num_experts - num_experts // num_groups, num_topk) / math.comb(num_experts, num_topk)
        return num_groups * (1 - miss)

    scaleout_topk = expected_topk(num_scaleout_ranks) if num_scaleout_ranks > 1 else 0
    topk = expected_topk(num_ranks)
    sm_read, sm_write = 1 / topk, 0.0
    rdma_traffic = nvlink_traffic = 0.0
    if num_scaleout_ranks > 1:
        sm_write += 1 / topk
        sm_write += (1 / topk) * (scaleout_topk / num_scaleout_ranks)
        rdma_traffic += (1 / topk) * (scaleout_topk * (1 - 1 / num_scaleout_ranks))
        sm_read += scaleout_topk / topk
        sm_write += 1
        nvlink_traffic += 1 - (1 / num_scaleup_ranks)
    else:
        if num_rdma_ranks > 1:
            sm_write += 1 / topk
        sm_write += num_nvlink_ranks / num_ranks
        nvlink_traffic += num_nvlink_ranks / num_ranks * (1 - 1 / num_nvlink_ranks)
        rdma_traffic += (num_ranks - num_nvlink_ranks) / num_ranks
    if num_scaleout_ranks > 1 and rdma_traffic / rdma_bw > nvlink_traffic / nvlink_bw:
        bounded_traffic, bounded_gbs = rdma_traffic, rdma_bw
    else:
        bounded_traffic, bounded_gbs = nvlink_traffic, nvlink_bw
    num_device_sms = device_num_sms()
    num_sms: float = num_device_sms
    if bounded_traffic > 0:
        wanted = [
            bounded_gbs / bounded_traffic * sm_read / sm_read_gbs,
            bounded_gbs / bounded_traffic * sm_write / sm_write_gbs,
        ]
        if rule("sm_combine_terms", False):  # the combine's traffic too (deep_ep/buffers/ep.py:526-528, 2.5.0)
            wanted += [bounded_gbs / bounded_traffic * (sm_write - nvlink_traffic) / sm_read_gbs,
                       bounded_gbs / bounded_traffic * (sm_read + nvlink_traffic) / sm_write_gbs]
        num_sms = max(wanted)
    result = align(max(4, math.ceil(num_sms * rule("sm_margin", 1.25))), int(rule("sm_align", 2)))
    result = result if prefer_overlap_with_compute else max(result, 64)
    return min(result, num_device_sms // 2 * 2 if rule("sm_cap_even", False) else num_device_sms)


#: ``ptx::kNumTMAAlignBytes``, ``sizeof(ptx::mbarrier)``.
TMA_ALIGN_BYTES = 32
MBARRIER_BYTES = 8
#: ``ElasticBuffer::kNumMaxSMs``, ``kNumMaxChannelsPerSM``, ``kNumMaxChannels`` (csrc/elastic/buffer.hpp:57-59).
NUM_MAX_SMS = 160
NUM_MAX_CHANNELS_PER_SM = 8
NUM_MAX_CHANNELS = NUM_MAX_CHANNELS_PER_SM * NUM_MAX_SMS
#: ``kNumNotifyWarps`` of the dispatch kernel.
NUM_NOTIFY_WARPS = 4


def token_bytes(
    num_hidden_bytes: int, num_sf_bytes: int, num_topk: int, with_metadata: bool, with_mbarrier: bool, row_id: str
) -> int:
    """``layout::TokenLayout(...).get_num_bytes<with_mbarrier>()``; its constructor's TMA check raises ``row_id``.
    The data part is aligned to the version's ``token_rdma_align`` (2.5.0: ``kNumRDMAAlignmentBytes`` = 64,
    deep_ep/include/deep_ep/layout/ep/token.cuh:34-37; 2.1.0: no such alignment)."""
    _refusals.check(num_hidden_bytes % TMA_ALIGN_BYTES == 0, row_id)  # layout.cuh:198
    num_metadata_bytes = num_topk * 8 + ((1 + num_topk) * 4 if with_metadata else 0)
    data = align(num_hidden_bytes, TMA_ALIGN_BYTES) + align(num_sf_bytes, TMA_ALIGN_BYTES) + align(
        num_metadata_bytes, TMA_ALIGN_BYTES)
    return align(data, int(rule("token_rdma_align", 1))) + align(MBARRIER_BYTES if with_mbarrier else 0,
                                                                 TMA_ALIGN_BYTES)


def dispatch_token_bytes(hidden: int, elem_size: int, num_sf_packs: int, num_topk: int, with_mbarrier: bool,
                         row_id: str) -> int:
    """``get_dispatch_token_layout`` (csrc/kernels/elastic/dispatch.hpp:136) bytes."""
    return token_bytes(hidden * elem_size, num_sf_packs * 4, num_topk, True, with_mbarrier, row_id)


@seam("v2_combine_token_bytes")
def combine_token_bytes(hidden: int, num_topk: int, with_mbarrier: bool, row_id: str) -> int:
    """``get_combine_token_layout`` (csrc/kernels/elastic/combine.hpp:109) bytes (bf16 payload)."""
    return token_bytes(hidden * 2, 0, num_topk, False, with_mbarrier, row_id)


def dispatch_buffer_size(
    num_max_tokens_per_rank: int, hidden: int, num_sf_packs: int, num_topk: int, elem_size: int,
    num_scaleout_ranks: int, num_scaleup_ranks: int, is_scaleup_nvlink: bool, row_id: str,
) -> int:
    """``ElasticBuffer::get_dispatch_buffer_size`` (csrc/elastic/buffer.hpp:586)."""
    t = dispatch_token_bytes(hidden, elem_size, num_sf_packs, num_topk, False, row_id)
    n = num_max_tokens_per_rank
    if num_scaleout_ranks == 1:
        return t * (0 if is_scaleup_nvlink else 1) * n + t * num_scaleup_ranks * n
    return (
        t * num_scaleup_ranks * num_scaleout_ranks * n
        + t * 1 * n
        + t * num_scaleout_ranks * (n + NUM_MAX_CHANNELS)
    )


def combine_buffer_size(
    num_max_tokens_per_rank: int, hidden: int, num_topk: int, num_scaleout_ranks: int, num_scaleup_ranks: int,
    is_scaleup_nvlink: bool, allow_multiple_reduction: bool, row_id: str,
) -> int:
    """``ElasticBuffer::get_combine_buffer_size`` (csrc/elastic/buffer.hpp:616)."""
    t = combine_token_bytes(hidden, num_topk, False, row_id)
    n, num_ranks = num_max_tokens_per_rank, num_scaleout_ranks * num_scaleup_ranks
    if num_scaleout_ranks == 1:
        in_layout = min(num_ranks, num_topk) if allow_multiple_reduction else num_topk
        send = t * (0 if is_scaleup_nvlink else num_ranks) * n * (1 if allow_multiple_reduction else num_topk)
        return send + t * in_layout * n
    up = min(num_scaleup_ranks, num_topk) if allow_multiple_reduction else num_topk
    out = min(num_scaleout_ranks, num_topk) if allow_multiple_reduction else num_topk
    return (
        t * up * num_scaleout_ranks * n
        + t * (1 if allow_multiple_reduction else num_topk) * num_scaleout_ranks * (n + NUM_MAX_CHANNELS)
        + t * out * n
    )


@seam("v2_buffer_size_hint")
def buffer_size_hint(
    num_max_tokens_per_rank: int,
    hidden: int,
    num_topk: int,
    use_fp8_dispatch: bool,
    num_scaleout_ranks: int,
    num_scaleup_ranks: int,
    is_scaleup_nvlink: bool,
    allow_multiple_reduction: bool,
) -> int:
    """``ElasticBuffer::calculate_buffer_size`` (csrc/elastic/buffer.hpp:652): the larger of the dispatch and
    combine layouts, 2 MiB aligned (4 MiB for the recorded 2 ranks, 128 x 7168, top-8)."""
    _refusals.check(num_max_tokens_per_rank > 0 and hidden > 0, "v2_init_size_args")
    _refusals.check(math.ceil(hidden / 32) * 4 <= hidden, "v2_init_hidden_tiny")
    num_topk = 32 if num_topk == 0 else num_topk
    elem_size = 1 if use_fp8_dispatch else 2
    num_sf_packs = math.ceil(hidden / 32) if use_fp8_dispatch else 0
    dispatch = dispatch_buffer_size(num_max_tokens_per_rank, hidden, num_sf_packs, num_topk, elem_size,
                                    num_scaleout_ranks, num_scaleup_ranks, is_scaleup_nvlink, "v2_init_hidden_tma")
    combine = combine_buffer_size(num_max_tokens_per_rank, hidden, num_topk, num_scaleout_ranks, num_scaleup_ranks,
                                  is_scaleup_nvlink, allow_multiple_reduction, "v2_init_hidden_tma")
    return align(max(dispatch, combine), ELASTIC_BUFFER_ALIGNMENT)


def num_channels_per_sm(
    num_ranks: int, num_experts: int, hidden: int, elem_size: int, num_sf_packs: int, num_topk: int,
    prefer_overlap_with_compute: bool,
) -> int:
    """Hybrid dispatch channels per SM, decided by shared-memory consumption (csrc/elastic/buffer.hpp:848-863)."""
    smem = device_smem_bytes()
    notify = align(num_ranks + num_experts, NUM_NOTIFY_WARPS * 32) * 4
    d = dispatch_token_bytes(hidden, elem_size, num_sf_packs, num_topk, True, "v2_dispatch_hidden_tma")
    c = combine_token_bytes(hidden, num_topk, True, "v2_dispatch_hidden_tma")
    per_sm = min((smem - notify) // d, 32 - NUM_NOTIFY_WARPS)
    per_sm = min(smem // c, per_sm)
    per_sm = min(per_sm // 2, NUM_MAX_CHANNELS_PER_SM)
    return per_sm if prefer_overlap_with_compute else min(per_sm, 4)
