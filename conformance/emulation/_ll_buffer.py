"""The low-latency buffer memory of a legacy ``Buffer``: the ``LowLatencyLayout`` of ``csrc/legacy/config.hpp``
(two send, two receive and two signalling buffers in the RDMA buffer), the RDMA bytes themselves, the double-buffer
index, the shrink-mode mask buffer, and the barrier of ``clean_low_latency_buffer``.

What lives in the emulated RDMA bytes: the signalling words (dispatch receive counts, combine receive flags, one
int32 per expert in each of the two signalling buffers) and the zero-copy combine staging rows
(``get_next_low_latency_combine_buffer`` is a view of the send buffer).  Message bytes (the send and receive data
regions) are not written by the emulated kernels (DIVERGENCES.md).  The arithmetic of the layout is the C++
code's: ``size_t`` (modulo 2**64) products and sums, ``int`` (32-bit) ``num_experts * num_max_dispatch_tokens``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from . import _comm
from ._refusals import check
from .seams import seam

#: ``LEGACY_NUM_TIMEOUT_CYCLES`` (csrc/kernels/legacy/compiled.cuh:18): a receiver waiting longer masks the peer.
TIMEOUT_CYCLES = 200_000_000_000
#: What the emulation charges a wait that ended with the data there (it has no clock; DIVERGENCES.md).
NOMINAL_WAIT_CYCLES = 1
_SIZE_T = 2**64


@seam("ll_nominal_wait_cycles")
def nominal_wait_cycles() -> int:
    """The cycles a wait that found its data is charged (:data:`NOMINAL_WAIT_CYCLES`)."""
    return NOMINAL_WAIT_CYCLES


def _sz(value: int) -> int:
    """A ``size_t`` value."""
    return value % _SIZE_T


def int32(value: int) -> int:
    """An ``int`` (32-bit, two's complement) value."""
    value &= 0xFFFFFFFF
    return value - 2**32 if value >= 2**31 else value


def _trunc_div(a: int, b: int) -> int:
    """C++ integer division (towards zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


@dataclass(frozen=True)
class Layout:
    """``LowLatencyLayout`` (csrc/legacy/config.hpp:126-181) for one (tokens, hidden, experts)."""

    num_clean_int: int  # int32 words per signalling buffer (one per expert)
    signal_bytes: int  # one signalling buffer, aligned to 128 bytes
    send_bytes: int
    recv_bytes: int
    combine_msg_bytes: int  # per-128-channel min/max then the bf16 row
    total_bytes: int

    def signal_offset(self, index: int) -> int:
        """Byte offset of signalling buffer ``index`` (``dispatch_rdma_recv_count_buffer``)."""
        return _sz(self.signal_bytes * index)

    def send_offset(self, index: int) -> int:
        """Byte offset of send buffer ``index`` (``combine_rdma_send_buffer_data_start``)."""
        return _sz(self.signal_bytes * 2 + self.send_bytes * index)


def layout(num_max_dispatch_tokens_per_rank: int, hidden: int, num_experts: int,
           rows: tuple[str, str, str] | None = None) -> Layout:
    """The layout; ``rows``: the refusal rows of its three host assertions (config.hpp:142, :150, :158), raised
    where the calling path can reach them (``clean_low_latency_buffer`` takes any ``hidden``)."""
    tokens, num_scales = num_max_dispatch_tokens_per_rank, _trunc_div(hidden, 128)
    if rows is not None:
        check(_sz(num_scales * 4) <= _sz(hidden), rows[0])
    dispatch_msg = _sz(16 + max(_sz(hidden * 2), _sz(hidden + num_scales * 4)))
    combine_msg = _sz(num_scales * 4 + hidden * 2)
    experts_tokens = int32(num_experts * tokens)
    send = max(_sz(tokens * dispatch_msg), _sz(experts_tokens * combine_msg))
    if rows is not None:
        check(send % 16 == 0, rows[1])
    recv = max(_sz(experts_tokens * dispatch_msg), _sz(experts_tokens * combine_msg))
    if rows is not None:
        check(recv % 16 == 0, rows[2])
    signal = _sz(num_experts * 4)
    aligned = _sz(_sz(signal + 127) // 128 * 128)
    total = _sz(2 * send + 2 * recv + 2 * aligned)
    return Layout(int32(signal // 4), aligned, send, recv, combine_msg, total)


def fits(lay: Layout, index: int, num_rdma_bytes: int) -> bool:
    """``check_boundary`` of ``clean_low_latency_buffer`` (csrc/legacy/buffer.hpp:1438-1441) for buffer ``index``."""
    offset = lay.signal_offset(index)
    offset = offset - _SIZE_T if offset >= 2**63 else offset  # a pointer difference (int64)
    return 0 <= offset and _sz(offset + _sz(lay.num_clean_int * 4)) <= _sz(num_rdma_bytes)


class LowLatencyBuffer:
    """One ``Buffer``'s low-latency memory: the RDMA bytes (allocated, zeroed as ``sync`` does, at first use), the
    double-buffer index (``low_latency_buffer_idx``) and, with ``enable_shrink`` and RDMA bytes, the mask buffer
    (one int32 per rank, this rank's own view: 1 = masked)."""

    def __init__(self, num_rdma_bytes: int, num_ranks: int, shrink: bool, device: torch.device) -> None:
        self.num_rdma_bytes = num_rdma_bytes
        self.num_ranks = num_ranks
        self.device = device
        self.index = 0
        self._bytes: torch.Tensor | None = None
        # csrc/legacy/buffer.hpp:273-280: allocated (and zeroed) only when there are RDMA bytes to initialise
        self.mask: torch.Tensor | None = torch.zeros(num_ranks, dtype=torch.int32) if shrink and num_rdma_bytes > 0 \
            else None

    @property
    def bytes(self) -> torch.Tensor:
        """The RDMA buffer as ``uint8`` (``cudaMemset(rdma_buffer_ptr, 0, num_rdma_bytes)`` at construction)."""
        if self._bytes is None:
            self._bytes = torch.zeros(self.num_rdma_bytes, dtype=torch.uint8, device=self.device)
        return self._bytes

    def flip(self) -> int:
        """The index this dispatch/combine uses; the next one uses the other buffer."""
        index, self.index = self.index, self.index ^ 1
        return index

    def words(self, lay: Layout, index: int) -> torch.Tensor:
        """Signalling buffer ``index``: ``num_clean_int`` int32 words (dispatch: ``[local expert * ranks + source]``
        counts, ``-count - 1``; combine: ``[global expert]`` flags)."""
        begin = lay.signal_offset(index)
        return self.bytes[begin:begin + 4 * max(lay.num_clean_int, 0)].view(torch.int32)

    def staging(self, lay: Layout, index: int, num_local: int, rows: int, hidden: int) -> torch.Tensor:
        """Send buffer ``index`` as the bf16 ``[num_local, rows, hidden]`` rows a zero-copy combine sends
        (csrc/legacy/buffer.hpp:1716-1727: one message of ``combine_msg_bytes`` per slot, the row first)."""
        begin, elems = lay.send_offset(index), lay.combine_msg_bytes // 2
        last = (num_local - 1) * rows * elems + (rows - 1) * elems + hidden  # one past the last element
        end = begin + 2 * last if num_local and rows else begin
        if end > self.num_rdma_bytes:
            raise RuntimeError(f"deep_ep emulation: the combine buffer [{begin}, {end}) lies beyond the "
                               f"{self.num_rdma_bytes} RDMA bytes (the real view points past the allocation)")
        flat = self.bytes[begin:self.num_rdma_bytes - (self.num_rdma_bytes - begin) % 2].view(torch.bfloat16)
        return flat.as_strided((num_local, rows, hidden), (rows * elems, elems, 1))

    @seam("ll_masked")
    def masked(self) -> list[bool]:
        """This rank's mask now (all unmasked without a mask buffer)."""
        return [False] * self.num_ranks if self.mask is None else [bool(v) for v in self.mask.tolist()]

    def time_out(self, peer: int) -> None:
        """A wait on ``peer`` ran past ``TIMEOUT_CYCLES``: the kernels mask it (``atomicExch(mask + peer, 1)``); without
        a mask buffer they ``trap()`` (internode_ll.cu:60-63, :397-405, :961-969)."""
        if self.mask is None:
            raise RuntimeError(f"deep_ep emulation: rank {peer} never signalled and there is no mask buffer (the "
                               "real kernel traps after LEGACY_NUM_TIMEOUT_CYCLES)")
        self.mask[peer] = 1


def exchange_with_masks(group: dist.ProcessGroup, state: LowLatencyBuffer, device: torch.device, num_rows: int,
                        error: str | BaseException | None, what: str,
                        fields: Callable[[], _comm.Fields]) -> tuple[_comm.Exchanged, list[list[bool]]]:
    """The call's preflight and rows (``_comm.exchange``), which also carry every rank's mask as it sends: ``(what
    arrived, masks)``, ``masks[s][d]``: rank ``s`` does not send to ``d``."""
    exchanged = _comm.exchange(group, device, num_rows, error, what, fields, [int(m) for m in state.masked()])
    return exchanged, masks_of(exchanged.table)


def masks_of(table: list[list[int]]) -> list[list[bool]]:
    """Every rank's mask from an exchange's ``[num_rows, *mask]`` rows (``masks[s][d]``: ``s`` does not send to
    ``d``)."""
    return [[bool(v) for v in row[1:]] for row in table]


def gather_masks(group: dist.ProcessGroup, state: LowLatencyBuffer, device: torch.device) -> list[list[bool]]:
    """Every rank's mask as it sends (``masks[s][d]``: rank ``s`` does not send to ``d``): one all-gather."""
    table = _comm.all_gather_ints(group, [int(m) for m in state.masked()], device)
    return [[bool(v) for v in row] for row in table.tolist()]


def barrier(group: dist.ProcessGroup, state: LowLatencyBuffer, device: torch.device) -> None:
    """The barrier of ``clean_low_latency_buffer`` (internode_ll.cu:21-68): without a mask buffer
    ``nvshmemx_barrier_all_block``; with one, each rank signals every peer it has not masked and waits for every
    such peer's signal, masking a peer whose signal never comes (that peer has masked this rank)."""
    masks = gather_masks(group, state, device)
    me = group.rank()
    if state.mask is None:
        return
    for peer in range(state.num_ranks):
        if peer != me and not masks[me][peer] and masks[peer][me]:
            state.time_out(peer)
