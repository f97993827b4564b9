"""Rank-side tasks of the benchmark (module-level, so the controller sends them by reference)."""

from __future__ import annotations

from collections import Counter
from typing import Any

#: How many times each ``torch.distributed`` collective ran on this rank since :func:`count_collectives` began.
_COUNTS: Counter[str] = Counter()
_ORIGINALS: dict[str, Any] = {}


def echo(case: Any, result: Any) -> Any:
    """The no-op backend: receive a case, return a canonical-sized result unchanged (the harness' round trip)."""
    return result


def count_collectives(by_caller: bool = False) -> None:
    """From now on count this rank's ``torch.distributed`` collectives (idempotent); ``by_caller``: keyed by the
    collective and the first caller outside ``torch`` and ``_comm`` (where a property's collectives come from)."""
    import sys

    import torch.distributed as dist

    from conformance.tasks.qp import COLLECTIVES

    for name in COLLECTIVES:
        if name in _ORIGINALS or not hasattr(dist, name):
            continue
        original = _ORIGINALS[name] = getattr(dist, name)

        def counted(*args: Any, _name: str = name, _original: Any = original, **kwargs: Any) -> Any:
            key = _name
            if by_caller:
                frame = sys._getframe(1)
                while frame is not None and ("/torch/" in frame.f_code.co_filename or
                                             frame.f_code.co_filename.endswith(("_comm.py", "_exchange.py"))):
                    frame = frame.f_back
                if frame is not None:
                    key = f"{_name} <- {frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_code.co_name}"
            _COUNTS[key] += 1
            return _original(*args, **kwargs)

        setattr(dist, name, counted)


def take_collective_counts() -> dict[str, int]:
    """The collectives counted since the last call (and start counting again from zero)."""
    counts = dict(_COUNTS)
    _COUNTS.clear()
    return counts
