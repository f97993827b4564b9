"""Canonical, order-free views of what a backend returned, sent from the ranks to the controller."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class DispatchOptions:
    """How a dispatch is called (the example gives the data; these give the call)."""

    do_expand: bool = False
    deterministic: bool = False
    async_finish: bool = False
    previous_event: bool = False


@dataclass
class DispatchView:
    """One rank's dispatch result, rows identified by source (rank, token) instead of by position.

    ``x``, ``topk_idx`` and ``topk_weights`` are the raw received rows (CPU copies); ``src_rank`` /
    ``src_token`` say where each row came from.  ``extras`` holds API-specific fields (handle tensors,
    prefix sums) for the properties that look at them.
    """

    backend: str
    call: str  # e.g. "ElasticBuffer.dispatch(x, topk_idx, topk_weights, num_experts=8, ...)"
    src_rank: torch.Tensor  # [N] int64
    src_token: torch.Tensor  # [N] int64
    x: torch.Tensor  # [N, hidden] bfloat16
    topk_idx: torch.Tensor  # [N, num_topk] int64, local expert or -1
    topk_weights: torch.Tensor  # [N, num_topk] float32
    num_recv_tokens_per_expert: list[int]
    extras: dict[str, Any] = field(default_factory=dict)


@dataclass
class Unsupported:
    """A backend cleanly rejected a configuration the contract allows (a capability gap, not a crash)."""

    backend: str
    call: str
    error: str
