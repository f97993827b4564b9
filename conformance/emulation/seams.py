"""The named seams of the emulation: the only points where a planted defect (a mutant of the suite's kill matrix)
may change it.

Each seam stands for a place where a real library bug would sit.  There are two kinds:

* **Call seams** (:data:`CALLS`): functions and methods of the emulation's internals, declared where they are
  defined with ``@seam("name")``.  The decorated name becomes a thin trampoline that calls the seam's current
  implementation, so every caller (inside its own module or not, however it imported the name) goes through it.
  :func:`replaced` swaps the implementation for ``wrapper(original, *args, **kwargs)`` while a block runs and
  restores it after.  A refactor may move or rename the function: the seam keeps its name, and a call of
  :func:`replaced` for a seam that no longer exists raises instead of planting nothing.
* **Entry points** (:data:`ENTRY_POINTS`): the library's own public names, ``"Class.method"`` of the emulated
  ``deep_ep`` classes and ``"deep_ep"`` (the names the package exports).  The real library fixes them (the API
  surface, P14, compares them), so a defect in a whole call (its arguments, its results, its signature) patches the
  attribute itself; :func:`entry_point` finds the class that defines it.

Nothing here knows the suite: the suite's mutants (``conformance/mutants``) patch through one helper that refuses any
other name, and a self-test (``tests/quality/test_mutant_seams.py``) fails when a registered mutant changes anything of
the emulation but these seams.  Every seam is patched by at least one mutant, or :data:`UNPATCHED` says why not.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

#: Call seams: name -> what the function computes (and so what a bug there breaks).  Arguments and results are the
#: decorated function's; a method's first argument is the buffer.
CALLS: dict[str, str] = {
    # routing math (``_route``), both APIs
    "align_up": "rounding a count up to a multiple (expert_alignment: V1's count list, V2's aligned counts, prefix "
                "sums and expand layout; 16 bytes: V1's internode per-token bytes)",
    "count_per_local_expert": "the raw (token, slot) receipts per local expert (V2: counts, prefix sums, expand "
                              "layout, statistics)",
    "to_local_topk": "a received token's global expert ids as this rank's local expert index, -1 elsewhere "
                     "(recv_topk_idx of both APIs)",
    "receive_order": "the order a V2 rank keeps its received tokens in (source ranks, source tokens, "
                     "num_max_tokens_per_rank, hybrid group key, deterministic: whether the caller asked for the "
                     "deterministic order)",
    "expand_layout": "V2 expand mode: the expanded row of each local slot, the raw counts and aligned starts",
    "exchange": "the token exchange of a normal-mode dispatch (both APIs): a Received of the rows this rank keeps, "
                "in (source rank, source token) order; fields V1 x, x_scales, topk_idx, topk_weights, in_rank, "
                "V2 x, sf, topk_idx, topk_weights",
    "combine_reduce": "a combine's float32 reduction, bias first, contributions in order, one rounding (V1 "
                      "intranode, V2 direct, and each level of the two-level reduction)",
    "combine_reduce_two_level": "the multi-node combine's reduction (V1 internode, V2 hybrid): each node's "
                                "contributions rounded, then the nodes' partial sums and the bias",
    # the legacy Buffer
    "v1_recv_topk_weights": "V1 dispatch's received weights from the sent ones: 0 at the slots whose expert is not "
                            "local (recv_topk_idx -1)",
    "v1_wait_previous_event": "a V1 call's wait for its previous_event before it reads its inputs (layout, "
                              "dispatch, combine, both paths)",
    "v1_dispatch_nvl_bytes": "the NVLink bytes an intranode dispatch needs (its buffer-size refusal)",
    "v1_buffer_alignment_bytes": "the alignment Buffer() requires of num_nvl_bytes and num_rdma_bytes",
    # the elastic ElasticBuffer
    "v2_receive": "a V2 dispatch's receive plan (ElasticBuffer._receive): recv_x, recv_sf, recv_topk_idx, "
                  "recv_topk_weights, raw / aligned counts, psum_expert, psum_scaleup, unaligned, metadata "
                  "(recv_src_metadata), dst_slots, num_recv_tokens, num_expanded_tokens",
    "v2_dispatch_checks": "the refusals of ElasticBuffer.dispatch in the library's order (a check too strict or too "
                          "lax; num_max_tokens_per_rank is its 7th argument after the buffer)",
    "v2_reduces_on_the_way": "whether a V2 combine's kernels reduce before the receiver (the buffer's "
                             "allow_multiple_reduction, as the kernels were compiled)",
    "v2_release": "what ElasticBuffer.destroy() does after its explicitly_destroy check: release the runtime",
    "v2_buffer_size_hint": "the V2 buffer size (get_buffer_size_hint, and ElasticBuffer() without num_bytes)",
    "v2_combine_token_bytes": "the bytes of one combine token in the V2 layouts (bf16 payload)",
    "device_num_sms": "the device's SM count (on CPU the stand-in of an H200: 132)",
    # the legacy low-latency kernels and buffer
    "ll_fp8_cast": "the low-latency dispatch's per-128-channel FP8 cast at the source (payload, scales)",
    "ll_ue8m0_bytes": "the UE8M0 byte of each float32 scale",
    "ll_combine_reduce": "the low-latency combine's weighted float32 sum over each token's slots (skip: the masked "
                         "ranks, 8th argument)",
    "ll_deliver": "when a low-latency call's receive phase runs: by the hook, by the async event, or now",
    "ll_layout_total_bytes": "the low-latency buffer layout's total bytes (size refusals and the size hint)",
    "ll_nominal_wait_cycles": "the wait cycles charged to a wait that found its data (the cost statistics)",
    "ll_masked": "a rank's mask as a low-latency call reads it (LowLatencyBuffer.masked: which ranks it skips)",
    "ll_clean_signals": "clean_low_latency_buffer's zeroing of both signalling buffers (the LowLatencyBuffer: "
                        ".bytes the RDMA buffer, .flip() the double-buffer index)",
    # events, the CPU model of streams
    "async_placeholder": "the not-yet-written stand-in of an async call's CPU output, registering its copy-out",
    "async_complete_later": "queuing an async call's copy-out and capturing the event that covers it",
    # memory
    "uninitialised": "memory the library allocates and never writes (the rows past a worst-case output's valid "
                     "ones): every byte 0x7F (shape, dtype, device -> tensor)",
    # refusals
    "refusal_enforced": "whether the refusal of a table row is enforced (always, in the library)",
}

#: Entry points: the library's public names, patched as a whole (``"Class.method"``; ``"deep_ep"``: the exports).
ENTRY_POINTS: dict[str, str] = {
    "Buffer.__init__": "building a V1 buffer (its arguments, or the process dying there)",
    "Buffer.get_dispatch_layout": "V1's layout call",
    "Buffer.dispatch": "V1 dispatch as called (its arguments, its outputs, the buffer's state between calls)",
    "Buffer.combine": "V1 combine as called",
    "Buffer.internode_combine": "V1's multi-node combine as called (Buffer.combine forwards to it on several nodes)",
    "Buffer.get_local_buffer_tensor": "the view of the raw NVLink / RDMA buffer",
    "Buffer.low_latency_dispatch": "the low-latency dispatch as called (outputs, hook, event, statistics)",
    "Buffer.low_latency_combine": "the low-latency combine as called",
    "Buffer.low_latency_query_mask_buffer": "the shrink-mode mask query",
    "ElasticBuffer.__init__": "building a V2 buffer",
    "ElasticBuffer.dispatch": "V2 dispatch as called (its arguments, its outputs, its signature)",
    "ElasticBuffer.combine": "V2 combine as called",
    "ElasticBuffer.barrier": "V2's barrier",
    "ElasticBuffer.get_theoretical_num_sms": "V2's automatic SM count",
    "ElasticBuffer.get_buffer_size_hint": "V2's size hint as called",
    "EventOverlap.__call__": "configuring release_handle for a `with` block",
    "EventOverlap.__exit__": "the wait at the end of a `with event:` block",
    "EventOverlap.current_stream_wait": "waiting on an event (and its hook)",
    "deep_ep": "the names the package exports (a class renamed or removed)",
}

#: Seams no registered mutant patches, and why.
UNPATCHED: dict[str, str] = {
    "device_num_sms": "read, not patched: overlap-off-uses-every-sm takes this many SMs; a different SM count is a "
                      "different device, not a library bug",
}

_original: dict[str, Callable[..., Any]] = {}
_current: dict[str, Callable[..., Any]] = {}


def seam(name: str) -> Callable[[F], F]:
    """Declare the decorated function (or method) as call seam ``name`` of :data:`CALLS`: its callers go through
    the seam's current implementation, which is the function itself unless :func:`replaced` is active."""
    if name not in CALLS:
        raise KeyError(f"{name!r} is not a declared call seam (conformance/emulation/seams.py: CALLS)")

    def declare(function: F) -> F:
        if name in _original:
            raise ValueError(f"call seam {name!r} declared twice")
        _original[name] = _current[name] = function

        @functools.wraps(function)
        def through(*args: Any, **kwargs: Any) -> Any:
            return _current[name](*args, **kwargs)

        return through  # type: ignore[return-value]

    return declare


