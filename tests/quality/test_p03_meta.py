"""Meta-tests of P3: it catches a token routed to the wrong local expert, holds on the emulation (one and two
nodes, shuffled V2 order), and its strategy produces received tokens mixing local and -1 slots."""


from conformance.core.example import Example, build_all_inputs
from conformance.oracle import expected_received_tokens, expected_recv_topk_idx
from conformance.strategies.layout import layout_examples
from tests.helpers.meta import assert_caught, assert_holds, assert_reaches, sample

P3 = "P3-recv-topk-idx"


def received_rows(example: Example) -> list[list[int]]:
    """The oracle's ``recv_topk_idx`` row of every token every rank receives."""
    inputs = build_all_inputs(example)
    return [expected_recv_topk_idx(example, inputs, rank, *tok)
            for rank in range(example.world_size) for tok in expected_received_tokens(example, inputs, rank)]


def test_p3_catches_a_wrong_local_expert(emulated_session) -> None:
    example, message = assert_caught(
        emulated_session, P3, "topk-idx-wrong-local-expert", layout_examples(2), shrink=False)
    assert example.experts_per_rank > 1
    assert "recv_topk_idx[rank" in message and "slot" in message and "expected" in message


def test_p3_holds_on_the_emulation_including_two_nodes(emulated_session, two_node_session) -> None:
    assert_holds(emulated_session, P3, sample(layout_examples(2), 12))
    assert_holds(two_node_session, P3, sample(layout_examples(4), 5))
    assert_holds(emulated_session, P3, sample(layout_examples(2), 4), mutant="v2-shuffled-receive-order")


def test_p3_strategy_mixes_local_and_minus_one_slots() -> None:
    def masked_slot(example: Example) -> bool:  # a received token with a masked slot next to a local one
        inputs = build_all_inputs(example)
        return any(-1 in inputs[s].topk_idx[t].tolist() for r in range(example.world_size)
                   for s, t in expected_received_tokens(example, inputs, r))

    assert_reaches(layout_examples(2), lambda ex: any(-1 in row and max(row) >= 0 for row in received_rows(ex)),
                   1000)
    assert_reaches(layout_examples(2), lambda ex: any(sum(i >= 0 for i in row) >= 2 for row in received_rows(ex)),
                   1000)
    assert_reaches(layout_examples(2), lambda ex: ex.mask_ratio > 0 and masked_slot(ex), 1000)
