"""Meta-tests of P10: it catches early events, ignored previous_event (dispatch, layout, internode combine), a `with`
that does not wait, an ignored release_handle, a hook run before the wait and a barrier that does not wait."""


from conformance.strategies.calls import small_examples
from tests.helpers.meta import assert_caught, assert_holds, assert_reaches, fails, sample

P10 = "P10-events"


def test_p10_catches_an_async_result_returned_before_it_is_ready(emulated_session) -> None:
    example, message = assert_caught(emulated_session, P10, "async-result-before-ready", small_examples(2),
                                     shrink=False)
    assert sum(example.tokens_per_rank) >= 1
    assert "differ from the synchronous" in message


def test_p10_catches_an_ignored_previous_event(emulated_session) -> None:
    example, message = assert_caught(emulated_session, P10, "previous-event-ignored", small_examples(2))
    assert "waited through previous_event" in message and "bytes differ" in message


def test_p10_catches_an_event_overlap_that_does_not_wait_on_exit(emulated_session) -> None:
    _, message = assert_caught(emulated_session, P10, "event-overlap-exit-no-wait", small_examples(2), shrink=False)
    # the exit neither waits nor lets the event go: whichever the shrunk case shows first
    assert "`with event(release_handle=True):`" in message
    assert "synchronous combine" in message or "event released" in message


def test_p10_catches_an_ignored_release_handle(emulated_session) -> None:
    _, message = assert_caught(emulated_session, P10, "release-handle-ignored", small_examples(2), shrink=False)
    assert "event released" in message and "release_handle=True" in message


def test_p10_catches_a_call_that_drops_release_handle(emulated_session) -> None:
    _, message = assert_caught(
        emulated_session, P10, "event-call-drops-release-handle", small_examples(2), shrink=False)
    assert "event released" in message and "`with event(release_handle=True):`" in message


def test_p10_catches_a_hook_run_before_the_wait(emulated_session) -> None:
    example, message = assert_caught(emulated_session, P10, "hook-before-event-wait", small_examples(2), shrink=False)
    assert "recv_x as the hook saw it" in message and "register_hook_after_wait" in message


def test_p10_catches_a_layout_that_ignores_previous_event(emulated_session) -> None:
    _, message = assert_caught(emulated_session, P10, "layout-ignores-previous-event", small_examples(2), shrink=False)
    assert "get_dispatch_layout(topk_idx written by a compute" in message and "synchronous layout" in message


def test_p10_catches_a_barrier_that_does_not_wait(emulated_session) -> None:
    _, message = assert_caught(
        emulated_session, P10, "barrier-returns-early-unless-sequential", small_examples(2), shrink=False)
    assert "ranks that had entered the barrier = 1, expected 2" in message and "sequential=False" in message


def test_p10_catches_an_internode_combine_that_ignores_previous_event(two_node_session) -> None:
    """Drawn cases, not shrunk (shrinking on four ranks takes minutes)."""
    for example in sample(small_examples(4), 8):
        message = fails(two_node_session, P10, example, "internode-combine-ignores-previous-event")
        if message is not None:
            break
    else:
        raise AssertionError("none of 8 drawn examples caught an internode combine that ignores previous_event")
    assert "emulated-v1 combine(expert outputs a compute is still writing" in message and "previous_event" in message
    assert fails(two_node_session, P10, example, None) is None


def test_p10_holds_on_the_emulation_including_two_nodes(emulated_session, two_node_session) -> None:
    assert_holds(emulated_session, P10, sample(small_examples(2), 8))
    assert_holds(two_node_session, P10, sample(small_examples(4), 4))


def test_p10_strategy_reaches_its_corners() -> None:
    strategy = small_examples(2)
    assert_reaches(strategy, lambda e: e.hidden == 128, 1000)  # V2 combine unsupported
    assert_reaches(strategy, lambda e: 0 in e.tokens_per_rank and sum(e.tokens_per_rank) > 0, 1000)
    assert_reaches(strategy, lambda e: e.mask_ratio == 1.0, 1000)  # nothing received anywhere
    assert_reaches(strategy, lambda e: e.payload == "special", 1000)  # NaN/Inf bytes through events
