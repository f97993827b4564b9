"""Meta-tests of P5 (combine): planted reduction and weight defects are caught, the oracle and the numeric bound
are right by hand, the property holds on the emulation (one and two nodes), V2's hidden=128 limit is reported
unsupported while V1 is still checked, and the strategy reaches the corners."""

import itertools

import torch

from conformance.assertions import assert_within_bound
from conformance.core.cases import CombineCase
from conformance.core.example import Example, RankInputs
from conformance.harness.session import Recorder
from conformance.oracle.bounds import reduction_bound
from conformance.oracle.reduction import ExpectedSum, expected_combined_weights, expected_scaled_combine, scaled_weight
from conformance.strategies.combine import combine_cases
from tests.helpers.meta import (
    assert_caught,
    assert_holds,
    assert_reaches,
    examples_to_catch,
    fails,
    sample,
)

P5 = "P5-combine"


def _hand_inputs() -> tuple[Example, list[RankInputs]]:
    # 2 ranks, 4 experts (rank 0 owns 0-1, rank 1 owns 2-3), top-2.
    example = Example(tokens_per_rank=(2, 1), hidden=2, num_topk=2, num_experts=4, payload="integers")
    r0 = RankInputs(
        x=torch.tensor([[1.0, -2.0], [3.0, 4.0]], dtype=torch.bfloat16),
        topk_idx=torch.tensor([[3, 0], [-1, 1]]),
        topk_weights=torch.tensor([[0.5, 0.25], [0.75, 1.0]]),
    )
    r1 = RankInputs(x=torch.tensor([[5.0, 6.0]], dtype=torch.bfloat16), topk_idx=torch.tensor([[-1, -1]]),
                    topk_weights=torch.tensor([[0.125, 0.375]]))
    return example, [r0, r1]


def test_oracle_by_hand() -> None:
    example, inputs = _hand_inputs()
    bias = [torch.tensor([[1.0, 1.0], [0.0, -1.0]], dtype=torch.bfloat16)]
    got = expected_scaled_combine(example, inputs, 0, bias, ranks_per_node=2)
    # token 0 reached ranks 0 (x1) and 1 (x2): 3 * x + bias; token 1 reached rank 0 only: x + bias.
    assert got.rounded().float().tolist() == [[4.0, -5.0], [3.0, 3.0]]
    assert got.num_terms.tolist() == [3, 2] and got.num_groups.tolist() == [1, 1]
    assert expected_scaled_combine(example, inputs, 1, [], 2).rounded().float().tolist() == [[0.0, 0.0]]
    own = inputs[0].topk_weights
    weights = expected_combined_weights(example, inputs, 0, lambda d, t, k: scaled_weight(own[t, k], d))
    # slot (0,0): expert 3 on rank 1 -> 0.5 * 2; slot (0,1): expert 0 on rank 0 -> 0.25; masked slot -> 0.
    assert weights.tolist() == [[1.0, 0.25], [0.0, 1.0]]


def test_bound_by_hand_accepts_the_rounding_and_rejects_one_ulp_more() -> None:
    # 1 + 2**-9: bf16 rounds it to 1.0 (error 2**-9 <= ulp(1)/2 = 2**-8); 1 + 2**-7 is one ulp too far.
    exact = torch.tensor([[1.0 + 2.0**-9]], dtype=torch.float64)
    expected = ExpectedSum(exact, exact.abs(), torch.tensor([2]), torch.tensor([1]))
    rounded = torch.tensor([[1.0]], dtype=torch.bfloat16)
    assert_within_bound(rounded, expected, two_level=False, name="x", rank=0, call="c")
    bound = float(reduction_bound(torch.tensor([[1.0]], dtype=torch.bfloat16), expected, False))
    assert 2.0**-8 <= bound < 2.0**-8 + 1e-6
    try:
        assert_within_bound(torch.tensor([[1.0 + 2.0**-7]], dtype=torch.bfloat16), expected, two_level=False,
                            name="x", rank=0, call="c")
    except AssertionError as failure:
        assert "x[rank 0, token 0, col 0]" in str(failure) and "bound" in str(failure)
    else:
        raise AssertionError("a result one ulp beyond the rounding passed the bound")


