"""Mutants of CUDA-graph capture (P29).  The emulation captures no graphs (P29 is unsupported on it), so both
mutants first give the emulated backends the emulation's stand-in for a graph (``backends.graphs.EagerGraph``: a
replay reruns the captured calls on the static inputs and rewrites the captured outputs; a buffer "built inside a
capture" is built, there being no capture on a CPU).  ``graph-stand-in`` is only that, and must be spared: P29's
check holds on a faithful replay.  ``graph-replay-frozen`` plants the defect: a replay that leaves the captured
outputs as the capture's run wrote them (a library whose captured kernels read routing or sizes fixed on the host
at capture time returns the capture-time receipts for every replay)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from conformance.backends.graphs import EagerGraph
from conformance.mutants.patching import seam
from conformance.mutants.registry import register


class _FrozenGraph(EagerGraph):
    def replay(self) -> None:
        """Nothing: the outputs stay those of the capture."""


def _stand_in(graph: type[EagerGraph]) -> Iterator[None]:
    def capture(original: Any, self: Any, step: Any, static: list[torch.Tensor]) -> Any:
        if self.spec.real:
            return original(self, step, static)
        return graph(step, static)

    def build_inside(original: Any, self: Any, build: Any, device: torch.device) -> BaseException | None:
        if self.spec.real:
            return original(self, build, device)
        try:
            build()
        except Exception as exc:  # noqa: BLE001 - what the stand-in reports, as the real path does
            return exc
        return None

    with seam("AdapterBase.graph_capture", capture), seam("AdapterBase.build_inside_capture", build_inside):
        yield


@register("graph-stand-in", "benign",
          "the emulated backends capture CUDA graphs with the emulation's stand-in (a replay reruns the captured "
          "calls and rewrites the captured outputs), as a faithful graph replays them")
def graph_stand_in() -> Iterator[None]:
    yield from _stand_in(EagerGraph)


@register("graph-replay-frozen", "harmful",
          "the emulated backends capture CUDA graphs whose replay leaves the captured outputs as the capture's run "
          "wrote them (every replay returns the capture-time inputs' rows and sums)")
def graph_replay_frozen() -> Iterator[None]:
    yield from _stand_in(_FrozenGraph)
