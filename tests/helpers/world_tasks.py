"""Tasks the world self-tests send to ranks."""

from __future__ import annotations

import os
import signal
import time

import torch
import torch.distributed as dist

from conformance.world.rank import call_context, context, current_call

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


def die_in_labelled_call(rank: int) -> None:
    """Rank ``rank`` dies by SIGFPE in a library call made for a refusal row (as the real V1 did on 2026-12-02)."""
    if context().rank == rank:
        with call_context("refusal row v1_example_row"), current_call("real-v1|Buffer.low_latency_combine"):
            os.kill(os.getpid(), signal.SIGFPE)
    dist.barrier()


def sticky_error_in_backend() -> None:
    """Every rank's ``real-v1`` call left a sticky CUDA error (simulated on CPU: ``step`` reports it sticky), as the
    real V1's shrink-mode clean did on one H200 (run 21): the world is retired, the failure is still real-v1's."""
    from unittest import mock

    from conformance.tasks import env

    with mock.patch.object(env, "step", lambda raised, sticky=False: (list(range(context().world_size)), True)):
        env.in_step(torch.device("cpu"), "real-v1", "low_latency_dispatch",
                    RuntimeError("CUDA error: an illegal memory access was encountered"))


def print_then_raise_in_step(rank: int, say: bool = True) -> None:
    """Rank ``rank`` prints a diagnostic from C (as DeepEP's JIT does: ``printf`` to fd 1, then its assertion; not
    with ``say=False``) and its backend's call raises; every rank ends the task in step."""
    from conformance.tasks import env

    error = None
    if context().rank == rank:
        if say:
            os.write(1, b"NVCC compilation failed: kernel.cu(12): error: identifier undefined\n")
        error = RuntimeError('Assertion exception (csrc/jit/compiler.hpp:239): false and "NVCC compilation failed"')
    env.in_step(torch.device("cpu"), "real-v2", "dispatch", error)


def hang_on_rank(rank: int) -> None:
    if context().rank == rank:
        time.sleep(3600)
    dist.barrier()
