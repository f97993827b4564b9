"""Mutants of the end of a run (P25-clean-exit): a buffer that is not released when its user says so, and so is
collected after the process group is gone."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from conformance.emulation.elastic import collect_at_exit
from conformance.mutants.patching import after_library_dispatch, seam
from conformance.mutants.registry import register

#: The buffers the planted leak keeps (as a library-global registry would).
_leaked: list[Any] = []


@register("v2-destroy-leaves-the-runtime", "harmful",
          "ElasticBuffer.destroy() neither releases the runtime nor lets the buffer go (a library-global registry "
          "keeps it): the destructor releases it at exit, after destroy_process_group(), and the process dies (the "
          "library's exit-time crash, for a user who did destroy)")
def v2_destroy_leaves_the_runtime() -> Iterator[None]:
    def release(original: Any, self: Any) -> None:  # after destroy()'s explicitly_destroy check
        self.explicitly_destroy = False  # the destructor will run destroy() itself, on whatever group is left
        collect_at_exit(self)
        _leaked.append(self)

    with seam("v2_release", release):
        yield


@register("fresh-group-dispatch-corrupt", "harmful",
          "a buffer built on a process group other than the one the world started with (a dist.new_group made just "
          "before it, as integrators do) dispatches one wrong byte (row 0 on the last rank; both APIs)")
def fresh_group_dispatch_corrupt() -> Iterator[None]:
    import torch

    from conformance.world.rank import context

    def corrupt(buffer: Any, recv_x: torch.Tensor, seconds: float) -> None:
        world = context()
        if buffer.group is not world.group and world.rank == world.world_size - 1 and recv_x.shape[0] > 0:
            recv_x.view(-1).view(torch.uint8)[0] ^= 0x01

    with after_library_dispatch(corrupt):
        yield
