"""Emulated elastic API: ``deep_ep.ElasticBuffer`` and ``deep_ep.EPHandle`` (V2).

(Over 400 lines: one class mirroring the library's ``ElasticBuffer``, kept whole so that it reads against
``deep_ep/buffers/elastic.py`` line by line.)
"""

from __future__ import annotations

import atexit
import functools
import os
import sys
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from . import _checks, _exchange, _refusals, _route, _sizing
from ._refusals import check
from ._topology import Topology, get_topology
from ._uninit import pad_uninitialised, uninitialised
from .seams import seam
from .utils.event import EventHandle, EventOverlap, async_outputs

XType = torch.Tensor | tuple[torch.Tensor, torch.Tensor]

#: ``layout::WorkspaceLayout`` limits (deep_ep/include/deep_ep/common/layout.cuh:19-21).
_MAX_RANKS = 1024
_MAX_EXPERTS = 2048
_MAX_EXPERTS_PER_RANK = 256
Bias = torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None


def _value_or(value: object, default: object) -> object:
    return default if value is None else value


def _domains(topo: Topology, allow_hybrid_mode: bool) -> tuple[int, int, bool]:
    """``(num_scaleout_ranks, num_scaleup_ranks, is_scaleup_nvlink)`` the NCCL context would report."""
    if allow_hybrid_mode and topo.num_nodes > 1:
        scaleout, scaleup = topo.num_nodes, topo.ranks_per_node
    else:
        scaleout, scaleup = 1, topo.num_ranks
    return scaleout, scaleup, scaleup == topo.ranks_per_node


def _pybind_type_error(function: str, row_id: str, class_name: str = "ElasticBuffer") -> TypeError:
    """pybind11's refusal of an argument it cannot convert (first line exact, the listing the emulation's)."""
    return TypeError(
        _refusals.message(row_id)
        + f"\n    1. (self: deep_ep._C.{class_name}, ...) -> tuple\n\nInvoked with: "
        f"<deep_ep emulation: the arguments of {class_name}.{function}>"
    )


def _event_arguments_ok(*events: object) -> bool:
    """pybind11 converts ``previous_event`` arguments only from ``None`` or a ``deep_ep`` ``EventHandle``."""
    return all(e is None or isinstance(e, EventHandle) for e in events)


def expand_padding_rows(num_rows: int, slots: torch.Tensor) -> torch.Tensor:
    """The rows of an expand-mode output of ``num_rows`` rows that no top-k slot points at (``slots``: the valid
    rows' ``recv_src_metadata[:, 2:]``, -1 where the slot is not local): the alignment gaps between experts and, in a
    worst-case allocation, the rows after the last expert."""
    used = torch.zeros(num_rows, dtype=torch.bool, device=slots.device)
    pointers = slots.to(torch.int64)
    used[pointers[pointers >= 0]] = True
    return torch.nonzero(~used).flatten()


def _unpadded_gaps(plan: dict) -> None:
    """Expand mode without ``do_zero_padding``: the alignment gaps between experts (rows no top-k slot of a received
    token points at) are never written by the library (dispatch_copy_epilogue.cuh zeroes them only with
    ``do_zero_padding``; the tensors are ``torch::empty``): uninitialised here too (0x7F bytes, ``_uninit``)."""
    gaps = expand_padding_rows(plan["recv_x"].shape[0], plan["metadata"][:, 2:])
    if gaps.numel() == 0:
        return
    for name in ("recv_x", "recv_sf", "recv_topk_weights"):
        t = plan.get(name)
        if t is not None:
            t[gaps] = uninitialised((gaps.numel(),) + tuple(t.shape[1:]), t.dtype, t.device)


