"""Meta-tests of P10: it catches early events, ignored previous_event and a `with` that does not wait."""

from hypothesis import find, settings

from conformance.strategies.calls import small_examples
from tests.meta import FIND_SETTINGS, assert_caught, assert_holds, sample

P10 = "P10-events"


def test_p10_catches_an_async_result_returned_before_it_is_ready(emulated_session) -> None:
    example, message = assert_caught(emulated_session, P10, "async-result-before-ready", small_examples(2))
    assert sum(example.tokens_per_rank) >= 1
    assert "differ from the synchronous" in message


def test_p10_catches_an_ignored_previous_event(emulated_session) -> None:
    example, message = assert_caught(emulated_session, P10, "previous-event-ignored", small_examples(2))
    assert "waited through previous_event" in message and "bytes differ" in message


def test_p10_catches_an_event_overlap_that_does_not_wait_on_exit(emulated_session) -> None:
    _, message = assert_caught(emulated_session, P10, "event-overlap-exit-no-wait", small_examples(2))
    assert "`with event:`" in message and "synchronous combine" in message


def test_p10_holds_on_the_emulation_including_two_nodes(emulated_session, two_node_session) -> None:
    assert_holds(emulated_session, P10, sample(small_examples(2), 8))
    assert_holds(two_node_session, P10, sample(small_examples(4), 4))


def test_p10_strategy_reaches_its_corners() -> None:
    strategy = small_examples(2)
    generous = settings(FIND_SETTINGS, max_examples=1000)
    find(strategy, lambda e: e.hidden == 128, settings=generous)  # V2 combine unsupported
    find(strategy, lambda e: 0 in e.tokens_per_rank and sum(e.tokens_per_rank) > 0, settings=generous)
    find(strategy, lambda e: e.mask_ratio == 1.0, settings=generous)  # nothing received anywhere
    find(strategy, lambda e: e.payload == "special", settings=generous)  # NaN/Inf bytes through events
