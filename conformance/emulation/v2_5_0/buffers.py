"""DeepEP 2.5.0's buffer classes besides ``EPBuffer``: ``BufferBase`` (their common lifecycle,
deep_ep/buffers/base.py), ``BufferAllocator`` (an allocation plan of aligned tensors, deep_ep/buffers/allocator.py),
and the buffers outside the expert-parallel contract, ``EngramBuffer``, ``PPBuffer``, ``BucketBuffer`` and
``BucketSession``: importable, as in the library, but not emulated (constructing one raises ``NotImplementedError``,
refusal table ``[[emulation_only]]`` ``emu_not_emulated_buffers``)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch

from .. import _refusals
from .._sizing import align

__all__ = ["BucketBuffer", "BucketSession", "BufferAllocator", "BufferBase", "EngramBuffer", "PPBuffer"]

#: ``kNumAllocationAlignmentBytes`` (deep_ep/include/deep_ep/common/compiled.cuh:69): 2 MiB.
NUM_ALLOCATION_ALIGNMENT = 2 * 1024 * 1024


class BufferBase(ABC):
    """Common lifecycle for communication buffers (deep_ep/buffers/base.py)."""

    def __init__(self, explicitly_destroy: bool = False) -> None:
        self.explicitly_destroy = explicitly_destroy
        self.runtime: Any = None

    @property
    def main_context(self) -> Any:
        """The first communication context, or ``None`` after destruction."""
        return getattr(self, "context", None) if self.runtime is not None else None

    def print_memory_usage(self) -> None:
        """Print this rank's workspace, communication buffer and RDMA storage sizes (the emulation's buffers hold no
        device memory: the sizes are the buffer's ``num_bytes``, no workspace, no storage)."""
        _refusals.check(self.runtime is not None, "v2_print_memory_usage_destroyed")
        num_bytes = getattr(self, "num_bytes", 0) + getattr(self, "num_lb_bytes", 0)
        group = getattr(self, "group", None)
        rank, size = (group.rank(), group.size()) if group is not None else (0, 1)
        print(f"[DeepEP memory usage] rank_idx={rank}, num_ranks={size}, GPU total {num_bytes / 2**30:.3f} GiB "
              f"(workspace 0.000 GiB, buffer {num_bytes / 2**30:.3f} GiB, RDMA storage 0.000 GiB), CPU total 0.000 GiB",
              flush=True)

    @abstractmethod
    def destroy(self) -> None:
        """Destroy the runtime.  Requires ``explicitly_destroy=True`` at construction."""
        _refusals.check(self.explicitly_destroy, "v2_destroy_not_explicit")
        if self.runtime is not None:
            self.runtime = None


class BufferAllocator:
    """Plan contiguous, aligned tensors before allocating their CUDA storage (deep_ep/buffers/allocator.py)."""

    def __init__(self) -> None:
        self.alignment = NUM_ALLOCATION_ALIGNMENT
        self.allocations: list[tuple[torch.Tensor, int]] = []
        self.num_bytes = 0
        self.materialized = False

    def allocate(self, shape: Any, dtype: torch.dtype) -> torch.Tensor:
        """Append an aligned tensor allocation and return its meta placeholder."""
        assert not self.materialized, "A materialized allocation plan cannot be changed"
        tensor = torch.empty(shape, dtype=dtype, device="meta")
        offset = align(self.num_bytes, self.alignment)
        self.allocations.append((tensor, offset))
        self.num_bytes = align(offset + tensor.nbytes, self.alignment)
        return tensor

    def materialize(self, storage: torch.Tensor) -> None:
        """Give every planned tensor its bytes of ``storage`` (a CUDA uint8 tensor of the plan's size)."""
        assert not self.materialized, "An allocation plan can only be materialized once"
        assert storage.is_cuda and storage.is_contiguous() and storage.dtype == torch.uint8
        assert storage.numel() == self.num_bytes
        for tensor, offset in self.allocations:
            value = storage.narrow(0, offset, tensor.nbytes).view(tensor.dtype).view(tensor.shape)
            torch.utils.swap_tensors(tensor, value)
        self.materialized = True


def _not_emulated(name: str) -> NotImplementedError:
    return NotImplementedError(f"deep_ep emulation: {name} is not emulated (DeepEP 2.5.0's {name} is outside the "
                               f"expert-parallel contract the suite checks)")


class EngramBuffer(BufferBase):
    """DeepEP 2.5.0's Engram buffer (remote KV fetch over RDMA): not emulated."""

    def __init__(self, group: Any, num_gpu_bytes: int, num_rdma_storage_bytes: int, use_cpu_rdma_storage: bool,
                 num_allocated_qps: int, qp_depth: int, restrict_rd_atomic: bool = False,
                 allow_hybrid_mode: bool = True, sl_idx: int | None = None, num_gpu_timeout_secs: int = 100,
                 explicitly_destroy: bool = False) -> None:
        raise _not_emulated("EngramBuffer")

    def destroy(self) -> None:  # pragma: no cover - never constructed
        super().destroy()


class PPBuffer(BufferBase):
    """DeepEP 2.5.0's pipeline-parallel send/recv buffer: not emulated."""

    def __init__(self, group: Any, num_max_tensor_bytes: int, num_max_inflight_tensors: int,
                 sl_idx: int | None = None, num_gpu_timeout_secs: int = 100, explicitly_destroy: bool = False) -> None:
        raise _not_emulated("PPBuffer")

    def destroy(self) -> None:  # pragma: no cover - never constructed
        super().destroy()


class BucketBuffer(BufferBase):
    """DeepEP 2.5.0's bucketed all-gather / reduce-scatter / all-reduce buffer: not emulated."""

    def __init__(self, group: Any, allocation_plan_or_num_bytes: Any, sl_idx: int | None = None,
                 num_gpu_timeout_secs: int = 100, explicitly_destroy: bool = False) -> None:
        raise _not_emulated("BucketBuffer")

    def destroy(self) -> None:  # pragma: no cover - never constructed
        super().destroy()


class BucketSession:
    """A session of a ``BucketBuffer``: not emulated."""

    def __init__(self, buffer: Any) -> None:
        raise _not_emulated("BucketSession")
