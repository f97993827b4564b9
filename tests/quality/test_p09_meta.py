"""Meta-tests of P9 (gradients): wrong gradient sign / scale and a stale cached dispatch in backward are caught,
the gradient oracle is right by hand, the property holds on the emulation (one and two nodes), and the
strategy reaches the corners."""

import torch

from conformance.core.example import Example, RankInputs, build_all_inputs
from conformance.oracle.reduction import expected_dispatch_backward, reach_counts
from conformance.strategies.combine import gradient_examples
from tests.helpers.meta import assert_caught, assert_holds, assert_reaches, sample

P9 = "P9-gradients"


def test_dispatch_backward_oracle_by_hand() -> None:
    example = Example(tokens_per_rank=(2, 0), hidden=2, num_topk=2, num_experts=4)
    inputs = [
        RankInputs(x=torch.zeros(2, 2, dtype=torch.bfloat16), topk_idx=torch.tensor([[0, 3], [-1, 1]]),
                   topk_weights=torch.ones(2, 2)),
        RankInputs(x=torch.zeros(0, 2, dtype=torch.bfloat16), topk_idx=torch.zeros(0, 2, dtype=torch.int64),
                   topk_weights=torch.zeros(0, 2)),
    ]

    def grad_rows(dst: int, token: int) -> tuple[torch.Tensor, torch.Tensor]:
        value = float(10 * dst + token + 1)  # rank 0: 1, 2; rank 1: 11, 12
        return torch.tensor([value, -value], dtype=torch.bfloat16), torch.tensor([value, 2 * value])

    grad_x, grad_w = expected_dispatch_backward(example, inputs, 0, grad_rows, ranks_per_node=2)
    # token 0 reached ranks 0 and 1 -> 1 + 11; token 1 reached rank 0 only -> 2.
    assert grad_x.rounded().float().tolist() == [[12.0, -12.0], [2.0, -2.0]]
    # weight grad of slot k comes from the owner of slot k: (0,0) rank 0 slot 0 = 1; (0,1) rank 1 slot 1 = 22;
    # (1,0) masked = 0; (1,1) rank 0 slot 1 = 4.
    assert grad_w.tolist() == [[1.0, 22.0], [0.0, 4.0]]


def test_p9_catches_a_flipped_gradient_sign(emulated_session) -> None:
    _, message = assert_caught(emulated_session, P9, "gradient-sign-flipped", gradient_examples(2), shrink=False)
    assert "x.grad[rank" in message


def test_p9_catches_a_wrong_gradient_scale(emulated_session) -> None:
    _, message = assert_caught(emulated_session, P9, "gradient-scale-wrong", gradient_examples(2), shrink=False)
    assert "expert_output.grad[rank" in message


def test_p9_catches_a_stale_cached_dispatch_in_backward(emulated_session) -> None:
    _, message = assert_caught(emulated_session, P9, "cached-dispatch-stale", gradient_examples(2), shrink=False)
    assert "expert_output.grad[rank" in message


def test_p9_holds_on_the_emulation_including_two_nodes(emulated_session, two_node_session) -> None:
    assert_holds(emulated_session, P9, sample(gradient_examples(2), 12))
    assert_holds(two_node_session, P9, sample(gradient_examples(4), 6))


def _counts(example: Example) -> list[int]:
    inputs = build_all_inputs(example)
    return [c for r in range(example.world_size) for c in reach_counts(example, inputs, r)]


def _two_slots_on_one_rank(example: Example) -> bool:
    per = example.experts_per_rank
    for r in build_all_inputs(example):
        for row in r.topk_idx.tolist():
            owners = [e // per for e in row if e >= 0]
            if len(owners) != len(set(owners)):
                return True
    return False


def test_p9_strategy_reaches_the_corners() -> None:
    strategy = gradient_examples(2)
    for payload in ("integers", "random"):  # exact and bounded gradients
        assert_reaches(strategy, lambda e, p=payload: e.payload == p and e.hidden != 128)
    assert_reaches(strategy, lambda e: 2 in _counts(e))  # x.grad summed over two ranks
    assert_reaches(strategy, lambda e: 0 in _counts(e))  # a token with zero gradient
    assert_reaches(strategy, _two_slots_on_one_rank)  # weight grads from one owner, two slots
    assert_reaches(strategy, lambda e: e.mask_ratio > 0 and 1 in _counts(e))  # masked slots
