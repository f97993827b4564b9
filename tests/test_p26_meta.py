"""Meta-tests of P26-worst-case-whole: it catches a V2 no-sync dispatch that leaves a valid row unwritten, holds on
the emulation (one and two nodes, and with the uninitialised memory reading as zeros), and its report says what a
reader gets past the valid rows: the emulation's uninitialised bytes."""

import torch

from conformance.emulation._uninit import uninitialised
from conformance.properties.test_p26_worst_case_whole import KEY, describe
from conformance.strategies import examples
from conformance.versions import POISON_BYTE
from tests.meta import assert_caught, assert_holds, sample

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
