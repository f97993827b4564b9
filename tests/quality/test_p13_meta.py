"""Meta-tests of P13: it catches a deterministic mode that is stable but not V1's order, spares a V2 default
order that changes on every call (and shows that mutant really reorders), holds on the emulation, and its
strategy produces ranks receiving several tokens from several sources (where order can go wrong)."""

from collections import Counter

from conformance.core.example import Example, build_all_inputs
from conformance.oracle import expected_received_tokens
from conformance.strategies.layout import layout_examples
from conformance.tasks.dispatch import repeated_views
from tests.helpers.meta import assert_caught, assert_holds, assert_reaches, sample

P13 = "P13-determinism"
#: Both ranks send 12 tokens over 4 experts, top-2: every rank receives many tokens from both sources.
BUSY = Example(tokens_per_rank=(12, 12), hidden=128, num_topk=2, num_experts=4, seed=7)


def order_matters(example: Example, per_source_min: int = 1) -> bool:
    """Some rank receives from two or more source ranks, at least ``per_source_min`` tokens from one of them."""
    inputs = build_all_inputs(example)
    for rank in range(example.world_size):
        per_source = Counter(src for src, _ in expected_received_tokens(example, inputs, rank))
        if len(per_source) >= 2 and max(per_source.values()) >= per_source_min:
            return True
    return False


def test_p13_catches_a_deterministic_mode_not_in_v1_order(emulated_session) -> None:
    example, message = assert_caught(
        emulated_session, P13, "deterministic-not-sorted", layout_examples(2), shrink=False)
    assert order_matters(example)
    assert "V1's receive order" in message and "[deterministic buffer]" in message


def test_p13_spares_a_v2_default_order_that_changes_every_call(emulated_session) -> None:
    with emulated_session.planted("v2-shuffled-receive-order"):
        results = emulated_session.run(repeated_views, BUSY)
    first, second = results[0]["emulated-v2"].default
    assert first.src_token.tolist() != second.src_token.tolist(), "the benign mutant did not reorder"
    assert sorted(first.src_token.tolist()) == sorted(second.src_token.tolist())
    assert_holds(emulated_session, P13, [BUSY, *sample(layout_examples(2), 4)], mutant="v2-shuffled-receive-order")


def test_p13_holds_on_the_emulation_including_two_nodes(emulated_session, two_node_session) -> None:
    assert_holds(emulated_session, P13, sample(layout_examples(2), 10))
    assert_holds(two_node_session, P13, sample(layout_examples(4), 5))


def test_p13_strategy_produces_examples_where_order_matters() -> None:
    assert_reaches(layout_examples(2), lambda ex: order_matters(ex, per_source_min=3), 1000)
    assert_reaches(layout_examples(4), lambda ex: order_matters(ex, per_source_min=3), 1000)