def test_p5_catches_a_lost_contributor(emulated_session) -> None:
    case, message = assert_caught(emulated_session, P5, "combine-drops-contributor", combine_cases(2), shrink=False)
    assert "combined_x[rank" in message and "combine(" in message


def test_p5_catches_a_contributor_counted_twice(emulated_session) -> None:
    _, message = assert_caught(emulated_session, P5, "combine-counts-contributor-twice", combine_cases(2), shrink=False)
    assert "combined_x[rank" in message


def test_p5_catches_bias_added_twice(emulated_session) -> None:
    case, message = assert_caught(emulated_session, P5, "combine-bias-twice", combine_cases(2), shrink=False)
    assert case.num_bias > 0 and "combined_x[rank" in message


def test_p5_catches_wrong_combined_weights(emulated_session) -> None:
    case, message = assert_caught(emulated_session, P5, "combined-weights-master-lane", combine_cases(2),
                                  shrink=False)
    assert "combined_topk_weights[rank" in message and "ElasticBuffer.combine(" in message
    assert case.example.num_topk >= 2


def test_p5_catches_explicit_v1_configs_ignored(emulated_session) -> None:
    case, message = assert_caught(emulated_session, P5, "v1-explicit-config-ignored", combine_cases(2), shrink=False)
    assert case.v1_num_sms not in (0, 20)
    assert "channels of the dispatch handle = 10" in message and "Buffer.dispatch(" in message


def test_p5_v1_config_comes_from_the_library_table_and_restores_the_sm_count(emulated_session) -> None:
    """The explicit configs are the library's own table entries built with the case's SM count, and the class's
    SM count (the default configs') is back at 20 afterwards."""
    import dataclasses

    from conformance.tasks.combine import combine_outputs

    case = dataclasses.replace(sample(combine_cases(2), 1)[0], v1_num_sms=8)
    results = emulated_session.run(combine_outputs, case)
    assert all(r["emulated-v1"].num_channels == 4 for r in results)
    again = emulated_session.run(combine_outputs, dataclasses.replace(case, v1_num_sms=0))
    assert all(r["emulated-v1"].num_channels == 10 for r in again)


def test_p5_holds_on_the_emulation_including_two_nodes(emulated_session, two_node_session) -> None:
    assert_holds(emulated_session, P5, sample(combine_cases(2), 12))
    assert_holds(two_node_session, P5, sample(combine_cases(4), 6))


def test_p5_reports_v2_hidden_128_unsupported_and_still_checks_v1(emulated_session) -> None:
    example = Example(tokens_per_rank=(6, 5), hidden=128, num_topk=2, num_experts=4, payload="integers", seed=7,
                      num_max_tokens_per_rank=16)
    case = CombineCase(example, num_bias=1, mode="exact")
    emulated_session.recorder = Recorder()  # (the session is shared: what other tests recorded is theirs)
    assert fails(emulated_session, P5, case, None) is None
    entry = emulated_session.recorder.unsupported["emulated-v2"]
    assert emulated_session.recorder.why == {"emulated-v2": ["limit"]}, emulated_session.recorder.why
    rejected = emulated_session.recorder.rejected["emulated-v2"]
    assert example.to_json() in rejected and entry["count"] == len(rejected)  # distinct examples, not ranks
    assert "combine" in entry["call"]
    assert "emulated-v1" not in emulated_session.recorder.unsupported
    message = fails(emulated_session, P5, case, "combine-drops-contributor")
    assert message is not None and "Buffer.combine(" in message and "ElasticBuffer" not in message


