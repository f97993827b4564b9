"""Meta-tests of P6 (round trip): lost contributions and unzeroed unreached tokens are caught, the oracle is
right by hand, the property holds on the emulation (one and two nodes), and the strategy reaches the corners."""

import torch

from conformance.core.example import Example, RankInputs, build_all_inputs
from conformance.oracle.reduction import expected_round_trip_bf16, reach_counts
from conformance.strategies.combine import round_trip_examples
from tests.helpers.meta import assert_caught, assert_holds, assert_reaches, sample

P6 = "P6-round-trip"


def test_round_trip_oracle_by_hand() -> None:
    example = Example(tokens_per_rank=(3, 0), hidden=2, num_topk=2, num_experts=4)
    nan = float("nan")
    inputs = [
        RankInputs(x=torch.tensor([[1.5, -0.0], [-3.0, nan], [7.0, -0.0]], dtype=torch.bfloat16),
                   topk_idx=torch.tensor([[0, 2], [1, -1], [-1, -1]]), topk_weights=torch.ones(3, 2)),
        RankInputs(x=torch.zeros(0, 2, dtype=torch.bfloat16), topk_idx=torch.zeros(0, 2, dtype=torch.int64),
                   topk_weights=torch.zeros(0, 2)),
    ]
    got = expected_round_trip_bf16(example, inputs, 0)
    assert reach_counts(example, inputs, 0) == [2, 1, 0]
    assert got[0].tolist() == [3.0, 0.0] and got[1, 0].item() == -3.0 and torch.isnan(got[1, 1])
    # a token that reached no rank is +0.0 bit for bit, even where x was -0.0
    assert got[2].view(torch.int16).tolist() == [0, 0]


def test_p6_catches_unzeroed_unreached_tokens(emulated_session) -> None:
    example, message = assert_caught(emulated_session, P6, "combine-unreached-token-garbage", round_trip_examples(2),
                                     shrink=False)
    assert "reached no rank and must come back as +0.0" in message


def test_p6_catches_a_lost_contributor(emulated_session) -> None:
    _, message = assert_caught(emulated_session, P6, "combine-drops-contributor", round_trip_examples(2), shrink=False)
    assert "combined_x[rank" in message


def test_p6_holds_on_the_emulation_including_two_nodes(emulated_session, two_node_session) -> None:
    assert_holds(emulated_session, P6, sample(round_trip_examples(2), 12))
    assert_holds(two_node_session, P6, sample(round_trip_examples(4), 6))


def _counts(example: Example) -> list[int]:
    inputs = build_all_inputs(example)
    return [c for r in range(example.world_size) for c in reach_counts(example, inputs, r)]


def test_p6_strategy_reaches_the_corners() -> None:
    strategy = round_trip_examples(2)
    assert_reaches(strategy, lambda e: 0 in _counts(e))  # a token reached no rank
    assert_reaches(strategy, lambda e: e.world_size in _counts(e))  # a token reached every rank
    assert_reaches(strategy, lambda e: e.payload == "special" and 2 in _counts(e))
    for payload in ("integers", "random"):
        assert_reaches(strategy, lambda e, p=payload: e.payload == p)
    assert_reaches(strategy, lambda e: e.hidden == 128)  # V2 combine limit


def test_reductions_may_flush_subnormals_but_not_change_normal_values() -> None:
    """Seen on CUDA: a bf16 subnormal summed in float32 came back as 0 (flush-to-zero); that is allowed."""
    import torch

    from conformance.assertions import same_value

    bits = torch.tensor([0x0001, 0x8001 - 0x10000, 0x0080, 0x3F80], dtype=torch.int16)  # 2 subnormals, min normal, 1.0
    expected = bits.view(torch.bfloat16)
    flushed = torch.zeros(4, dtype=torch.bfloat16)
    assert same_value(flushed, expected).tolist() == [True, True, False, False]
    assert same_value(expected, expected).all()


def test_p6_on_several_nodes_checks_the_tree_byte_for_byte_where_the_bound_would_accept_one_rounding() -> None:
    """Two nodes of three ranks; a token of 129 reaches ranks 0-2 (node 0) and 3-4 (node 1).  The tree: node 0's
    partial 387 rounds to 388 (a tie, to even), node 1's 258 is a bf16 value, 388 + 258 = 646 rounds to 648 (a tie,
    to even); one rounding of 645 gives 644, which the float32-accumulation bound of two levels also accepts."""
    from conformance.assertions import Mismatch, assert_reduction, assert_within_bound
    from conformance.oracle.reduction import expected_round_trip_sum

    example = Example(tokens_per_rank=(1, 0, 0, 0, 0, 0), hidden=1, num_topk=5, num_experts=6)
    inputs = [RankInputs(x=torch.tensor([[129.0]], dtype=torch.bfloat16), topk_idx=torch.tensor([[0, 1, 2, 3, 4]]),
                         topk_weights=torch.ones(1, 5))]
    inputs += [RankInputs(torch.zeros(0, 1, dtype=torch.bfloat16), torch.zeros(0, 5, dtype=torch.int64),
                          torch.zeros(0, 5)) for _ in range(5)]
    expected = expected_round_trip_sum(example, inputs, 0, ranks_per_node=3)
    tree, once = torch.tensor([[648.0]], dtype=torch.bfloat16), torch.tensor([[644.0]], dtype=torch.bfloat16)
    assert_reduction(tree, expected, ranks_per_group=3, world_size=6, two_level=True, name="x", rank=0, call="c")
    assert_within_bound(once, expected, two_level=True, name="x", rank=0, call="c")
    try:
        assert_reduction(once, expected, ranks_per_group=3, world_size=6, two_level=True, name="x", rank=0,
                         call="c")
    except Mismatch as failure:
        assert "reduction tree" in str(failure) and "648.0" in str(failure), failure
    else:
        raise AssertionError("one rounding passed where the tree rounds per node")
