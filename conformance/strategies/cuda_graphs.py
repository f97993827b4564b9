"""Draws of P29-cuda-graphs: a shared example (the graph's shapes) with one to three input sets of those shapes and
one to four replays naming them in any order.

The corners: a replay on the capture's own inputs after one on other inputs (a replay must not keep the previous
set's results), the same set replayed twice, and, through the shared draws, empty ranks and routing that leaves a
rank nothing.  Replays shrink towards ``(1, 0)`` (another set, then the captured one) and the sets towards two.
"""

from __future__ import annotations

from hypothesis import strategies as st

from conformance.core.cases import GraphCase
from conformance.strategies import examples


@st.composite
def graph_cases(draw: st.DrawFn, world_size: int) -> GraphCase:
    """Cases of P29-cuda-graphs on a world of ``world_size`` ranks."""
    example = draw(examples(world_size), label="the graph's shapes (input set 0)")
    num_sets = draw(st.integers(2, GraphCase.MAX_SETS) | st.just(1), label="input sets")
    replays = draw(st.lists(st.integers(0, num_sets - 1), min_size=1, max_size=4).map(tuple), label="replays")
    if num_sets > 1 and replays == (0,) * len(replays):
        replays = (1, *replays)  # at least one replay on new inputs where there are any
    case = GraphCase(example=example, num_sets=num_sets, replays=replays)
    case.validate()
    return case
