"""``deep_ep.comm`` of DeepEP 2.5.0 (deep_ep/comm/): the communication helpers ``EPBuffer`` binds as methods
(``barrier``, ``get_comm_stream``, ``get_physical_domain_size``, ``get_logical_domain_size``), over the emulation's
stand-in for the NCCL context (:class:`Context`: the group's topology)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from .._topology import Topology, get_topology

__all__ = ["Context", "barrier", "destroy_all_managed_nccl_comm", "get_comm_stream", "get_logical_domain_size",
           "get_nccl_comm_handle", "get_physical_domain_size"]


class Context:
    """The emulation's stand-in for ``deep_ep._C``'s communication context (``EPBuffer.context``): the domains the
    NCCL context would report for the group."""

    def __init__(self, topology: Topology, allow_hybrid_mode: bool) -> None:
        self.topology = topology
        self.allow_hybrid_mode = allow_hybrid_mode

    def get_physical_domain_size(self) -> tuple[int, int]:
        """``(num_rdma_ranks, num_nvl_ranks)``: nodes and ranks per node."""
        return self.topology.num_nodes, self.topology.ranks_per_node

    def get_logical_domain_size(self) -> tuple[int, int]:
        """``(num_scaleout_ranks, num_scaleup_ranks)``: the physical split in hybrid mode on several nodes, else
        ``(1, num_ranks)``."""
        return _logical(self.topology, self.allow_hybrid_mode)


def _logical(topology: Topology, allow_hybrid_mode: bool) -> tuple[int, int]:
    if allow_hybrid_mode and topology.num_nodes > 1:
        return topology.num_nodes, topology.ranks_per_node
    return 1, topology.num_ranks


def barrier(buffer: Any, wait_comm_stream: bool = True, with_cpu_sync: bool = False, sequential: bool = True,
            context_idx: int | None = None) -> None:
    """A barrier across the buffer's group (deep_ep/comm/barrier.py: on the buffer's context)."""
    context = buffer.context if context_idx is None else buffer.contexts[context_idx]
    if context is None:
        raise RuntimeError("deep_ep emulation: the buffer was destroyed")
    dist.barrier(group=buffer.group)


def get_comm_stream(buffer: Any) -> torch.Stream | None:
    """The emulation runs on the current stream: returns it on CUDA, ``None`` on CPU."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.current_stream()
    return None


def get_physical_domain_size(group_or_buffer: Any) -> tuple[int, int]:
    """Physical RDMA and NVLink domain sizes of a process group or buffer (deep_ep/comm/handle.py:81-86)."""
    context = getattr(group_or_buffer, "context", None)
    if context is not None:
        return context.get_physical_domain_size()
    topology = get_topology(group_or_buffer)
    return topology.num_nodes, topology.ranks_per_node


def get_logical_domain_size(group_or_buffer: Any, allow_hybrid_mode: bool | None = None) -> tuple[int, int]:
    """Logical scale-out and scale-up domain sizes of a process group or buffer (deep_ep/comm/handle.py:89-96)."""
    context = getattr(group_or_buffer, "context", None)
    if context is not None:
        return context.get_logical_domain_size()
    return _logical(get_topology(group_or_buffer), True if allow_hybrid_mode is None else allow_hybrid_mode)


def destroy_all_managed_nccl_comm() -> None:
    """Destroy the NCCL communicators DeepEP created (the emulation creates none: nothing to do)."""


def get_nccl_comm_handle(group: Any, force_new_comm: bool = False) -> Any:
    """Not emulated: the emulation has no NCCL communicator (its exchange is a ``torch.distributed`` collective)."""
    raise NotImplementedError("deep_ep emulation: deep_ep.comm.get_nccl_comm_handle is not emulated (the emulation "
                              "uses no NCCL communicator)")