def declared() -> set[str]:
    """The call seams defined so far (every one of :data:`CALLS` once the emulation is imported)."""
    return set(_original)


def original(name: str) -> Callable[..., Any]:
    """Call seam ``name``'s own implementation."""
    return _original[_known(name)]


def current(name: str) -> Callable[..., Any]:
    """What call seam ``name`` runs now."""
    return _current[_known(name)]


def _known(name: str) -> str:
    if name not in _original:
        raise KeyError(f"no call seam {name!r}; the call seams: {sorted(_original)}")
    return name


@contextlib.contextmanager
def replaced(name: str, wrapper: Callable[..., Any]) -> Iterator[None]:
    """While active, call seam ``name`` runs ``wrapper(original, *args, **kwargs)`` (``original``: what it ran
    before); restored on exit, also when the block raises."""
    previous = _current[_known(name)]

    def patched(*args: Any, **kwargs: Any) -> Any:
        return wrapper(previous, *args, **kwargs)

    _current[name] = patched
    try:
        yield
    finally:
        _current[name] = previous


def entry_point(package: ModuleType, name: str) -> tuple[Any, str]:
    """``(owner, attribute)`` of entry point ``name`` in ``package`` (the emulated ``deep_ep``): the class of the
    method's MRO that defines it (``Buffer.low_latency_dispatch``: its mixin), or the package itself for
    ``"deep_ep"`` (attribute ``""``)."""
    if name not in ENTRY_POINTS:
        raise KeyError(f"{name!r} is not an entry point (conformance/emulation/seams.py: ENTRY_POINTS)")
    if name == "deep_ep":
        return package, ""
    class_name, _, attribute = name.partition(".")
    cls = getattr(package, class_name)
    owner = next((k for k in cls.__mro__ if attribute in vars(k)), None)
    if owner is None:
        raise KeyError(f"entry point {name!r}: {class_name} has no {attribute!r}")
    return owner, attribute
