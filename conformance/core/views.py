"""What the ranks send back: canonical, order-free views of a backend's results, and what a call raised."""

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
    #: V2 dispatch options (capability ``dispatch_options``; ``do_cpu_sync=False``: ``worst_case``)
    do_handle_copy: bool = True
    do_zero_padding: bool = False
    do_cpu_sync: bool = True
    #: V2 buffer options (capability ``buffer_options``): the buffer the call runs on is built with them
    allow_multiple_reduction: bool = True
    prefer_overlap_with_compute: bool = True
    #: V1 only: dispatch (and combine through its handle) with an explicit ``config``, the library's own table entry
    #: for this world built with this SM count (``Buffer.set_num_sms`` then ``get_dispatch_config``); 0: no config
    v1_num_sms: int = 0

    def non_default(self) -> dict[str, bool]:
        """The V2 dispatch and buffer options that differ from the library's defaults (for call descriptions)."""
        defaults = DispatchOptions()
        names = ("do_handle_copy", "do_zero_padding", "do_cpu_sync", "allow_multiple_reduction",
                 "prefer_overlap_with_compute")
        return {name: getattr(self, name) for name in names if getattr(self, name) != getattr(defaults, name)}


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
    api: str = ""  # "v1" / "v2": the contract the backend follows (empty: read from a built-in backend's name)
    #: The expert_alignment the backend applied, when not the example's (a wrapper that takes none applies 1).
    expert_alignment: int | None = None


@dataclass
class Unsupported:
    """A backend cleanly rejected a configuration the contract allows (a capability gap, not a crash)."""

    backend: str
    call: str
    error: str
    condition: str = ""  # the known limit's condition, e.g. "hidden == 128" (backends.limits)


@dataclass(frozen=True)
class Raised:
    """What one call raised on one rank (``None`` fields: it did not raise)."""

    type: str | None
    message: str | None

    @classmethod
    def of(cls, exc: BaseException | None) -> Raised:
        """From a caught exception (or ``None`` when the call returned)."""
        return cls(None, None) if exc is None else cls(type(exc).__name__, str(exc))

    def __str__(self) -> str:
        return "returned normally" if self.type is None else f"{self.type}({self.message!r})"
