"""Draws of the FP8 and low-latency properties: examples the V1 low-latency kernels accept (hidden in their
``SWITCH_HIDDEN`` set, ``num_ranks * num_max_dispatch_tokens_per_rank`` a multiple of 4, finite payloads for the
FP8 cast), and FP8 payload examples for normal mode (any hidden the normal kernels take)."""

from __future__ import annotations

from hypothesis import strategies as st

from conformance.strategies import examples

#: Hidden sizes of the low-latency kernels, smallest first (CPU cost grows with them).
LL_HIDDEN = (2048, 4096, 7168)
#: ``num_max_dispatch_tokens_per_rank`` drawn: multiples of 4 (the TMA rule), small for CPU runs.
LL_MAX_TOKENS = (4, 8, 16)


def ll_examples(world_size: int) -> st.SearchStrategy:
    """Examples for low-latency calls (``num_max_tokens_per_rank`` is the dispatch's token maximum)."""
    return examples(world_size, hidden_sizes=LL_HIDDEN, payloads=("random", "integers"), max_tokens=LL_MAX_TOKENS)


def fp8_examples(world_size: int) -> st.SearchStrategy:
    """Examples for normal-mode FP8 dispatch (the payload bytes come from ``core.example.fp8_payload``)."""
    return examples(world_size, hidden_sizes=(128, 256, 512, 1024, 2048), payloads=("random",))
