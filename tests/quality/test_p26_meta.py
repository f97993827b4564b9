"""Meta-tests of P26-worst-case-whole: it catches a V2 no-sync dispatch that leaves a valid row unwritten, holds on
the emulation (one and two nodes, and with the uninitialised memory reading as zeros), and its report says what a
reader gets past the valid rows: the emulation's uninitialised bytes.  The rows of recv_topk_idx past the valid count
are not -1 there (as on the real 2.1.0 and 2.5.0): P26 finds it, its known defect explains it, DeepEP's fix holds."""

import torch

from conformance.emulation._uninit import uninitialised
from conformance.properties.test_p26_worst_case_whole import KEY, describe
from conformance.strategies import examples
from conformance.versions import POISON_BYTE
from tests.helpers.meta import assert_caught, assert_holds, fails, sample

PID = "P26-worst-case-whole"


def test_p26_catches_a_valid_row_left_unwritten(emulated_session) -> None:
    example, message = assert_caught(
        emulated_session, PID, "v2-worst-case-last-row-unwritten", examples(2), shrink=False)
    assert sum(example.tokens_per_rank) >= 1
    assert "first" in message and "rows of" in message and "expected" in message, message


def test_p26_holds_on_the_emulation_including_two_nodes(emulated_session, two_node_session) -> None:
    assert_holds(emulated_session, PID, sample(examples(2), 8))
    assert_holds(two_node_session, PID, sample(examples(4), 4))
    # nothing past the valid rows is asserted: zeros there (a fresh allocator block) hold as well
    assert_holds(emulated_session, PID, sample(examples(2), 4), mutant="uninitialised-zeroed")


def test_p26_reports_what_a_reader_gets_past_the_valid_rows(emulated_session) -> None:
    (example,) = [e for e in sample(examples(2), 20) if 0 < sum(e.tokens_per_rank) < 2 * e.num_max_tokens_per_rank][:1]
    emulated_session.recorder.artifacts.pop(KEY, None)  # what the other tests of this session recorded
    emulated_session.check(PID, example)
    seen = emulated_session.recorder.artifacts[KEY]["emulated-v2"]
    poison = describe(uninitialised((2, 3), torch.int64, "cpu"))
    assert poison.startswith(f"0x{POISON_BYTE:02X} bytes"), poison
    for output in ("recv_x", "recv_topk_idx", "recv_topk_weights"):
        assert seen[f"rows {output}[tail]"] == [poison], seen


def _session_without_known_defects():
    from conformance.core.spec import parse_backends
    from conformance.harness.config import RunConfig
    from conformance.harness.session import Session
    from conformance.world.launcher import WorldShape

    return Session(RunConfig(WorldShape(1, 2), tuple(parse_backends("emulated-v2", False)), "cpu", 120.0,
                             known_defects="none"))


def test_p26_finds_the_uninitialised_topk_idx_tail_and_its_fix() -> None:
    """The rows of recv_topk_idx past the valid count are not -1 on the emulation (as on the real 2.1.0 and 2.5.0):
    without the known defects P26 fails there, naming the rows; the known-defect entry's expression matches that
    failure; with DeepEP's fix planted (-1 there, mutant v2-worst-case-topk-idx-filled) it holds."""
    from conformance.harness.known_defects import load
    from conformance.versions import contract

    (example,) = [e for e in sample(examples(2), 20) if 0 < sum(e.tokens_per_rank) < 2 * e.num_max_tokens_per_rank][:1]
    session = _session_without_known_defects()
    try:
        message = fails(session, PID, example, None)
        assert message is not None and "recv_topk_idx[rank " in message and "expected -1 (no expert)" in message
        assert fails(session, PID, example, "v2-worst-case-topk-idx-filled") is None
    finally:
        session.close()
    for version in ("2.1.0", "2.5.0"):
        entries = load(contract(version).known_defects_path).for_property(PID)
        (entry,) = [e for e in entries if e.id == "v2-recv-topk-idx-uninitialised-past-valid-rows"]
        assert entry.message_matches(message) and entry.covers_column("emulated-v2"), (version, message)


def test_p26_reports_the_tail_as_a_known_defect(emulated_session) -> None:
    (example,) = [e for e in sample(examples(2), 20) if 0 < sum(e.tokens_per_rank) < 2 * e.num_max_tokens_per_rank][:1]
    emulated_session.recorder.known_defects.clear()
    emulated_session.check(PID, example)  # counted as the known defect, not raised
    seen = emulated_session.recorder.known_defects["v2-recv-topk-idx-uninitialised-past-valid-rows"]
    assert seen["failed"] >= 1 and "recv_topk_idx[rank " in seen["message"], seen
