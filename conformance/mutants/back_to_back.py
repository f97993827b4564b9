"""Mutants only back-to-back rounds with a late rank can find (P28): a dispatch that gives up waiting for a peer.
Every other property starts its calls on all ranks together, so none of them waits long for a peer."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from conformance.mutants.patching import seam
from conformance.mutants.registry import register

#: How long a planted dispatch waits for a late peer before it gives up.
PATIENCE_S = 0.05


@register("late-peer-gives-up", "harmful",
          f"a dispatch that waited more than {PATIENCE_S * 1000:.0f} ms for a late peer stops waiting and hands back "
          "its receive buffer unfilled (every received row's bytes zero; both APIs, normal mode)")
def late_peer_gives_up() -> Iterator[None]:
    def dispatch(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        result = original(self, *args, **kwargs)
        if time.monotonic() - started > PATIENCE_S:
            recv_x = result[0][0] if isinstance(result[0], tuple) else result[0]
            if recv_x.numel():
                recv_x.zero_()
        return result

    with seam("Buffer.dispatch", dispatch), seam("ElasticBuffer.dispatch", dispatch):
        yield
