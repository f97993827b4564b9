"""A pure-PyTorch, API-compatible model of DeepEP 2.5.0's ``deep_ep`` (``--deep-ep emulation:2.5.0``).

Drop-in usage: ``import conformance.emulation.v2_5_0 as deep_ep`` (or ``conformance.backends.alias.use_emulation(
"2.5.0")``).  DeepEP 2.5.0 removed the legacy ``Buffer`` (V1) and split ``ElasticBuffer`` into ``EPBuffer`` (expert
parallelism, modelled here), ``EngramBuffer``, ``PPBuffer`` and ``BucketBuffer`` (importable, not emulated); there is
no ``Buffer``, ``ElasticBuffer`` or ``Config``.  Modelled from the 2.5.0 source (the ``deepinfer-ep`` 2.5.0 sdist);
``conformance/emulation/DIVERGENCES.md`` ("DeepEP 2.5.0") lists what is modelled, how, and what no recording backs
yet.
"""

import torch

from . import comm, utils
from .buffers.allocator import BufferAllocator
from .buffers.base import BufferBase
from .buffers.bucket import BucketBuffer, BucketSession
from .buffers.engram import EngramBuffer
from .buffers.ep import EPBuffer, EPHandle
from .buffers.pp import PPBuffer
from .comm import destroy_all_managed_nccl_comm, get_logical_domain_size, get_physical_domain_size
from .utils.event import EventHandle, EventOverlap

topk_idx_t = torch.int64
__version__ = "2.5.0+emulation"
IS_EMULATION = True


def __getattr__(name: str) -> object:
    """A name the module lacks raises the real module's ``AttributeError``, naming it ``deep_ep`` (the module its
    callers import): DeepEP 2.5.0 has no ``Buffer``, ``ElasticBuffer`` or ``Config``; recorded on the real 2.5.0,
    ``AttributeError: module 'deep_ep' has no attribute 'Buffer'`` (fixtures/deepep-real-2.5.0-2026-12-06, every case's
    V1 part)."""
    raise AttributeError(f"module 'deep_ep' has no attribute '{name}'")


def get_num_allocation_alignment() -> int:
    """``kNumAllocationAlignmentBytes`` (deep_ep/include/deep_ep/common/compiled.cuh:69): 2 MiB."""
    return 2 * 1024 * 1024


def get_num_rdma_alignment() -> int:
    """``kNumRDMAAlignmentBytes`` (compiled.cuh:68): 64."""
    return 64


def get_num_tma_alignment() -> int:
    """``kNumTMAAlignmentBytes`` (compiled.cuh:67): 32."""
    return 32


__all__ = [
    "BucketBuffer",
    "BucketSession",
    "BufferAllocator",
    "BufferBase",
    "EPBuffer",
    "EPHandle",
    "EngramBuffer",
    "EventHandle",
    "EventOverlap",
    "IS_EMULATION",
    "PPBuffer",
    "comm",
    "destroy_all_managed_nccl_comm",
    "get_logical_domain_size",
    "get_num_allocation_alignment",
    "get_num_rdma_alignment",
    "get_num_tma_alignment",
    "get_physical_domain_size",
    "topk_idx_t",
    "utils",
]
