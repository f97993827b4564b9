"""``deep_ep.Config`` stand-in (the legacy API's performance-tuning config)."""

from __future__ import annotations

from . import _refusals

#: ``LEGACY_NUM_MAX_NVL_PEERS``: NVLink peers per node in the legacy kernels.
NUM_MAX_NVL_PEERS = 8
_NUM_MAX_TOPK = 128
_NUM_MAX_SCALES = 128
#: ``sizeof(internode::SourceMeta)``: two ints (source RDMA rank, NVLink-rank bit mask).
SOURCE_META_BYTES = 8


def _align(value: int, alignment: int) -> int:
    return (value + alignment - 1) // alignment * alignment


class Config:
    """Chunking configuration of the legacy high-throughput kernels.

    Only ``num_sms`` changes results: the emulation splits each rank's tokens into ``num_sms // 2``
    channels exactly as the real kernels do (this shapes ``channel_prefix_matrix`` and ``send_head``).
    The constructor refuses what the real one refuses (``csrc/legacy/config.hpp:41-50``), and arguments
    pybind11 would not convert to ``int`` (a float) with the same ``TypeError`` first line.
    Like the real pybind11 class (``csrc/legacy/buffer.hpp:1752``), it exposes no fields: the values are
    private here, so a client reading ``config.num_sms`` fails on the emulation as it does on the library.
    """

    def __init__(
        self,
        num_sms: int = 20,
        num_max_nvl_chunked_send_tokens: int = 6,
        num_max_nvl_chunked_recv_tokens: int = 256,
        num_max_rdma_chunked_send_tokens: int = 6,
        num_max_rdma_chunked_recv_tokens: int = 256,
    ) -> None:
        args = (
            num_sms,
            num_max_nvl_chunked_send_tokens,
            num_max_nvl_chunked_recv_tokens,
            num_max_rdma_chunked_send_tokens,
            num_max_rdma_chunked_recv_tokens,
        )
        if not all(_is_pybind_int(a) for a in args):
            raise TypeError(
                _refusals.message("v1_set_num_sms_float")
                + "\n    1. deep_ep._C.Config(num_sms: int = 20, num_max_nvl_chunked_send_tokens: int = 6, "
                "num_max_nvl_chunked_recv_tokens: int = 256, num_max_rdma_chunked_send_tokens: int = 6, "
                "num_max_rdma_chunked_recv_tokens: int = 256)\n\nInvoked with: " + ", ".join(map(repr, args))
            )
        _refusals.check(num_sms >= 0, "v1_config_negative_sms")
        _refusals.check(
            num_max_nvl_chunked_send_tokens > 0 and num_max_nvl_chunked_recv_tokens > 0, "v1_config_nvl_nonpositive"
        )
        _refusals.check(
            num_max_nvl_chunked_send_tokens < num_max_nvl_chunked_recv_tokens, "v1_config_nvl_send_ge_recv"
        )
        _refusals.check(
            num_max_rdma_chunked_send_tokens > 0 and num_max_rdma_chunked_recv_tokens > 0,
            "v1_config_rdma_nonpositive",
        )
        # NOTES: like the real constructor, the two checks below read the *arguments* (the parameter shadows
        # the aligned member there)
        _refusals.check(
            num_max_rdma_chunked_send_tokens < num_max_rdma_chunked_recv_tokens, "v1_config_rdma_send_ge_recv"
        )
        _refusals.check(
            num_max_rdma_chunked_send_tokens <= num_max_rdma_chunked_recv_tokens // 2,
            "v1_config_rdma_send_gt_half_recv",
        )
        self._num_sms = int(num_sms)
        self._num_max_nvl_chunked_send_tokens = int(num_max_nvl_chunked_send_tokens)
        self._num_max_nvl_chunked_recv_tokens = int(num_max_nvl_chunked_recv_tokens)
        self._num_max_rdma_chunked_send_tokens = int(num_max_rdma_chunked_send_tokens)
        self._num_max_rdma_chunked_recv_tokens = _align(
            int(num_max_rdma_chunked_recv_tokens), int(num_max_rdma_chunked_send_tokens)
        )

    @property
    def _num_channels(self) -> int:
        """Number of communication channels (two SMs per channel; at least 1 for the emulation's own math, the
        library's checks use ``num_sms // 2`` itself)."""
        return max(self._num_sms // 2, 1)

    def get_nvl_buffer_size_hint(self, hidden_bytes: int, num_ranks: int) -> int:
        """NVLink buffer size in bytes: the real formula (``csrc/legacy/config.hpp:53``)."""
        num_rdma_ranks = max(num_ranks // NUM_MAX_NVL_PEERS, 1)
        num_nvl_ranks = min(num_ranks, NUM_MAX_NVL_PEERS)
        num_channels = self._num_sms // 2
        per_token = hidden_bytes + SOURCE_META_BYTES + _NUM_MAX_TOPK * 8 + _NUM_MAX_TOPK * 4 + _NUM_MAX_SCALES * 4
        num_bytes = num_channels * num_nvl_ranks * (2 * num_rdma_ranks + 3) * 4
        num_bytes += num_channels * num_nvl_ranks * self._num_max_nvl_chunked_recv_tokens * per_token
        return _align(num_bytes, 128)

    def get_rdma_buffer_size_hint(self, hidden_bytes: int, num_ranks: int) -> int:
        """RDMA buffer size in bytes: the real formula (``csrc/legacy/config.hpp:75``), 0 up to 8 ranks."""
        if num_ranks <= NUM_MAX_NVL_PEERS:
            return 0
        return rdma_size_hint(self, hidden_bytes, num_ranks // NUM_MAX_NVL_PEERS)

    def __repr__(self) -> str:
        return (
            f"Config({self._num_sms}, {self._num_max_nvl_chunked_send_tokens}, "
            f"{self._num_max_nvl_chunked_recv_tokens}, {self._num_max_rdma_chunked_send_tokens}, "
            f"{self._num_max_rdma_chunked_recv_tokens})"
        )


def rdma_size_hint(config: Config, hidden_bytes: int, num_rdma_ranks: int) -> int:
    """``Config::get_rdma_buffer_size_hint`` for ``num_rdma_ranks`` RDMA ranks (nodes of 8 in the library)."""
    num_channels = config._num_sms // 2
    recv = config._num_max_rdma_chunked_recv_tokens
    num_bytes = num_channels * num_rdma_ranks * (NUM_MAX_NVL_PEERS * 2 + 2) * 2 * 4
    num_bytes += num_channels * num_rdma_ranks * recv * hidden_bytes * 2
    num_bytes += num_channels * num_rdma_ranks * recv * SOURCE_META_BYTES * 2
    num_bytes += num_channels * num_rdma_ranks * recv * _NUM_MAX_TOPK * 8 * 2
    num_bytes += num_channels * num_rdma_ranks * recv * _NUM_MAX_TOPK * 4 * 2
    num_bytes += num_channels * num_rdma_ranks * recv * _NUM_MAX_SCALES * 4 * 2
    num_bytes += num_channels * num_rdma_ranks * recv * 16 * 2
    return _align(num_bytes, 128)


def _is_pybind_int(value: object) -> bool:
    """Whether pybind11 converts ``value`` to a C++ ``int`` (ints and ``__index__`` objects, never floats)."""
    return not isinstance(value, float) and hasattr(type(value), "__index__")
