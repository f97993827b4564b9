"""The V2 buffer size: ``ElasticBuffer.get_buffer_size_hint`` and the ``num_bytes`` of a buffer built from the MoE
settings, computed from DeepEP 2.1.0's source (``ElasticBuffer::calculate_buffer_size``, csrc/elastic/buffer.hpp:
652-680, with ``get_dispatch_buffer_size`` / ``get_combine_buffer_size`` above it, 586-648; the token and buffer
layouts of deep_ep/include/deep_ep/common/layout.cuh:180-260).

Written here as a table of (buffer, slots, tokens per slot) per mode, so that it stays independent of the
emulation's sizing code.  Every buffer is ``slots x tokens x token_bytes``; a token's bytes are its payload, its
scale factors and its metadata, each rounded up to the 32-byte TMA alignment (no mbarrier in the buffer layouts).
The hint is the larger of the dispatch and combine layouts, rounded up to 2 MiB.
"""

from __future__ import annotations

#: ``ptx::kNumTMAAlignBytes``; ``symmetric::kNumAlignmentBytes`` (2 MiB); ``ElasticBuffer::kNumMaxChannels``
#: (``kNumMaxChannelsPerSM * kNumMaxSMs`` = 8 x 160, csrc/elastic/buffer.hpp:57-59).
TMA_BYTES = 32
ALIGNMENT = 2 * 1024 * 1024
MAX_CHANNELS = 8 * 160


def _up(value: int, to: int) -> int:
    return -(-value // to) * to


def token_bytes(payload: int, scales: int, num_topk: int, with_source: bool, align: int = 1) -> int:
    """One token of a buffer layout: the payload, the scales, then per top-k slot an int index and a float weight
    (plus, for dispatch, the int source index and one int per slot for the linked list), each part TMA-aligned; the
    whole rounded up to ``align`` (DeepEP 2.5.0 aligns a token to 64 RDMA bytes: deep_ep/include/deep_ep/layout/ep/
    token.cuh:34-37; 2.1.0 does not: 1)."""
    metadata = num_topk * 8 + (4 * (1 + num_topk) if with_source else 0)
    return _up(_up(payload, TMA_BYTES) + _up(scales, TMA_BYTES) + _up(metadata, TMA_BYTES), align)


def logical_domains(num_nodes: int, ranks_per_node: int, allow_hybrid_mode: bool) -> tuple[int, int, bool]:
    """``(scale-out ranks, scale-up ranks, scale-up is the NVLink domain)`` the library sizes for
    (``nccl::get_logical_domain_size``, csrc/kernels/backend/nccl.cu:56-60): hybrid mode splits nodes x NVLink
    ranks; direct mode is one scale-up domain of every rank."""
    if allow_hybrid_mode:
        return num_nodes, ranks_per_node, True
    return 1, num_nodes * ranks_per_node, num_nodes == 1


def _buffers(num_max_tokens: int, hidden: int, num_topk: int, use_fp8_dispatch: bool, allow_multiple_reduction: bool,
             scaleout: int, scaleup: int, nvlink: bool, align: int = 1) -> dict[str, list[tuple[int, int, int]]]:
    """Per layout ("dispatch", "combine"): its buffers as (slots, tokens per slot, bytes per token)."""
    n, ranks = num_max_tokens, scaleout * scaleup
    if use_fp8_dispatch:  # one byte per element, ceil(hidden / 32) float scale packs (the library's approximation)
        dispatch_token = token_bytes(hidden, 4 * -(-hidden // 32), num_topk, True, align)
    else:
        dispatch_token = token_bytes(2 * hidden, 0, num_topk, True, align)
    combine_token = token_bytes(2 * hidden, 0, num_topk, False, align)
    amr = allow_multiple_reduction
    if scaleout == 1:  # direct mode: a send buffer only where the scale-up domain is not NVLink
        return {
            "dispatch": [(0 if nvlink else 1, n, dispatch_token), (ranks, n, dispatch_token)],
            "combine": [(0 if nvlink else ranks, n * (1 if amr else num_topk), combine_token),
                        (min(ranks, num_topk) if amr else num_topk, n, combine_token)],
        }
    return {  # hybrid mode: scale-up receive, scale-out send and receive (per channel, up to MAX_CHANNELS more)
        "dispatch": [(scaleup, scaleout * n, dispatch_token), (1, n, dispatch_token),
                     (scaleout, n + MAX_CHANNELS, dispatch_token)],
        "combine": [(min(scaleup, num_topk) if amr else num_topk, scaleout * n, combine_token),
                    (1 if amr else num_topk, scaleout * (n + MAX_CHANNELS), combine_token),
                    (min(scaleout, num_topk) if amr else num_topk, n, combine_token)],
    }


def expected_buffer_size(num_max_tokens: int, hidden: int, num_topk: int, *, use_fp8_dispatch: bool,
                         allow_hybrid_mode: bool, allow_multiple_reduction: bool, num_nodes: int,
                         ranks_per_node: int, token_align: int = 1) -> int:
    """``get_buffer_size_hint(group, num_max_tokens, hidden, num_topk, use_fp8_dispatch, allow_hybrid_mode,
    allow_multiple_reduction)`` on ``num_nodes`` x ``ranks_per_node`` ranks (``num_topk=0`` sizes for 32 slots,
    the kernels' maximum; ``token_align``: the version's token alignment, see :func:`token_bytes`)."""
    num_topk = num_topk or 32
    scaleout, scaleup, nvlink = logical_domains(num_nodes, ranks_per_node, allow_hybrid_mode)
    layouts = _buffers(num_max_tokens, hidden, num_topk, use_fp8_dispatch, allow_multiple_reduction, scaleout,
                       scaleup, nvlink, token_align)
    largest = max(sum(slots * tokens * size for slots, tokens, size in buffers) for buffers in layouts.values())
    return _up(largest, ALIGNMENT)
