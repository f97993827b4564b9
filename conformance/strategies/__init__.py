"""Hypothesis strategies: the shared vocabulary of draws (controller only), and one module per area.

This module is the vocabulary every property draws from (like array-api-tests' ``hypothesis_helpers``):
the sizes and choices below, and :func:`examples`, which reaches the corners the contract cares about:
empty ranks, ranks at the pinned maximum, all tokens to one rank or one expert, every slot masked, top-k up
to the number of experts, alignments with counts around their multiples, and payloads carrying NaN bit
patterns, -0.0 and +-Inf.

The routing is drawn as data, slot by slot (:func:`with_drawn_routing`, ``Example.topk_idx``), the way the derived
one is built from ``routing`` and ``mask_ratio`` (a slot masked with probability ``mask_ratio``; the pattern's
experts: any, a few hot ones, rank 0's only, expert 0 in the first slot), so that Hypothesis shrinks the routing
itself: a slot shrinks to masked (where ``mask_ratio`` masks any) or to the lowest expert id free in its row.  Only
the first :data:`DRAWN_ROUTING_MAX_SLOTS` slots are drawn (rank by rank, token by token: every slot of a small
example); a large example's tokens past them derive their routing from its seed (drawing thousands of slots would
slow every draw).

Area modules build the richer cases on it: :mod:`~conformance.strategies.layout`
(counts aimed at alignment edges), :mod:`~conformance.strategies.combine` (combine, round trip, cached
dispatch, gradients), :mod:`~conformance.strategies.calls` (events, QP cap, bad input, API surface).

Every strategy takes the world size: a property's strategy is ``world_size -> SearchStrategy``.
"""

from __future__ import annotations

import dataclasses
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
#: The routing of this many slots (tokens x top-k, rank by rank) is drawn as data; the rest derives from the seed.
DRAWN_ROUTING_MAX_SLOTS = 128
#: ``skewed``: a slot's position among the experts in order of popularity is ``u ** SKEW_POWER`` of the way down.
SKEW_POWER = 8


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
    slots = draw(routing_values(), label="routing slots")
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
    return with_drawn_routing(example, slots)


def routing_values() -> st.SearchStrategy[bytes]:
    """The values a routing is drawn from (:func:`with_drawn_routing`): drawn first, before the example's sizes."""
    return st.binary(min_size=DRAWN_ROUTING_MAX_SLOTS + 1, max_size=DRAWN_ROUTING_MAX_SLOTS + 1)


def with_drawn_routing(example: Example, values: bytes) -> Example:
    """``example`` with the routing of its first :data:`DRAWN_ROUTING_MAX_SLOTS` slots drawn as data (``topk_idx``:
    rank by rank, whole tokens; the tokens past them derive theirs from the seed).

    Drawn as the derived routing is built: per rank, per token, per slot, a value ``u`` in [0, 1) (a byte / 256);
    the slot is masked if ``u < mask_ratio``, else it takes an expert not in its row yet, among the pattern's
    candidates: ``random`` any expert (ascending), ``skewed`` every expert in order of popularity from a drawn hot
    expert on (the same order on every rank; the position ``u ** SKEW_POWER`` of the way down), ``one_rank`` rank 0's
    experts (a slot with none left is masked), ``one_expert`` expert 0 in the first slot, then any.

    The values are one draw of :func:`routing_values` (the first byte picks the hot expert, one byte per slot after
    it), whatever the example (the ones past its slots unused; Hypothesis shrinks each byte towards 0):

    - one draw: a draw per slot would cost as much again as the rest of the example;
    - the same number of values for every example: fewer tokens or a smaller top-k never ask for more, so a large
      failing example shrinks into a small one with its routing (and a change of pattern keeps the slots aligned);
    - drawn before the example's sizes: Hypothesis often fills the end of a choice sequence with its simplest values
      (its first, size-capped draws; the mutations of its later ones), which would mask every slot of a third of
      the examples (as the derived routing does not: its simplest seed, 0, routes at random).
    """
    budget = DRAWN_ROUTING_MAX_SLOTS // example.num_topk  # tokens drawn
    num_experts, ratio = example.num_experts, example.mask_ratio
    hot = values[0] % num_experts
    popularity = [(hot + i) % num_experts for i in range(num_experts)]
    slots = iter(values[1:])
    rows = []
    for tokens in example.tokens_per_rank:
        rank_rows = []
        for _ in range(min(tokens, budget)):
            budget -= 1
            row: list[int] = []
            for j in range(example.num_topk):
                u = next(slots) / 256
                if example.routing == "one_expert" and j == 0:
                    order: list[int] = [0]
                elif example.routing == "one_rank":
                    order = list(range(example.experts_per_rank))
                else:
                    order = popularity if example.routing == "skewed" else list(range(num_experts))
                candidates = [e for e in order if e not in row]
                if u < ratio or not candidates:
                    row.append(-1)
                    continue
                position = (u - ratio) / (1 - ratio)
                if example.routing == "skewed":
                    position **= SKEW_POWER
                row.append(candidates[min(int(position * len(candidates)), len(candidates) - 1)])
            rank_rows.append(tuple(row))
        rows.append(tuple(rank_rows))
    drawn = dataclasses.replace(example, topk_idx=tuple(rows))
    drawn.validate()
    return drawn


def sized(build: Callable[[int], st.SearchStrategy[Any]]) -> Callable[[Any], st.SearchStrategy[Any]]:
    """A property's strategy (world shape -> cases) from a strategy of the world size (most need no more)."""
    return lambda world: build(world.size)
