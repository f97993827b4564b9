"""Rank task of P26: V2 dispatches without a CPU sync, their outputs read whole, after the caching allocator was
filled with the uninitialised-memory byte (on a GPU: a freed block of 0x7F bytes the outputs are then carved from;
the emulation hands out such bytes itself, ``conformance.emulation._uninit``)."""

from __future__ import annotations

from typing import Any

import torch

from conformance.core.views import DispatchOptions
from conformance.emulation._uninit import POISON_BYTE
from conformance.tasks.dispatch import dispatch_view
from conformance.tasks.env import RankEnv, rank_task

#: The worst-case variants, by name: their options, and the capabilities a backend needs besides ``worst_case``.
VARIANTS: dict[str, tuple[DispatchOptions, tuple[str, ...]]] = {
    "rows": (DispatchOptions(do_cpu_sync=False), ()),
    "expand": (DispatchOptions(do_cpu_sync=False, do_expand=True), ("expand",)),
    "expand_zero_padding": (DispatchOptions(do_cpu_sync=False, do_expand=True, do_zero_padding=True),
                            ("expand", "dispatch_options")),
}
#: Bytes of the block filled with :data:`POISON_BYTE` and freed before each dispatch (more than any output here).
FILL_BYTES = 256 << 20


def fill_allocator(device: torch.device) -> None:
    """Leave a freed block of :data:`POISON_BYTE` in the caching allocator (CUDA); nothing on CPU."""
    if device.type == "cuda":
        block = torch.full((FILL_BYTES,), POISON_BYTE, dtype=torch.uint8, device=device)
        del block


@rank_task
def worst_case_views(env: RankEnv) -> dict[str, Any]:
    """Per V2 backend with ``worst_case``: ``{variant: DispatchView}`` of each :data:`VARIANTS` entry it has the
    capabilities for (whole outputs, CPU copies)."""

    def run(adapter: Any) -> dict[str, Any]:
        out = {}
        for name, (options, needs) in VARIANTS.items():
            if all(adapter.spec.has(need) for need in needs):
                fill_allocator(env.device)
                out[name] = dispatch_view(env, adapter, options)
        return out

    return env.each_backend("dispatch", run, api="v2", capability="worst_case")
