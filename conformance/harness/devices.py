"""GPU partitioning: each xdist worker owns a disjoint slice of the parent's GPUs, one GPU per rank; with
``--rank-setup shared`` every worker's world shares the first visible GPU instead (:func:`shared_gpu_workers`).

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


#: ``-n auto`` with ``--rank-setup shared``: at most this many worlds side by side on the one GPU (the kernels of
#: worlds sharing a GPU are time-sliced: more worlds add little once the GPU is busy) ...
SHARED_MAX_WORKERS = 4
#: ... and one per this many CPU cores: a world of two ranks keeps about four processes busy (its pytest worker,
#: its node agent, the two ranks; the warm-up's compiles come on top).
CORES_PER_SHARED_WORLD = 4


def cpu_cores() -> int:
    """CPU cores this process may run on (its affinity where the platform says, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def shared_gpu_workers(cores: int | None = None) -> int:
    """How many xdist workers ``-n auto`` starts when every world shares one GPU (``--rank-setup shared``):
    ``min(SHARED_MAX_WORKERS, cores // CORES_PER_SHARED_WORLD)``, at least 1 (16 cores: 4 worlds)."""
    cores = cpu_cores() if cores is None else cores
    return max(1, min(SHARED_MAX_WORKERS, cores // CORES_PER_SHARED_WORLD))
