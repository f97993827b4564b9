"""Emulated legacy API: ``deep_ep.Buffer`` (intranode and internode high-throughput dispatch/combine).

The two paths differ where the library's do: their checks (rows and order of ``Buffer::intranode_dispatch`` /
``internode_dispatch`` and their combines), their handles and the combine's rounding.  The rest is one code:
a dispatch once checked (``_cached_dispatch``, ``_fresh_dispatch``), the checks both make alike
(``_check_dispatch_inputs``, ``_check_combine_inputs``, ``_check_biases``, ``Buffer._check_notify``) and the
reduction (``Buffer._reduce_back``).

(Over 400 lines: one class mirroring the library's one class, whose dispatch, combine and handle layout must
stay side by side to be compared with ``deep_ep/buffers/legacy.py``.)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import Tensor

from . import _checks, _exchange, _route, _sizing
from ._checks import INT_MAX
from ._low_latency import LowLatencyMixin
from ._low_latency import rdma_size_hint as ll_rdma_size_hint
from ._refusals import check, refuse
from ._topology import get_topology
from ._uninit import pad_filled, pad_uninitialised
from .config import NUM_MAX_NVL_PEERS, SOURCE_META_BYTES, Config, rdma_size_hint
from .seams import seam
from .utils.event import EventHandle, EventOverlap, async_outputs

#: ``LEGACY_NUM_MAX_RDMA_PEERS``, ``LEGACY_NUM_MAX_LOCAL_EXPERTS``, ``LEGACY_NUM_BUFFER_ALIGNMENT_BYTES``.
NUM_MAX_RDMA_PEERS = 20
NUM_MAX_LOCAL_EXPERTS = 1024
BUFFER_ALIGNMENT_BYTES = 128
#: Ranks the ``SWITCH_RANKS`` / ``SWITCH_RDMA_RANKS`` kernel dispatchers instantiate.
SUPPORTED_NVL_RANKS = (2, 4, 8)
SUPPORTED_RDMA_RANKS = (2, 3, 4, 6, 8, 12, 16, 18, 20)
#: ``kNumCombineForwarderWarps`` of the internode combine kernel.
NUM_COMBINE_FORWARDER_WARPS = 24

Bias = torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None
#: What a dispatch returns (either path): ``(recv_x or (recv_x, recv_x_scales), recv_topk_idx, recv_topk_weights,
#: num_recv_tokens_per_expert_list, handle, event)``.
DispatchOutputs = tuple[
    tuple[torch.Tensor, torch.Tensor] | torch.Tensor,
    torch.Tensor | None,
    torch.Tensor | None,
    list[int] | None,
    tuple | None,
    EventOverlap,
]

_DISPATCH_CONFIGS = {
    2: (24, 256, 6, 128),
    4: (6, 256, 6, 128),
    8: (6, 256, 6, 128),
    16: (36, 288, 20, 128),
    24: (32, 288, 8, 128),
    32: (32, 288, 8, 128),
    48: (32, 288, 8, 128),
    64: (32, 288, 8, 128),
    96: (20, 480, 12, 128),
    128: (20, 560, 12, 128),
    144: (32, 720, 12, 128),
    160: (28, 720, 12, 128),
}
_COMBINE_CONFIGS = {
    2: (10, 256, 6, 128),
    4: (9, 256, 6, 128),
    8: (4, 256, 6, 128),
    16: (4, 288, 12, 128),
    24: (1, 288, 8, 128),
    32: (1, 288, 8, 128),
    48: (1, 288, 8, 128),
    64: (1, 288, 8, 128),
    96: (1, 480, 8, 128),
    128: (1, 560, 8, 128),
    144: (2, 720, 8, 128),
    160: (2, 720, 8, 128),
}


class _InputRows(NamedTuple):
    """The refusal rows of the checks of a dispatch's top-k and FP8 inputs and of ``allocate_on_comm_stream``, which
    both paths make alike, in the same order (csrc/legacy/buffer.hpp:481-512 intranode, :960-991 internode)."""

    topk_pairing: str
    topk_dim: str
    num_experts: str
    topk_layout: str
    weights_layout: str
    topk_rows: str
    weights_cols: str
    weights_dtype: str
    topk_dtype: str
    fp8_x: str
    scales_dtype: str
    scales_dim: str
    scales_rows: str
    alloc_on_comm_stream: str


_INTRANODE_INPUT_ROWS = _InputRows(
    "v1_dispatch_topk_pairing", "v1_dispatch_topk_1d", "v1_dispatch_num_experts_positive",
    "v1_dispatch_topk_dim_contiguous", "v1_dispatch_weights_dim_contiguous", "v1_dispatch_topk_rows",
    "v1_dispatch_weights_cols", "v1_dispatch_weights_dtype", "v1_dispatch_topk_dtype", "v1_dispatch_fp8_x_elem_size",
    "v1_dispatch_fp8_scales_dtype", "v1_dispatch_fp8_scales_dim", "v1_dispatch_fp8_scales_rows",
    "v1_dispatch_alloc_on_comm_stream",
)
_INTERNODE_INPUT_ROWS = _InputRows(
    "v1_internode_topk_pairing", "v1_internode_topk_1d", "v1_internode_topk_963", "v1_internode_topk_964",
    "v1_internode_topk_965", "v1_internode_topk_966", "v1_internode_topk_967", "v1_internode_weights_dtype",
    "v1_internode_topk_dtype", "v1_internode_fp8_977", "v1_internode_fp8_978", "v1_internode_fp8_979",
    "v1_internode_fp8_980", "v1_internode_alloc_on_comm_stream",
)


#: The rows of the clean-metadata checks of ``notify_dispatch`` and ``cached_notify`` (``Buffer._check_notify``).
_NOTIFY_DISPATCH_ROWS = ("v1_internode_rdma_clean_meta", "v1_internode_nvl_clean_meta", "v1_internode_rdma_bytes_int")
_CACHED_NOTIFY_ROWS = ("v1_internode_cached_notify_1515", "v1_internode_cached_notify_1516",
                       "v1_internode_cached_notify_1517")


def _check_dispatch_inputs(rows: _InputRows, x: Tensor, x_scales: Tensor | None,
                           topk_idx: Tensor | None, topk_weights: Tensor | None, num_experts: int,
                           previous_event: EventOverlap | None, async_finish: bool, allocate_on_comm_stream: bool
                           ) -> tuple[int, int, int]:
    """The checks of a dispatch's top-k and FP8 inputs and of ``allocate_on_comm_stream`` (:class:`_InputRows`);
    returns ``(num_topk, num_scales, scale_hidden_stride)``."""
    num_tokens = x.shape[0]
    check((topk_idx is None) == (topk_weights is None), rows.topk_pairing)
    num_topk = 0
    if topk_idx is not None:
        num_topk = _checks.size(topk_idx, 1, rows.topk_dim)
        check(num_experts > 0, rows.num_experts)
        check(_contiguous_nd(topk_idx, 2), rows.topk_layout)
        check(_contiguous_nd(topk_weights, 2), rows.weights_layout)
        check(num_tokens == topk_idx.shape[0] and num_tokens == topk_weights.shape[0], rows.topk_rows)
        check(num_topk == topk_weights.shape[1], rows.weights_cols)
        check(topk_weights.dtype == torch.float32, rows.weights_dtype)
        _checks.expect_dtype(topk_idx, torch.int64, rows.topk_dtype)
    num_scales = scale_hidden_stride = 0
    if x_scales is not None:
        check(x.element_size() == 1, rows.fp8_x)
        check(x_scales.dtype in (torch.float32, torch.int32), rows.scales_dtype)
        check(x_scales.dim() == 2, rows.scales_dim)
        check(x_scales.shape[0] == num_tokens, rows.scales_rows)
        num_scales, scale_hidden_stride = x_scales.shape[1], x_scales.stride(1)
    if allocate_on_comm_stream:
        check(_checks.has_event(previous_event) and async_finish, rows.alloc_on_comm_stream)
    return num_topk, num_scales, scale_hidden_stride


def _check_combine_inputs(rows: tuple[str, str, str, str], x: Tensor, topk_weights: Tensor | None,
                          previous_event: EventOverlap | None, async_finish: bool, allocate_on_comm_stream: bool
                          ) -> int:
    """A combine's checks of ``allocate_on_comm_stream`` and of its weights, alike on both paths (``rows``: the
    rows of the first, then of the weights' layout, rows and dtype; csrc/legacy/buffer.hpp:756-774 intranode,
    :1299-1318 internode); returns ``num_topk``."""
    if allocate_on_comm_stream:
        check(_checks.has_event(previous_event) and async_finish, rows[0])
    num_topk = 0
    if topk_weights is not None:
        check(_contiguous_nd(topk_weights, 2), rows[1])
        check(topk_weights.shape[0] == x.shape[0], rows[2])
        check(topk_weights.dtype == torch.float32, rows[3])
        num_topk = topk_weights.shape[1]
    return num_topk


def _check_biases(rows: tuple[str, str, str], biases: list[Tensor], x: Tensor, num_tokens: int) -> None:
    """A combine's checks of each bias (``rows``: layout, dtype, shape ``[num_tokens, hidden]``), alike on both
    paths."""
    for b in biases:
        check(_contiguous_nd(b, 2), rows[0])
        check(b.dtype == x.dtype, rows[1])
        check(tuple(b.shape) == (num_tokens, x.shape[1]), rows[2])


def _event(device: torch.device, async_finish: bool) -> EventHandle | None:
    return EventHandle(device) if async_finish else None


def _unpack_bias(bias: Bias) -> list[torch.Tensor]:
    if isinstance(bias, torch.Tensor):
        return [bias]
    if isinstance(bias, tuple):
        check(len(bias) == 2, "v1_combine_bias_tuple")
        return [b for b in bias if b is not None]
    return []


def _launch_error(num_sms: int, row_zero: str, row_too_many: str) -> None:
    """The cooperative kernel launch of ``num_sms`` blocks: CUDA refuses 0 blocks and more than one per SM."""
    check(num_sms != 0, row_zero)
    check(num_sms <= _sizing.device_num_sms(), row_too_many)


def _bytes_per_token(hidden_int4: int, num_scales: int, num_topk_idx: int, num_topk_weights: int) -> int:
    """``internode::get_num_bytes_per_token``."""
    raw = hidden_int4 * 16 + SOURCE_META_BYTES + num_scales * 4 + num_topk_idx * 4 + num_topk_weights * 4
    return _route.align_up(raw, 16)


def _rdma_clean_meta(
    hidden_int4: int, num_scales: int, topk_idx: int, topk_weights: int, rdma_ranks: int, recv_tokens: int,
    channels: int,
) -> tuple[int, int]:
    """``internode::get_rdma_clean_meta`` (int offset, int count)."""
    per_token = _bytes_per_token(hidden_int4, num_scales, topk_idx, topk_weights)
    return (
        per_token * recv_tokens * rdma_ranks * 2 * channels // 4,
        (NUM_MAX_NVL_PEERS * 2 + 4) * rdma_ranks * 2 * channels,
    )


def _nvl_clean_meta(
    hidden_int4: int, num_scales: int, topk_idx: int, topk_weights: int, rdma_ranks: int, recv_tokens: int,
    channels: int,
) -> tuple[int, int]:
    """``internode::get_nvl_clean_meta`` (int offset, int count) with ``NUM_MAX_NVL_PEERS`` NVLink ranks."""
    per_token = _bytes_per_token(hidden_int4, num_scales, topk_idx, topk_weights)
    return (
        recv_tokens * per_token * NUM_MAX_NVL_PEERS * channels // 4,
        NUM_MAX_NVL_PEERS * (2 * rdma_ranks + 2) * channels,
    )


@seam("v1_buffer_alignment_bytes")
def buffer_alignment_bytes() -> int:
    """The alignment ``Buffer()`` requires of its NVLink and RDMA byte counts (:data:`BUFFER_ALIGNMENT_BYTES`)."""
    return BUFFER_ALIGNMENT_BYTES


@seam("v1_dispatch_nvl_bytes")
def v1_dispatch_nvl_bytes(
    num_ranks: int, num_channels: int, config: Config, hidden: int, elem_size: int, num_topk: int, num_scales: int
) -> int:
    """NVLink bytes an intranode dispatch needs (csrc/legacy/buffer.hpp:627-637)."""
    queue = num_channels * num_ranks * config._num_max_nvl_chunked_recv_tokens
    return (
        num_ranks * num_ranks * 4  # size prefix matrix
        + num_channels * num_ranks * 4  # channel start offset
        + num_channels * num_ranks * 4  # channel end offset
        + num_channels * num_ranks * 4 * 2  # queue head and tail
        + queue * hidden * elem_size  # data
        + queue * 4  # source index
        + queue * num_topk * 8  # top-k index
        + queue * num_topk * 4  # top-k weights
        + queue * 4 * num_scales  # FP8 scales
    )


def v1_combine_nvl_bytes(
    num_ranks: int, num_channels: int, config: Config, hidden: int, elem_size: int, num_topk: int
) -> int:
    """NVLink bytes an intranode combine needs (csrc/legacy/buffer.hpp:807-811)."""
    queue = num_channels * num_ranks * config._num_max_nvl_chunked_recv_tokens
    return num_channels * num_ranks * 4 * 2 + queue * hidden * elem_size + queue * 4 + queue * num_topk * 4


@seam("v1_recv_topk_weights")
def _recv_topk_weights(recv_topk_idx: Tensor, sent: Tensor) -> Tensor:
    """V1's ``recv_topk_weights``: the sent weights, 0 at the slots whose expert is not local (index -1)."""
    return torch.where(recv_topk_idx >= 0, sent, torch.zeros_like(sent))