def test_p5_strategy_reaches_the_corners() -> None:
    strategy = combine_cases(2)

    def reaches(example: Example, n: int) -> bool:
        from conformance.core.example import build_all_inputs
        from conformance.oracle.reduction import reach_counts

        inputs = build_all_inputs(example)
        return any(c == n for r in range(example.world_size) for c in reach_counts(example, inputs, r))

    for num_bias in (0, 1, 2):
        assert_reaches(strategy, lambda c, n=num_bias: c.num_bias == n)
    assert_reaches(strategy, lambda c: c.mode == "exact")
    assert_reaches(strategy, lambda c: c.v1_num_sms == 0)  # the default configs
    assert_reaches(strategy, lambda c: c.v1_num_sms not in (0, 20))  # a table entry, other SMs
    assert_reaches(strategy, lambda c: c.mode == "bounded")
    assert_reaches(strategy, lambda c: c.example.hidden == 128)
    assert_reaches(strategy, lambda c: c.example.hidden != 128)
    assert_reaches(strategy, lambda c: 0 in c.example.tokens_per_rank)
    assert_reaches(strategy, lambda c: reaches(c.example, 2))  # summed over two ranks
    assert_reaches(strategy, lambda c: reaches(c.example, 0))  # bias only / +0.0
    # the spread draws do not hide the narrow corners: top-1, routing to one rank, every slot masked
    assert_reaches(strategy, lambda c: c.example.num_topk == 1)
    assert_reaches(strategy, lambda c: c.example.routing == "one_rank")
    assert_reaches(strategy, lambda c: c.example.mask_ratio == 1.0)
    assert_reaches(strategy, lambda c: c.mode == "exact" and c.num_bias == 2 and reaches(c.example, 2))
    assert_reaches(combine_cases(4), lambda c: reaches(c.example, 4))  # every rank of two nodes


# ------------------------------------------------------------------------------------------ the reduction tree


def _bf16(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.bfloat16)


def test_the_tree_by_hand_two_levels_round_differently_from_one() -> None:
    from conformance.oracle.tree import predict_token

    # Ranks 0 and 1 form node 0, rank 2 node 1; every float32 sum below is exact.
    contributions = [(0, _bf16(1.0, 255.0)), (1, _bf16(2.0**-8, 1.5)), (2, _bf16(2.0**-8, 1.5))]
    one, exact_one = predict_token(contributions, [], 4, 4, 2)
    two, exact_two = predict_token(contributions, [], 2, 4, 2)
    assert exact_one.all() and exact_two.all()
    # column 0: one level 1 + 2**-7 (a bf16 value: exact); two levels bf16(1 + 2**-8) = 1 (tie to even), + 2**-8.
    assert one.tolist()[0] == 1.0 + 2.0**-7 and two.tolist()[0] == 1.0
    assert one.tolist()[1] == 258.0 and two.tolist()[1] == 258.0


def test_the_tree_predicts_nothing_where_a_float32_sum_is_inexact_or_special() -> None:
    from conformance.oracle.tree import exact_float32_sum

    terms = torch.tensor([[2.0**30, 1.0, float("nan"), 2.0**-130], [1.0, 2.0**-20, 1.0, 0.0]], dtype=torch.float64)
    total, exact = exact_float32_sum(terms)
    # 2**30 + 1: needs 31 bits (inexact); 1 + 2**-20: exact; NaN: never; a subnormal term: never.
    assert exact.tolist() == [False, True, False, False]
    assert total[1] == 1.0 + 2.0**-20


def test_p5_catches_one_extra_rounding_on_one_node_and_on_two(emulated_session, two_node_session) -> None:
    for session, strategy in ((emulated_session, combine_cases(2)), (two_node_session, combine_cases(4))):
        _, message = assert_caught(session, P5, "combine-extra-rounding", strategy, shrink=False)
        assert "reduction tree" in message, message


#: Hypothesis seeds on which P5 must catch one extra rounding within the default budget of 25 examples.
EXTRA_ROUNDING_SEEDS = (1, 2, 3, 4)


def test_p5_catches_one_extra_rounding_on_every_seed_within_the_default_budget(emulated_session,
                                                                              two_node_session) -> None:
    for session, world in ((emulated_session, 2), (two_node_session, 4)):
        drawn = {seed: examples_to_catch(session, P5, "combine-extra-rounding", combine_cases(world), seed)
                 for seed in EXTRA_ROUNDING_SEEDS}
        assert None not in drawn.values(), f"world of {world}: examples to catch per seed {drawn}"


