"""Mutants that make the library die instead of returning wrong data: the suite must report a crash
(naming the rank, with every other rank's stacks), rebuild its world and go on."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import torch.distributed as dist

from conformance.mutants.patching import seam
from conformance.mutants.registry import register


@register("rank-dies-in-dispatch", "harmful",
          "the last rank's process is killed (SIGKILL) inside ElasticBuffer.dispatch when it sends tokens")
def rank_dies_in_dispatch() -> Iterator[None]:
    def dispatch(original: Any, self: Any, x: Any, *args: Any, **kwargs: Any) -> Any:
        if dist.get_rank() == dist.get_world_size() - 1 and x.shape[0] > 0 and kwargs.get("handle") is None:
            os.kill(os.getpid(), signal.SIGKILL)
        return original(self, x, *args, **kwargs)

    with seam("ElasticBuffer.dispatch", dispatch):
        yield


@register("crash-on-construction", "harmful",
          "the rank process dies by SIGSEGV whenever a Buffer or an ElasticBuffer is built (a broken library build)")
def crash_on_construction() -> Iterator[None]:
    def segfault(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
        os.kill(os.getpid(), signal.SIGSEGV)

    with seam("Buffer.__init__", segfault), seam("ElasticBuffer.__init__", segfault):
        yield
