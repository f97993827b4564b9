"""SM / QP / buffer-size heuristics of the elastic (V2) API, with CPU stand-ins for device properties.

Stand-ins (used when the tensors are on CPU, so no GPU is queried): an H200, i.e. 132 SMs and 18 NVLink
links of 26.5625 GB/s read by ``nvidia-smi nvlink -s``, times the library's 0.9 efficiency factor
(430.3125 GB/s), and a 400 Gb/s (50 GB/s) RDMA NIC.  With these the real formula gives 22 SMs for two
ranks with 8 or 16 experts, which is what the recordings show.
"""

from __future__ import annotations

import math
import os

H200_NUM_SMS = 132
H200_NVLINK_GBS = 18 * 26.5625 * 0.9
DEFAULT_RDMA_GBS = 400 / 8
ELASTIC_BUFFER_ALIGNMENT = 2 << 20


def align(value: int, alignment: int) -> int:
    """Round ``value`` up to a multiple of ``alignment``."""
    return (value + alignment - 1) // alignment * alignment


def nvlink_gbs() -> float:
    """NVLink bandwidth stand-in (override with ``DEEP_EP_EMULATION_NVLINK_GBS``)."""
    return float(os.environ.get("DEEP_EP_EMULATION_NVLINK_GBS", H200_NVLINK_GBS))


def rdma_gbs() -> float:
    """RDMA bandwidth stand-in (override with ``DEEP_EP_EMULATION_RDMA_GBS``)."""
    return float(os.environ.get("DEEP_EP_EMULATION_RDMA_GBS", DEFAULT_RDMA_GBS))


def device_num_sms() -> int:
    """SM count stand-in (override with ``DEEP_EP_EMULATION_NUM_SMS``)."""
    return int(os.environ.get("DEEP_EP_EMULATION_NUM_SMS", H200_NUM_SMS))


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
    """The real bandwidth model (balanced gate): even SM count, at least 4, at most the device's."""
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
        num_sms = max(
            bounded_gbs / bounded_traffic * sm_read / sm_read_gbs,
            bounded_gbs / bounded_traffic * sm_write / sm_write_gbs,
        )
    result = align(max(4, math.ceil(num_sms * 1.25)), 2)
    result = result if prefer_overlap_with_compute else max(result, 64)
    return min(result, num_device_sms)


def buffer_size_hint(
    num_ranks: int,
    num_scaleout_ranks: int,
    num_max_tokens_per_rank: int,
    hidden: int,
    num_topk: int,
    use_fp8_dispatch: bool,
) -> int:
    """Approximate V2 buffer size: a receive slot per (rank, token) (plus send and forward buffers in
    hybrid mode), 2 MiB aligned.  Matches the one recorded value (4 MiB for 2 ranks, 128 x 7168, top-8)."""
    token_bytes = hidden * (1 if use_fp8_dispatch else 2) + (hidden // 128 * 4 if use_fp8_dispatch else 0)
    token_bytes += num_topk * (8 + 4) + 16
    num_bytes = num_ranks * num_max_tokens_per_rank * token_bytes
    if num_scaleout_ranks > 1:
        num_bytes += 2 * num_scaleout_ranks * num_max_tokens_per_rank * token_bytes
    return align(max(num_bytes, 1), ELASTIC_BUFFER_ALIGNMENT)
