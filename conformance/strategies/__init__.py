"""Hypothesis strategies: the shared vocabulary of draws (controller only), and one module per area.

This module is the vocabulary every property draws from (like array-api-tests' ``hypothesis_helpers``):
the sizes and choices below, and :func:`examples`, which reaches the corners the contract cares about:
empty ranks, ranks at the pinned maximum, all tokens to one rank or one expert, every slot masked, top-k up
to the number of experts, alignments with counts around their multiples, and payloads carrying NaN bit
patterns, -0.0 and +-Inf.  Area modules build the richer cases on it: :mod:`~conformance.strategies.layout`
(counts aimed at alignment edges), :mod:`~conformance.strategies.combine` (combine, round trip, cached
dispatch, gradients), :mod:`~conformance.strategies.calls` (events, QP cap, bad input, API surface).

Every strategy takes the world size: a property's strategy is ``world_size -> SearchStrategy``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

from conformance.core.example import PAYLOADS, ROUTINGS, Example

#: Hidden sizes the real kernels support; small first so that shrinking heads there.
HIDDEN_SIZES = (128, 256, 512, 1024, 2048, 4096, 7168)
#: Pinned V2 maxima drawn (tokens per rank never exceed the example's).
MAX_TOKENS_PER_RANK = (16, 64, 128, 256)
ALIGNMENTS = (1, 2, 16, 128)
MASK_RATIOS = (0.0, 0.1, 0.5, 1.0)
MAX_TOPK = 8
MAX_EXPERTS_PER_RANK = 8


@st.composite
def examples(
    draw: st.DrawFn,
    world_size: int,
    hidden_sizes: tuple[int, ...] = HIDDEN_SIZES,
    payloads: tuple[str, ...] = PAYLOADS,
    max_tokens: tuple[int, ...] = MAX_TOKENS_PER_RANK,
    routings: tuple[str, ...] = ROUTINGS,
    mask_ratios: tuple[float, ...] = MASK_RATIOS,
    min_topk: int = 1,
) -> Example:
    """Examples for a world of ``world_size`` ranks (``routings``, ``mask_ratios`` and ``min_topk``, at most the
    number of experts, narrow the draws: a property that needs tokens reaching many ranks asks for it)."""
    num_max = draw(st.sampled_from(max_tokens), label="num_max_tokens_per_rank")
    tokens = draw(
        st.lists(st.integers(0, num_max), min_size=world_size, max_size=world_size),
        label="tokens_per_rank",
    )
    experts_per_rank = draw(st.integers(1, MAX_EXPERTS_PER_RANK), label="experts_per_rank")
    num_experts = experts_per_rank * world_size
    example = Example(
        tokens_per_rank=tuple(tokens),
        hidden=draw(st.sampled_from(hidden_sizes), label="hidden"),
        num_topk=draw(st.integers(min(min_topk, num_experts), min(MAX_TOPK, num_experts)), label="num_topk"),
        num_experts=num_experts,
        expert_alignment=draw(st.sampled_from(ALIGNMENTS), label="expert_alignment"),
        routing=draw(st.sampled_from(routings), label="routing"),
        mask_ratio=draw(st.sampled_from(mask_ratios), label="mask_ratio"),
        payload=draw(st.sampled_from(payloads), label="payload"),
        seed=draw(st.integers(0, 2**32 - 1), label="seed"),
        num_max_tokens_per_rank=num_max,
    )
    example.validate()
    return example


def sized(build: Callable[[int], st.SearchStrategy[Any]]) -> Callable[[Any], st.SearchStrategy[Any]]:
    """A property's strategy (world shape -> cases) from a strategy of the world size (most need no more)."""
    return lambda world: build(world.size)
