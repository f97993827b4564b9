"""Meta-tests of P22-epilogue-events: it catches an epilogue that does not wait for previous_event_before_epilogue (the
dispatch's compute and the combine's bias), and a refusal of the wrong event type that is dropped; it holds on the
emulation (one and two nodes); its strategy reaches its corners."""


from conformance.strategies.options import epilogue_examples
from tests.helpers.meta import assert_caught, assert_holds, assert_reaches, sample

PID = "P22-epilogue-events"


def test_catches_an_ignored_epilogue_event(emulated_session) -> None:
    example, message = assert_caught(emulated_session, PID, "epilogue-event-ignored", epilogue_examples(2),
                                     shrink=False)
    assert "previous_event_before_epilogue" in message and "[" in message, message


def test_catches_a_dropped_wrong_type_refusal(emulated_session) -> None:
    _, message = assert_caught(emulated_session, PID, "refusal-dropped-event-type", epilogue_examples(2), shrink=False)
    assert "v2_dispatch_event_type" in message and "TypeError" in message, message


def test_holds_on_the_emulation_including_two_nodes(emulated_session, two_node_session) -> None:
    assert_holds(emulated_session, PID, sample(epilogue_examples(2), 8))
    assert_holds(two_node_session, PID, sample(epilogue_examples(4), 3))


def test_strategy_reaches_its_corners() -> None:
    strategy = epilogue_examples(2)
    assert_reaches(strategy, lambda e: 0 in e.tokens_per_rank and sum(e.tokens_per_rank) > 0, 1000)
    assert_reaches(strategy, lambda e: e.mask_ratio == 1.0, 1000)  # nothing received: the bias alone comes back
    assert_reaches(strategy, lambda e: e.payload == "random", 1000)
