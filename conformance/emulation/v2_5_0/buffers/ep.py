"""``deep_ep.buffers.ep`` of DeepEP 2.5.0: ``EPBuffer`` and ``EPHandle``, emulated (deep_ep/buffers/ep.py).

``EPBuffer`` is 2.1.0's ``ElasticBuffer`` split out and renamed, with contract changes, modelled from the 2.5.0
source (``conformance/versions/2.5.0/``; DIVERGENCES.md, "DeepEP 2.5.0"):

- the constructor takes no ``num_cpu_bytes`` (Engram moved to ``EngramBuffer``), but ``lb_allocation_plan_or_num_bytes``
  (a load-balance region) and an optional ``sl_idx``;
- ``dispatch``: ``do_handle_copy`` must be ``False`` (an assert, ep.py:638; the handle keeps the caller's
  ``topk_idx`` and checks its version counter at every use, ep.py:103-111), ``previous_event_before_epilogue`` is
  gone, an explicit ``num_sms`` is rounded up to even (``align(num_sms, 2)``), ``defer_epilogue=True`` returns the
  ``EventOverlap`` only and hands ``(recv_x, recv_topk_idx, recv_topk_weights, handle)`` out at its
  ``current_stream_wait()`` (it requires ``async_with_compute_stream=True``: ep.hpp:773, after the kernels launched);
- ``combine``: the same SM rounding and ``defer_epilogue`` (checked first, ep.hpp:811);
- the runtime's checks in 2.5.0's order (csrc/buffers/ep.hpp), its SM model (margin 1.3, a multiple of 4, the
  combine's traffic weighed too), its token layout (data aligned to 64 bytes), its limits (512 experts per rank);
- the persisting defects of 2.1.0: ``recv_topk_idx`` rows past the valid count of a ``do_cpu_sync=False`` dispatch
  uninitialised, a cached dispatch with the default ``num_sms`` and no ``num_experts`` raising ``TypeError``, a buffer
  collected after its group was destroyed taking the process down.

What the versions share (the exchange, layouts, reductions, uninitialised memory) is ``ElasticBuffer``'s runtime
(``conformance.emulation.elastic``); every method here raises from 2.5.0's refusal table.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from conformance import versions

from ... import _checks, _refusals, _sizing
from ..._refusals import check
from ..._topology import get_topology
from ...elastic import Bias, ElasticBuffer, XType, _domains, dispatch_argument_checks
from ...elastic import EPHandle as _EPHandle210
from .. import comm
from ..utils.event import EventHandle, EventOverlap
from .allocator import BufferAllocator
from .base import BufferBase

VERSION = "2.5.0"

__all__ = ["EPBuffer", "EPHandle"]

#: ``EPSignals::kNumMaxExpertsPerRank`` (deep_ep/include/deep_ep/layout/ep/workspace.cuh:11; 2.1.0's limit was 256).
_MAX_EXPERTS_PER_RANK = 512
_MAX_EXPERTS = 2048
#: ``kNumMaxRanks`` and ``kNumMaxQPs`` (deep_ep/include/deep_ep/common/compiled.cuh:74, :80), the communication
#: context's limits (csrc/kernels/comm/context.cpp:94-95).
_MAX_RANKS = 1024
_MAX_QPS = 1024


def _emulating(cls: type) -> type:
    """Every method the class defines raises from DeepEP 2.5.0's refusal table (and follows its rules)."""
    for name, value in list(vars(cls).items()):
        if isinstance(value, staticmethod):
            setattr(cls, name, staticmethod(_refusals.emulating(VERSION)(value.__func__)))
        elif callable(value) and not isinstance(value, type) and name not in ("__init_subclass__",):
            setattr(cls, name, _refusals.emulating(VERSION)(value))
    return cls


