"""Meta-tests of P27-fresh-groups: it catches a buffer that misbehaves only on a group made just before it, and a
refusal on some ranks only or without a message, and holds on the emulation (both APIs, one and two nodes)."""

import re

import pytest

from conformance.core.views import Raised
from conformance.properties.test_p27_fresh_groups import KEY, check
from conformance.strategies.fresh_groups import fresh_groups_examples
from tests.helpers.meta import RecordingContext, assert_caught, assert_holds, sample

PID = "P27-fresh-groups"
MUTANT = "fresh-group-dispatch-corrupt"


def test_fresh_groups_catches_a_buffer_wrong_only_on_a_fresh_group(emulated_session) -> None:
    example, message = assert_caught(emulated_session, PID, MUTANT, fresh_groups_examples(2), shrink=False)
    assert "fresh new_group" in message and "rank 1" in message, (example, message)


def test_fresh_groups_holds_on_the_emulation_including_two_nodes(emulated_session, two_node_session) -> None:
    assert_holds(emulated_session, PID, sample(fresh_groups_examples(2), 10))
    assert_holds(two_node_session, PID, sample(fresh_groups_examples(4), 5))


@pytest.mark.parametrize(("per_rank_raised", "expected"), [
    ((Raised("RuntimeError", "comm argument is NULL"), None), "refused on rank(s) [0] only"),
    ((Raised("RuntimeError", ""), Raised("RuntimeError", "")), "no message"),
])
def test_fresh_groups_fails_a_refusal_on_some_ranks_or_without_a_word(per_rank_raised, expected) -> None:
    from conformance.core.example import Example

    example = sample(fresh_groups_examples(2), 1)[0]
    assert isinstance(example, Example)
    view = object()  # a rank that dispatched (never reached: the refusal is judged first)
    per_rank = [{"emulated-v2": {"new_group": raised if raised is not None else view}} for raised in per_rank_raised]
    with pytest.raises(AssertionError, match=re.escape(expected)):
        check(RecordingContext(), example, per_rank)


def test_fresh_groups_records_a_clean_refusal_on_every_rank() -> None:
    example = sample(fresh_groups_examples(2), 1)[0]
    refused = Raised("RuntimeError", "NCCL communicator of this group is not initialised")
    ctx = RecordingContext()
    check(ctx, example, [{"real-v2": {"new_group_nccl": refused}}] * 2)
    assert ctx.seen == {"real-v2": {"new_group_nccl": [f"refused: {refused}"]}} and KEY == "fresh groups"
