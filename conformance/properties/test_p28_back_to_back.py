"""P28 back to back: rounds of dispatch then combine issued one after the other on the same buffer, with no barrier
between them, a rank arriving late and ranks sending nothing, give every round the oracle's rows and sums.

Training loops issue dispatch, combine, dispatch... with ranks arriving at different times and token counts that
change every step, an empty rank (0 tokens) next to a full one.  Per backend (both APIs' normal mode, one buffer for
all rounds), two or three rounds on one shape: each round draws its own token counts (a rank is empty as often as
not) and payloads; in each round one rank (or none) sleeps 20 or 100 ms before its dispatch while the others are
already waiting in theirs; the experts are the identity (the received rows are combined unchanged) and the combined
rows are read only after the last round, so each round's outputs must outlive the calls after it.

Asserted per round, on every rank: the dispatch holds exactly the oracle's receipts for that round's inputs (P1's
and P2's comparison: sources, local experts, bytes, weights), and the combine is P6's round trip of that round
(byte-exact for integer payloads; on several nodes the backend's reduction tree), the backends agreeing with each
other.  A failure names the round, the late rank and its delay.  Nothing hangs (the example timeout).
"""

from __future__ import annotations

from typing import Any

from conformance.assertions import assert_view_matches_oracle
from conformance.checks.round_trip import check as round_trip_check
from conformance.core.cases import BackToBackCase
from conformance.core.outcomes import NotChecked
from conformance.properties import CheckContext, Property, register
from conformance.strategies import sized
from conformance.strategies.back_to_back import back_to_back_cases
from conformance.tasks.back_to_back import back_to_back_rounds


def check(ctx: CheckContext, case: BackToBackCase, per_rank: list[dict[str, Any]]) -> None:
    """Every round's dispatch against the oracle, then its combine as P6's round trip."""
    __tracebackhide__ = True
    for results in per_rank:
        for result in results.values():
            if isinstance(result, NotChecked):
                ctx.not_checked(result, case)
    for i, example in enumerate(case.rounds()):
        late = case.late[i]
        when = (f"round {i + 1} of {case.num_rounds} (tokens_per_rank {list(example.tokens_per_rank)}, "
                + (f"rank {late} {case.delay_ms} ms late" if late >= 0 and case.delay_ms else "no rank late") + ")")
        rounds = [{b: r[i] for b, r in ranks.items() if not isinstance(r, NotChecked)} for ranks in per_rank]
        try:
            for rank, results in enumerate(rounds):
                for backend, got in results.items():
                    ctx.checking((backend,))
                    assert_view_matches_oracle(ctx, example, rank, got.dispatch,
                                               after="the rounds before it" if i else "")
            round_trip_check(ctx, example, [{b: got.combined for b, got in results.items()} for results in rounds])
        except AssertionError as exc:
            raise AssertionError(f"{when}: {exc}") from None


PROPERTY = register(Property(
    id="P28-back-to-back",
    title="dispatch and combine issued back to back without a barrier, a rank late and ranks empty, give every "
          "round the oracle's rows and sums",
    strategy=sized(back_to_back_cases), task=back_to_back_rounds, check=check, case_type=BackToBackCase,
    needs=("combine",),
))
test_back_to_back = PROPERTY.test
