"""DeepEP 2.5.0's buffers outside the expert-parallel contract: ``EngramBuffer`` (deep_ep/buffers/engram.py),
``PPBuffer`` (pp.py), ``BucketBuffer`` and ``BucketSession`` (bucket.py): importable, as in the library, but not
emulated (constructing one raises ``NotImplementedError``, refusal table ``[[emulation_only]]``
``emu_v25_not_emulated_buffers``)."""

from __future__ import annotations

from typing import Any

from .base import BufferBase

__all__ = ["BucketBuffer", "BucketSession", "EngramBuffer", "PPBuffer"]


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
