"""Rank task of P26: V2 dispatches without a CPU sync, their outputs read whole, after the caching allocator was
filled with the uninitialised-memory byte (on a GPU: a freed block of 0x7F bytes the outputs are then carved from;
the emulation hands out such bytes itself: ``conformance.versions.POISON_BYTE``)."""

from __future__ import annotations

from typing import Any

import torch

from conformance.core.views import DispatchOptions
from conformance.tasks.dispatch import dispatch_view
from conformance.tasks.env import RankEnv, rank_task
from conformance.versions import POISON_BYTE

#: The worst-case variants, by name: their options, and the capabilities a backend needs besides ``worst_case``.
VARIANTS: dict[str, tuple[DispatchOptions, tuple[str, ...]]] = {
    "rows": (DispatchOptions(do_cpu_sync=False), ()),
    "expand": (DispatchOptions(do_cpu_sync=False, do_expand=True), ("expand",)),
    "expand_zero_padding": (DispatchOptions(do_cpu_sync=False, do_expand=True, do_zero_padding=True),
                            ("expand", "dispatch_options")),
}
#: Bytes of the large block filled with :data:`POISON_BYTE` and freed before each dispatch (more than any output).
FILL_BYTES = 256 << 20
#: The caching allocator serves requests of at most 1 MiB from a separate pool of 2 MiB segments: this many blocks of
#: 1 MiB are filled there too (a run on one H200 found every small output in segments the large block never reached:
#: zeros of fresh memory, or an earlier call's bytes).
SMALL_BLOCKS = 64


def fill_allocator(device: torch.device) -> None:
    """Leave the caching allocator's free memory filled with :data:`POISON_BYTE` (CUDA; nothing on CPU): its unused
    segments released, then a large block and :data:`SMALL_BLOCKS` small ones (both pools) filled and freed."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
        blocks = [torch.full((FILL_BYTES,), POISON_BYTE, dtype=torch.uint8, device=device)]
        blocks += [torch.full((1 << 20,), POISON_BYTE, dtype=torch.uint8, device=device) for _ in range(SMALL_BLOCKS)]
        del blocks


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
