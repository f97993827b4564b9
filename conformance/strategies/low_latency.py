"""Draws of the FP8 and low-latency properties: examples the V1 low-latency kernels accept (hidden in their
``SWITCH_HIDDEN`` set, ``num_ranks * num_max_dispatch_tokens_per_rank`` a multiple of 4, finite payloads for the
FP8 cast), shrink-mode cases (which ranks failed), buffer-cleaning cases, and FP8 payload examples for normal mode
(any hidden the normal kernels take)."""

from __future__ import annotations

from hypothesis import strategies as st

from conformance.core.cases import CleanCase, ShrinkCase
from conformance.strategies import examples

#: Hidden sizes of the low-latency kernels, smallest first (CPU cost grows with them).
LL_HIDDEN = (2048, 4096, 7168)
#: ``num_max_dispatch_tokens_per_rank`` drawn: multiples of 4 (the TMA rule), small for CPU runs.
LL_MAX_TOKENS = (4, 8, 16)


def ll_examples(world_size: int) -> st.SearchStrategy:
    """Examples for low-latency calls (``num_max_tokens_per_rank`` is the dispatch's token maximum)."""
    return examples(world_size, hidden_sizes=LL_HIDDEN, payloads=("random", "integers"), max_tokens=LL_MAX_TOKENS)


@st.composite
def shrink_cases(draw: st.DrawFn, world_size: int) -> ShrinkCase:
    """Shrink-mode cases: any set of failed ranks (one or more first, then none; all included), an extra rank
    masked and unmasked again by the others, receive hooks or not."""
    example = draw(examples(world_size, hidden_sizes=LL_HIDDEN[:1], payloads=("integers", "random"),
                            max_tokens=LL_MAX_TOKENS), label="example")
    ranks = st.integers(0, world_size - 1)
    masked = draw(st.sets(ranks, min_size=1, max_size=world_size) | st.just(frozenset()), label="masked")
    others = [r for r in range(world_size) if r not in masked]
    toggled = draw(st.none() | st.sampled_from(others), label="toggled") if others else None
    return ShrinkCase(example, masked=tuple(sorted(masked)), toggled=toggled, hook=draw(st.booleans(), label="hook"))


@st.composite
def clean_cases(draw: st.DrawFn, world_size: int) -> CleanCase:
    """Buffer-cleaning cases: an example, the seed of the garbage bytes, a receive hook or not."""
    example = draw(examples(world_size, hidden_sizes=LL_HIDDEN[:1], payloads=("integers", "random"),
                            max_tokens=LL_MAX_TOKENS), label="example")  # the layout's offsets move with experts
    return CleanCase(example, dirt_seed=draw(st.integers(0, 2**16), label="dirt_seed"),
                     hook=draw(st.booleans(), label="hook"))


def fp8_examples(world_size: int) -> st.SearchStrategy:
    """Examples for normal-mode FP8 dispatch (the payload bytes come from ``core.example.fp8_payload``)."""
    return examples(world_size, hidden_sizes=(128, 256, 512, 1024, 2048), payloads=("random",))
