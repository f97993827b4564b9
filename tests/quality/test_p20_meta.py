"""Meta-tests of P20-dispatch-options: it catches a handle that keeps the caller's topk_idx although a copy was asked
for, padding left unzeroed and statistics overwritten; it spares padding garbage where do_zero_padding is off; it holds
on the emulation (one and two nodes); a plug-in without the capability is unsupported with the reason; its strategy
reaches its corners."""

import pytest

from conformance.core.example import Example, build_all_inputs
from conformance.core.spec import BackendSpec
from conformance.harness.config import RunConfig
from conformance.harness.session import Session
from conformance.oracle import expected_raw_counts
from conformance.oracle.counts import expected_padding_rows
from conformance.properties import catalog
from conformance.strategies.options import dispatch_option_examples
from conformance.world.launcher import WorldShape
from tests.helpers.meta import assert_caught, assert_holds, assert_reaches, sample

PID = "P20-dispatch-options"


def padded(example: Example) -> bool:
    """Some rank's expand layout has alignment padding rows."""
    inputs = build_all_inputs(example)
    return any(expected_padding_rows(example, inputs, rank) for rank in range(example.world_size))


@pytest.mark.parametrize(("mutant", "expected"), [
    ("handle-not-copied", "topk_idx"),
    ("zero-padding-skipped", "must be +0.0 with do_zero_padding=True"),
    ("v2-stats-not-accumulated", "cumulative_local_expert_recv_stats on rank"),
])
def test_catches(emulated_session, mutant: str, expected: str) -> None:
    example, message = assert_caught(emulated_session, PID, mutant, dispatch_option_examples(2), shrink=False)
    assert expected in message and "[" in message, message  # value, expectation and the call
    if mutant == "zero-padding-skipped":
        assert padded(example)


def test_catches_the_leak_of_a_handle_not_copied_into_cached_dispatch_and_combine(emulated_session) -> None:
    """Where tokens move, the caller's later change shows in what the handle does, before the aliasing check."""
    moving = dispatch_option_examples(2).filter(lambda e: sum(e.tokens_per_rank) > 0 and e.mask_ratio == 0.0)
    _, message = assert_caught(emulated_session, PID, "handle-not-copied", moving, shrink=False)
    assert "the caller overwrote its topk_idx with -1 right after the dispatch" in message, message


def test_holds_on_the_emulation_including_two_nodes(emulated_session, two_node_session) -> None:
    assert_holds(emulated_session, PID, sample(dispatch_option_examples(2), 8))
    assert_holds(two_node_session, PID, sample(dispatch_option_examples(4), 3))


def test_spares_padding_garbage_without_do_zero_padding(emulated_session) -> None:
    examples = [ex for ex in sample(dispatch_option_examples(2), 12) if padded(ex)][:3]
    assert examples, "the sample holds no example with alignment padding"
    assert_holds(emulated_session, PID, examples, mutant="expand-padding-garbage")


def test_a_plugin_without_the_capability_is_unsupported_with_the_reason() -> None:
    plugin = BackendSpec("plugin", "v2", target="my_pkg.ep:factory", declared=frozenset({"combine", "expand"}))
    item = Session(RunConfig(WorldShape(1, 2), (plugin,))).excluded(catalog()[PID])["my_pkg.ep:factory"]
    reason = item.reason
    assert item.why == "capability" and item.span == "property", item
    assert "does not declare" in reason and "'dispatch_options'" in reason and PID in reason, reason


def test_strategy_reaches_its_corners() -> None:
    strategy = dispatch_option_examples(2)
    assert_reaches(strategy, lambda e: e.expert_alignment >= 16 and padded(e), 1000)
    assert_reaches(strategy, lambda e: e.expert_alignment > 1 and sum(e.tokens_per_rank) > 0 and not padded(e),
                   1000)  # aligned counts exactly: nothing to zero
    assert_reaches(strategy, lambda e: e.payload == "random", 1000)

    def idle_expert(e: Example) -> bool:  # a local expert that receives nothing: its statistic stays 0
        inputs = build_all_inputs(e)
        return sum(e.tokens_per_rank) > 0 and any(0 in expected_raw_counts(e, inputs, r) for r in range(2))

    assert_reaches(strategy, idle_expert, 1000)
