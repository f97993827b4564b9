"""``deep_ep.Config`` stand-in (the legacy API's performance-tuning config)."""

from __future__ import annotations

_NUM_MAX_NVL_PEERS = 8
_NUM_MAX_TOPK = 128
_NUM_MAX_SCALES = 128
_SOURCE_META_BYTES = 8


def _align(value: int, alignment: int) -> int:
    return (value + alignment - 1) // alignment * alignment


class Config:
    """Chunking configuration of the legacy high-throughput kernels.

    Only ``num_sms`` changes results: the emulation splits each rank's tokens into ``num_sms // 2``
    channels exactly as the real kernels do (this shapes ``channel_prefix_matrix`` and ``send_head``).
    """

    def __init__(
        self,
        num_sms: int = 20,
        num_max_nvl_chunked_send_tokens: int = 6,
        num_max_nvl_chunked_recv_tokens: int = 256,
        num_max_rdma_chunked_send_tokens: int = 6,
        num_max_rdma_chunked_recv_tokens: int = 256,
    ) -> None:
        if num_sms < 0:
            raise RuntimeError("Assertion exception (csrc/config.hpp): num_sms >= 0")
        if not (0 < num_max_nvl_chunked_send_tokens < num_max_nvl_chunked_recv_tokens):
            raise RuntimeError(
                "Assertion exception (csrc/config.hpp): "
                "num_max_nvl_chunked_send_tokens < num_max_nvl_chunked_recv_tokens"
            )
        if num_max_rdma_chunked_send_tokens <= 0 or num_max_rdma_chunked_recv_tokens <= 0:
            raise RuntimeError(
                "Assertion exception (csrc/config.hpp): "
                "num_max_rdma_chunked_send_tokens > 0 and num_max_rdma_chunked_recv_tokens > 0"
            )
        self.num_sms = num_sms
        self.num_max_nvl_chunked_send_tokens = num_max_nvl_chunked_send_tokens
        self.num_max_nvl_chunked_recv_tokens = num_max_nvl_chunked_recv_tokens
        self.num_max_rdma_chunked_send_tokens = num_max_rdma_chunked_send_tokens
        self.num_max_rdma_chunked_recv_tokens = _align(
            num_max_rdma_chunked_recv_tokens, num_max_rdma_chunked_send_tokens
        )

    @property
    def num_channels(self) -> int:
        """Number of communication channels (two SMs per channel)."""
        return max(self.num_sms // 2, 1)

    def get_nvl_buffer_size_hint(self, hidden_bytes: int, num_ranks: int) -> int:
        """Approximate NVLink buffer size in bytes (same structure as the real hint, not byte-exact)."""
        num_rdma_ranks = max(num_ranks // _NUM_MAX_NVL_PEERS, 1)
        num_nvl_ranks = min(num_ranks, _NUM_MAX_NVL_PEERS)
        per_token = (
            hidden_bytes + _SOURCE_META_BYTES + _NUM_MAX_TOPK * 8 + _NUM_MAX_TOPK * 4 + _NUM_MAX_SCALES * 4
        )
        num_bytes = self.num_channels * num_nvl_ranks * (2 * num_rdma_ranks + 3) * 4
        num_bytes += self.num_channels * num_nvl_ranks * self.num_max_nvl_chunked_recv_tokens * per_token
        return _align(num_bytes, 128)

    def get_rdma_buffer_size_hint(self, hidden_bytes: int, num_ranks: int) -> int:
        """Approximate RDMA buffer size in bytes (0 on a single NVLink domain, like the real hint)."""
        num_rdma_ranks = num_ranks // _NUM_MAX_NVL_PEERS
        if num_ranks <= _NUM_MAX_NVL_PEERS:
            return 0
        per_token = (
            hidden_bytes + _SOURCE_META_BYTES + _NUM_MAX_TOPK * 8 + _NUM_MAX_TOPK * 4 + _NUM_MAX_SCALES * 4
        )
        num_bytes = self.num_channels * num_rdma_ranks * (num_rdma_ranks + 2) * 2 * 4
        num_bytes += (
            self.num_channels * num_rdma_ranks * self.num_max_rdma_chunked_recv_tokens * per_token * 2
        )
        return _align(num_bytes, 128)

    def __repr__(self) -> str:
        return (
            f"Config({self.num_sms}, {self.num_max_nvl_chunked_send_tokens}, "
            f"{self.num_max_nvl_chunked_recv_tokens}, {self.num_max_rdma_chunked_send_tokens}, "
            f"{self.num_max_rdma_chunked_recv_tokens})"
        )
