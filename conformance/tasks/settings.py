"""What every task receives besides the example, and the loop over backends every task runs."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from conformance.backends.factory import get_adapter
from conformance.backends.limits import known_limit
from conformance.backends.spec import BackendSpec
from conformance.backends.views import Unsupported
from conformance.example import Example


@dataclass(frozen=True)
class TaskSettings:
    """What every task needs besides the example."""

    backends: tuple[str, ...]
    mutant: str | None = None


def backend_calls(
    settings: TaskSettings, example: Example, operation: str, call: Callable[[Any], Any]
) -> Iterator[tuple[str, Any]]:
    """Yield ``(backend name, call(adapter))`` for every backend.

    An exception that a known limit covers (:mod:`conformance.backends.limits`) becomes an
    :class:`Unsupported` result for that backend; any other exception propagates (a failure).
    """
    for name in settings.backends:
        spec = BackendSpec.parse(name)
        adapter = get_adapter(spec)
        try:
            yield name, call(adapter)
        except Exception as exc:
            limit = known_limit(spec.api, operation, example)
            if limit is None:
                raise
            yield name, Unsupported(name, f"{spec.class_name}.{operation}", f"{type(exc).__name__}: {exc}")
