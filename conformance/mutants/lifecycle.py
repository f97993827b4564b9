"""Mutants of the end of a run (P25-clean-exit): a buffer that is not released when its user says so, and so is
collected after the process group is gone."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from conformance.emulation.elastic import collect_at_exit
from conformance.mutants.patching import seam
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