def _extra_rounding_rates(draw_values, world: int, groups: tuple[int, ...], num_bias: int) -> dict[str, float]:
    """For each way one extra bf16 rounding can split the last level of the combine of a token that reaches every
    rank of a ``world`` with ``num_bias`` biases (P5's experts: rank d returns bf16(x * (1 + d))), the fraction of
    columns whose result it changes (``groups``: the tree's inner levels, :func:`predict_tokens` computes the right
    result): ``k`` consecutive terms of that level, in the order listed (biases first), rounded before the rest."""
    from conformance.oracle.reduction import scaled_expert_row
    from conformance.oracle.tree import predict_tokens, round_bf16

    x, biases = draw_values(), [draw_values() for _ in range(num_bias)]
    contributions = [(d, scaled_expert_row(x, d)) for d in range(world)]
    columns = x.numel()
    right, determined = predict_tokens([(contributions, biases)], groups, columns)
    kept = determined[0]  # the columns whose bytes the tree predicts (all of them for integers)

    def rounded(terms: list[torch.Tensor]) -> torch.Tensor:
        return round_bf16(torch.stack([t.double() for t in terms]).sum(dim=0)).double()

    # the terms of the last level: the biases, then the rows or the per-group partials (rounded)
    if groups:
        (g,) = groups
        last = biases + [rounded([row for d, row in contributions if d // g == key]) for key in range(world // g)]
    else:
        last = biases + [row for _, row in contributions]
    rates = {}
    for k in range(2, len(last)):  # round the first k terms, then add the rest
        wrong = rounded([rounded(last[:k])] + last[k:])
        rates[f"first {k} of {len(last)} terms"] = float((wrong != right[0].double())[kept].double().mean())
    for start in range(1, len(last) - 2):  # round k terms in the middle
        for k in range(2, len(last) - start):
            wrong = rounded(last[:start] + [rounded(last[start:start + k])] + last[start + k:])
            changed = (wrong != right[0].double())[kept]
            rates[f"terms {start}..{start + k - 1} of {len(last)}"] = float(changed.double().mean())
    if groups:  # the forwarders' rounding skipped (hybrid-reduction-rounds-once)
        once = rounded(biases + [row for _, row in contributions])
        rates["no per-node rounding"] = float((once != right[0].double())[kept].double().mean())
    return rates


def test_one_extra_rounding_changes_enough_columns_of_p5_payloads() -> None:
    """The derivation of ``conformance.strategies.combine`` (P5 and one extra rounding), measured: for exact mode's
    wide integers and bounded mode's normals, every way an extra rounding can split a token's combine on one node
    (2 ranks), two nodes (2 x 2) and four (4 x 1) changes at least 7% of the columns, each drawn on its own (of the
    columns whose bytes the tree predicts: all for integers, nearly all for normals)."""
    from conformance.core.example import wide_integers

    gen = torch.Generator().manual_seed(16)
    columns, checked = 20000, 0
    payloads = {"wide": lambda: wide_integers((columns,), torch.bfloat16, gen),
                "random": lambda: torch.randn(columns, generator=gen).to(torch.bfloat16)}
    for payload, draw_values in payloads.items():
        for (world, groups), num_bias in itertools.product(((2, ()), (4, (2,)), (4, ())), (0, 1, 2)):
            rates = _extra_rounding_rates(draw_values, world, groups, num_bias)
            low = {shape: rate for shape, rate in rates.items() if not rate >= 0.07}
            assert not low, f"{payload}, world {world}, groups {groups}, {num_bias} bias(es): {low} (all: {rates})"
            checked += len(rates)
    assert checked > 50  # the splits were there to measure


def test_p5_catches_a_hybrid_reduction_that_rounds_once(two_node_session) -> None:
    _, message = assert_caught(two_node_session, P5, "hybrid-reduction-rounds-once", combine_cases(4), shrink=False)
    assert "reduction tree" in message and "group of 2 rank(s)" in message, message
