"""Meta-tests of P4: it catches a zeroed live weight and either API changing its own behaviour at -1 slots,
reports the V1/V2 difference at -1 slots as a divergence (only when it is observable), holds on the
emulation, and its strategy produces received tokens with -1 slots of both kinds."""


from conformance.core.example import Example, build_all_inputs
from conformance.harness.session import Recorder
from conformance.oracle import expected_received_tokens
from conformance.properties import catalog
from conformance.properties.test_p04_weights import DIVERGENCE_KEY
from conformance.strategies.layout import layout_examples
from conformance.tasks.dispatch import dispatch_views
from tests.helpers.meta import RecordingContext, assert_caught, assert_holds, assert_reaches, sample

P4 = "P4-weights"
#: top-4 of 4 experts on 2 ranks: every received token has two slots pointing at the other rank (-1 slots).
WITH_MINUS_ONE = Example(tokens_per_rank=(6, 5), hidden=128, num_topk=4, num_experts=4, seed=1)
#: top-1, nothing masked: every received token's only slot is local, so no -1 slot exists anywhere.
WITHOUT_MINUS_ONE = Example(tokens_per_rank=(6, 5), hidden=128, num_topk=1, num_experts=4, seed=1)


def minus_one_slots(example: Example) -> tuple[int, int]:
    """(slots on received tokens pointing at another rank's expert, masked slots on received tokens)."""
    inputs = build_all_inputs(example)
    remote = masked = 0
    for rank in range(example.world_size):
        for src, tok in expected_received_tokens(example, inputs, rank):
            for e in inputs[src].topk_idx[tok].tolist():
                masked += e < 0
                remote += e >= 0 and e // example.experts_per_rank != rank
    return remote, masked


def test_p4_catches_a_zeroed_live_weight(emulated_session) -> None:
    _, message = assert_caught(emulated_session, P4, "zero-one-live-weight", layout_examples(2), shrink=False)
    assert "= 0.0 (0x00000000), expected the sender's weight" in message and "a local expert" in message


def test_p4_fails_when_v2_writes_zero_at_minus_one_slots(emulated_session) -> None:
    _, message = assert_caught(emulated_session, P4, "v2-zeroes-minus-one-weights", layout_examples(2), shrink=False)
    assert "V2 changed its own behaviour" in message and "ElasticBuffer.dispatch(" in message


def test_p4_fails_when_v1_keeps_weights_at_minus_one_slots(emulated_session) -> None:
    _, message = assert_caught(emulated_session, P4, "v1-keeps-minus-one-weights", layout_examples(2), shrink=False)
    assert "V1 changed its own behaviour" in message and "Buffer.dispatch(" in message


def test_p4_reports_the_divergence_only_when_observable(emulated_session) -> None:
    assert minus_one_slots(WITH_MINUS_ONE)[0] > 0 and minus_one_slots(WITHOUT_MINUS_ONE) == (0, 0)
    emulated_session.recorder = Recorder()
    emulated_session.check(P4, WITHOUT_MINUS_ONE)
    assert emulated_session.recorder.divergences == {}
    emulated_session.check(P4, WITH_MINUS_ONE)
    message = emulated_session.recorder.divergences[DIVERGENCE_KEY]
    assert "Buffer (V1) writes 0.0" in message and "keeps the sender's weight" in message
    emulated_session.recorder = Recorder()


def test_p4_no_divergence_with_one_api_selected(emulated_session) -> None:
    prop = catalog()[P4]
    views = emulated_session.run(dispatch_views, WITH_MINUS_ONE)
    for api in ("v1", "v2"):
        ctx = RecordingContext(emulated_session.shape)  # sees one API's views, as --backends emulated-v2 would
        prop.check(ctx, WITH_MINUS_ONE, [{k: v for k, v in per_rank.items() if k.endswith(api)} for per_rank in views])
        assert ctx.divergences == {}


def test_p4_holds_on_the_emulation_including_two_nodes(emulated_session, two_node_session) -> None:
    assert_holds(emulated_session, P4, sample(layout_examples(2), 12))
    assert_holds(two_node_session, P4, sample(layout_examples(4), 5))
    assert_holds(emulated_session, P4, sample(layout_examples(2), 4), mutant="v2-shuffled-receive-order")


def test_p4_strategy_produces_both_kinds_of_minus_one_slots() -> None:
    assert_reaches(layout_examples(2), lambda ex: minus_one_slots(ex)[0] > 0, 1000)
    assert_reaches(layout_examples(2), lambda ex: minus_one_slots(ex)[1] > 0, 1000)
    assert_reaches(layout_examples(2), lambda ex: sum(ex.tokens_per_rank) > 0 and minus_one_slots(ex) == (0, 0),
                   1000)