class EPHandle(_EPHandle210):
    """Communication handle returned by ``EPBuffer.dispatch`` (DeepEP 2.5.0: the same fields as 2.1.0's, and
    ``topk_idx`` is the caller's tensor itself, checked at every use: ``'`topk_idx` must not be modified while the
    EP handle is in use'`` once its version counter moved, deep_ep/buffers/ep.py:103-111)."""

    @property
    def topk_idx(self) -> torch.Tensor:
        """The dispatch's ``topk_idx`` (the caller's tensor; refused once modified in place)."""
        with _refusals.version(VERSION):
            check(self._topk_idx_version is None or self._topk_idx._version == self._topk_idx_version,
                  "v2_handle_topk_idx_modified")
        return self._topk_idx

    @topk_idx.setter
    def topk_idx(self, value: torch.Tensor) -> None:
        self._topk_idx = value
        self._topk_idx_version = None if value.is_inference() else value._version


@_emulating
class EPBuffer(ElasticBuffer, BufferBase):
    """Pure-PyTorch model of DeepEP 2.5.0's ``deep_ep.EPBuffer`` (expert-parallel dispatch / combine)."""

    _VERSION = VERSION
    _HANDLE = EPHandle
    _EVENT_OVERLAP = EventOverlap
    #: ``~EPBuffer`` (csrc/buffers/ep.hpp:98-100 -> base.hpp:17-22): without ``explicitly_destroy`` the destructor
    #: still calls ``destroy()``, whose barrier (ep.hpp:106) runs on the destroyed group's communicator; the fault
    #: surfaces at the next CUDA call with a check, ``cudaFreeHost`` (ep.hpp:110), and leaves the destructor
    #: (``noexcept(false)``): the process terminates.  Modelled from the source, unrecorded.
    _COLLECTED_AFTER_GROUP = ("terminate called after throwing an instance of 'EPException'\n  what():  CUDA runtime "
                             "exception (csrc/buffers/ep.hpp:110): 700 (cudaErrorIllegalAddress, an illegal memory "
                             "access was encountered)")
    _NOT_DESTROYED = "`destroy()` is not called before DeepEP EP buffer destruction, which can leak resources."

    # Common communication functions (deep_ep/buffers/ep.py:237-240)
    barrier = comm.barrier
    get_comm_stream = comm.get_comm_stream
    get_physical_domain_size = comm.get_physical_domain_size
    get_logical_domain_size = comm.get_logical_domain_size

    def __init__(
        self,
        group: dist.ProcessGroup,
        num_bytes: int | None = None,
        num_max_tokens_per_rank: int = 0,
        hidden: int = 0,
        num_topk: int = 0,
        use_fp8_dispatch: bool = False,
        lb_allocation_plan_or_num_bytes: BufferAllocator | int = 0,
        deterministic: bool = False,
        allow_hybrid_mode: bool = True,
        allow_multiple_reduction: bool = True,
        prefer_overlap_with_compute: bool = True,
        sl_idx: int | None = None,
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
        self._topo = get_topology(group)  # the emulation's stand-in for the NCCL communicator
        scaleout, scaleup, is_nvlink = _domains(self._topo, allow_hybrid_mode)
        if num_bytes is None:  # calculate_ep_buffer_size (csrc/buffers/ep.hpp:249-283)
            num_bytes = _sizing.buffer_size_hint(
                num_max_tokens_per_rank, hidden, num_topk, use_fp8_dispatch, scaleout, scaleup, is_nvlink,
                allow_multiple_reduction,
            )
        self.num_bytes = num_bytes
        # load-balance region (deep_ep/buffers/ep.py:313-319)
        plan = lb_allocation_plan_or_num_bytes if isinstance(lb_allocation_plan_or_num_bytes, BufferAllocator) \
            else None
        num_lb_bytes = lb_allocation_plan_or_num_bytes if plan is None else plan.num_bytes
        if plan is not None:
            check(not plan.materialized, "v2_init_lb_plan_materialized")
        check(isinstance(num_lb_bytes, int) and num_lb_bytes >= 0, "v2_init_lb_bytes_type")
        self.num_lb_bytes = num_lb_bytes
        self.num_max_tokens_per_rank = num_max_tokens_per_rank
        if num_allocated_qps == 0:
            num_allocated_qps = _sizing.auto_num_allocated_qps(allow_hybrid_mode)
        self.num_allocated_qps = num_allocated_qps
        BufferBase.__init__(self, explicitly_destroy)
        # the C++ constructor (csrc/buffers/ep.hpp:51-96) and its communication context (context.cpp:94-98)
        alignment = _sizing.ELASTIC_BUFFER_ALIGNMENT
        check(num_bytes > 0 and num_bytes % alignment == 0, "v2_init_num_bytes_alignment")
        check(num_lb_bytes >= 0 and num_lb_bytes % alignment == 0, "v2_init_lb_bytes_alignment")
        check(0 < self.num_ranks <= _MAX_RANKS, "v2_init_too_many_ranks")
        check(0 < num_allocated_qps <= _MAX_QPS, "v2_init_qps_range")
        self.sl_idx = sl_idx
        if plan is not None:  # materialize(self.runtime.lb_storage): a CUDA region the emulation does not keep
            raise NotImplementedError("deep_ep emulation: EPBuffer(lb_allocation_plan_or_num_bytes=<BufferAllocator>) "
                                      "is not emulated (the load-balance region holds no memory in the emulation)")
        self.context: comm.Context | None = comm.Context(self._topo, allow_hybrid_mode)
        self.nccl_comm_handle = None
        self._start(num_cpu_timeout_secs, num_gpu_timeout_secs, explicitly_destroy, is_nvlink)

    # ----------------------------------------------------------------------------------- lifecycle/info
    def destroy(self) -> None:
        """Release the buffer (requires ``explicitly_destroy=True``; a second call does nothing, as the real one)."""
        check(self.explicitly_destroy, "v2_destroy_not_explicit")  # BufferBase.destroy (deep_ep/buffers/base.py:24)
        if self.runtime is not None:
            self._release()
        self.context = None
        self.nccl_comm_handle = None

    def __getattr__(self, name: str) -> object:
        raise AttributeError(f"'EPBuffer' object has no attribute '{name}'")

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
        """Recommended buffer size in bytes (2 MiB aligned): the real ``calculate_ep_buffer_size``."""
        scaleout, scaleup, is_nvlink = _domains(get_topology(group), allow_hybrid_mode)
        return _sizing.buffer_size_hint(
            num_max_tokens_per_rank, hidden, num_topk, use_fp8_dispatch, scaleout, scaleup, is_nvlink,
            allow_multiple_reduction,
        )

    @staticmethod
    def capture() -> EventHandle:
        """Capture an event on the current stream."""
        return EventHandle()

    def get_theoretical_num_sms(
        self,
        num_experts: int,
        num_topk: int,
        num_scaleout_topk: int = 0,
        rdma_gbs: float = 0,
        nvlink_gbs: float = 0,
        sm_read_gbs: float = 0,
        sm_write_gbs: float = 0,
    ) -> int:
        """The real bandwidth-model SM count (cached; deep_ep/buffers/ep.py:430-549): 0 bandwidths are detected (the
        CPU stand-ins of ``_sizing``), 0 per-SM HBM bandwidths the library's defaults (180 / 45 GB/s)."""
        sm_read_gbs = sm_read_gbs or _sizing.rule("sm_read_gbs", 180)
        sm_write_gbs = sm_write_gbs or _sizing.rule("sm_write_gbs", 45)
        return ElasticBuffer.get_theoretical_num_sms(self, num_experts, num_topk, num_scaleout_topk, rdma_gbs,
                                                     nvlink_gbs, sm_read_gbs, sm_write_gbs)

    def lb_get_theoretical_num_sms(self) -> int:
        """The load-balance SM count: not emulated (no load-balance region)."""
        raise NotImplementedError("deep_ep emulation: EPBuffer.lb_get_theoretical_num_sms is not emulated")

    def lb_prefetch_weights(self, redundant_expert_weights: Any, expert_weights: Any, redundancy_mapping: torch.Tensor,
                            num_sms: int = 0, previous_event: EventHandle | None = None) -> EventOverlap:
        """Not emulated (the load-balance region holds no memory in the emulation)."""
        raise NotImplementedError("deep_ep emulation: EPBuffer.lb_prefetch_weights is not emulated")

    def lb_reduce_grads(self, redundant_expert_grads: torch.Tensor, expert_grads: torch.Tensor,
                        redundancy_mapping: torch.Tensor, num_sms: int = 0,
                        previous_event: EventHandle | None = None) -> EventOverlap:
        """Not emulated (the load-balance region holds no memory in the emulation)."""
        raise NotImplementedError("deep_ep emulation: EPBuffer.lb_reduce_grads is not emulated")

    def _class_name(self) -> str:
        return "EPBuffer"

    print_memory_usage = BufferBase.print_memory_usage  # (raising from 2.5.0's table: deep_ep/buffers/base.py:18)

    # ----------------------------------------------------------------------------------------- dispatch
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
        async_with_compute_stream: bool = False,
        allocate_on_comm_stream: bool = False,
        handle: EPHandle | None = None,
        do_handle_copy: bool = False,
        do_cpu_sync: bool | None = None,
        do_expand: bool = False,
        do_zero_padding: bool = False,
        use_tma_aligned_col_major_sf: bool = False,
        defer_epilogue: bool = False,
    ) -> tuple[XType, torch.Tensor | None, torch.Tensor | None, EPHandle, EventOverlap] | EventOverlap:
        """Dispatch tokens to the ranks of their experts (see the real docstring).

        Returns ``(recv_x, recv_topk_idx, recv_topk_weights, handle, event_overlap)``; with ``defer_epilogue=True``
        the ``EventOverlap`` alone, whose ``current_stream_wait()`` returns ``(recv_x, recv_topk_idx,
        recv_topk_weights, handle)``.
        """
        check(not do_handle_copy, "v2_dispatch_handle_copy")
        check(not _checks.deterministic_fill_enabled(), "v2_dispatch_deterministic")
        call = self._python_dispatch(x, topk_idx, handle, num_experts, num_max_tokens_per_rank, expert_alignment,
                                     num_sms, num_qps, do_cpu_sync, do_expand)
        out = self._issue_dispatch(call, topk_weights, cumulative_local_expert_recv_stats, previous_event,
                                   async_with_compute_stream, allocate_on_comm_stream, do_zero_padding,
                                   use_tma_aligned_col_major_sf, defer_epilogue)
        if not defer_epilogue:
            return out
        recv_x, recv_topk_idx, recv_topk_weights, handle, event = out
        deterministic = event.hook_after_wait  # the deterministic epilogue runs in the deferred one (ep.py:751-752)
        event.hook_after_wait = None

        def epilogue() -> tuple[XType, torch.Tensor | None, torch.Tensor | None, EPHandle]:
            if deterministic is not None:
                deterministic()
            return recv_x, recv_topk_idx, recv_topk_weights, handle

        event.register_hook_after_wait(epilogue)
        return event

    def _issue_dispatch(self, call: dict, topk_weights: torch.Tensor | None, stats: torch.Tensor | None,
                        previous_event: EventHandle | None, async_with_compute_stream: bool,
                        allocate_on_comm_stream: bool, do_zero_padding: bool, use_tma_aligned_col_major_sf: bool,
                        defer_epilogue: bool) -> tuple:
        """``self.runtime.dispatch`` (the shared runtime; on CPU with ``async_with_compute_stream`` its outputs are
        completed at the event's wait, :func:`conformance.emulation.utils.event.async_outputs`)."""
        return _async_dispatch(self, call, topk_weights, stats, previous_event, async_with_compute_stream,
                               allocate_on_comm_stream, do_zero_padding, use_tma_aligned_col_major_sf, defer_epilogue)

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
        """The refusals of ``EPBuffer::dispatch`` (csrc/buffers/ep.hpp:311-547), its workspace layout
        (workspace.cuh:43-46), its launcher (csrc/kernels/ep/dispatch.hpp:57) and JIT build, in the library's order.

        Returns the hybrid channel count (1 in direct mode), or, when this rank has more tokens than
        ``num_max_tokens_per_rank`` (ep.hpp:344, a rank-local fact), that refusal unraised (raised after the
        verdict-only preflight, as in 2.1.0's emulation)."""
        hybrid = self.num_scaleout_ranks > 1
        cached = handle is not None
        check(num_sms > 0, "v2_dispatch_num_sms_positive")  # ep.hpp:312, one assert with the next row's
        check(num_sms <= _sizing.device_num_sms(), "v2_dispatch_num_sms_device")
        check(num_sms > 1 or self.num_scaleout_ranks == 1 or self.num_scaleup_ranks == 1, "v2_dispatch_hybrid_one_sm")
        check(not do_zero_padding or do_expand, "v2_dispatch_zero_padding_without_expand")
        if cached and hybrid:
            check(handle.token_metadata_at_forward is not None, "v2_dispatch_cached_hybrid_field_745")
            check(handle.channel_linked_list is not None, "v2_dispatch_cached_hybrid_field_746")
        checked = dispatch_argument_checks(self, x, sf, topk_idx, topk_weights, stats, handle, num_max_tokens_per_rank,
                                           num_experts, num_sms, previous_event, allocate_on_comm_stream)
        if isinstance(checked, BaseException):
            return checked
        channels, num_topk, num_local_experts = checked
        # EPWorkspaceLayout (workspace.cuh:45-46)
        check(num_experts <= _MAX_EXPERTS, "v2_dispatch_too_many_experts")
        check(num_local_experts <= _MAX_EXPERTS_PER_RANK, "v2_dispatch_too_many_local_experts_512")
        if cached:  # launch_dispatch (csrc/kernels/ep/dispatch.hpp:57)
            check(stats is None, "v2_dispatch_cached_stats")
        if num_topk > 32 and _refusals.enforced("v2_dispatch_topk_too_large"):
            raise _jit_error("v2_dispatch_topk_too_large", ("impls/ep/dispatch.cuh", 92, "Insufficient lanes"),
                             ("impls/ep/dispatch.cuh", 314, "Insufficient lanes for loading top-k indices"))
        return channels

    # ------------------------------------------------------------------------------------------ combine
    def combine(
        self,
        x: torch.Tensor,
        handle: EPHandle,
        topk_weights: torch.Tensor | None = None,
        bias: Bias = None,
        num_sms: int = 0,
        num_qps: int = 0,
        previous_event: EventHandle | None = None,
        async_with_compute_stream: bool = False,
        allocate_on_comm_stream: bool = False,
        defer_epilogue: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None, EventOverlap] | EventOverlap:
        """Reduce expert outputs back to the source tokens (float32 accumulation, bias added).

        Returns ``(combined_x, combined_topk_weights, event_overlap)``; with ``defer_epilogue=True`` the
        ``EventOverlap`` alone, whose ``current_stream_wait()`` returns ``(combined_x, combined_topk_weights)``.
        """
        check(not _checks.deterministic_fill_enabled(), "v2_combine_deterministic")
        num_sms, biases = self._python_combine(handle, num_sms, num_qps, bias)
        out = _async_combine(self, x, handle, topk_weights, biases, num_sms, previous_event,
                             async_with_compute_stream, allocate_on_comm_stream, defer_epilogue)
        if not defer_epilogue:
            return out
        combined_x, combined_topk_weights, event = out
        event.register_hook_after_wait(lambda: (combined_x, combined_topk_weights))
        return event

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
        """The refusals of ``EPBuffer::combine`` (csrc/buffers/ep.hpp:807-893), its launcher
        (csrc/kernels/ep/combine.hpp:50-56) and JIT build, in the library's order."""
        check(num_sms > 0, "v2_combine_num_sms_positive")  # ep.hpp:808, one assert with the next row's
        check(num_sms <= _sizing.device_num_sms(), "v2_combine_num_sms_device")
        check(num_sms > 1 or self.num_scaleout_ranks == 1 or self.num_scaleup_ranks == 1, "v2_combine_hybrid_one_sm")
        check(not defer_epilogue or async_with_compute_stream, "v2_combine_defer_without_async")
        check(x.dim() == 2, "v2_combine_x_dim")  # get_shape<2>(x)
        num_tokens, hidden = x.shape
        check(x.is_contiguous(), "v2_combine_x_cuda_contiguous")
        check(x.dtype == torch.bfloat16, "v2_combine_x_dtype")
        check((hidden * x.element_size()) % 16 == 0, "v2_combine_hidden_bytes")
        num_combined_tokens, num_topk = handle.topk_idx.shape
        check(
            handle.psum_num_recv_tokens_per_scaleup_rank.shape[0] == self.num_scaleup_ranks, "v2_combine_handle_scaleup"
        )
        check(num_combined_tokens <= handle.num_max_tokens_per_rank, "v2_combine_handle_1214")
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
        if previous_event is not None:  # stream_control_prologue (ep.hpp:141-142)
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
            # std::optional::value() of a direct-mode handle (ep.hpp:876)
            check(handle.token_metadata_at_forward is not None, "v2_combine_hybrid_handle_without_metadata")
            channels = handle.token_metadata_at_forward.shape[0]
            check(channels % num_sms == 0, "v2_combine_hybrid_channels")
            check(channels // num_sms <= 16, "v2_combine_hybrid_channels_per_sm")
            num_warps = 2 * (channels // num_sms)
            token = _sizing.combine_token_bytes(hidden, num_topk, True, "v2_combine_hidden_tma")
            check(num_warps * token <= _sizing.device_smem_bytes(), "v2_combine_hybrid_smem")
        if hidden % 256 != 0 and _refusals.enforced("v2_combine_hidden_jit"):  # EP_STATIC_ASSERT(kHidden % 256 == 0)
            raise _jit_error("v2_combine_hidden_jit", ("impls/ep/combine.cuh", 110, "Invalid hidden"))


def _jit_error(row_id: str, *assertions: tuple[str, int, str]) -> BaseException:
    """The JIT build's failure on static assertions (``(file under deep_ep/include/deep_ep/, line, text)``): deep_jit's
    ``call_external_command`` refuses NVCC's exit code (third-party/deep_jit/include/deep_jit/utils/command.hpp:35)
    with the command line and the compiler's output in the message, as recorded on the real 2.5.0
    (fixtures/deepep-real-2.5.0-2026-12-06: ``.../impls/ep/combine.cuh(110): error: static assertion failed with
    "Invalid hidden"``); the emulation writes a placeholder for the command line and NVCC's line for each failed
    assertion, not the rest of its output."""
    output = "\n".join(f"{versions.DEFAULT_VALUES['build_root']}/deep_ep/include/deep_ep/{path}({line}): "
                       f"error: static assertion failed with \"{text}\"" for path, line, text in assertions)
    return _refusals.error(row_id, exit_code=1, command="<deep_ep emulation: the NVCC command line>", output=output)


# The shared runtime with 2.1.0's CPU model of asynchronous outputs (placeholders completed at the event's wait).
def _dispatch_outputs(buffer: EPBuffer, call: dict, topk_weights: torch.Tensor | None, stats: torch.Tensor | None,
                      previous_event: EventHandle | None, async_with_compute_stream: bool,
                      allocate_on_comm_stream: bool, do_zero_padding: bool, use_tma_aligned_col_major_sf: bool,
                      defer_epilogue: bool) -> tuple:
    def after_exchange() -> None:  # ep.hpp:772-773: after the kernels were launched
        check(not defer_epilogue or async_with_compute_stream, "v2_dispatch_defer_without_async")

    return buffer._runtime_dispatch(
        call, topk_weights, stats, (previous_event,), async_with_compute_stream, allocate_on_comm_stream,
        False, do_zero_padding, use_tma_aligned_col_major_sf,
        deterministic_by_hook=async_with_compute_stream, after_exchange=after_exchange)


def _combine_outputs(buffer: EPBuffer, x: torch.Tensor, handle: EPHandle, topk_weights: torch.Tensor | None,
                     biases: list[torch.Tensor], num_sms: int, previous_event: EventHandle | None,
                     async_with_compute_stream: bool, allocate_on_comm_stream: bool, defer_epilogue: bool) -> tuple:
    return buffer._runtime_combine(x, handle, topk_weights, biases, num_sms, (previous_event,),
                                   async_with_compute_stream, allocate_on_comm_stream, defer_epilogue)


def _with_async_outputs(fn: Callable[..., tuple], num_outputs: int) -> Callable[..., tuple]:
    from ...utils.event import async_outputs

    return functools.wraps(fn)(async_outputs("async_with_compute_stream", num_outputs)(fn))


_async_dispatch = _with_async_outputs(_dispatch_outputs, 3)
_async_combine = _with_async_outputs(_combine_outputs, 2)
