"""The named seams of the adapters: where a planted defect may change what an adapter reports to the task (the
suite's stand-in for a bug in the returned data itself, or in an integrator's wrapper), beside the emulation's own
seams (``conformance/emulation/seams.py``).

A seam here is one method of a built-in adapter or autograd wrapper, patched as a whole (``wrapper(original, self,
*args, **kwargs)``, through ``conformance.mutants.patching.seam``).  Every seam is patched by at least one mutant, or
:data:`UNPATCHED` says why not (``tests/quality/test_mutant_seams.py``).
"""

from __future__ import annotations

from conformance.backends.autograd import FusedCombine, FusedDispatch
from conformance.backends.contract import AdapterBase
from conformance.backends.elastic import ElasticAdapter
from conformance.backends.legacy import LegacyAdapter

#: name -> (class, method, what the method returns to the task).
SEAMS: dict[str, tuple[type, str, str]] = {
    "LegacyAdapter.dispatch": (LegacyAdapter, "dispatch", "V1 dispatch's canonical view (received rows, source "
                               "ids, counts) and the raw results kept for combine"),
    "ElasticAdapter.dispatch": (ElasticAdapter, "dispatch", "V2 dispatch's canonical view and raw results"),
    "ElasticAdapter.combine": (ElasticAdapter, "combine", "V2 combine's (combined_x, combined_topk_weights)"),
    "LegacyAdapter.cached_dispatch": (LegacyAdapter, "cached_dispatch", "the rows of a V1 dispatch through an "
                                      "earlier handle"),
    "ElasticAdapter.cached_dispatch": (ElasticAdapter, "cached_dispatch", "the rows of a V2 dispatch through an "
                                       "earlier handle"),
    "FusedDispatch.backward": (FusedDispatch, "backward", "the gradients of a dispatch (a combine of the "
                               "gradients of its outputs)"),
    "FusedCombine.backward": (FusedCombine, "backward", "the gradient of a combine (a cached dispatch of it)"),
    "AdapterBase.graph_capture": (AdapterBase, "graph_capture", "a CUDA graph of a dispatch and combine: the "
                                  "outputs each replay rewrites (both APIs)"),
    "AdapterBase.build_inside_capture": (AdapterBase, "build_inside_capture", "what building a buffer inside a "
                                         "CUDA-graph capture raised (both APIs)"),
}

#: Seams no registered mutant patches, and why (none today).
UNPATCHED: dict[str, str] = {}


def resolve(name: str) -> tuple[type, str]:
    """``(class, method)`` of seam ``name``."""
    if name not in SEAMS:
        raise KeyError(f"{name!r} is not an adapter seam (conformance/backends/seams.py: SEAMS)")
    cls, method, _ = SEAMS[name]
    return cls, method
