"""Mutants only back-to-back rounds with a late rank can find (P28): a dispatch that gives up waiting for a peer.
Every other property starts its calls on all ranks together, so none of them waits that long for a peer (on a loaded
machine any dispatch may, and then another property catches it too: P26 did in the kill matrix)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from conformance.mutants.patching import after_library_dispatch
from conformance.mutants.registry import register

#: How long a planted dispatch waits for a late peer before it gives up.
PATIENCE_S = 0.05


@register("late-peer-gives-up", "harmful",
          f"a dispatch that waited more than {PATIENCE_S * 1000:.0f} ms for a late peer stops waiting and hands back "
          "its receive buffer unfilled (every received row's bytes zero; both APIs, normal mode)")
def late_peer_gives_up() -> Iterator[None]:
    def give_up(buffer: Any, recv_x: torch.Tensor, seconds: float) -> None:
        if seconds > PATIENCE_S and recv_x.numel():
            recv_x.zero_()

    with after_library_dispatch(give_up):
        yield
