"""What the ranks send back: canonical, order-free views of a backend's results, and what a call raised."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from conformance.core.raisers import ApiViolation, NotSupported, suite_frame


@dataclass(frozen=True)
class DispatchOptions:
    """How a dispatch is called (the example gives the data; these give the call)."""

    do_expand: bool = False
    deterministic: bool = False
    async_finish: bool = False
    previous_event: bool = False
    #: V2 dispatch options (capability ``dispatch_options``; ``do_cpu_sync=False``: ``worst_case``).
    #: ``do_handle_copy``: ``None`` leaves it to the library's default (2.1.0 copies ``topk_idx`` into the handle, 2.5.0
    #: refuses ``True``); ``True`` / ``False`` pass it
    do_handle_copy: bool | None = None
    do_zero_padding: bool = False
    do_cpu_sync: bool = True
    #: V2 buffer options (capability ``buffer_options``): the buffer the call runs on is built with them
    allow_multiple_reduction: bool = True
    prefer_overlap_with_compute: bool = True
    #: V1 only: dispatch (and combine through its handle) with an explicit ``config``, the library's own table entry
    #: for this world built with this SM count (``Buffer.set_num_sms`` then ``get_dispatch_config``); 0: no config
    v1_num_sms: int = 0

    def non_default(self) -> dict[str, bool | None]:
        """The V2 dispatch and buffer options that differ from the library's defaults (for call descriptions)."""
        defaults = DispatchOptions()
        names = ("do_handle_copy", "do_zero_padding", "do_cpu_sync", "allow_multiple_reduction",
                 "prefer_overlap_with_compute")
        return {name: getattr(self, name) for name in names if getattr(self, name) != getattr(defaults, name)}


@dataclass
class V1Layout:
    """What V1 says of a dispatch's layout on this rank: ``Buffer.get_dispatch_layout`` of its own ``topk_idx`` and
    the handle's channel count (one column of its channel prefix matrix per channel: ``config.num_sms // 2``)."""

    num_tokens_per_rank: torch.Tensor  # [num_ranks] int
    num_tokens_per_expert: torch.Tensor  # [num_experts] int
    is_token_in_rank: torch.Tensor  # [num_tokens, num_ranks] bool
    num_channels: int | None = None

    def fields(self) -> dict[str, Any]:
        """Every field by name (what a repeated or asynchronous dispatch must reproduce)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass
class V2Layout:
    """What V2's ``EPHandle`` says of a dispatch on this rank (counts, prefix sums, where each row came from) and the
    facts of the call a check reads (the SM count and buffer size it ran with, whether the handle kept the caller's
    own ``topk_idx``)."""

    num_unaligned_recv_tokens_per_expert: torch.Tensor  # [local experts] int
    psum_num_recv_tokens_per_expert: torch.Tensor  # [local experts] int, inclusive, aligned
    psum_num_recv_tokens_per_scaleup_rank: torch.Tensor  # [scale-up peers] int, inclusive
    num_recv_tokens: int
    recv_src_metadata: torch.Tensor  # [rows, 2 + num_topk] int: (source token id, source rank id, slots...)
    num_sms: int | None = None
    num_bytes: int | None = None
    #: ``do_handle_copy=False`` keeps the caller's ``topk_idx`` in the handle (deep_ep/buffers/elastic.py:1005)
    handle_topk_idx_is_input: bool | None = None

    def fields(self) -> dict[str, Any]:
        """Every field by name (what a repeated or asynchronous dispatch must reproduce; ``recv_src_metadata`` has
        one row per received row)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


Layout = V1Layout | V2Layout


def layout_of(api: str, fields: dict[str, Any]) -> Layout:
    """A plug-in's layout fields (``Dispatched.extras``, capability ``layout``) as the layout type of its API; a
    missing or unknown field is a ``TypeError`` naming it."""
    cls = V2Layout if api == "v2" else V1Layout
    try:
        return cls(**fields)
    except TypeError as exc:
        raise TypeError(f"the layout fields of a {api} backend are {', '.join(cls.__dataclass_fields__)} "
                        f"({cls.__name__}); got {', '.join(fields) or 'none'}: {exc}") from None


@dataclass
class DispatchView:
    """One rank's dispatch result, rows identified by source (rank, token) instead of by position.

    ``x``, ``topk_idx`` and ``topk_weights`` are the raw received rows (CPU copies); ``src_rank`` /
    ``src_token`` say where each row came from.  ``layout`` holds what the API says of the layout (V1's
    ``get_dispatch_layout``, V2's handle prefix sums) for the properties that look at it: ``None`` for a plug-in
    that does not expose it (capability ``layout``).
    """

    backend: str
    call: str  # e.g. "ElasticBuffer.dispatch(x, topk_idx, topk_weights, num_experts=8, ...)"
    src_rank: torch.Tensor  # [N] int64
    src_token: torch.Tensor  # [N] int64
    x: torch.Tensor  # [N, hidden] bfloat16
    topk_idx: torch.Tensor  # [N, num_topk] int64, local expert or -1
    topk_weights: torch.Tensor  # [N, num_topk] float32
    num_recv_tokens_per_expert: list[int]
    layout: Layout | None = None
    api: str = ""  # "v1" / "v2": the contract the backend follows (empty: read from a built-in backend's name)
    #: The expert_alignment the backend applied, when not the example's (a wrapper that takes none applies 1).
    expert_alignment: int | None = None


def v1_layout(view: DispatchView) -> V1Layout:
    """V1's layout of ``view`` (a V1 backend's view; else an ``AssertionError`` naming the call)."""
    if not isinstance(view.layout, V1Layout):
        raise AssertionError(f"{view.backend} gave no V1 layout (get_dispatch_layout) but "
                             f"{type(view.layout).__name__} [{view.call}]")
    return view.layout


def v2_layout(view: DispatchView) -> V2Layout:
    """The V2 handle's layout of ``view`` (a V2 backend's view; else an ``AssertionError`` naming the call)."""
    if not isinstance(view.layout, V2Layout):
        raise AssertionError(f"{view.backend} gave no V2 handle layout (prefix sums, recv_src_metadata) but "
                             f"{type(view.layout).__name__} [{view.call}]")
    return view.layout


@dataclass(frozen=True)
class Raised:
    """What one call raised on one rank (``None`` fields: it did not raise); ``side_effect``: what the call left
    behind in the calling thread besides (e.g. its current CUDA stream switched), ``None`` when nothing."""

    type: str | None
    message: str | None
    side_effect: str | None = None

    @classmethod
    def of(cls, exc: BaseException | None) -> Raised:
        """From a caught exception (or ``None`` when the call returned).  Only what a backend raised is an outcome:
        a :class:`~conformance.core.raisers.NotSupported`, an :class:`~conformance.core.raisers.ApiViolation` (a
        result that broke the API: a failure) or an exception the suite's own code raised
        (:func:`~conformance.core.raisers.suite_frame`) is raised again, never recorded as a refusal."""
        if exc is None:
            return cls(None, None)
        if isinstance(exc, NotSupported | ApiViolation) or suite_frame(exc) is not None:
            raise exc
        return cls(type(exc).__name__, str(exc))

    def __str__(self) -> str:
        return "returned normally" if self.type is None else f"{self.type}({self.message!r})"
