"""What a backend's public calls returned, checked against what the API promises before the suite reads it.

A value that breaks the API (a ``None`` where the API returns a list, a tuple of another length, something that is
not a tensor) is an :class:`~conformance.core.raisers.ApiViolation` naming the value, the promise and the call: the
backend's failure, not an error of the suite that read it.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch

from conformance.core.raisers import ApiViolation


@dataclass
class Raw:
    """What a backend's dispatch returns besides the view, passed back to its combine and cached dispatch: the rows
    as the dispatch returned them and what the backend needs to go on.  Each backend fills the fields of its API
    and leaves the others ``None``."""

    recv_x: torch.Tensor  # the received rows, as dispatch returned them
    recv_topk_weights: torch.Tensor | None  # their top-k weights, as dispatch returned them
    handle: Any = None  # the dispatch's handle (V1 ``Buffer`` / V2 ``ElasticBuffer``; a plug-in's, where it has one)
    buffer: Any = None  # V2: the buffer the dispatch ran on (its combine and cached dispatch use that buffer)
    dispatched: Any = None  # a plug-in: what its wrapper's dispatch returned (``plugins.Dispatched``)
    v1_num_sms: int | None = None  # V1: the table config's num_sms the dispatch ran with (``None``: the default)


def kind(value: Any) -> str:
    if isinstance(value, tuple):
        return f"a tuple of {len(value)}"
    return "None" if value is None else type(value).__name__


def returned(call: str, value: Any, arity: int, described: str | None = None) -> tuple:
    """``value``, the result of ``call``, checked to be the tuple of ``arity`` entries the API returns (else an
    :class:`~conformance.core.raisers.ApiViolation`: the backend's failure, not the suite's)."""
    if not isinstance(value, tuple) or len(value) != arity:
        raise ApiViolation(f"{call} returned {kind(value)}, a tuple of {arity} expected [{described or call}]")
    return value


def tensors(call: str, **values: Any) -> dict[str, Any]:
    """``values`` checked to be tensors (the API returns tensors there), else an ApiViolation naming the value."""
    for name, value in values.items():
        if not isinstance(value, torch.Tensor):
            raise ApiViolation(f"{name}={kind(value)} returned by {call}, a tensor expected")
    return values


def counts_list(counts: Any, call: str) -> list[int]:
    """V1's ``num_recv_tokens_per_expert_list``: a list of ints (one per local expert), else an ApiViolation."""
    try:
        return [operator.index(c) for c in counts]
    except (TypeError, RuntimeError, ValueError):  # not iterable, not integers, a tensor of several elements
        pass
    raise ApiViolation(f"num_recv_tokens_per_expert_list={counts!r} returned by {call}, a list of int (the received "
                       f"token count of each local expert) expected")
