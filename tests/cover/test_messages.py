"""Refusal messages compare without the library's build directory: a wheel built in /tmp/src/DeepEP names its
sources ``(/tmp/src/DeepEP/csrc/...)`` where the recordings say ``(csrc/...)`` (seen on the real 2.1.0, P10)."""

import pytest

from conformance.assertions import assert_raised_everywhere, without_build_directory
from conformance.core.views import Raised

RECORDED = "Assertion exception (csrc/elastic/buffer.hpp:540): allocate_on_comm_stream"
BUILT = "Assertion exception (/tmp/src/DeepEP/csrc/elastic/buffer.hpp:540): allocate_on_comm_stream"


def test_the_same_refusal_from_another_build_directory_is_the_same() -> None:
    assert without_build_directory(BUILT) == RECORDED
    assert without_build_directory(RECORDED) == RECORDED
    raised = [Raised("RuntimeError", BUILT)] * 2
    assert_raised_everywhere(raised, call="c", expected_type="RuntimeError", expected_message=RECORDED)
    assert_raised_everywhere(raised, call="c", message_prefix="Assertion exception (csrc/elastic/")
    assert_raised_everywhere(raised, call="c",
                             message_pattern=r"Assertion exception \(csrc/elastic/buffer\.hpp:540\).*")


def test_another_line_or_file_is_still_a_different_refusal() -> None:
    for other in ("Assertion exception (/tmp/src/DeepEP/csrc/elastic/buffer.hpp:541): allocate_on_comm_stream",
                  "Assertion exception (/tmp/src/DeepEP/csrc/legacy/buffer.hpp:540): allocate_on_comm_stream"):
        with pytest.raises(AssertionError, match="expected message"):
            assert_raised_everywhere([Raised("RuntimeError", other)], call="c", expected_message=RECORDED)
    assert without_build_directory("see /tmp/src/notes (x)") == "see /tmp/src/notes (x)"


def test_a_build_root_placeholder_matches_with_or_without_the_build_directory() -> None:
    """The real 2.1.0 names deep_ep/include files by their absolute build path; P12 compares the message after
    :func:`without_build_directory` (run 21, one H200: ``v2_combine_hidden_tma`` failed P12 for it)."""
    from conformance import versions

    table = versions.contract("2.1.0").refusals
    matches, message_pattern = table.matches, table.message_pattern

    real = ("Assertion exception (/tmp/src/DeepEP/deep_ep/include/deep_ep/common/layout.cuh:198): "
            "num_hidden_bytes % ptx::kNumTMAAlignBytes == 0")
    assert matches("v2_combine_hidden_tma", real)
    assert matches("v2_combine_hidden_tma", without_build_directory(real))
    assert_raised_everywhere([Raised("RuntimeError", real)] * 2, call="c",
                             message_pattern=message_pattern("v2_combine_hidden_tma"))
    assert not matches("v2_combine_hidden_tma", real.replace(":198", ":199"))
    emulated = real.replace("/tmp/src/DeepEP", "<DeepEP build root>")
    assert matches("v2_combine_hidden_tma", emulated)


def test_a_path_through_a_relative_include_is_the_same_file() -> None:
    """The real 2.5.0 names a header included by a relative path through the including file's folder
    (``csrc/buffers/../kernels/ep/dispatch.hpp``): run 26 on one H100, P12 failed real-v2's refusal
    ``v2_dispatch_cached_stats`` on its own comparison.  Another file or line still differs."""
    from conformance import versions

    table = versions.contract("2.5.0").refusals
    real = ("Assertion exception (/tmp/ep25src/src/csrc/buffers/../kernels/ep/dispatch.hpp:57): "
            "cumulative_local_expert_recv_stats == nullptr")
    assert table.matches("v2_dispatch_cached_stats", real)
    assert table.matches("v2_dispatch_cached_stats", without_build_directory(real))
    assert table.matches("v2_dispatch_cached_stats", real.replace("buffers/../", ""))
    assert not table.matches("v2_dispatch_cached_stats", real.replace(":57", ":58"))
    assert not table.matches("v2_dispatch_cached_stats", real.replace("kernels/ep/", "kernels/ll/"))
    assert not table.matches("v2_dispatch_cached_stats", real.replace("buffers/../", "buffers/"))
