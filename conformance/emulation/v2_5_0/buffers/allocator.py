"""``deep_ep.buffers.allocator`` of DeepEP 2.5.0: ``BufferAllocator``, a plan of aligned tensors before their CUDA
storage exists (deep_ep/buffers/allocator.py)."""

from __future__ import annotations

from typing import Any

import torch

from ..._sizing import align

__all__ = ["BufferAllocator"]

#: ``kNumAllocationAlignmentBytes`` (deep_ep/include/deep_ep/common/compiled.cuh:69): 2 MiB.
NUM_ALLOCATION_ALIGNMENT = 2 * 1024 * 1024


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