def _contiguous_nd(t: torch.Tensor, dims: int) -> bool:
    return t.dim() == dims and t.is_contiguous()


def _typed_nd(t: Tensor, dims: int, dtype: torch.dtype) -> bool:
    return _contiguous_nd(t, dims) and t.dtype == dtype


def _recv_channel_prefix(senders: Sequence[Tensor], num_channels: int, column: int) -> Tensor:
    """``[senders, num_channels]``: per sender (each a ``[tokens, columns]`` bool routing), where its tokens for
    ``column`` (a rank or a node) start in each of its channels (the exclusive prefix over its channels)."""
    return torch.stack(
        [_route.recv_channel_prefix_row(_route.channel_prefix_matrix(p, num_channels)[column]) for p in senders]
    )


def _recv_prefix_sum(senders: Sequence[Tensor], column: int) -> Tensor:
    """int32 ``[senders]``: the inclusive prefix over the senders of the tokens each sends to ``column``."""
    return torch.cumsum(torch.tensor([int(p[:, column].sum()) for p in senders]), 0).to(torch.int32)


@seam("v1_wait_previous_event")
def _wait_previous(previous_event: EventOverlap | None) -> None:
    """The call waits for ``previous_event`` (the wrapper's ``EventOverlap``; none: nothing to wait for)."""
    event = getattr(previous_event, "event", None)
    if event is not None:
        event.current_stream_wait()


class _Runtime:
    """The few queries of the library's C++ runtime (``deep_ep._C.Buffer``) that clients read."""

    def __init__(self, num_rdma_ranks: int, rdma_rank: int) -> None:
        self._num_rdma_ranks = num_rdma_ranks
        self._rdma_rank = rdma_rank

    def get_num_rdma_ranks(self) -> int:
        """RDMA ranks (nodes): the library's ``max(1, num_ranks / 8)``, the emulation's nodes."""
        return self._num_rdma_ranks

    def get_rdma_rank(self) -> int:
        """This rank's RDMA rank (node index)."""
        return self._rdma_rank


