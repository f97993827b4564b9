"""GPU partitioning: each xdist worker owns a disjoint slice of the parent's GPUs, one GPU per rank.

Nothing here creates a CUDA context (the pytest processes never initialise CUDA).
"""

from __future__ import annotations

import os

from conformance.core.probe import cuda_device_count


def visible_gpus() -> list[str]:
    """The GPU ids this process may hand out, from ``CUDA_VISIBLE_DEVICES`` or the device count."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [g.strip() for g in listed.split(",") if g.strip() and g.strip() != "-1"]
    return [str(i) for i in range(cuda_device_count())]


def gpu_slice(gpus: list[str], index: int, world_size: int) -> tuple[str, ...]:
    """The GPUs of worker ``index`` when each worker needs ``world_size`` of them (may be short)."""
    return tuple(gpus[index * world_size : (index + 1) * world_size])


def max_gpu_workers(world_size: int) -> int:
    """How many workers the visible GPUs can serve without oversubscription (at least 1)."""
    return max(1, len(visible_gpus()) // world_size)
