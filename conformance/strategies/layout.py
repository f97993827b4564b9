"""Strategies for the layout properties (P2 counts, P3, P4, P8 expand layout, P13 determinism).

:func:`alignment_examples` aims per-expert counts at the edges of an alignment: it routes every token to
global expert 0 (``one_expert`` routing, no masking), so that expert's count on rank 0 is the total number
of tokens, and picks that total one below, at, or one above a multiple of 1, 16 or 128.  It is mixed with
the general :func:`conformance.strategies.examples`, which reach the other corners (masks, skew, empty ranks).
Hidden sizes stay small: these properties are about counts and rows, not about the hidden dimension.
"""

from __future__ import annotations

from hypothesis import strategies as st

from conformance.core.example import Example
from conformance.strategies import MAX_TOKENS_PER_RANK, examples, routing_values, with_drawn_routing

#: Small hidden sizes (dispatch only; V2 dispatch accepts 128, only its combine does not).
LAYOUT_HIDDEN_SIZES = (128, 256)
#: The alignments whose edges :func:`aimed_alignment_examples` aims at.
AIMED_ALIGNMENTS = (1, 16, 128)


@st.composite
def aimed_alignment_examples(draw: st.DrawFn, world_size: int) -> Example:
    """Examples whose expert 0 (on rank 0) receives ``m * alignment - 1``, ``m * alignment`` or
    ``m * alignment + 1`` tokens, for alignment 1, 16 or 128."""
    slots = draw(routing_values(), label="routing slots")
    alignment = draw(st.sampled_from(AIMED_ALIGNMENTS), label="expert_alignment")
    capacity = max(MAX_TOKENS_PER_RANK) * world_size
    max_multiple = max(1, min(3, (capacity - 1) // alignment))
    multiple = draw(st.integers(1, max_multiple), label="multiple")
    offset = draw(st.sampled_from((-1, 1, 0)), label="offset from the multiple")
    total = multiple * alignment + offset
    base, extra = divmod(total, world_size)
    tokens = tuple(base + (1 if r < extra else 0) for r in range(world_size))
    num_max = min(m for m in MAX_TOKENS_PER_RANK if m >= max(tokens))
    experts_per_rank = draw(st.integers(1, 4), label="experts_per_rank")
    num_experts = experts_per_rank * world_size
    example = Example(
        tokens_per_rank=tokens,
        hidden=draw(st.sampled_from(LAYOUT_HIDDEN_SIZES), label="hidden"),
        num_topk=draw(st.integers(1, min(4, num_experts)), label="num_topk"),
        num_experts=num_experts,
        expert_alignment=alignment,
        routing="one_expert",
        mask_ratio=0.0,
        payload="random",
        seed=draw(st.integers(0, 2**32 - 1), label="seed"),
        num_max_tokens_per_rank=num_max,
    )
    example.validate()
    return with_drawn_routing(example, slots)


def layout_examples(world_size: int) -> st.SearchStrategy[Example]:
    """General examples with small hidden sizes (every routing, mask ratio, alignment, empty ranks)."""
    return examples(world_size, hidden_sizes=LAYOUT_HIDDEN_SIZES, payloads=("random", "special"))


def alignment_examples(world_size: int) -> st.SearchStrategy[Example]:
    """General examples mixed with counts aimed at the edges of alignments 1, 16 and 128."""
    return st.one_of(layout_examples(world_size), aimed_alignment_examples(world_size))
