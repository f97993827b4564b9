"""The V2 launch schedule: ``ElasticBuffer.get_theoretical_num_sms`` and ``get_theoretical_num_qps`` as DeepEP 2.1.0
computes them on the host (deep_ep/buffers/elastic.py:729-853), for bandwidths given explicitly (so nothing is
detected on the machine; with ``rdma_gbs=0`` / ``nvlink_gbs=0`` the library asks the hardware instead).

The SM model, for a balanced gate: a token reaches ``E[distinct groups among its top-k]`` ranks (or nodes); per
unit of token traffic the SMs read and write some HBM volume and the fabric carries some NVLink and RDMA volume.
The bounding fabric's bandwidth over its volume is the token rate; the SMs needed to read and to write at that rate
(``sm_read_gbs`` / ``sm_write_gbs`` per SM), whichever is more, times 1.25, rounded up to an even count of at least
4 (at least 64 when the buffer does not prefer overlapping with compute), at most the device's SM count.  The
float expressions keep the source's order of operations, so that the rounding up lands on the same integer.

DeepEP 2.5.0 changed the constants (deep_ep/buffers/ep.py:430-549): the SMs the combine needs are weighed too, the
margin is 1.3, the count a multiple of 4, capped by the device's count rounded down to even.  They are arguments
here, which a check takes from the version's contract (``conformance.versions``: ``sm_margin``, ``sm_align``,
``sm_combine_terms``, ``sm_cap_even``).
"""

from __future__ import annotations

import math

#: The device SM count on CPU runs: the suite models an H200 there (132 SMs, the emulation's stand-in); on GPUs the
#: ranks report their device's own count.
CPU_DEVICE_SMS = 132


def expected_topk_groups(num_experts: int, num_topk: int, num_groups: int) -> float:
    """How many of ``num_groups`` equal groups of experts a uniformly drawn top-k set touches, on average."""
    per_group = num_experts // num_groups
    miss_one = math.comb(num_experts - per_group, num_topk) / math.comb(num_experts, num_topk)
    return num_groups * (1 - miss_one)


def expected_num_sms(num_experts: int, num_topk: int, *, num_nodes: int, ranks_per_node: int,
                     allow_hybrid_mode: bool, prefer_overlap_with_compute: bool, rdma_gbs: float, nvlink_gbs: float,
                     sm_read_gbs: float, sm_write_gbs: float, device_sms: int, margin: float = 1.25,
                     multiple: int = 2, combine_terms: bool = False, cap_even: bool = False) -> int:
    """``get_theoretical_num_sms(num_experts, num_topk, 0, rdma_gbs, nvlink_gbs, sm_read_gbs, sm_write_gbs)`` on
    a buffer of ``num_nodes`` x ``ranks_per_node`` ranks (``rdma_gbs`` and ``nvlink_gbs`` non-zero); ``margin``,
    ``multiple``, ``combine_terms``, ``cap_even``: the version's constants (2.1.0's by default)."""
    ranks = num_nodes * ranks_per_node
    hybrid = allow_hybrid_mode and num_nodes > 1  # more than one scale-out rank
    reached = expected_topk_groups(num_experts, num_topk, ranks)  # destination ranks per token
    read = 1 / reached  # the source tokens
    if hybrid:
        nodes_reached = expected_topk_groups(num_experts, num_topk, num_nodes)
        write = 1 / reached  # the scale-up warps fill the send buffer
        write += (1 / reached) * (nodes_reached / num_nodes)  # the local bypass
        rdma = (1 / reached) * (nodes_reached * (1 - 1 / num_nodes))
        read += nodes_reached / reached  # the forward warps read what arrived
        write += 1  # and issue the scale-up copies
        nvlink = 1 - 1 / ranks_per_node
    else:
        write = 1 / reached if num_nodes > 1 else 0  # a send buffer for the RDMA peers
        write += ranks_per_node / ranks  # the NVLink copies
        nvlink = ranks_per_node / ranks * (1 - 1 / ranks_per_node)
        rdma = (ranks - ranks_per_node) / ranks
    if hybrid and rdma / rdma_gbs > nvlink / nvlink_gbs:
        traffic, gbs = rdma, rdma_gbs
    else:
        traffic, gbs = nvlink, nvlink_gbs
    wanted: float = device_sms
    if traffic > 0:
        needs = [gbs / traffic * read / sm_read_gbs, gbs / traffic * write / sm_write_gbs]
        if combine_terms:  # the combine reads what the dispatch wrote, and writes what it read, over NVLink
            needs += [gbs / traffic * (write - nvlink) / sm_read_gbs, gbs / traffic * (read + nvlink) / sm_write_gbs]
        wanted = max(needs)
    count = max(4, math.ceil(wanted * margin))
    count = -(-count // multiple) * multiple
    if not prefer_overlap_with_compute:
        count = max(count, 64)
    return min(count, device_sms // 2 * 2 if cap_even else device_sms)


def expected_num_qps(num_sms: int, *, allow_hybrid_mode: bool, num_allocated_qps: int) -> int:
    """``get_theoretical_num_qps(num_sms)``: hybrid-capable buffers give every channel (16 per SM) and the notify
    warps a QP, direct ones at most 9; never more than the buffer allocated."""
    wanted = num_sms * 16 + 1 if allow_hybrid_mode else min(num_sms, 9)
    return min(wanted, num_allocated_qps)
