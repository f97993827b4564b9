"""Draws of P28-back-to-back: two or three rounds on one shape (the shared draws' first example; the later rounds
draw new token counts, new payloads from a new seed, the drawn routing refitted), each with a rank that arrives
late or none, and a delay.

The corners: a rank with no tokens next to full ones (each rank's count of a later round is 0 as often as not, so
a rank is empty in one round and full in the next, and every rank can be empty at once), the late rank being an
empty one, the same rank late in every round or a different one each time.  Delays shrink towards the longest
(Hypothesis shrinks a ``sampled_from`` to its first choice), so a failure that needs a late rank keeps its delay.
"""

from __future__ import annotations

from hypothesis import strategies as st

from conformance.core.cases import BackToBackCase
from conformance.strategies import examples

#: Rounds after the first (the first is the shared draws' example).
MAX_LATER_ROUNDS = 2


@st.composite
def back_to_back_cases(draw: st.DrawFn, world_size: int) -> BackToBackCase:
    """Cases of P28-back-to-back on a world of ``world_size`` ranks."""
    example = draw(examples(world_size), label="first round")
    num_max = example.num_max_tokens_per_rank
    count = st.one_of(st.just(0), st.integers(0, num_max))
    later = draw(st.lists(st.lists(count, min_size=world_size, max_size=world_size).map(tuple),
                          min_size=1, max_size=MAX_LATER_ROUNDS).map(tuple), label="later rounds' tokens_per_rank")
    late = draw(st.lists(st.integers(-1, world_size - 1), min_size=len(later) + 1, max_size=len(later) + 1)
                .map(tuple), label="late rank per round (-1: none)")
    delay = draw(st.sampled_from(BackToBackCase.DELAYS_MS), label="delay_ms")
    case = BackToBackCase(example=example, later_tokens=later, late=late, delay_ms=delay)
    case.validate()
    return case