class Buffer(LowLatencyMixin):
    """Pure-PyTorch model of ``deep_ep.Buffer`` running over any ``torch.distributed`` process group.

    Arguments mirror the real constructor.  Buffer sizes are checked like the real library does (the real
    ``num_nvl_bytes`` / ``num_rdma_bytes`` formulas); buffer memory is allocated only when a call needs it (the
    low-latency calls, ``get_local_buffer_tensor``).  The low-latency calls and the shrink-mode mask calls
    come from ``LowLatencyMixin`` (``_low_latency.py``).  Every refusal shared with the library is raised from the
    refusal table (``refusals.toml``).
    """

    num_sms: int = 20

    def __init__(
        self,
        group: dist.ProcessGroup | None,
        num_nvl_bytes: int = 0,
        num_rdma_bytes: int = 0,
        low_latency_mode: bool = False,
        num_qps_per_rank: int = 24,
        allow_nvlink_for_low_latency_mode: bool = True,
        allow_mnnvl: bool = False,
        explicitly_destroy: bool = False,
        enable_shrink: bool = False,
        comm: object | None = None,
    ) -> None:
        if group is None:
            if comm is not None:
                raise NotImplementedError("deep_ep emulation: mpi4py communicators are not supported")
            refuse("v1_init_no_group_no_comm")
        self.rank = group.rank()
        self.group = group
        self.group_size = group.size()
        # The C++ constructor (csrc/legacy/buffer.hpp:107-116), before any communication
        alignment = buffer_alignment_bytes()
        check(
            num_nvl_bytes % alignment == 0 and (num_nvl_bytes <= INT_MAX or num_rdma_bytes == 0),
            "v1_init_nvl_bytes_alignment",
        )
        check(
            num_rdma_bytes % alignment == 0 and (low_latency_mode or num_rdma_bytes <= INT_MAX),
            "v1_init_rdma_bytes_alignment",
        )
        check((num_nvl_bytes % 2**64) // 16 < INT_MAX, "v1_init_nvl_bytes_too_large")  # size_t arithmetic
        check((num_rdma_bytes % 2**64) // 16 < INT_MAX, "v1_init_rdma_bytes_too_large")
        check(
            0 <= self.rank < self.group_size
            and (self.group_size <= NUM_MAX_NVL_PEERS * NUM_MAX_RDMA_PEERS or low_latency_mode),
            "v1_init_too_many_ranks",
        )
        check(
            self.group_size < NUM_MAX_NVL_PEERS or self.group_size % NUM_MAX_NVL_PEERS == 0,
            "v1_init_ranks_not_multiple_of_8",
        )
        self._topo = get_topology(group)
        if num_rdma_bytes > 0:  # the library: more than 8 ranks; the emulation: more than one node
            check(self._topo.num_nodes > 1 or low_latency_mode, "v1_init_rdma_bytes_single_node")
        if self._topo.num_nodes > 1 or low_latency_mode:  # after the device-id / IPC-handle all-gathers
            check(num_qps_per_rank > 0, "v1_init_qps_per_rank")
            # deep_ep/buffers/legacy.py:113: the QP depth the low-latency calls check their token count against
            self.nvshmem_qp_depth = int(os.environ.get("NVSHMEM_QP_DEPTH", "1024"))
        self.num_nvl_bytes = num_nvl_bytes
        self.num_rdma_bytes = num_rdma_bytes
        self.low_latency_mode = low_latency_mode
        self.num_qps_per_rank = num_qps_per_rank
        self.allow_nvlink_for_low_latency_mode = allow_nvlink_for_low_latency_mode
        self.allow_mnnvl = allow_mnnvl
        self.explicitly_destroy = explicitly_destroy
        self.enable_shrink = enable_shrink
        self.runtime: _Runtime | None = _Runtime(self._topo.num_nodes, self._topo.node)

    @property
    def _internode(self) -> bool:
        """Whether dispatch/combine take the internode path (the library: ``get_num_rdma_ranks() > 1``)."""
        return self._topo.num_nodes > 1

    @property
    def _config_ranks(self) -> int:
        """The group size the default configs are looked up for.

        The library's internode path only exists from 16 ranks on (nodes of 8 GPUs); the emulation models
        ``N`` emulated nodes as ``8 * N`` real ranks there, so its default configs are the multi-node ones
        (intranode: the group size, as the library).
        """
        return self._topo.num_nodes * NUM_MAX_NVL_PEERS if self._internode else self.group_size

    # ----------------------------------------------------------------------------------------- lifecycle
    def destroy(self) -> None:
        """Release the buffer (requires ``explicitly_destroy=True``).

        Like the library: a second call raises ``AttributeError`` (the runtime is gone), and a group whose
        NVLink rank count has no barrier kernel (not 2, 4 or 8) refuses when ``num_nvl_bytes > 0``.
        """
        check(self.explicitly_destroy, "v1_destroy_not_explicit")
        check(self.runtime is not None, "v1_destroy_twice")
        if self.num_nvl_bytes > 0:  # the library's NVLink ranks: min(num_ranks, 8); an emulated node is 8 GPUs
            nvl_ranks = NUM_MAX_NVL_PEERS if self._internode else self.group_size
            check(nvl_ranks in SUPPORTED_NVL_RANKS, "v1_destroy_unsupported_ranks")
        self.runtime = None

    def _check_alive(self, row_id: str) -> None:
        """A destroyed buffer's runtime is ``None``: the library fails with ``AttributeError`` on it."""
        check(self.runtime is not None, row_id)

    @staticmethod
    def is_sm90_compiled() -> bool:
        """The emulation reports an SM90 build (no FP8 kernels are actually compiled)."""
        return True

    @staticmethod
    def set_num_sms(new_num_sms: int) -> None:
        """Set the SM count used by the default configs (must be even)."""
        check(new_num_sms % 2 == 0, "v1_set_num_sms_odd")
        Buffer.num_sms = new_num_sms

    @staticmethod
    def capture() -> EventOverlap:
        """Capture an event on the current stream."""
        return EventOverlap(EventHandle())

    @staticmethod
    def get_low_latency_rdma_size_hint(
        num_max_dispatch_tokens_per_rank: int, hidden: int, num_ranks: int, num_experts: int
    ) -> int:
        """The low-latency RDMA buffer size the library asks for (``LowLatencyLayout``, byte-exact)."""
        return ll_rdma_size_hint(num_max_dispatch_tokens_per_rank, hidden, num_ranks, num_experts)

    def get_comm_stream(self) -> torch.Stream | None:
        """The emulation runs on the current stream; returns it on CUDA, ``None`` on CPU."""
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            return torch.cuda.current_stream()
        return None

    def get_local_buffer_tensor(self, dtype: torch.dtype, size: torch.Size | None = None, offset: int = 0,
                                use_rdma_buffer: bool = False) -> torch.Tensor:
        """The raw NVLink buffer (or, with ``use_rdma_buffer``, the RDMA buffer) as ``dtype`` from byte ``offset`` on,
        ``num_bytes // element size`` elements (deep_ep/buffers/legacy.py:201-220, csrc/legacy/buffer.hpp:215-221),
        or its first ``size.numel()`` elements viewed as ``size``.

        The RDMA buffer holds what the emulated low-latency kernels keep there (the signalling words, the zero-copy
        combine rows; ``_ll_buffer``); the NVLink buffer only what the caller writes (normal-mode kernels do not
        use buffer memory in the emulation).  The real tensor runs ``offset`` bytes past the buffer's end when
        ``offset > 0``: the emulation refuses a view that needs bytes beyond the buffer or a misaligned offset.
        """
        check(self.runtime is not None, "v1_local_buffer_after_destroy")
        element = dtype.itemsize
        num_bytes = self.num_rdma_bytes if use_rdma_buffer else self.num_nvl_bytes
        numel = num_bytes // element
        if size is not None:
            check(numel >= size.numel(), "v1_local_buffer_size")
        length = numel if size is None else size.numel()
        shape = (length,) if size is None else size
        if length == 0:
            return torch.empty(shape, dtype=dtype, device=self._ll().device)
        end = offset + length * element
        if offset < 0 or end > num_bytes or offset % element:
            which = "RDMA" if use_rdma_buffer else "NVLink"
            raise RuntimeError(f"deep_ep emulation: {length} x {dtype} from byte {offset} of the {which} buffer "
                               f"({num_bytes} bytes): beyond its end or misaligned (the real one points there anyway)")
        if use_rdma_buffer:
            raw = self._ll().bytes
        else:
            raw = self.__dict__.get("_nvl_bytes")
            if raw is None:
                raw = self.__dict__["_nvl_bytes"] = torch.zeros(num_bytes, dtype=torch.uint8, device=self._ll().device)
        return raw[offset:end].view(dtype).view(shape)

    @staticmethod
    def get_dispatch_config(num_ranks: int) -> Config:
        """The real library's recommended dispatch config for ``num_ranks`` (every entry built, as the real map)."""
        config_map = {n: Config(Buffer.num_sms, *values) for n, values in _DISPATCH_CONFIGS.items()}
        check(num_ranks in config_map, "v1_dispatch_config_unsupported_ranks", num_ranks=num_ranks)
        return config_map[num_ranks]

    @staticmethod
    def get_combine_config(num_ranks: int) -> Config:
        """The real library's recommended combine config for ``num_ranks``."""
        config_map = {n: Config(Buffer.num_sms, *values) for n, values in _COMBINE_CONFIGS.items()}
        check(num_ranks in config_map, "v1_combine_config_unsupported_ranks", num_ranks=num_ranks)
        return config_map[num_ranks]

    # ------------------------------------------------------------------------------------------ layout
    def get_dispatch_layout(
        self,
        topk_idx: torch.Tensor,
        num_experts: int,
        previous_event: EventOverlap | None = None,
        async_finish: bool = False,
        allocate_on_comm_stream: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor, EventOverlap]:
        """Per-rank / per-RDMA-rank / per-expert token counts and ``is_token_in_rank`` (see real docs).

        Communication-free, like the real kernel.  Expert ids outside ``[0, num_experts)`` (and, when
        ``num_experts`` is not a multiple of the group size, ids past the last whole rank) count nowhere,
        as in the real kernel.
        """
        self._check_alive("v1_layout_after_destroy")
        check(topk_idx.dim() == 2, "v1_layout_topk_dim")
        check(topk_idx.is_contiguous(), "v1_layout_topk_contiguous")
        check(num_experts > 0, "v1_layout_num_experts_positive")
        if allocate_on_comm_stream:
            check(_checks.has_event(previous_event) and async_finish, "v1_layout_alloc_on_comm_stream")
        _wait_previous(previous_event)
        _checks.expect_dtype(topk_idx, torch.int64, "v1_layout_topk_dtype")
        per_rank, per_rdma, per_expert, in_rank = _route.compute_layout(
            topk_idx, num_experts, self.group_size, self._topo.ranks_per_node
        )
        return per_rank, per_rdma, per_expert, in_rank, EventOverlap(_event(topk_idx.device, async_finish))

    # ---------------------------------------------------------------------------------------- dispatch
    @async_outputs("async_finish", 3)
    def dispatch(
        self,
        x: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        handle: tuple | None = None,
        num_tokens_per_rank: torch.Tensor | None = None,
        num_tokens_per_rdma_rank: torch.Tensor | None = None,
        is_token_in_rank: torch.Tensor | None = None,
        num_tokens_per_expert: torch.Tensor | None = None,
        topk_idx: torch.Tensor | None = None,
        topk_weights: torch.Tensor | None = None,
        expert_alignment: int = 1,
        num_worst_tokens: int = 0,
        config: Config | None = None,
        previous_event: EventOverlap | None = None,
        async_finish: bool = False,
        allocate_on_comm_stream: bool = False,
    ) -> DispatchOutputs:
        """Dispatch tokens to the ranks holding their experts; cached when ``handle`` is given.

        Returns ``(recv_x, recv_topk_idx, recv_topk_weights, num_recv_tokens_per_expert_list, handle,
        event)``.
        """
        check(not _checks.deterministic_fill_enabled(), "v1_dispatch_deterministic")
        config = self.get_dispatch_config(self._config_ranks) if config is None else config
        self._check_alive("v1_dispatch_after_destroy")
        if self._internode:
            check(num_worst_tokens == 0, "v1_internode_worst_tokens")
            return self.internode_dispatch(
                x, handle, num_tokens_per_rank, num_tokens_per_rdma_rank, is_token_in_rank, num_tokens_per_expert,
                topk_idx, topk_weights, expert_alignment, config, previous_event, async_finish, allocate_on_comm_stream,
            )
        x, x_scales = x if isinstance(x, tuple) else (x, None)
        if handle is not None:
            check(topk_idx is None and topk_weights is None, "v1_dispatch_cached_with_topk")
            rank_prefix_matrix, channel_prefix_matrix, recv_cpm, recv_src_idx, is_token_in_rank, send_head = handle
            self._check_intranode_dispatch(
                x, x_scales, None, None, None, is_token_in_rank, None, rank_prefix_matrix, channel_prefix_matrix,
                num_worst_tokens, config, previous_event, async_finish, allocate_on_comm_stream,
            )
            return self._cached_dispatch(x, x_scales, is_token_in_rank, num_worst_tokens, previous_event, async_finish)
        check(
            num_tokens_per_rank is not None and is_token_in_rank is not None and num_tokens_per_expert is not None,
            "v1_dispatch_missing_layout",
        )
        self._check_intranode_dispatch(
            x, x_scales, topk_idx, topk_weights, num_tokens_per_rank, is_token_in_rank, num_tokens_per_expert,
            None, None, num_worst_tokens, config, previous_event, async_finish, allocate_on_comm_stream,
        )
        return self._fresh_dispatch(
            x, x_scales, topk_idx, topk_weights, is_token_in_rank, num_tokens_per_expert, expert_alignment,
            num_worst_tokens, previous_event, async_finish,
            lambda recv: self._intranode_handle(recv, config, is_token_in_rank, num_worst_tokens),
        )

    def _cached_dispatch(self, x: Tensor, x_scales: Tensor | None, is_token_in_rank: Tensor, num_worst_tokens: int,
                         previous_event: EventOverlap | None, async_finish: bool) -> DispatchOutputs:
        """A cached dispatch once its checks passed, on either path: the handle's ``is_token_in_rank`` routes the
        new payload (padded to ``num_worst_tokens`` rows, intranode only); no top-k, counts or handle."""
        _wait_previous(previous_event)
        recv = self._exchange(x, x_scales, None, None, is_token_in_rank, None, "Buffer.dispatch")
        recv_x = pad_uninitialised(recv.fields["x"], num_worst_tokens)
        recv_scales = pad_uninitialised(recv.fields["x_scales"], num_worst_tokens)
        event = EventOverlap(_event(x.device, async_finish))
        return (recv_x, recv_scales) if x_scales is not None else recv_x, None, None, None, None, event

    def _fresh_dispatch(self, x: Tensor, x_scales: Tensor | None, topk_idx: Tensor | None, topk_weights: Tensor | None,
                        is_token_in_rank: Tensor, num_tokens_per_expert: Tensor, expert_alignment: int,
                        num_worst_tokens: int, previous_event: EventOverlap | None, async_finish: bool,
                        handle_of: Callable[[_exchange.Received], tuple]) -> DispatchOutputs:
        """A non-cached dispatch once its checks passed, on either path (``handle_of(received)``: the path's handle).

        ``recv_topk_idx`` is local or -1, ``recv_topk_weights`` 0 at the -1 slots (as the real V1 writes them), the
        counts are the aligned receipts per local expert (none with ``num_worst_tokens``, intranode only, which pads
        every received tensor to that many rows).
        """
        _wait_previous(previous_event)
        num_experts = num_tokens_per_expert.numel()
        recv = self._exchange(x, x_scales, topk_idx, topk_weights, is_token_in_rank, num_tokens_per_expert,
                              "Buffer.dispatch", num_experts)
        experts_per_rank = num_experts // self.group_size
        recv_topk_idx = recv_topk_weights = None
        if topk_idx is not None:
            recv_topk_idx = _route.to_local_topk(recv.fields["topk_idx"], self.rank, experts_per_rank)
            if topk_weights is not None:
                recv_topk_weights = _recv_topk_weights(recv_topk_idx, recv.fields["topk_weights"])
        per_expert = torch.stack(recv.gathered["num_tokens_per_expert"]).reshape(self.group_size, num_experts)
        local_counts = per_expert[:, self.rank * experts_per_rank : (self.rank + 1) * experts_per_rank].sum(0)
        counts_list = (
            []
            if num_worst_tokens > 0
            else [_route.align_up(int(c), expert_alignment) for c in local_counts.cpu()]
        )
        handle = handle_of(recv)
        # rows past the received ones: uninitialised (torch::empty) but recv_topk_idx, which the kernel sets to -1
        # (csrc/kernels/legacy/intranode.cu:535-545)
        recv_x = pad_uninitialised(recv.fields["x"], num_worst_tokens)
        recv_scales = pad_uninitialised(recv.fields["x_scales"], num_worst_tokens)
        recv_topk_idx = pad_filled(recv_topk_idx, num_worst_tokens, -1)
        recv_topk_weights = pad_uninitialised(recv_topk_weights, num_worst_tokens)
        event = EventOverlap(_event(x.device, async_finish))
        return (
            (recv_x, recv_scales) if x_scales is not None else recv_x,
            recv_topk_idx,
            recv_topk_weights,
            counts_list,
            handle,
            event,
        )

    def _check_intranode_dispatch(
        self, x: Tensor, x_scales: Tensor | None, topk_idx: Tensor | None, topk_weights: Tensor | None,
        num_tokens_per_rank: Tensor | None, is_token_in_rank: Tensor, num_tokens_per_expert: Tensor | None,
        cached_rank_prefix_matrix: Tensor | None, cached_channel_prefix_matrix: Tensor | None, num_worst_tokens: int,
        config: Config, previous_event: EventOverlap | None, async_finish: bool, allocate_on_comm_stream: bool,
    ) -> None:
        """The refusals of ``Buffer::intranode_dispatch`` (csrc/legacy/buffer.hpp:436-627) and its kernel
        launchers (csrc/kernels/legacy/intranode.cu), in the library's order."""
        cached = cached_rank_prefix_matrix is not None
        num_ranks = self.group_size
        check(config._num_sms % 2 == 0, "v1_dispatch_config_odd_sms")
        num_channels = config._num_sms // 2
        check(is_token_in_rank.dtype == torch.bool, "v1_dispatch_is_token_in_rank_dtype")
        if cached:
            check(cached_rank_prefix_matrix.dtype == torch.int32, "v1_dispatch_cached_rank_prefix_dtype")
            check(cached_channel_prefix_matrix.dtype == torch.int32, "v1_dispatch_cached_channel_prefix_dtype")
        else:
            check(num_tokens_per_expert.dtype == torch.int32, "v1_dispatch_tokens_per_expert_dtype")
            check(num_tokens_per_rank.dtype == torch.int32, "v1_dispatch_tokens_per_rank_dtype")
        check(_contiguous_nd(x, 2), "v1_dispatch_x_dim_contiguous")
        check((x.shape[1] * x.element_size()) % 16 == 0, "v1_dispatch_hidden_bytes")
        check(_contiguous_nd(is_token_in_rank, 2), "v1_dispatch_is_token_in_rank_dim_contiguous")
        check(
            is_token_in_rank.shape[0] == x.shape[0] and is_token_in_rank.shape[1] == num_ranks,
            "v1_dispatch_is_token_in_rank_shape",
        )
        if cached:
            check(_contiguous_nd(cached_rank_prefix_matrix, 2), "v1_dispatch_cached_rank_prefix_shape")
            check(
                tuple(cached_rank_prefix_matrix.shape) == (num_ranks, num_ranks), "v1_dispatch_cached_rank_prefix_size"
            )
            check(_contiguous_nd(cached_channel_prefix_matrix, 2), "v1_dispatch_cached_channel_prefix_shape")
            check(
                tuple(cached_channel_prefix_matrix.shape) == (num_ranks, num_channels),
                "v1_dispatch_cached_channel_count",
            )
        else:
            check(_contiguous_nd(num_tokens_per_expert, 1), "v1_dispatch_tokens_per_expert_dim")
            check(num_tokens_per_expert.shape[0] % num_ranks == 0, "v1_dispatch_experts_not_divisible")
            check(
                num_tokens_per_expert.shape[0] // num_ranks <= NUM_MAX_LOCAL_EXPERTS,
                "v1_dispatch_too_many_local_experts_1024",
            )
            check(_contiguous_nd(num_tokens_per_rank, 1), "v1_dispatch_tokens_per_rank_dim")
            check(num_tokens_per_rank.shape[0] == num_ranks, "v1_dispatch_tokens_per_rank_size")
        _, hidden = x.shape
        num_experts = 0 if cached else num_tokens_per_expert.shape[0]
        num_local_experts = num_experts // num_ranks
        num_topk, num_scales, scale_hidden_stride = _check_dispatch_inputs(
            _INTRANODE_INPUT_ROWS, x, x_scales, topk_idx, topk_weights, num_experts, previous_event, async_finish,
            allocate_on_comm_stream,
        )
        if not cached:
            check(
                num_ranks * (num_ranks + num_local_experts) * 4 <= self.num_nvl_bytes, "v1_dispatch_nvl_bytes_notify"
            )
            # notify_dispatch (csrc/kernels/legacy/intranode.cu:166-171)
            check(num_local_experts <= 128 and num_ranks <= 128, "v1_dispatch_too_many_local_experts_128")
            check(num_ranks in SUPPORTED_NVL_RANKS, "v1_dispatch_unsupported_ranks")
            if num_worst_tokens > 0:
                check(topk_idx is not None, "v1_dispatch_worst_tokens_needs_topk")
        check(
            v1_dispatch_nvl_bytes(num_ranks, num_channels, config, hidden, x.element_size(), num_topk, num_scales)
            <= self.num_nvl_bytes,
            "v1_dispatch_nvl_bytes_data",
        )
        check(num_scales * scale_hidden_stride < INT_MAX, "v1_dispatch_scale_stride")
        _launch_error(config._num_sms, "v1_dispatch_zero_sms_launch", "v1_dispatch_too_many_sms_launch")

    def _exchange(
        self, x: Tensor, x_scales: Tensor | None, topk_idx: Tensor | None, topk_weights: Tensor | None,
        is_token_in_rank: Tensor, num_tokens_per_expert: Tensor | None, what: str, num_experts: int | None = None,
    ) -> _exchange.Received:
        # Expert ids outside this rank's range are dropped (-1), as by the real kernels.  Only the internode
        # path can get here with a wrongly shaped is_token_in_rank (the library does not check it there and
        # reads out of bounds): an emulation refusal, on every rank.
        error = None
        if is_token_in_rank.shape != (x.shape[0], self.group_size):
            error = (
                f"deep_ep emulation: is_token_in_rank has shape {tuple(is_token_in_rank.shape)}, "
                f"expected {(x.shape[0], self.group_size)}"
            )
        fields = {
            "x": x,
            "x_scales": x_scales,
            "topk_idx": topk_idx,
            "topk_weights": topk_weights,
            "in_rank": is_token_in_rank.to(torch.bool),
        }
        whole = {} if num_tokens_per_expert is None else {"num_tokens_per_expert": num_tokens_per_expert}
        return _exchange.gather_selected(self.group, x.device, x.shape[0], error, what, fields,
                                         lambda s, f: f["in_rank"][:, self.rank], whole)

    def _intranode_handle(
        self, recv: _exchange.Received, config: Config, is_token_in_rank: torch.Tensor, num_worst_tokens: int = 0
    ) -> tuple:
        num_channels = config._num_channels
        device = is_token_in_rank.device
        world, me = self.group_size, self.rank
        rank_prefix_matrix = torch.zeros((world, world), dtype=torch.int32)
        rank_prefix_matrix[:, me] = _recv_prefix_sum(recv.gathered["in_rank"], me)
        cpm = _route.channel_prefix_matrix(is_token_in_rank.to(torch.bool), num_channels)
        recv_cpm = _recv_channel_prefix(recv.gathered["in_rank"], num_channels, me)
        send_head = _route.send_head(is_token_in_rank.to(torch.bool), num_channels)
        return (
            rank_prefix_matrix.to(device),
            cpm,
            recv_cpm.to(device),
            pad_filled(recv.src_token.to(torch.int32), num_worst_tokens, -1),  # recv_src_idx: one per recv row
            is_token_in_rank,
            send_head,
        )

    # ----------------------------------------------------------------------------------------- combine
    @async_outputs("async_finish", 2)
    def combine(
        self,
        x: torch.Tensor,
        handle: tuple,
        topk_weights: torch.Tensor | None = None,
        bias: Bias = None,
        config: Config | None = None,
        previous_event: EventOverlap | None = None,
        async_finish: bool = False,
        allocate_on_comm_stream: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None, EventOverlap]:
        """Reduce (unweighted sum, float32, one rounding) the received tokens back to their source ranks."""
        check(not _checks.deterministic_fill_enabled(), "v1_combine_deterministic")
        config = self.get_combine_config(self._config_ranks) if config is None else config
        self._check_alive("v1_combine_after_destroy")
        if self._internode:
            return self.internode_combine(
                x, handle, topk_weights, bias, config, previous_event, async_finish, allocate_on_comm_stream
            )
        rank_prefix_matrix, _, channel_prefix_matrix, src_idx, is_recv_token_in_rank, send_head = handle
        biases = _unpack_bias(bias)
        self._check_intranode_combine(
            x, topk_weights, biases, src_idx, rank_prefix_matrix, channel_prefix_matrix, send_head, config,
            previous_event, async_finish, allocate_on_comm_stream,
        )
        _wait_previous(previous_event)
        column = rank_prefix_matrix[:, self.rank].to(torch.int64).cpu()
        num_recv = int(column[-1])
        starts = torch.cat([torch.zeros(1, dtype=torch.int64), column[:-1]])
        src_rank = torch.repeat_interleave(torch.arange(self.group_size), column - starts).to(x.device)
        combined_x, combined_w = self._reduce_back(
            x[:num_recv],
            src_rank,
            src_idx[:num_recv].to(torch.int64),
            None if topk_weights is None else topk_weights[:num_recv],
            is_recv_token_in_rank.shape[0],
            bias,
        )
        _route.rewrite_send_head_for_combine(send_head, config._num_channels)
        return combined_x, combined_w, EventOverlap(_event(x.device, async_finish))

    def _check_intranode_combine(
        self, x: Tensor, topk_weights: Tensor | None, biases: list[Tensor], src_idx: Tensor, rank_prefix_matrix: Tensor,
        channel_prefix_matrix: Tensor, send_head: Tensor, config: Config, previous_event: EventOverlap | None,
        async_finish: bool, allocate_on_comm_stream: bool,
    ) -> None:
        """The refusals of ``Buffer::intranode_combine`` (csrc/legacy/buffer.hpp:732-807) and its kernel
        launchers, in the library's order."""
        num_ranks = self.group_size
        check(_contiguous_nd(x, 2), "v1_combine_x_dim_contiguous")
        check(_typed_nd(src_idx, 1, torch.int32), "v1_combine_handle_tensor_733")
        check(_typed_nd(send_head, 2, torch.int32), "v1_combine_handle_tensor_734")
        check(_typed_nd(rank_prefix_matrix, 2, torch.int32), "v1_combine_handle_tensor_735")
        check(_typed_nd(channel_prefix_matrix, 2, torch.int32), "v1_combine_handle_tensor_737")
        check(config._num_sms % 2 == 0, "v1_combine_config_odd_sms")
        num_channels = config._num_sms // 2
        num_tokens, hidden = x.shape
        num_recv_tokens = send_head.shape[0]
        check(src_idx.shape[0] == num_tokens, "v1_combine_x_rows")
        check(send_head.shape[1] == num_ranks, "v1_combine_send_head_ranks")
        check(tuple(rank_prefix_matrix.shape) == (num_ranks, num_ranks), "v1_combine_rank_prefix_shape")
        check(tuple(channel_prefix_matrix.shape) == (num_ranks, num_channels), "v1_combine_channel_count")
        check((hidden * x.element_size()) % 16 == 0, "v1_combine_hidden_bytes")
        num_topk = _check_combine_inputs(
            ("v1_combine_alloc_on_comm_stream", "v1_combine_weights_dim_contiguous", "v1_combine_weights_rows",
             "v1_combine_weights_dtype"), x, topk_weights, previous_event, async_finish, allocate_on_comm_stream,
        )
        check(num_channels * num_ranks * 4 * 2 <= self.num_nvl_bytes, "v1_combine_nvl_bytes_queue")
        # after cached_notify_combine (a barrier with the peers)
        _check_biases(("v1_combine_bias_dim", "v1_combine_bias_dtype", "v1_combine_bias_shape"), biases, x,
                      num_recv_tokens)
        check(
            v1_combine_nvl_bytes(num_ranks, num_channels, config, hidden, x.element_size(), num_topk)
            <= self.num_nvl_bytes,
            "v1_combine_nvl_bytes_data",
        )
        check(x.dtype == torch.bfloat16, "v1_combine_x_dtype")  # SWITCH_TYPES of the combine launcher

    def _reduce_back(
        self,
        x: torch.Tensor,
        src_rank: torch.Tensor,
        src_token: torch.Tensor,
        topk_weights: torch.Tensor | None,
        num_tokens: int,
        bias: Bias,
        ranks_per_group: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Return the rows to their sources and reduce them there.  Intranode: one float32 accumulation (bias
        first), one rounding.  Internode (``ranks_per_group``: the ranks of one node): as the library's
        ``internode::combine`` (csrc/kernels/legacy/internode.cu, ``combine_token``), the NVLink forwarder of
        each node sums that node's contributions in float32 and writes them as ``x.dtype`` into the RDMA
        buffer; the RDMA receiver sums the two biases and the nodes' partials in float32 and rounds again."""
        parts, _ = _exchange.return_to_sources(
            self.group, x.device, src_rank, {"x": x, "token": src_token, "w": topk_weights}
        )
        contributions = [(p["token"], p["x"]) for p in parts]
        if ranks_per_group is None:
            combined_x = _route.combine_reduce(
                num_tokens, x.shape[1], contributions, _unpack_bias(bias), x.dtype, x.device
            )
        else:
            groups: list[list[tuple[torch.Tensor, torch.Tensor]]] = [
                [] for _ in range(self.group_size // ranks_per_group)]
            for source, contribution in enumerate(contributions):
                groups[source // ranks_per_group].append(contribution)
            combined_x = _route.combine_reduce_two_level(
                num_tokens, x.shape[1], groups, _unpack_bias(bias), x.dtype, x.device
            )
        combined_w = None
        if topk_weights is not None:
            combined_w = torch.zeros(
                (num_tokens, topk_weights.shape[1]), dtype=torch.float32, device=x.device
            )
            for p in parts:
                combined_w.index_add_(0, p["token"], p["w"])
        return combined_x, combined_w

    # --------------------------------------------------------------------------------------- internode
    def internode_dispatch(
        self,
        x: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        handle: tuple | None = None,
        num_tokens_per_rank: torch.Tensor | None = None,
        num_tokens_per_rdma_rank: torch.Tensor | None = None,
        is_token_in_rank: torch.Tensor | None = None,
        num_tokens_per_expert: torch.Tensor | None = None,
        topk_idx: torch.Tensor | None = None,
        topk_weights: torch.Tensor | None = None,
        expert_alignment: int = 1,
        config: Config | None = None,
        previous_event: EventOverlap | None = None,
        async_finish: bool = False,
        allocate_on_comm_stream: bool = False,
    ) -> DispatchOutputs:
        """Multi-node dispatch; same results as intranode, internode handle tuple (see DIVERGENCES.md)."""
        assert config is not None
        x, x_scales = x if isinstance(x, tuple) else (x, None)
        if handle is not None:
            check(topk_idx is None and topk_weights is None, "v1_internode_cached_with_topk")
            (is_token_in_rank, rdma_channel_prefix_matrix, gbl_channel_prefix_matrix, _recv_rdma_channel_prefix_matrix,
             recv_rdma_rank_prefix_sum, _recv_gbl_channel_prefix_matrix, recv_gbl_rank_prefix_sum, _recv_src_meta,
             _send_rdma_head, _send_nvl_head) = handle
            self._check_internode_dispatch(
                x, x_scales, None, None, None, None, is_token_in_rank, None,
                (rdma_channel_prefix_matrix, recv_rdma_rank_prefix_sum, gbl_channel_prefix_matrix,
                 recv_gbl_rank_prefix_sum),
                config, previous_event, async_finish, allocate_on_comm_stream,
            )
            return self._cached_dispatch(x, x_scales, is_token_in_rank, 0, previous_event, async_finish)
        check(
            num_tokens_per_rank is not None and is_token_in_rank is not None and num_tokens_per_expert is not None,
            "v1_internode_missing_layout",
        )
        self._check_internode_dispatch(
            x, x_scales, topk_idx, topk_weights, num_tokens_per_rank, num_tokens_per_rdma_rank, is_token_in_rank,
            num_tokens_per_expert, None, config, previous_event, async_finish, allocate_on_comm_stream,
        )
        return self._fresh_dispatch(
            x, x_scales, topk_idx, topk_weights, is_token_in_rank, num_tokens_per_expert, expert_alignment, 0,
            previous_event, async_finish, lambda recv: self._internode_handle(recv, config, is_token_in_rank),
        )

    def _check_internode_dispatch(
        self, x: Tensor, x_scales: Tensor | None, topk_idx: Tensor | None, topk_weights: Tensor | None,
        num_tokens_per_rank: Tensor | None, num_tokens_per_rdma_rank: Tensor | None, is_token_in_rank: Tensor,
        num_tokens_per_expert: Tensor | None, cached: tuple[Tensor, Tensor, Tensor, Tensor] | None, config: Config,
        previous_event: EventOverlap | None, async_finish: bool, allocate_on_comm_stream: bool,
    ) -> None:
        """The refusals of ``Buffer::internode_dispatch`` (csrc/legacy/buffer.hpp:900-991) and its notify /
        dispatch launchers (csrc/kernels/legacy/internode.cu), in the library's order.

        The library's RDMA ranks are nodes of 8 GPUs; the emulation's are its nodes (``LOCAL_WORLD_SIZE``).
        """
        num_ranks, num_rdma_ranks = self.group_size, self._topo.num_nodes
        num_channels = config._num_sms // 2
        check(config._num_sms % 2 == 0, "v1_internode_odd_sms")
        check(0 < num_rdma_ranks <= NUM_MAX_RDMA_PEERS, "v1_internode_rdma_ranks")
        if cached is None:
            check(num_tokens_per_rdma_rank is not None, "v1_internode_missing_rdma_layout")
            check(num_tokens_per_rank.dtype == torch.int32, "v1_internode_dtype_num_tokens_per_rank")
            check(num_tokens_per_rdma_rank.dtype == torch.int32, "v1_internode_dtype_num_tokens_per_rdma_rank")
            check(num_tokens_per_expert.dtype == torch.int32, "v1_internode_dtype_num_tokens_per_expert")
        else:
            rdma_cpm, recv_rdma_prefix, gbl_cpm, recv_gbl_prefix = cached
            check(rdma_cpm.dtype == torch.int32, "v1_internode_cached_dtype_918")
            check(recv_rdma_prefix.dtype == torch.int32, "v1_internode_cached_dtype_919")
            check(gbl_cpm.dtype == torch.int32, "v1_internode_cached_dtype_920")
            check(recv_gbl_prefix.dtype == torch.int32, "v1_internode_cached_dtype_921")
        check(_contiguous_nd(x, 2), "v1_internode_x_dim_contiguous")
        check((x.shape[1] * x.element_size()) % 16 == 0, "v1_internode_hidden_bytes")
        if cached is not None:
            check(_contiguous_nd(rdma_cpm, 2), "v1_internode_cached_shape_932")
            check(tuple(rdma_cpm.shape) == (num_rdma_ranks, num_channels), "v1_internode_cached_shape_933")
            check(_contiguous_nd(recv_rdma_prefix, 1), "v1_internode_cached_shape_935")
            check(recv_rdma_prefix.shape[0] == num_rdma_ranks, "v1_internode_cached_shape_936")
            check(_contiguous_nd(gbl_cpm, 2), "v1_internode_cached_shape_937")
            check(tuple(gbl_cpm.shape) == (num_ranks, num_channels), "v1_internode_cached_shape_938")
            check(_contiguous_nd(recv_gbl_prefix, 1), "v1_internode_cached_shape_940")
            check(recv_gbl_prefix.shape[0] == num_ranks, "v1_internode_cached_shape_941")
        else:
            check(_contiguous_nd(num_tokens_per_rank, 1), "v1_internode_layout_943")
            check(_contiguous_nd(num_tokens_per_rdma_rank, 1), "v1_internode_layout_944")
            check(_contiguous_nd(num_tokens_per_expert, 1), "v1_internode_layout_945")
            check(num_tokens_per_rank.shape[0] == num_ranks, "v1_internode_layout_946")
            check(num_tokens_per_rdma_rank.shape[0] == num_rdma_ranks, "v1_internode_layout_947")
            check(num_tokens_per_expert.shape[0] % num_ranks == 0, "v1_internode_experts_not_divisible")
            check(num_tokens_per_expert.shape[0] // num_ranks <= NUM_MAX_LOCAL_EXPERTS, "v1_internode_layout_949")
        _, hidden = x.shape
        hidden_int4 = hidden * x.element_size() // 16
        num_experts = 0 if cached is not None else num_tokens_per_expert.shape[0]
        num_topk, num_scales, scale_hidden_stride = _check_dispatch_inputs(
            _INTERNODE_INPUT_ROWS, x, x_scales, topk_idx, topk_weights, num_experts, previous_event, async_finish,
            allocate_on_comm_stream,
        )
        rdma_hint = rdma_size_hint(config, hidden_int4 * 16, num_rdma_ranks)
        if cached is None:  # notify_dispatch (internode.cu:430-437)
            self._check_notify(False, hidden_int4, num_scales, num_topk, num_topk, num_channels, config, rdma_hint)
        else:  # cached_notify (internode.cu:1515-1519), no top-k in cached mode
            self._check_notify(True, hidden_int4, num_scales, 0, 0, num_channels, config, rdma_hint)
        check(num_scales * scale_hidden_stride < INT_MAX, "v1_internode_scale_stride")

    def _check_notify(self, cached: bool, hidden_int4: int, num_scales: int, num_topk_idx: int, num_topk_weights: int,
                      num_channels: int, config: Config, rdma_hint: int) -> None:
        """The checks of the internode notify kernels: ``notify_dispatch`` (a fresh dispatch, internode.cu:430-437)
        or ``cached_notify`` (``cached``: a cached dispatch or a combine, :1515-1519).  Both check that the clean
        metadata fits in the RDMA and NVLink buffers and that the RDMA size is an ``int``; then the first needs a
        supported RDMA rank count, the second more than 3 channel halves."""
        num_rdma_ranks = self._topo.num_nodes
        rdma_meta = _rdma_clean_meta(hidden_int4, num_scales, num_topk_idx, num_topk_weights, num_rdma_ranks,
                                     config._num_max_rdma_chunked_recv_tokens, num_channels)
        nvl_meta = _nvl_clean_meta(hidden_int4, num_scales, num_topk_idx, num_topk_weights, num_rdma_ranks,
                                   config._num_max_nvl_chunked_recv_tokens, num_channels)
        rows = _CACHED_NOTIFY_ROWS if cached else _NOTIFY_DISPATCH_ROWS
        check(sum(rdma_meta) * 4 <= rdma_hint, rows[0])
        check(sum(nvl_meta) * 4 <= self.num_nvl_bytes, rows[1])
        check(rdma_hint < INT_MAX, rows[2])
        if cached:
            check(num_channels * 2 > 3, "v1_internode_cached_notify_1519")
        else:
            check(num_rdma_ranks in SUPPORTED_RDMA_RANKS, "v1_internode_unsupported_rdma_ranks")

    def _internode_handle(
        self, recv: _exchange.Received, config: Config, is_token_in_rank: torch.Tensor
    ) -> tuple:
        topo, me = self._topo, self.rank
        nodes, rpn = topo.num_nodes, topo.ranks_per_node
        num_channels = config._num_channels
        device = is_token_in_rank.device
        in_rank = is_token_in_rank.to(torch.bool)
        in_node = in_rank.reshape(in_rank.shape[0], nodes, rpn).any(dim=2)
        rdma_cpm = _route.channel_prefix_matrix(in_node, num_channels)
        gbl_cpm = _route.channel_prefix_matrix(in_rank, num_channels)
        peers = [n * rpn + topo.local_rank for n in range(nodes)]
        peer_in_node = [
            p.reshape(p.shape[0], nodes, rpn).any(dim=2) for p in (recv.gathered["in_rank"][q] for q in peers)
        ]
        recv_rdma_cpm = _recv_channel_prefix(peer_in_node, num_channels, topo.node)
        recv_rdma_rank_prefix_sum = _recv_prefix_sum(peer_in_node, topo.node)
        recv_gbl_cpm = _recv_channel_prefix(recv.gathered["in_rank"], num_channels, me)
        recv_gbl_rank_prefix_sum = _recv_prefix_sum(recv.gathered["in_rank"], me)
        # (source rank, source token) as two int32 = the real 8-byte SourceMeta rows, typed uint8 [n, 8] like it
        recv_src_meta = torch.stack([recv.src_rank, recv.src_token], dim=1).to(torch.int32).contiguous()
        recv_src_meta = recv_src_meta.view(torch.uint8).reshape(-1, SOURCE_META_BYTES)
        send_rdma_head = _route.send_head(in_node, num_channels)
        rdma_rows = torch.cat(
            [
                recv.gathered["in_rank"][q][peer_in_node[i][:, topo.node]].reshape(-1, nodes, rpn)[
                    :, topo.node
                ]
                for i, q in enumerate(peers)
            ]
        )
        send_nvl_head = _route.send_head(rdma_rows, num_channels)
        if rpn < NUM_MAX_NVL_PEERS:  # the real head has one column per NVLink peer slot (8); absent peers: -1
            pad = torch.full((send_nvl_head.shape[0], NUM_MAX_NVL_PEERS - rpn), -1, dtype=torch.int32,
                             device=send_nvl_head.device)
            send_nvl_head = torch.cat([send_nvl_head, pad], dim=1)
        return (
            is_token_in_rank,
            rdma_cpm,
            gbl_cpm,
            recv_rdma_cpm.to(device),
            recv_rdma_rank_prefix_sum.to(device),
            recv_gbl_cpm.to(device),
            recv_gbl_rank_prefix_sum.to(device),
            recv_src_meta,
            send_rdma_head,
            send_nvl_head.to(device),
        )

    def internode_combine(
        self,
        x: torch.Tensor,
        handle: tuple | list,
        topk_weights: torch.Tensor | None = None,
        bias: Bias = None,
        config: Config | None = None,
        previous_event: EventOverlap | None = None,
        async_finish: bool = False,
        allocate_on_comm_stream: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None, EventOverlap]:
        """Multi-node combine (same numerics as the intranode one in the emulation)."""
        assert config is not None
        (is_combined_token_in_rank, _, _, rdma_channel_prefix_matrix, rdma_rank_prefix_sum, gbl_channel_prefix_matrix,
         _gbl_rank_prefix_sum, src_meta, send_rdma_head, send_nvl_head) = handle
        biases = _unpack_bias(bias)
        self._check_internode_combine(
            x, topk_weights, biases, src_meta, is_combined_token_in_rank, rdma_channel_prefix_matrix,
            rdma_rank_prefix_sum, gbl_channel_prefix_matrix, send_rdma_head, send_nvl_head, config, previous_event,
            async_finish, allocate_on_comm_stream,
        )
        _wait_previous(previous_event)
        meta = src_meta.contiguous().view(torch.int32)  # (source rank, source token)
        num_recv = meta.shape[0]
        combined_x, combined_w = self._reduce_back(
            x[:num_recv],
            meta[:, 0].to(torch.int64),
            meta[:, 1].to(torch.int64),
            None if topk_weights is None else topk_weights[:num_recv],
            is_combined_token_in_rank.shape[0],
            bias,
            ranks_per_group=self._topo.ranks_per_node,
        )
        return combined_x, combined_w, EventOverlap(_event(x.device, async_finish))

    def _check_internode_combine(
        self, x: Tensor, topk_weights: Tensor | None, biases: list[Tensor], src_meta: Tensor,
        is_combined_token_in_rank: Tensor, rdma_channel_prefix_matrix: Tensor, rdma_rank_prefix_sum: Tensor,
        gbl_channel_prefix_matrix: Tensor, combined_rdma_head: Tensor, combined_nvl_head: Tensor, config: Config,
        previous_event: EventOverlap | None, async_finish: bool, allocate_on_comm_stream: bool,
    ) -> None:
        """The refusals of ``Buffer::internode_combine`` (csrc/legacy/buffer.hpp:1265-1361) and its launchers
        (csrc/kernels/legacy/internode.cu:1515-1519, 2366-2373), in the library's order."""
        num_ranks, num_rdma_ranks = self.group_size, self._topo.num_nodes
        num_channels = config._num_sms // 2
        check(config._num_sms % 2 == 0, "v1_internode_combine_odd_sms")
        check(_contiguous_nd(x, 2), "v1_internode_combine_x")
        check(_typed_nd(src_meta, 2, torch.uint8), "v1_internode_combine_handle_1269")
        check(_typed_nd(is_combined_token_in_rank, 2, torch.bool), "v1_internode_combine_handle_1270")
        check(_typed_nd(rdma_channel_prefix_matrix, 2, torch.int32), "v1_internode_combine_handle_1272")
        check(_typed_nd(rdma_rank_prefix_sum, 1, torch.int32), "v1_internode_combine_handle_1274")
        check(_typed_nd(gbl_channel_prefix_matrix, 2, torch.int32), "v1_internode_combine_handle_1276")
        check(_typed_nd(combined_rdma_head, 2, torch.int32), "v1_internode_combine_handle_1278")
        check(_typed_nd(combined_nvl_head, 2, torch.int32), "v1_internode_combine_handle_1280")
        _, hidden = x.shape
        hidden_int4 = hidden * x.element_size() // 16
        num_combined_tokens = is_combined_token_in_rank.shape[0]
        check((hidden * x.element_size()) % 16 == 0, "v1_internode_combine_hidden_bytes")
        check(src_meta.shape[1] == SOURCE_META_BYTES, "v1_internode_combine_handle_1286")
        check(is_combined_token_in_rank.shape[1] == num_ranks, "v1_internode_combine_handle_1287")
        check(
            tuple(rdma_channel_prefix_matrix.shape) == (num_rdma_ranks, num_channels),
            "v1_internode_combine_channel_count_1288",
        )
        check(rdma_rank_prefix_sum.shape[0] == num_rdma_ranks, "v1_internode_combine_handle_1289")
        check(
            tuple(gbl_channel_prefix_matrix.shape) == (num_ranks, num_channels),
            "v1_internode_combine_channel_count_1290",
        )
        check(tuple(combined_rdma_head.shape) == (num_combined_tokens, num_rdma_ranks),
              "v1_internode_combine_handle_1291")
        check(combined_nvl_head.shape[1] == NUM_MAX_NVL_PEERS, "v1_internode_combine_handle_1293")
        num_topk = _check_combine_inputs(
            ("v1_internode_combine_alloc_on_comm_stream", "v1_internode_combine_weights_1316",
             "v1_internode_combine_weights_1317", "v1_internode_combine_weights_dtype"),
            x, topk_weights, previous_event, async_finish, allocate_on_comm_stream,
        )
        check(config._num_max_nvl_chunked_recv_tokens % num_rdma_ranks == 0, "v1_internode_combine_nvl_recv_divisible")
        check(
            config._num_max_nvl_chunked_send_tokens <= config._num_max_nvl_chunked_recv_tokens // num_rdma_ranks,
            "v1_internode_combine_nvl_send_bound",
        )
        rdma_hint = rdma_size_hint(config, hidden_int4 * 16, num_rdma_ranks)
        self._check_notify(True, hidden_int4, 0, 0, num_topk, num_channels, config, rdma_hint)
        _check_biases(("v1_internode_combine_bias_1359", "v1_internode_combine_bias_1360",
                       "v1_internode_combine_bias_1361"), biases, x, num_combined_tokens)
        # the combine launcher (internode.cu:2363-2373)
        warps_per_forwarder = max(NUM_COMBINE_FORWARDER_WARPS // num_rdma_ranks, 1)
        nvl_recv, nvl_send = config._num_max_nvl_chunked_recv_tokens, config._num_max_nvl_chunked_send_tokens
        rdma_send = config._num_max_rdma_chunked_send_tokens
        check(nvl_recv // num_rdma_ranks > max(rdma_send, nvl_send), "v1_internode_combine_chunk_bound")
        check(nvl_recv // num_rdma_ranks - warps_per_forwarder >= nvl_send, "v1_internode_combine_forwarder_room")
        check(rdma_send >= warps_per_forwarder, "v1_internode_combine_rdma_send_min")
        check(x.dtype == torch.bfloat16, "v1_internode_combine_x_dtype")

