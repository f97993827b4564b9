"""Meta-tests of P12: bad input raises everywhere, and a refusal must not corrupt the next call."""

from hypothesis import find, settings

from conformance.core.cases import BAD_INPUT_DEFECTS
from conformance.strategies.calls import bad_input_cases
from tests.meta import FIND_SETTINGS, assert_caught, assert_holds, sample

P12 = "P12-bad-input"


def test_p12_catches_a_refusal_that_leaves_the_buffer_corrupted(emulated_session) -> None:
    _, message = assert_caught(emulated_session, P12, "refusal-corrupts-buffer", bad_input_cases(2))
    assert "the call right after the rejected" in message and "bytes differ" in message


def test_p12_catches_too_many_tokens_accepted_and_truncated(emulated_session) -> None:
    case, message = assert_caught(emulated_session, P12, "too-many-tokens-truncated",
                                  bad_input_cases(2, defects=("too_many_tokens", "bf16_weights")))
    assert case.defect == "too_many_tokens"
    assert "returned normally" in message


def test_p12_reports_the_upstream_cached_dispatch_typeerror_as_a_divergence(emulated_session) -> None:
    from conformance.core.cases import BadInputCase

    case = next(c for c in sample(bad_input_cases(2), 200) if c.defect == "v2_cached_dispatch_without_num_experts")
    emulated_session.recorder.divergences.clear()
    assert_holds(emulated_session, P12, [BadInputCase(case.example, case.defect)])
    assert "emulated-v2:cached-dispatch-without-num-experts" in emulated_session.recorder.divergences


def test_p12_holds_on_the_emulation_including_two_nodes(emulated_session, two_node_session) -> None:
    per_defect = {c.defect: c for c in sample(bad_input_cases(2), 300)}
    assert set(per_defect) == set(BAD_INPUT_DEFECTS)
    assert_holds(emulated_session, P12, list(per_defect.values()))
    assert_holds(two_node_session, P12, sample(bad_input_cases(4), 6))


def test_p12_strategy_draws_every_defect() -> None:
    strategy = bad_input_cases(2)
    generous = settings(FIND_SETTINGS, max_examples=1000)
    for defect in BAD_INPUT_DEFECTS:
        find(strategy, lambda c, d=defect: c.defect == d, settings=generous)
    find(strategy, lambda c: c.defect == "expert_id_out_of_range" and c.example.tokens_per_rank[0] == 0,
         settings=generous)
