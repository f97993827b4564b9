"""``deep_ep.buffers.base`` of DeepEP 2.5.0: ``BufferBase``, the buffers' common lifecycle (deep_ep/buffers/base.py)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from ... import _refusals

__all__ = ["BufferBase"]


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
