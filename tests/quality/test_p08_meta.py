"""Meta-tests of P8: it catches a non-contiguous expand layout and expand prefix sums with the non-expand
meaning, spares garbage in the padding and a shuffled V2 order, skips (naming the missing backend) without
a V2 backend, holds on the emulation, and its strategy produces padded experts and multi-slot tokens."""


import pytest
import torch

from conformance.core.example import Example, build_all_inputs
from conformance.core.spec import BackendSpec
from conformance.harness.config import RunConfig
from conformance.harness.session import Session
from conformance.oracle import expected_raw_counts, expected_received_tokens, expected_recv_topk_idx
from conformance.properties import NotApplicable, catalog
from conformance.strategies.layout import alignment_examples
from conformance.tasks.dispatch import expand_views
from conformance.world.launcher import WorldShape
from tests.helpers.meta import assert_caught, assert_holds, assert_reaches, sample

P8 = "P8-expand-layout"


def padded_gap(example: Example) -> bool:
    """Some rank has an expert whose rows end before its aligned segment does, followed by an expert with rows."""
    inputs = build_all_inputs(example)
    for rank in range(example.world_size):
        raw = expected_raw_counts(example, inputs, rank)
        for e in range(len(raw) - 1):
            if raw[e] % example.expert_alignment and any(raw[e + 1:]):
                return True
    return False


def multi_local_slots(example: Example) -> bool:
    """Some received token has two or more slots pointing at local experts (two expanded rows)."""
    inputs = build_all_inputs(example)
    return any(sum(i >= 0 for i in expected_recv_topk_idx(example, inputs, rank, *tok)) >= 2
               for rank in range(example.world_size) for tok in expected_received_tokens(example, inputs, rank))


def test_p8_catches_a_gap_inside_an_expert(emulated_session) -> None:
    example, message = assert_caught(emulated_session, P8, "expand-not-contiguous", alignment_examples(2),
                                     shrink=False)
    assert example.expert_alignment > 1
    assert "contiguous" in message and "recv_src_metadata[rank" in message and "do_expand=True" in message


def test_p8_catches_non_expand_prefix_sums_in_expand_mode(emulated_session) -> None:
    _, message = assert_caught(
        emulated_session, P8, "expand-psum-non-expand-semantics", alignment_examples(2), shrink=False)
    assert "psum_num_recv_tokens_per_expert[rank" in message and "raw count" in message


def test_p8_holds_on_the_emulation_including_two_nodes(emulated_session, two_node_session) -> None:
    assert_holds(emulated_session, P8, sample(alignment_examples(2), 12))
    assert_holds(two_node_session, P8, sample(alignment_examples(4), 5))


@pytest.mark.parametrize("mutant", ["expand-padding-garbage", "v2-shuffled-receive-order"])
def test_p8_spares_padding_bytes_and_receive_order(emulated_session, mutant: str) -> None:
    examples = [ex for ex in sample(alignment_examples(2), 12) if padded_gap(ex)][:4]
    assert examples, "the sample holds no example with alignment padding"
    assert_holds(emulated_session, P8, examples, mutant=mutant)


def test_p8_is_not_applicable_without_a_v2_backend_and_says_why() -> None:
    """With only V1 selected, P8 (V2's expand mode) is reported unsupported with the reason, never skipped
    (the reason reaches the report and the repro)."""
    config = RunConfig(WorldShape(1, 2), (BackendSpec("emulated", "v1"),))
    session = Session(config)
    expected = r"^P8-expand-layout checks the v2 \(ElasticBuffer\) contract and emulated-v1 follows v1 \(Buffer\)$"
    with pytest.raises(NotApplicable, match=expected):
        session.check(P8, Example(tokens_per_rank=(2, 2), hidden=128, num_topk=1, num_experts=2))
    session.run_property(catalog()[P8])
    assert "emulated-v1 follows v1 (Buffer)" in session.recorder.not_applicable and session.recorder.examples == 0
    assert session.recorder.excluded == {"emulated-v1": session.recorder.not_applicable}


def test_p8_strategy_produces_padding_and_multi_slot_tokens() -> None:
    assert_reaches(alignment_examples(2), lambda ex: ex.expert_alignment >= 16 and padded_gap(ex), 1000)
    assert_reaches(alignment_examples(2), lambda ex: ex.expert_alignment > 1 and multi_local_slots(ex), 1000)


def test_p8_padding_mutant_really_writes_the_padding(emulated_session) -> None:
    from conformance.canonical import padding_rows

    example = next(ex for ex in sample(alignment_examples(2), 12) if padded_gap(ex))
    with emulated_session.planted("expand-padding-garbage"):
        results = emulated_session.run(expand_views, example)
    touched = 0
    for per_backend in results:
        for view, _ in per_backend.values():
            pad = padding_rows(view)
            touched += int(view.x[pad].view(torch.int16).ne(0).any()) if bool(pad.any()) else 0
    assert touched > 0
