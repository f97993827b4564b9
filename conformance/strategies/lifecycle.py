"""P25's cases: how a run ends (the scenarios of :class:`~conformance.core.cases.ExitCase`) on one small example.

The property is about processes, not about payloads: each case starts a fresh process per backend and rank, so the
draws are few and fixed (two cases, each checked once: Hypothesis stops when it has seen them both).  The example is
the smallest every API takes (hidden 256: V2's combine compiles for multiples of 256 only).
"""

from __future__ import annotations

from hypothesis import strategies as st

from conformance.core.cases import ExitCase
from conformance.core.example import Example


def exit_example(world_size: int) -> Example:
    """A few tokens per rank, top-2 of two experts per rank, integer payloads."""
    return Example(tokens_per_rank=tuple(4 + r % 3 for r in range(world_size)), hidden=256, num_topk=2,
                   num_experts=2 * world_size, payload="integers", seed=25, num_max_tokens_per_rank=16)


def exit_cases(world_size: int) -> st.SearchStrategy[ExitCase]:
    """Each scenario on :func:`exit_example`."""
    return st.sampled_from(ExitCase.SCENARIOS).map(lambda scenario: ExitCase(exit_example(world_size), scenario))
