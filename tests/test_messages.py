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
