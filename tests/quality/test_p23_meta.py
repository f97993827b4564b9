"""Meta-tests of P23-ll-shrink: its planted defects are caught, it holds on the emulation (also with two nodes and
with other wait-cost values), its strategy reaches its corners."""

import pytest

from conformance.strategies.low_latency import shrink_cases
from tests.helpers.meta import assert_caught, assert_holds, sample

PID = "P23-ll-shrink"


@pytest.mark.parametrize("mutant, says", [
    # a masked source's block, or its wait (the smallest failing case may have no token to send)
    ("ll-masked-rank-still-receives", ("layout_range", "recv_count", "dispatch_wait_recv_cost_stats")),
    ("ll-masked-rank-still-contributes", ("combined_x",)),
    ("ll-masked-rank-waited-for", ("unchanged (a masked rank is neither waited for nor sends",)),
    ("ll-query-wrong-mask", ("low_latency_query_mask_buffer",)),
])
def test_catches(emulated_session, mutant: str, says: tuple[str, ...]) -> None:
    case, message = assert_caught(emulated_session, PID, mutant, shrink_cases(2), shrink=False)
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


def test_unequal_masks_time_the_silent_rank_out(emulated_session) -> None:
    """Not drawn by P23 (the real wait lasts about 100 s): rank 0 masks rank 1, rank 1 masks nobody.  Rank 1's
    waits for rank 0 time out (charged LEGACY_NUM_TIMEOUT_CYCLES + 1 each) and mask it; rank 0 does not wait."""
    from conformance.emulation._ll_buffer import TIMEOUT_CYCLES

    (masks0, cost0, count0), (masks1, cost1, count1) = emulated_session.world.run(
        "tests.quality.test_p23_meta:_unequal_masks", timeout=60)
    assert masks0 == [0, 1] and masks1 == [1, 0], (masks0, masks1)  # rank 1 masked rank 0 on the timeout
    assert cost1[0] == 2 * (TIMEOUT_CYCLES + 1) and cost0[1] == 0, (cost0, cost1)  # two local experts waited
    assert count0 == [1, 1] and count1 == [1, 1], (count0, count1)  # each received only its own tokens


def _unequal_masks() -> tuple[list[int], list[int], list[int]]:
    """Rank task: a shrink-mode buffer, rank 0 masks rank 1, then one bf16 low-latency dispatch on every rank."""
    import torch

    from conformance.emulation.legacy import Buffer
    from conformance.world.rank import context

    ctx = context()
    t, hidden, num_experts = 4, 2048, 4
    buffer = Buffer(ctx.group, 0, Buffer.get_low_latency_rdma_size_hint(t, hidden, 2, num_experts),
                    low_latency_mode=True, num_qps_per_rank=2, explicitly_destroy=True, enable_shrink=True)
    if ctx.rank == 0:
        buffer.low_latency_update_mask_buffer(1, True)
    x = torch.ones((2, hidden), dtype=torch.bfloat16)
    topk_idx = torch.tensor([[0, 2], [1, 3]], dtype=torch.int64)
    cost = torch.zeros(2, dtype=torch.int64)
    _, count, _, _, _ = buffer.low_latency_dispatch(x, topk_idx, t, num_experts, use_fp8=False,
                                                    dispatch_wait_recv_cost_stats=cost)
    status = torch.zeros(2, dtype=torch.int32)
    buffer.low_latency_query_mask_buffer(status)
    buffer.destroy()
    return status.tolist(), cost.tolist(), count.tolist()