def _worst_expanded(num_ranks: int, num_max: int, num_topk: int, num_local: int, alignment: int) -> int:
    """The expanded rows a dispatch without CPU sync allocates (csrc/elastic/buffer.hpp:1064-1067)."""
    rows = num_ranks * num_max * min(num_topk, num_local) + (alignment - 1) * num_local
    return -(-rows // alignment) * alignment


def _worst_case(plan: dict, num_recv_tokens: int, num_expanded_tokens: int, do_expand: bool) -> None:
    """Pad the received tensors to the rows the library allocates without a CPU sync (or from a cached handle):
    the valid rows first (``psum_num_recv_tokens_per_scaleup_rank[-1]`` of them), then rows the library leaves
    uninitialised (``torch::empty``, csrc/elastic/buffer.hpp:1064-1109): uninitialised here too (``_uninit``: 0x7F
    bytes) for payloads, scales, weights, top-k indices and ``recv_src_metadata`` (combine reads the valid rows only:
    ``psum_num_recv_tokens_per_scaleup_rank[-1]`` of them, as the kernels read it on the device).
    ``num_recv_tokens_per_expert_list`` is empty (the counts were never read on the host)."""
    rows = num_expanded_tokens if do_expand else num_recv_tokens
    for name in ("recv_x", "recv_sf", "recv_topk_weights", "recv_topk_idx"):
        plan[name] = pad_uninitialised(plan[name], rows)
    plan["metadata"] = pad_uninitialised(plan["metadata"], num_recv_tokens)
    plan["num_recv_tokens"], plan["num_expanded_tokens"], plan["aligned"] = num_recv_tokens, num_expanded_tokens, []


def _local_reduce(rows: torch.Tensor, token: torch.Tensor, weights: torch.Tensor | None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The sender side of an expand-mode combine with ``allow_multiple_reduction``: the rows of this rank's slots of
    one token are summed in float32 and rounded to the payload dtype before they leave the rank, one row per
    (token, rank) (csrc/kernels/elastic ``combine_impl``, deep_ep/include/deep_ep/impls/combine.cuh:126-176, and
    ``hybrid_combine_impl``, hybrid_combine.cuh:234-274; a single slot is sent as it is, which is the same value).
    The slots' weights, each in its own column, come along in the reduced row."""
    token, inverse = torch.unique(token, return_inverse=True)
    summed = torch.zeros((token.numel(), rows.shape[1]), dtype=torch.float32, device=rows.device)
    summed.index_add_(0, inverse, rows.to(torch.float32))
    if weights is not None:
        weights = torch.zeros((token.numel(), weights.shape[1]), dtype=weights.dtype,
                              device=weights.device).index_add_(0, inverse, weights)
    return summed.to(rows.dtype), token, weights


def _expanded_send_with_weights() -> RuntimeError:
    """Expand mode without ``allow_multiple_reduction`` sends every slot's row ("expanded send"), which takes no
    weights: the real kernel traps (``EP_DEVICE_ASSERT(topk_weights == nullptr)``, combine.cuh:68-69,
    hybrid_combine.cuh:117-119); the emulation refuses before communicating (see DIVERGENCES.md)."""
    return RuntimeError("deep_ep emulation: combine of an expand-mode handle on a buffer with "
                        "allow_multiple_reduction=False takes no topk_weights (the real kernel traps: "
                        "EP_DEVICE_ASSERT(topk_weights == nullptr), combine.cuh:68)")


#: ``~ElasticBuffer`` of a buffer collected after its process group was destroyed (csrc/elastic/buffer.hpp:146-153:
#: ``destroy()`` -> ``barrier(true, true)`` on the freed communicator -> the ``cudaDeviceSynchronize`` at :203), thrown
#: out of a destructor: the process terminates (the known defect ``v2-buffer-outlives-process-group``).
COLLECTED_AFTER_GROUP = ("terminate called after throwing an instance of 'EPException'\n  what():  CUDA runtime "
                         "exception (csrc/elastic/buffer.hpp:203): 700 (cudaErrorIllegalAddress, an illegal memory "
                         "access was encountered)")
#: The buffers built with ``explicitly_destroy=False`` that are still alive (their destructor runs ``destroy()``).
_implicitly_destroyed: weakref.WeakSet = weakref.WeakSet()


def collect_at_exit(buffer: ElasticBuffer) -> None:
    """The interpreter's exit runs ``buffer``'s destructor if it is still alive then (a buffer built with
    ``explicitly_destroy=False``: the destructor calls ``destroy()`` itself, on whatever group is left)."""
    _implicitly_destroyed.add(buffer)


def _group_destroyed(group: object) -> bool:
    """Whether ``group`` no longer exists (``destroy_process_group()`` ran)."""
    try:
        from torch.distributed import distributed_c10d

        return not dist.is_initialized() or group not in distributed_c10d._world.pg_map
    except Exception:  # noqa: BLE001 - torch itself is being torn down: the group is gone
        return True


def _destructor(buffer: ElasticBuffer) -> None:
    """What the real ``~ElasticBuffer`` does (buffer.hpp:146-153): without ``explicitly_destroy``, ``destroy()``; its
    barrier on a destroyed group's communicator faults and the exception leaves the destructor: the process dies (the
    emulation prints what the real one prints and aborts).  With ``explicitly_destroy`` and no ``destroy()``, the
    library's warning.  (A barrier on a live group is not emulated: the emulation's buffers hold nothing to release.)
    The texts are the buffer class's (``_COLLECTED_AFTER_GROUP``, ``_NOT_DESTROYED``)."""
    if getattr(buffer, "runtime", None) is None:
        return
    if not buffer.explicitly_destroy:
        if _group_destroyed(buffer.group):
            sys.stdout.flush()
            sys.stderr.write(type(buffer)._COLLECTED_AFTER_GROUP + "\n")
            sys.stderr.flush()
            os.abort()
    else:
        print(type(buffer)._NOT_DESTROYED, flush=True)
    buffer.runtime = None


@atexit.register
def _collect_at_exit() -> None:
    """The interpreter's exit collects what module globals still hold (a wrapper's ``_buffer``)."""
    for buffer in list(_implicitly_destroyed):
        _destructor(buffer)


class EPHandle:
    """Communication handle returned by ``ElasticBuffer.dispatch`` (same attributes as the real one)."""

    def __init__(
        self,
        do_expand: bool,
        num_experts: int,
        expert_alignment: int,
        num_max_tokens_per_rank: int,
        num_sms: int,
        topk_idx: torch.Tensor,
        num_recv_tokens: int,
        num_expanded_tokens: int,
        num_recv_tokens_per_expert_list: list,
        psum_num_recv_tokens_per_scaleup_rank: torch.Tensor,
        psum_num_recv_tokens_per_expert: torch.Tensor,
        num_unaligned_recv_tokens_per_expert: torch.Tensor,
        recv_src_metadata: torch.Tensor,
        dst_buffer_slot_idx: torch.Tensor,
        token_metadata_at_forward: torch.Tensor | None,
        channel_linked_list: torch.Tensor | None,
    ) -> None:
        assert topk_idx is not None
        self.do_expand = do_expand
        self.num_experts = num_experts
        self.expert_alignment = expert_alignment
        self.num_max_tokens_per_rank = num_max_tokens_per_rank
        self.num_sms = num_sms
        self.topk_idx = topk_idx
        self.psum_num_recv_tokens_per_scaleup_rank = psum_num_recv_tokens_per_scaleup_rank
        self.psum_num_recv_tokens_per_expert = psum_num_recv_tokens_per_expert
        self.num_unaligned_recv_tokens_per_expert = num_unaligned_recv_tokens_per_expert
        self.num_recv_tokens_per_expert_list = num_recv_tokens_per_expert_list
        self.recv_src_metadata = recv_src_metadata
        self.dst_buffer_slot_idx = dst_buffer_slot_idx
        self.token_metadata_at_forward = token_metadata_at_forward
        self.channel_linked_list = channel_linked_list
        self.num_recv_tokens = num_recv_tokens
        self.num_expanded_tokens = num_expanded_tokens
        self.cached_recv_src_metadata_before_sort = None


def dispatch_argument_checks(
    buffer: Any,
    x: torch.Tensor,
    sf: torch.Tensor | None,
    topk_idx: torch.Tensor,
    topk_weights: torch.Tensor | None,
    stats: torch.Tensor | None,
    handle: Any,
    num_max_tokens_per_rank: int,
    num_experts: int,
    num_sms: int,
    previous_event: EventHandle | None,
    allocate_on_comm_stream: bool,
) -> tuple[int, int, int] | BaseException:
    """The refusals of a V2 dispatch's arguments, from ``x``'s rank to the buffer's size, in the library's order:
    ``ElasticBuffer::dispatch`` (within csrc/elastic/buffer.hpp:728-979) and 2.5.0's ``EPBuffer::dispatch`` (within
    csrc/buffers/ep.hpp:311-547: the same checks in the same order, its stream prologue at ep.hpp:141-142, its
    2-D ``dst_buffer_slot_idx`` at ep.hpp:462).  Each version's ``_check_dispatch`` makes its own checks before and
    after these.  Returns ``(channels, num_topk, num_local_experts)`` (channels: the hybrid channel count, 1 in
    direct mode), or, when this rank has more tokens than ``num_max_tokens_per_rank`` (a rank-local fact), that
    refusal unraised."""
    hybrid = buffer.num_scaleout_ranks > 1
    cached = handle is not None
    check(x.dim() == 2, "v2_dispatch_x_dim")  # get_shape<2>(x)
    num_tokens, hidden = x.shape
    num_local_experts = num_experts // buffer.num_ranks
    check(x.is_contiguous(), "v2_dispatch_x_cuda_contiguous")
    check((hidden * x.element_size()) % 16 == 0, "v2_dispatch_hidden_bytes")
    if _refusals.violated(num_tokens <= num_max_tokens_per_rank, "v2_dispatch_too_many_tokens"):
        return _refusals.error("v2_dispatch_too_many_tokens")
    num_sf_packs = 0
    if sf is not None:
        check(sf.dim() == 2, "v2_dispatch_sf_dim")
        check(sf.shape[0] == num_tokens, "v2_dispatch_sf_rows")
        check(sf.is_cuda or not x.is_cuda, "v2_dispatch_sf_cuda")
        check(sf.element_size() == 4, "v2_dispatch_sf_elem_size")
        num_sf_packs = sf.shape[1]
    check(topk_idx.dim() == 2, "v2_dispatch_topk_dim")
    num_topk = topk_idx.shape[1]
    check(topk_idx.shape[0] == num_tokens, "v2_dispatch_topk_rows")
    check(topk_idx.dtype == torch.int64, "v2_dispatch_topk_dtype")
    check(topk_idx.is_contiguous(), "v2_dispatch_topk_cuda_contiguous")
    if topk_weights is not None:
        check(topk_weights.dim() == 2, "v2_dispatch_weights_dim")
        check(topk_weights.shape[0] == num_tokens, "v2_dispatch_weights_rows")
        check(topk_weights.is_contiguous(), "v2_dispatch_weights_cuda_contiguous")
        _checks.expect_dtype(topk_weights, torch.float32, "v2_dispatch_weights_dtype")
    if stats is not None:
        check(stats.dim() == 1, "v2_dispatch_stats_dim")
        check(stats.is_contiguous(), "v2_dispatch_stats_cuda_contiguous")
        check(stats.shape[0] == num_local_experts, "v2_dispatch_stats_len")
        _checks.expect_dtype(stats, torch.int32, "v2_dispatch_stats_dtype")
    if previous_event is not None:  # stream_control_prologue (buffer.hpp:539-540)
        check(allocate_on_comm_stream, "v2_dispatch_previous_event_without_comm_alloc")
    check(num_experts % buffer.num_ranks == 0, "v2_dispatch_experts_not_divisible_explicit")
    if cached:
        check(handle.psum_num_recv_tokens_per_expert.shape[0] == num_local_experts, "v2_dispatch_cached_handle_809")
        check(
            handle.num_unaligned_recv_tokens_per_expert.shape[0] == num_local_experts,
            "v2_dispatch_cached_handle_824",
        )
        check(
            handle.psum_num_recv_tokens_per_scaleup_rank.shape[0] == buffer.num_scaleup_ranks,
            "v2_dispatch_cached_handle_838",
        )
    channels = 1
    if hybrid:
        check(num_sms <= _sizing.NUM_MAX_SMS, "v2_dispatch_hybrid_sms")
        channels = num_sms * _sizing.num_channels_per_sm(
            buffer.num_ranks, num_experts, hidden, x.element_size(), num_sf_packs, num_topk,
            buffer.prefer_overlap_with_compute,
        )
        if cached:
            per_channel = -(-num_max_tokens_per_rank // channels) if channels else 0
            check(
                tuple(handle.token_metadata_at_forward.shape)
                == (channels, buffer.num_scaleout_ranks * per_channel + 1, 2 + 2 * num_topk),
                "v2_dispatch_cached_hybrid_channels",
            )
    elif cached:  # a hybrid handle has a 4-D dst_buffer_slot_idx (get_shape<2> at buffer.hpp:873)
        check(handle.token_metadata_at_forward is None, "v2_dispatch_cached_dst_slot_dim")
    check(
        _sizing.dispatch_buffer_size(
            num_max_tokens_per_rank, hidden, num_sf_packs, num_topk, x.element_size(), buffer.num_scaleout_ranks,
            buffer.num_scaleup_ranks, buffer._is_scaleup_nvlink, "v2_dispatch_hidden_tma",
        )
        <= buffer.num_bytes,
        "v2_dispatch_buffer_size",
    )
    return channels, num_topk, num_local_experts


class ElasticBuffer:
    """Pure-PyTorch model of ``deep_ep.ElasticBuffer`` (expert-parallel dispatch/combine only).

    The public methods are DeepEP 2.1.0's (``deep_ep/buffers/elastic.py``); what they share with later versions'
    V2 buffers (the exchange, the layouts, the reductions, uninitialised memory) is in the ``_runtime_*`` methods,
    which a later version's class (``conformance.emulation.v2_5_0.EPBuffer``) drives through its own public methods,
    checks and refusal table."""

    #: The DeepEP version this class models (its refusal table is the one ``_refusals`` raises from).
    _VERSION = "2.1.0"
    #: The handle class its dispatch returns, and the event wrapper its calls return.
    _HANDLE: type = EPHandle
    _EVENT_OVERLAP: type = EventOverlap
    #: What the process prints and does when a buffer is collected after its group was destroyed, or never destroyed.
    _COLLECTED_AFTER_GROUP = COLLECTED_AFTER_GROUP
    _NOT_DESTROYED = "`destroy()` is not called before DeepEP elastic buffer destruction, which can leak resources."

    def __init__(
        self,
        group: dist.ProcessGroup,
        num_bytes: int | None = None,
        num_cpu_bytes: int = 0,
        num_max_tokens_per_rank: int = 0,
        hidden: int = 0,
        num_topk: int = 0,
        use_fp8_dispatch: bool = False,
        deterministic: bool = False,
        allow_hybrid_mode: bool = True,
        allow_multiple_reduction: bool = True,
        prefer_overlap_with_compute: bool = True,
        sl_idx: int = 3,
        num_allocated_qps: int = 0,
        num_cpu_timeout_secs: int = 300,
        num_gpu_timeout_secs: int = 100,
        explicitly_destroy: bool = False,
    ) -> None:
        self.group = group
        self.rank_idx = group.rank()
        self.num_ranks = group.size()
        self.allow_hybrid_mode = allow_hybrid_mode
        self.allow_multiple_reduction = allow_multiple_reduction
        self.prefer_overlap_with_compute = prefer_overlap_with_compute
        self.deterministic = deterministic
        if num_cpu_bytes > 0:
            check(num_bytes is not None, "v2_init_cpu_bytes_without_num_bytes")
        self._topo = get_topology(group)  # the emulation's stand-in for the NCCL communicator
        scaleout, scaleup, is_nvlink = _domains(self._topo, allow_hybrid_mode)
        if num_bytes is None:
            num_bytes = _sizing.buffer_size_hint(
                num_max_tokens_per_rank, hidden, num_topk, use_fp8_dispatch, scaleout, scaleup, is_nvlink,
                allow_multiple_reduction,
            )
        self.num_bytes = num_bytes
        self.num_cpu_bytes = num_cpu_bytes
        self.num_max_tokens_per_rank = num_max_tokens_per_rank
        self.sl_idx = sl_idx
        if num_allocated_qps == 0:
            num_allocated_qps = _sizing.auto_num_allocated_qps(allow_hybrid_mode)
        self.num_allocated_qps = num_allocated_qps
        alignment = _sizing.ELASTIC_BUFFER_ALIGNMENT
        if allow_hybrid_mode and num_cpu_bytes > 0:  # create_cpu_handle (buffer.hpp:689)
            check(num_cpu_bytes > 0 and num_cpu_bytes % alignment == 0, "v2_init_cpu_handle_alignment")
        # the C++ constructor (csrc/elastic/buffer.hpp:98-127)
        check(num_bytes > 0 and num_bytes % alignment == 0, "v2_init_num_bytes_alignment")
        check(num_cpu_bytes >= 0 and num_cpu_bytes % alignment == 0, "v2_init_cpu_bytes_alignment")
        check(num_cpu_bytes <= num_bytes, "v2_init_cpu_bytes_exceed")
        check(self.num_ranks <= _MAX_RANKS, "v2_init_too_many_ranks")  # WorkspaceLayout (layout.cuh:38)
        self._start(num_cpu_timeout_secs, num_gpu_timeout_secs, explicitly_destroy, is_nvlink)

    def _start(self, num_cpu_timeout_secs: int, num_gpu_timeout_secs: int, explicitly_destroy: bool,
               is_nvlink: bool) -> None:
        """What every version's constructor does once its checks passed: the runtime exists, the domains are known,
        and the ranks meet in a barrier (the real constructors' ``group.barrier()``)."""
        self.num_cpu_timeout_secs = num_cpu_timeout_secs
        self.num_gpu_timeout_secs = num_gpu_timeout_secs
        self.explicitly_destroy = explicitly_destroy
        self.runtime: object | None = object()
        if not explicitly_destroy:
            collect_at_exit(self)
        self._sm_cache: dict[tuple, int] = {}
        #: Emulation-only, documented in DIVERGENCES.md: the SM/QP counts of the last dispatch/combine launch.
        self.last_launch: dict[str, object] | None = None
        self.num_scaleout_ranks, self.num_scaleup_ranks = self.get_logical_domain_size()
        self.scaleout_rank_idx = self.rank_idx // self.num_scaleup_ranks
        self.scaleup_rank_idx = self.rank_idx % self.num_scaleup_ranks
        self.num_rdma_ranks, self.num_nvlink_ranks = self.get_physical_domain_size()
        self._is_scaleup_nvlink = is_nvlink
        dist.barrier(group=self.group)

    # ----------------------------------------------------------------------------------- lifecycle/info
    def __del__(self) -> None:
        _destructor(self)

    def destroy(self) -> None:
        """Release the buffer (requires ``explicitly_destroy=True``; a second call does nothing, as the real one)."""
        check(self.explicitly_destroy, "v2_destroy_not_explicit")
        self._release()

    @seam("v2_release")
    def _release(self) -> None:
        """What ``destroy()`` does once its check passed: the runtime is released (the buffer refuses every call
        after it)."""
        self.runtime = None

    def _check_alive(self) -> None:
        """Emulation helper of the non-data calls (``barrier``): a destroyed buffer refuses them."""
        if self.runtime is None:
            raise RuntimeError("deep_ep emulation: the buffer was destroyed")

    @staticmethod
    def get_buffer_size_hint(
        group: dist.ProcessGroup,
        num_max_tokens_per_rank: int,
        hidden: int,
        num_topk: int = 0,
        use_fp8_dispatch: bool = False,
        allow_hybrid_mode: bool = True,
        allow_multiple_reduction: bool = True,
    ) -> int:
        """Recommended buffer size in bytes (2 MiB aligned): the real ``calculate_buffer_size``."""
        scaleout, scaleup, is_nvlink = _domains(get_topology(group), allow_hybrid_mode)
        return _sizing.buffer_size_hint(
            num_max_tokens_per_rank, hidden, num_topk, use_fp8_dispatch, scaleout, scaleup, is_nvlink,
            allow_multiple_reduction,
        )

    def barrier(
        self, use_comm_stream: bool = True, with_cpu_sync: bool = False, sequential: bool = True
    ) -> None:
        """Barrier across the group."""
        self._check_alive()
        dist.barrier(group=self.group)

    @staticmethod
    def capture() -> EventHandle:
        """Capture an event on the current stream."""
        return EventHandle()

    def get_comm_stream(self) -> torch.Stream | None:
        """The emulation runs on the current stream; returns it on CUDA, ``None`` on CPU."""
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            return torch.cuda.current_stream()
        return None

    def get_physical_domain_size(self) -> tuple[int, int]:
        """``(num_rdma_ranks, num_nvlink_ranks)``: nodes and ranks per node."""
        return self._topo.num_nodes, self._topo.ranks_per_node

    def get_logical_domain_size(self) -> tuple[int, int]:
        """``(num_scaleout_ranks, num_scaleup_ranks)``: physical split if hybrid, else ``(1, num_ranks)``."""
        if self.allow_hybrid_mode and self._topo.num_nodes > 1:
            return self._topo.num_nodes, self._topo.ranks_per_node
        return 1, self.num_ranks

    def get_theoretical_num_sms(
        self,
        num_experts: int,
        num_topk: int,
        num_scaleout_topk: int = 0,
        rdma_gbs: float = 0,
        nvlink_gbs: float = 0,
        sm_read_gbs: float = 200,
        sm_write_gbs: float = 50,
    ) -> int:
        """The real bandwidth-model SM count (cached), with the CPU stand-ins of ``_sizing``."""
        key = (num_experts, num_topk, num_scaleout_topk, rdma_gbs, nvlink_gbs, sm_read_gbs, sm_write_gbs)
        if key not in self._sm_cache:
            self._sm_cache[key] = _sizing.theoretical_num_sms(
                num_experts,
                num_topk,
                self.num_ranks,
                self.num_scaleout_ranks,
                self.num_scaleup_ranks,
                self.num_rdma_ranks,
                self.num_nvlink_ranks,
                self.prefer_overlap_with_compute,
                num_scaleout_topk,
                rdma_gbs,
                nvlink_gbs,
                sm_read_gbs,
                sm_write_gbs,
            )
        return self._sm_cache[key]

    def get_theoretical_num_qps(self, num_sms: int) -> int:
        """Recommended QP count for ``num_sms``, capped by ``num_allocated_qps``."""
        return _sizing.theoretical_num_qps(num_sms, self.allow_hybrid_mode, self.num_allocated_qps)

    def __getattr__(self, name: str) -> object:
        if name.startswith(("engram_", "pp_", "agrs_")) or name in (
            "all_gather",
            "create_agrs_session",
            "destroy_agrs_session",
        ):
            raise NotImplementedError(f"deep_ep emulation: ElasticBuffer.{name} is not emulated")
        raise AttributeError(name)

    # ----------------------------------------------------------------------------------------- dispatch
    @async_outputs("async_with_compute_stream", 3)
    def dispatch(
        self,
        x: XType,
        topk_idx: torch.Tensor | None = None,
        topk_weights: torch.Tensor | None = None,
        cumulative_local_expert_recv_stats: torch.Tensor | None = None,
        num_experts: int | None = None,
        num_max_tokens_per_rank: int | None = None,
        expert_alignment: int | None = None,
        num_sms: int = 0,
        num_qps: int = 0,
        previous_event: EventHandle | None = None,
        previous_event_before_epilogue: EventHandle | None = None,
        async_with_compute_stream: bool = False,
        allocate_on_comm_stream: bool = False,
        handle: EPHandle | None = None,
        do_handle_copy: bool = True,
        do_cpu_sync: bool | None = None,
        do_expand: bool = False,
        do_zero_padding: bool = False,
        use_tma_aligned_col_major_sf: bool = False,
    ) -> tuple[XType, torch.Tensor | None, torch.Tensor | None, EPHandle, EventOverlap]:
        """Dispatch tokens to the ranks of their experts (see the real docstring).

        Returns ``(recv_x, recv_topk_idx, recv_topk_weights, handle, event_overlap)``.
        """
        check(not _checks.deterministic_fill_enabled(), "v2_dispatch_deterministic")
        call = self._python_dispatch(x, topk_idx, handle, num_experts, num_max_tokens_per_rank, expert_alignment,
                                     num_sms, num_qps, do_cpu_sync, do_expand)
        return self._runtime_dispatch(
            call, topk_weights, cumulative_local_expert_recv_stats, (previous_event, previous_event_before_epilogue),
            async_with_compute_stream, allocate_on_comm_stream, do_handle_copy, do_zero_padding,
            use_tma_aligned_col_major_sf, deterministic_by_hook=async_with_compute_stream)

    def _python_dispatch(self, x: XType, topk_idx: torch.Tensor | None, handle: EPHandle | None,
                         num_experts: int | None, num_max_tokens_per_rank: int | None, expert_alignment: int | None,
                         num_sms: int, num_qps: int, do_cpu_sync: bool | None, do_expand: bool) -> dict:
        """The wrapper's part of ``dispatch`` before the runtime's (deep_ep/buffers/elastic.py:924-962; 2.5.0's
        ep.py:640-677): the SM and QP counts (an explicit SM count rounded up to the version's
        ``num_sms_multiple``), the cached handle's rules and the defaults.  The call as the runtime gets it."""
        num_topk = (handle.topk_idx if topk_idx is None else topk_idx).shape[1]
        multiple = int(_sizing.rule("num_sms_multiple", 1))
        num_sms = self.get_theoretical_num_sms(num_experts, num_topk) if num_sms == 0 else _sizing.align(
            num_sms, multiple)
        num_qps = self.get_theoretical_num_qps(num_sms) if num_qps == 0 else num_qps
        check(num_qps <= self.num_allocated_qps, "v2_dispatch_qps")
        self.last_launch = {"op": "dispatch", "num_sms": num_sms, "num_qps": num_qps}

        x, sf = x if isinstance(x, tuple) else (x, None)
        cached = handle is not None
        if cached:
            check(topk_idx is None, "v2_dispatch_cached_with_topk")
            check(do_cpu_sync is None or not do_cpu_sync, "v2_dispatch_cached_cpu_sync")
            topk_idx = handle.topk_idx
            num_max_tokens_per_rank = _value_or(num_max_tokens_per_rank, handle.num_max_tokens_per_rank)
            num_experts = _value_or(num_experts, handle.num_experts)
            expert_alignment = _value_or(expert_alignment, handle.expert_alignment)
            do_cpu_sync = False
            check(
                (num_experts, expert_alignment, num_max_tokens_per_rank)
                == (handle.num_experts, handle.expert_alignment, handle.num_max_tokens_per_rank),
                "v2_dispatch_cached_param_mismatch",
            )
            do_expand = handle.do_expand
        return {"x": x, "sf": sf, "topk_idx": topk_idx, "handle": handle, "num_experts": num_experts,
                "num_max_tokens_per_rank": _value_or(num_max_tokens_per_rank, self.num_max_tokens_per_rank),
                "expert_alignment": _value_or(expert_alignment, 1), "num_sms": num_sms, "num_topk": num_topk,
                "do_cpu_sync": do_cpu_sync, "do_expand": do_expand}

    def _runtime_dispatch(
        self,
        call: dict,
        topk_weights: torch.Tensor | None,
        stats: torch.Tensor | None,
        events: tuple[EventHandle | None, ...],
        async_with_compute_stream: bool,
        allocate_on_comm_stream: bool,
        do_handle_copy: bool,
        do_zero_padding: bool,
        use_tma_aligned_col_major_sf: bool,
        deterministic_by_hook: bool,
        after_exchange: Callable[[], None] | None = None,
    ) -> tuple[XType, torch.Tensor | None, torch.Tensor | None, EPHandle, EventOverlap]:
        """``self.runtime.dispatch`` and what the wrapper does with its result (every version's): the argument
        conversion, the runtime's checks (:meth:`_check_dispatch`, the version's order), the exchange, the received
        tensors (worst-case rows and gaps uninitialised), the handle (``_HANDLE``), the event, the deterministic
        epilogue (a hook of the event when ``deterministic_by_hook``).  ``events``: the events the call waits for
        (``previous_event`` first).  ``after_exchange``: a check the runtime makes after its kernels were launched."""
        x, sf, topk_idx, handle = call["x"], call["sf"], call["topk_idx"], call["handle"]
        num_experts, num_sms, num_topk = call["num_experts"], call["num_sms"], call["num_topk"]
        num_max_tokens_per_rank, expert_alignment = call["num_max_tokens_per_rank"], call["expert_alignment"]
        do_cpu_sync, do_expand = call["do_cpu_sync"], call["do_expand"]
        previous_event = events[0]
        cached = handle is not None
        check(self.runtime is not None, "v2_dispatch_after_destroy")
        # pybind11 argument conversion of ``self.runtime.dispatch(...)``
        if num_experts is None and _refusals.enforced("v2_dispatch_num_experts_none_explicit_sms"):
            raise _pybind_type_error("dispatch", "v2_dispatch_num_experts_none_explicit_sms", self._class_name())
        if _refusals.violated(_event_arguments_ok(*events), "v2_dispatch_event_type"):
            raise _pybind_type_error("dispatch", "v2_dispatch_event_type", self._class_name())
        channels = self._check_dispatch(
            x, sf, topk_idx, topk_weights, stats, handle, num_max_tokens_per_rank,
            num_experts, num_sms, previous_event, allocate_on_comm_stream, do_expand, do_zero_padding,
        )
        for event in events:
            if event is not None:
                event.current_stream_wait()

        error = channels if isinstance(channels, BaseException) else None
        error = error or _checks.expert_range_error(topk_idx, num_experts)  # an emulation refusal (see table)
        plan = self._receive(
            x,
            sf,
            topk_idx,
            topk_weights,
            error,
            num_experts,
            num_max_tokens_per_rank,
            expert_alignment,
            do_expand,
        )
        if after_exchange is not None:
            after_exchange()
        if do_expand and not do_zero_padding:
            _unpadded_gaps(plan)
        if not cached and do_cpu_sync is not None and not do_cpu_sync:
            _worst_case(plan, self.num_ranks * num_max_tokens_per_rank, _worst_expanded(
                self.num_ranks, num_max_tokens_per_rank, topk_idx.shape[1], num_experts // self.num_ranks,
                expert_alignment), do_expand)
        elif cached:
            _worst_case(plan, handle.num_recv_tokens, handle.num_expanded_tokens, do_expand)
            plan["aligned"] = handle.num_recv_tokens_per_expert_list
        if sf is not None and use_tma_aligned_col_major_sf:  # buffer.hpp:1091-1098: stride (1, align(rows, 4))
            rows = plan["recv_sf"].shape[0]
            col_major = torch.empty_strided(tuple(plan["recv_sf"].shape), (1, -(-rows // 4) * 4 if rows else 1),
                                            dtype=plan["recv_sf"].dtype, device=plan["recv_sf"].device)
            col_major.copy_(plan["recv_sf"])
            plan["recv_sf"] = col_major
        if stats is not None:
            stats += torch.tensor(plan["raw"], dtype=stats.dtype, device=stats.device)
        if handle is None:
            forward_metadata = linked_list = None
            if self.num_scaleout_ranks > 1:  # placeholders of the real shapes (the emulation has no forwarders)
                per_channel = -(-num_max_tokens_per_rank // channels) if channels else 0
                rows = self.num_scaleout_ranks * per_channel + 1
                forward_metadata = torch.full((channels, rows, 2 + 2 * num_topk), -1, dtype=torch.int32,
                                              device=x.device)
                linked_list = torch.full((channels, rows, self.num_scaleup_ranks), -1, dtype=torch.int32,
                                         device=x.device)
            handle = self._HANDLE(
                do_expand,
                num_experts,
                expert_alignment,
                num_max_tokens_per_rank,
                num_sms,
                topk_idx.clone() if do_handle_copy else topk_idx,
                plan["num_recv_tokens"],
                plan["num_expanded_tokens"],
                plan["aligned"],
                plan["psum_scaleup"],
                plan["psum_expert"],
                plan["unaligned"],
                plan["metadata"],
                plan["dst_slots"],
                forward_metadata,
                linked_list,
            )
        event_overlap = self._EVENT_OVERLAP(EventHandle(x.device) if async_with_compute_stream else None)
        if self.deterministic:  # the real deterministic epilogue (the order is already final, see DIVERGENCES.md)
            epilogue = functools.partial(self._deterministic_epilogue, handle, cached)
            if deterministic_by_hook:
                event_overlap.register_hook_after_wait(self._under_version(epilogue))
            else:
                epilogue()
        recv_x = (plan["recv_x"], plan["recv_sf"]) if sf is not None else plan["recv_x"]
        return recv_x, plan["recv_topk_idx"], plan["recv_topk_weights"], handle, event_overlap

    def _class_name(self) -> str:
        """The class the library names in its messages (``ElasticBuffer``; a later version's own)."""
        return "ElasticBuffer"

    def _under_version(self, fn: Callable[[], Any]) -> Callable[[], Any]:
        """``fn`` raising from this class's version's table when it runs later (a hook run at an event's wait)."""
        version = self._VERSION

        def run() -> Any:
            with _refusals.version(version):
                return fn()

        return run

    @staticmethod
    def _deterministic_epilogue(handle: EPHandle, cached: bool) -> None:
        """``EPHandle.deterministic_sort``'s bookkeeping: a cached dispatch needs the metadata its non-cached
        dispatch saved (deep_ep/buffers/elastic.py:122-124)."""
        if not cached:
            handle.cached_recv_src_metadata_before_sort = handle.recv_src_metadata.clone()
        check(handle.cached_recv_src_metadata_before_sort is not None, "v2_dispatch_deterministic_sort_without_cache")

    @seam("v2_dispatch_checks")
    def _check_dispatch(
        self,
        x: torch.Tensor,
        sf: torch.Tensor | None,
        topk_idx: torch.Tensor,
        topk_weights: torch.Tensor | None,
        stats: torch.Tensor | None,
        handle: EPHandle | None,
        num_max_tokens_per_rank: int,
        num_experts: int,
        num_sms: int,
        previous_event: EventHandle | None,
        allocate_on_comm_stream: bool,
        do_expand: bool,
        do_zero_padding: bool,
    ) -> int | BaseException:
        """The refusals of ``ElasticBuffer::dispatch`` (csrc/elastic/buffer.hpp:728-979) and its launcher, in
        the library's order.

        Returns the hybrid channel count (1 in direct mode), or, when this rank has more tokens than
        ``num_max_tokens_per_rank`` (buffer.hpp:756, a rank-local fact), that refusal unraised: the caller
        raises it after the verdict-only preflight so that the peers raise ``PeerRefused`` instead of hanging.
        """
        hybrid = self.num_scaleout_ranks > 1
        cached = handle is not None
        check(num_sms > 0, "v2_dispatch_num_sms_positive")
        check(not do_zero_padding or do_expand, "v2_dispatch_zero_padding_without_expand")
        if cached and hybrid:
            check(handle.token_metadata_at_forward is not None, "v2_dispatch_cached_hybrid_field_745")
            check(handle.channel_linked_list is not None, "v2_dispatch_cached_hybrid_field_746")
        checked = dispatch_argument_checks(self, x, sf, topk_idx, topk_weights, stats, handle, num_max_tokens_per_rank,
                                           num_experts, num_sms, previous_event, allocate_on_comm_stream)
        if isinstance(checked, BaseException):
            return checked
        channels, num_topk, num_local_experts = checked
        check(num_experts <= _MAX_EXPERTS, "v2_dispatch_too_many_experts")  # WorkspaceLayout (layout.cuh:39-40)
        check(num_local_experts <= _MAX_EXPERTS_PER_RANK, "v2_dispatch_too_many_local_experts")
        check(num_sms <= _sizing.device_num_sms(), "v2_dispatch_num_sms_device")
        if cached:  # launch_dispatch (csrc/kernels/elastic/dispatch.hpp:167-168)
            check(stats is None, "v2_dispatch_cached_stats")
        check(num_topk <= 32, "v2_dispatch_topk_too_large")  # the JIT build's EP_STATIC_ASSERT(kNumTopk <= 32)
        return channels

    @seam("v2_receive")
    def _receive(
        self,
        x: torch.Tensor,
        sf: torch.Tensor | None,
        topk_idx: torch.Tensor,
        topk_weights: torch.Tensor | None,
        error: BaseException | None,
        num_experts: int,
        num_max_tokens_per_rank: int,
        expert_alignment: int,
        do_expand: bool,
    ) -> dict:
        me, world = self.rank_idx, self.num_ranks
        experts_per_rank = num_experts // world
        fields = {"x": x, "sf": sf, "topk_idx": topk_idx, "topk_weights": topk_weights}
        recv = _exchange.gather_selected(  # the call's preflight (this rank's verdict) and its rows
            self.group,
            x.device,
            x.shape[0],
            error,
            "ElasticBuffer.dispatch",
            fields,
            lambda s, f: _route.token_in_rank(f["topk_idx"], num_experts, world)[:, me],
        )
        hybrid = self.num_scaleout_ranks > 1
        group_key = recv.src_rank % self.num_scaleup_ranks if hybrid and not self.deterministic else None
        order = _route.receive_order(recv.src_rank, recv.src_token, num_max_tokens_per_rank, group_key,
                                     deterministic=self.deterministic)
        src_rank, src_token = recv.src_rank[order], recv.src_token[order]
        got = {name: (None if t is None else t[order]) for name, t in recv.fields.items()}
        global_topk = got["topk_idx"]
        local_topk = _route.to_local_topk(global_topk, me, experts_per_rank)
        raw = _route.count_per_local_expert(local_topk, experts_per_rank)
        aligned = [_route.align_up(c, expert_alignment) for c in raw]
        n = int(src_rank.numel())
        device = x.device
        scaleup_peer = src_rank % self.num_scaleup_ranks
        per_peer = (
            torch.bincount(scaleup_peer.cpu(), minlength=self.num_scaleup_ranks)
            if n
            else torch.zeros(self.num_scaleup_ranks, dtype=torch.int64)
        )
        metadata = torch.full((n, 2 + topk_idx.shape[1]), -1, dtype=torch.int32, device=device)
        metadata[:, 0] = (src_rank * num_max_tokens_per_rank + src_token).to(torch.int32)
        metadata[:, 1] = (
            src_rank * topk_idx.shape[1] + _route.last_slot_on_rank(global_topk, me, experts_per_rank)
        ).to(torch.int32)
        plan = {
            "raw": raw,
            "aligned": aligned,
            "num_recv_tokens": n,
            "num_expanded_tokens": sum(aligned),
            "psum_scaleup": torch.cumsum(per_peer, 0).to(torch.int32).to(device),
            "unaligned": torch.tensor(raw, dtype=torch.int32, device=device),
            "dst_slots": _route.dst_buffer_slots(
                topk_idx, me, world, experts_per_rank, num_max_tokens_per_rank
            ),
            "metadata": metadata,
        }
        if not do_expand:
            # columns 2.. are not written in non-expand mode (the real buffer shows stale values of earlier calls)
            metadata[:, 2:] = uninitialised((n, topk_idx.shape[1]), torch.int32, device)
            plan["psum_expert"] = (
                torch.cumsum(torch.tensor(aligned, dtype=torch.int64), 0).to(torch.int32).to(device)
            )
            plan.update(
                recv_x=got["x"],
                recv_sf=got["sf"],
                recv_topk_idx=local_topk,
                recv_topk_weights=got["topk_weights"],
            )
            return plan
        slots, raw, starts = _route.expand_layout(local_topk, experts_per_rank, expert_alignment)
        total = plan["num_expanded_tokens"]
        rows = slots[slots >= 0]
        token_of_row = torch.nonzero(slots >= 0)[:, 0]
        recv_x = torch.zeros((total,) + tuple(x.shape[1:]), dtype=x.dtype, device=device)
        recv_x[rows] = got["x"][token_of_row]
        recv_sf = None
        if sf is not None:
            recv_sf = torch.zeros((total,) + tuple(sf.shape[1:]), dtype=sf.dtype, device=device)
            recv_sf[rows] = got["sf"][token_of_row]
        recv_w = None
        if topk_weights is not None:
            recv_w = torch.zeros(total, dtype=topk_weights.dtype, device=device)
            recv_w[rows] = got["topk_weights"][slots >= 0]
        metadata[:, 2:] = slots.to(torch.int32)
        plan["psum_expert"] = torch.tensor(
            [s + c for s, c in zip(starts, raw, strict=False)], dtype=torch.int32, device=device
        )
        plan.update(recv_x=recv_x, recv_sf=recv_sf, recv_topk_idx=None, recv_topk_weights=recv_w)
        return plan

    # ------------------------------------------------------------------------------------------ combine
    @async_outputs("async_with_compute_stream", 2)
    def combine(
        self,
        x: torch.Tensor,
        handle: EPHandle,
        topk_weights: torch.Tensor | None = None,
        bias: Bias = None,
        num_sms: int = 0,
        num_qps: int = 0,
        previous_event: EventHandle | None = None,
        previous_event_before_epilogue: EventHandle | None = None,
        async_with_compute_stream: bool = False,
        allocate_on_comm_stream: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None, EventOverlap]:
        """Reduce expert outputs back to the source tokens (float32 accumulation, bias added).

        Returns ``(combined_x, combined_topk_weights, event_overlap)``.
        """
        check(not _checks.deterministic_fill_enabled(), "v2_combine_deterministic")
        num_sms, biases = self._python_combine(handle, num_sms, num_qps, bias)
        return self._runtime_combine(x, handle, topk_weights, biases, num_sms,
                                     (previous_event, previous_event_before_epilogue), async_with_compute_stream,
                                     allocate_on_comm_stream)

    def _python_combine(self, handle: EPHandle, num_sms: int, num_qps: int, bias: Bias
                        ) -> tuple[int, list[torch.Tensor]]:
        """The wrapper's part of ``combine`` (deep_ep/buffers/elastic.py:1086-1090; 2.5.0's ep.py:816-820): the SM
        count (the handle's, or an explicit one rounded up to the version's ``num_sms_multiple``), the QP check, the
        bias unpacked."""
        multiple = int(_sizing.rule("num_sms_multiple", 1))
        num_sms = handle.num_sms if num_sms == 0 else _sizing.align(num_sms, multiple)
        num_qps = self.get_theoretical_num_qps(num_sms) if num_qps == 0 else num_qps
        check(num_qps <= self.num_allocated_qps, "v2_combine_qps")
        self.last_launch = {"op": "combine", "num_sms": num_sms, "num_qps": num_qps}
        biases: list[torch.Tensor] = []
        if isinstance(bias, torch.Tensor):
            biases = [bias]
        elif isinstance(bias, tuple):
            check(len(bias) == 2, "v2_combine_bias_tuple")
            biases = [b for b in bias if b is not None]
        return num_sms, biases

    def _runtime_combine(self, x: torch.Tensor, handle: EPHandle, topk_weights: torch.Tensor | None,
                         biases: list[torch.Tensor], num_sms: int, events: tuple[EventHandle | None, ...],
                         async_with_compute_stream: bool, allocate_on_comm_stream: bool,
                         defer_epilogue: bool = False) -> tuple[torch.Tensor, torch.Tensor | None, EventOverlap]:
        """``self.runtime.combine`` (every version's): the argument conversion, the runtime's checks
        (:meth:`_check_combine`, the version's order), the reduction.  ``events``: the events it waits for
        (``previous_event`` first)."""
        previous_event = events[0]
        check(self.runtime is not None, "v2_combine_after_destroy")
        handle_fields = (handle.recv_src_metadata, handle.topk_idx, handle.psum_num_recv_tokens_per_scaleup_rank,
                         handle.token_metadata_at_forward, handle.channel_linked_list, handle.num_experts,
                         handle.num_max_tokens_per_rank, handle.do_expand)  # what the wrapper passes on
        del handle_fields
        if _refusals.violated(_event_arguments_ok(*events), "v2_combine_event_type"):
            raise _pybind_type_error("combine", "v2_combine_event_type", self._class_name())
        self._check_combine(x, handle, topk_weights, biases, num_sms, previous_event, allocate_on_comm_stream,
                            async_with_compute_stream=async_with_compute_stream, defer_epilogue=defer_epilogue)
        reduce_on_the_way = self._reduces_on_the_way()
        if handle.do_expand and not reduce_on_the_way and topk_weights is not None:
            raise _expanded_send_with_weights()
        for event in events:
            if event is not None:
                event.current_stream_wait()

        # the kernels read the valid rows only (their count on the device: the handle's last scale-up prefix sum);
        # past them a no-sync handle's metadata is uninitialised
        psum = handle.psum_num_recv_tokens_per_scaleup_rank
        meta = handle.recv_src_metadata[: int(psum[-1]) if psum.numel() else 0]
        n_max = handle.num_max_tokens_per_rank
        gidx = meta[:, 0].to(torch.int64)
        num_topk = handle.topk_idx.shape[1]
        if handle.do_expand:
            slots = meta[:, 2:].to(torch.int64)
            valid = slots >= 0
            tok, k = torch.nonzero(valid, as_tuple=True)
            rows = slots[valid]
            send_x = x[rows]
            send_g = gidx[tok]
            send_slot = k
            send_w = None
            if topk_weights is not None:
                send_w = torch.zeros((rows.numel(), num_topk), dtype=torch.float32, device=x.device)
                send_w[torch.arange(rows.numel(), device=x.device), k] = topk_weights[rows]
            if reduce_on_the_way:  # each rank first reduces its own slots of a token (see _local_reduce)
                send_x, send_g, send_w = _local_reduce(send_x, send_g, send_w)
                send_slot = torch.full((send_g.numel(),), -1, dtype=torch.int64, device=x.device)
        else:
            n = meta.shape[0]
            send_x, send_g = x[:n], gidx
            send_slot = torch.full((n,), -1, dtype=torch.int64, device=x.device)
            send_w = None if topk_weights is None else topk_weights[:n]
        parts, _ = _exchange.return_to_sources(
            self.group,
            x.device,
            torch.div(send_g, n_max, rounding_mode="floor"),
            {"x": send_x, "token": send_g % n_max, "slot": send_slot, "w": send_w},
        )
        num_tokens = handle.topk_idx.shape[0]
        contributions = [(p["token"], p["x"]) for p in parts]
        if self.num_scaleout_ranks > 1 and reduce_on_the_way:
            per_node: list[list] = [[] for _ in range(self.num_scaleout_ranks)]
            for s, c in enumerate(contributions):
                per_node[s // self.num_scaleup_ranks].append(c)
            combined_x = _route.combine_reduce_two_level(
                num_tokens, x.shape[1], per_node, biases, x.dtype, x.device
            )
        else:
            combined_x = _route.combine_reduce(
                num_tokens, x.shape[1], contributions, biases, x.dtype, x.device
            )
        combined_w = None
        if topk_weights is not None:
            combined_w = torch.zeros((num_tokens, num_topk), dtype=torch.float32, device=x.device)
            owner = _route.expert_owner(handle.topk_idx, handle.num_experts // self.num_ranks)
            for s, p in enumerate(parts):
                tok = p["token"]
                if tok.numel() == 0:
                    continue
                slot_mask = torch.where(
                    (p["slot"] >= 0).unsqueeze(1),
                    torch.arange(num_topk, device=x.device).unsqueeze(0) == p["slot"].unsqueeze(1),
                    owner[tok] == s,
                )
                combined_w[tok] = torch.where(slot_mask, p["w"], combined_w[tok])
        event_overlap = self._EVENT_OVERLAP(EventHandle(x.device) if async_with_compute_stream else None)
        return combined_x, combined_w, event_overlap

    @seam("v2_reduces_on_the_way")
    def _reduces_on_the_way(self) -> bool:
        """Whether combine's kernels reduce before the receiver's epilogue (their ``kAllowMultipleReduction``
        template flag, the buffer's ``allow_multiple_reduction``): per rank in expand mode, per node in hybrid mode.
        The host-side size checks read the attribute itself."""
        return bool(self.allow_multiple_reduction)

    def _check_combine(
        self,
        x: torch.Tensor,
        handle: EPHandle,
        topk_weights: torch.Tensor | None,
        biases: list[torch.Tensor],
        num_sms: int,
        previous_event: EventHandle | None,
        allocate_on_comm_stream: bool,
        async_with_compute_stream: bool = False,
        defer_epilogue: bool = False,
    ) -> None:
        """The refusals of ``ElasticBuffer::combine`` (csrc/elastic/buffer.hpp:1198-1280), its launcher
        (csrc/kernels/elastic/combine.hpp:140-146) and JIT build, in the library's order (``async_with_compute_stream``,
        ``defer_epilogue``: a later version's flags, which 2.1.0 does not have)."""
        check(num_sms > 0, "v2_combine_num_sms_positive")
        check(x.dim() == 2, "v2_combine_x_dim")  # get_shape<2>(x)
        num_tokens, hidden = x.shape
        check(x.is_contiguous(), "v2_combine_x_cuda_contiguous")
        check(x.dtype == torch.bfloat16, "v2_combine_x_dtype")
        check((hidden * x.element_size()) % 16 == 0, "v2_combine_hidden_bytes")
        num_combined_tokens, num_topk = handle.topk_idx.shape
        check(
            handle.psum_num_recv_tokens_per_scaleup_rank.shape[0] == self.num_scaleup_ranks, "v2_combine_handle_scaleup"
        )
        check(handle.do_expand or handle.recv_src_metadata.shape[0] == num_tokens, "v2_combine_x_rows")
        if topk_weights is not None:
            if handle.do_expand:
                check(topk_weights.dim() == 1, "v2_combine_expand_weights_dim")
                check(topk_weights.shape[0] == num_tokens, "v2_combine_expand_weights_rows")
            else:
                check(topk_weights.dim() == 2, "v2_combine_weights_dim")
                check(tuple(topk_weights.shape) == (num_tokens, num_topk), "v2_combine_weights_shape")
            check(topk_weights.is_contiguous(), "v2_combine_weights_cuda_contiguous")
            check(topk_weights.dtype == torch.float32, "v2_combine_weights_dtype")
        for b in biases:
            check(b.dim() == 2 and b.is_contiguous(), "v2_combine_bias_dim")
            check(b.dtype == x.dtype, "v2_combine_bias_dtype")
            check(tuple(b.shape) == (num_combined_tokens, hidden), "v2_combine_bias_shape")
        if previous_event is not None:  # stream_control_prologue (buffer.hpp:539-540)
            check(allocate_on_comm_stream, "v2_combine_previous_event_without_comm_alloc")
        check(
            _sizing.combine_buffer_size(
                handle.num_max_tokens_per_rank, hidden, num_topk, self.num_scaleout_ranks, self.num_scaleup_ranks,
                self._is_scaleup_nvlink, self.allow_multiple_reduction, "v2_combine_hidden_tma",
            )
            <= self.num_bytes,
            "v2_combine_buffer_size",
        )
        if self.num_scaleout_ranks > 1:
            # std::optional::value() of a direct-mode handle
            check(handle.token_metadata_at_forward is not None, "v2_combine_hybrid_handle_without_metadata")
            channels = handle.token_metadata_at_forward.shape[0]
            check(channels % num_sms == 0, "v2_combine_hybrid_channels")
            check(channels // num_sms <= 16, "v2_combine_hybrid_channels_per_sm")
            num_warps = 2 * (channels // num_sms)
            token = _sizing.combine_token_bytes(hidden, num_topk, True, "v2_combine_hidden_tma")
            check(num_warps * token <= _sizing.device_smem_bytes(), "v2_combine_hybrid_smem")
        check(hidden % 256 == 0, "v2_combine_hidden_jit")  # JIT: EP_STATIC_ASSERT(kHidden % 256 == 0, "Invalid hidden")
