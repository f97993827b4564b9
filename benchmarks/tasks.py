"""Rank-side tasks of the benchmark (module-level, so the controller sends them by reference)."""

from __future__ import annotations

from collections import Counter
from typing import Any

#: How many times each ``torch.distributed`` collective ran on this rank since :func:`count_collectives` began.
_COUNTS: Counter[str] = Counter()
_COUNTING: list[bool] = []  # one entry once counting began (the wrappers stay for the process)


def echo(case: Any, result: Any) -> Any:
    """The no-op backend: receive a case, return a canonical-sized result unchanged (the harness' round trip)."""
    return result


def count_collectives(by_caller: bool = False) -> None:
    """From now on count this rank's ``torch.distributed`` collectives (idempotent); ``by_caller``: keyed by the
    collective and the first caller outside ``torch`` and ``_comm`` (where a property's collectives come from)."""
    import sys

    from conformance.tasks.qp import wrap_collectives

    if _COUNTING:
        return
    _COUNTING.append(True)

    def record(name: str) -> None:
        key = name
        if by_caller:
            frame = sys._getframe(2)  # record <- the wrapper <- its caller
            while frame is not None and ("/torch/" in frame.f_code.co_filename or
                                         frame.f_code.co_filename.endswith(("_comm.py", "_exchange.py"))):
                frame = frame.f_back
            if frame is not None:
                key = f"{name} <- {frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_code.co_name}"
        _COUNTS[key] += 1

    wrap_collectives(record)


def take_collective_counts() -> dict[str, int]:
    """The collectives counted since the last call (and start counting again from zero)."""
    counts = dict(_COUNTS)
    _COUNTS.clear()
    return counts
