"""Meta-tests of P1: it catches a flipped byte, shrinks to a minimal case, and holds on the emulation."""

from conformance.strategies import examples
from tests.helpers.meta import assert_caught, assert_holds, sample

P1 = "P1-per-expert-payloads"


def test_p1_catches_one_flipped_byte_and_names_it(emulated_session) -> None:
    example, message = assert_caught(emulated_session, P1, "flip-one-byte", examples(2))
    # Shrunk: the mutant only needs one token received by the last rank.
    assert sum(example.tokens_per_rank) == 1
    assert "recv_x[rank 1, expert" in message and "src (" in message and "bytes differ" in message
    assert "Buffer.dispatch(" in message or "ElasticBuffer.dispatch(" in message


def test_p1_holds_on_the_emulation_including_two_nodes(emulated_session, two_node_session) -> None:
    assert_holds(emulated_session, P1, sample(examples(2), 15))
    assert_holds(two_node_session, P1, sample(examples(4), 10))
