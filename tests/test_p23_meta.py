"""Meta-tests of P23-ll-shrink: its planted defects are caught, it holds on the emulation (also with two nodes and
with other wait-cost values), its strategy reaches its corners."""

import pytest

from conformance.strategies.low_latency import shrink_cases
from tests.meta import assert_caught, assert_holds, sample

PID = "P23-ll-shrink"


@pytest.mark.parametrize("mutant, says", [
    # a masked source's block, or its wait (the smallest failing case may have no token to send)
    ("ll-masked-rank-still-receives", ("layout_range", "recv_count", "dispatch_wait_recv_cost_stats")),
    ("ll-masked-rank-still-contributes", ("combined_x",)),
    ("ll-masked-rank-waited-for", ("unchanged (a masked rank is neither waited for nor sends",)),
    ("ll-query-wrong-mask", ("low_latency_query_mask_buffer",)),
])
def test_catches(emulated_session, mutant: str, says: tuple[str, ...]) -> None:
    case, message = assert_caught(emulated_session, PID, mutant, shrink_cases(2))
    assert case.masked, case  # every one of these defects needs a masked rank
    assert any(s in message for s in says) and "expected" in message and "[" in message, message


def test_holds_on_the_emulation(emulated_session, two_node_session) -> None:
    assert_holds(emulated_session, PID, sample(shrink_cases(2), 6))
    assert_holds(two_node_session, PID, sample(shrink_cases(4), 3))


def test_spares_other_wait_costs(emulated_session) -> None:
    assert_holds(emulated_session, PID, sample(shrink_cases(2), 4), mutant="ll-wait-costs-doubled")


def test_strategy_reaches_its_corners() -> None:
    drawn = sample(shrink_cases(4), 60)
    sizes = {len(case.masked) for case in drawn}
    assert {0, 1, 4} <= sizes and any(1 < n < 4 for n in sizes), sizes
    assert any(case.toggled is not None for case in drawn) and {case.hook for case in drawn} == {False, True}
    assert all(case.toggled not in case.masked for case in drawn)
