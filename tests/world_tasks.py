"""Tasks the world self-tests send to ranks."""

from __future__ import annotations

import os
import signal
import time

import torch
import torch.distributed as dist

from conformance.world.rank import context

_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")


def environment() -> dict[str, str]:
    return {k: os.environ[k] for k in _KEYS}


def all_reduce_rank() -> int:
    t = torch.tensor([context().rank])
    dist.all_reduce(t)
    return int(t)


def raise_on_rank(rank: int) -> None:
    if context().rank == rank:
        raise ValueError(f"planted failure on rank {rank}")
    dist.barrier()


def kill_rank(rank: int) -> None:
    if context().rank == rank:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()


def hang_on_rank(rank: int) -> None:
    if context().rank == rank:
        time.sleep(3600)
    dist.barrier()
