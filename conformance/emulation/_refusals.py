"""The library's refusals, raised from the refusal table (``refusals.toml``, next to this module).

Every refusal the emulation shares with DeepEP 2.1.0 is raised through :func:`check` / :func:`refuse` with the
id of its table row, so the exception type and message come from one place, the table, whose ``source`` /
``expression`` columns the self-test re-reads from the library's source.  Messages may carry ``{name}``
placeholders filled from the keyword arguments (e.g. ``Unsupported number of EP ranks: {num_ranks}``).

:func:`enforced` is a call seam (``seams.py``): a mutant drops one refusal there narrowly
(``conformance/mutants/refusals.py``).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any, NoReturn

import tomllib

from .seams import seam

#: The project's refusal table (one ``[[refusal]]`` per library refusal).
TABLE_PATH = Path(__file__).with_name("refusals.toml")

#: Exception classes a row may name.
EXCEPTIONS: dict[str, type[BaseException]] = {
    cls.__name__: cls
    for cls in (RuntimeError, AssertionError, ValueError, TypeError, IndexError, AttributeError, ZeroDivisionError)
}

#: Values of placeholders the emulation cannot know (the real message carries them; see the row's note).
DEFAULT_VALUES = {"build_root": "<DeepEP build root>"}



@functools.cache
def rows() -> dict[str, dict[str, Any]]:
    """Every row of the table, by id."""
    with open(TABLE_PATH, "rb") as f:
        table = tomllib.load(f)
    return {row["id"]: row for row in table["refusal"]}


def message(row_id: str, **values: Any) -> str:
    """The row's message with its placeholders filled."""
    text = rows()[row_id]["message"]
    return text.format(**{**DEFAULT_VALUES, **values}) if "{" in text else text


def error(row_id: str, **values: Any) -> BaseException:
    """The exception the library raises for row ``row_id`` (not raised)."""
    cls = EXCEPTIONS[rows()[row_id]["exception"]]
    text = message(row_id, **values)
    return cls(text) if text or cls is not AssertionError else cls()


def refuse(row_id: str, **values: Any) -> NoReturn:
    """Raise the library's exception for row ``row_id``."""
    raise error(row_id, **values)


@seam("refusal_enforced")
def enforced(row_id: str) -> bool:
    """Whether the refusal of row ``row_id`` is enforced: always, as in the library (a planted defect drops one)."""
    del row_id
    return True


def check(ok: bool, row_id: str, **values: Any) -> None:
    """Raise the library's exception for row ``row_id`` unless ``ok`` (or the row is not :func:`enforced`)."""
    if not ok and enforced(row_id):
        raise error(row_id, **values)


def violated(ok: bool, row_id: str) -> bool:
    """Whether the condition of ``row_id`` is violated (``not ok``) and the row is :func:`enforced`."""
    return not ok and enforced(row_id)


def message_pattern(row_id: str) -> str:
    """A regular expression the message of row ``row_id`` matches: the exact text, the text as a prefix, or the
    text with each ``{placeholder}`` matching anything (the row's ``message_match``)."""
    row = rows()[row_id]
    # The file of an assertion is the path the build compiled it from: relative for some files, absolute (the
    # build directory) for others, e.g. "/tmp/src/DeepEP/csrc/legacy/buffer.hpp:481" on the recorded 2.1.0
    # build.  The path up to csrc/ is not part of the contract; from csrc/ on it is.
    text = re.escape(row["message"]).replace(re.escape("(csrc/"), r"\((?:[^()\s]*/)?csrc/")
    # A ``{build_root}/`` placeholder likewise: absent once the message went through
    # ``assertions.without_build_directory`` (run 21 on one H200: P12 failed its own comparison for that); the
    # emulation writes ``<DeepEP build root>`` there.
    text = text.replace(re.escape("({build_root}/"), r"\((?:[^()]*/)?")
    if row["message_match"] == "prefix":
        return text + ".*"
    if row["message_match"] == "pattern":
        return re.sub(r"\\\{[a-z_]+\\\}", ".+?", text)
    return text


def matches(row_id: str, message: str) -> bool:
    """Whether ``message`` is the message of row ``row_id`` (see :func:`message_pattern`)."""
    return re.fullmatch(message_pattern(row_id), message, re.S) is not None
