"""The library's refusals, raised from the refusal table of the version being emulated.

Every refusal the emulation shares with DeepEP is raised through :func:`check` / :func:`refuse` with the id of its
table row, so the exception type and message come from one place, the version's table
(``conformance/versions/<version>/refusals.toml``, read through :mod:`conformance.versions`), whose ``source`` /
``expression`` columns the self-test re-reads from the library's source.  Messages may carry ``{name}`` placeholders
filled from the keyword arguments (e.g. ``Unsupported number of EP ranks: {num_ranks}``).

Which version's table: DeepEP 2.1.0's unless a call runs under :func:`version` (the 2.5.0 emulation's classes run
every method that way, :func:`emulating`): the code the versions share checks by row id, and each version's row
says where that check lives in its source and what it raises.

:func:`enforced` is a call seam (``seams.py``): a mutant drops one refusal there narrowly
(``conformance/mutants/refusals.py``).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator
from typing import Any, NoReturn, TypeVar

from conformance import versions

from .seams import seam

#: Exception classes a row may name.
EXCEPTIONS: dict[str, type[BaseException]] = {
    cls.__name__: cls
    for cls in (RuntimeError, AssertionError, ValueError, TypeError, IndexError, AttributeError, ZeroDivisionError)
}
assert set(EXCEPTIONS) == set(versions.EXCEPTIONS)

#: The DeepEP version whose table the current call raises from.
_VERSION: contextvars.ContextVar[str] = contextvars.ContextVar("deep_ep_emulated_version",
                                                                default=versions.DEFAULT_VERSION)
F = TypeVar("F", bound=Callable[..., Any])


def current() -> str:
    """The DeepEP version being emulated now (whose table and rules apply)."""
    return _VERSION.get()


def table() -> versions.RefusalTable:
    """The refusal table of the version being emulated now."""
    return versions.contract(_VERSION.get()).refusals


@contextlib.contextmanager
def version(name: str) -> Iterator[None]:
    """Raise from DeepEP ``name``'s table inside the block."""
    token = _VERSION.set(name)
    try:
        yield
    finally:
        _VERSION.reset(token)


def emulating(name: str) -> Callable[[F], F]:
    """Decorator: the function raises from DeepEP ``name``'s table (a deferred epilogue it returns is wrapped by
    its caller the same way)."""

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with version(name):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate


def rows() -> dict[str, Any]:
    """Every row of the current version's table, by id."""
    return dict(table().rows)


def message(row_id: str, **values: Any) -> str:
    """The row's message with its placeholders filled."""
    return table().message(row_id, **values)


def error(row_id: str, **values: Any) -> BaseException:
    """The exception the library raises for row ``row_id`` (not raised)."""
    cls = EXCEPTIONS[table().exception(row_id)]
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
    """A regular expression the message of row ``row_id`` matches (:meth:`conformance.versions.RefusalTable
    .message_pattern`)."""
    return table().message_pattern(row_id)


def matches(row_id: str, text: str) -> bool:
    """Whether ``text`` is the message of row ``row_id``."""
    return table().matches(row_id, text)
