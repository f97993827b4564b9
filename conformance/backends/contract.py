"""The contract every backend implements: the built-in ``Buffer`` / ``ElasticBuffer`` adapters and plug-ins.

A backend drives one DeepEP-like API inside a rank process, the way integrators call it, and returns
canonical views (:class:`~conformance.core.views.DispatchView`) plus the raw results a later combine or cached
dispatch needs (the handle).  Rank tasks only call the methods of :class:`Backend`.

What a backend supports is declared, not discovered: ``spec.capabilities`` (see
:data:`conformance.core.spec.CAPABILITIES`).  A property that needs a capability the backend does not declare
is reported ``unsupported`` for it before anything runs.  A configuration the backend cannot handle at run
time is refused by raising :class:`NotSupported` with the reason: the rank task turns it into that backend's
:class:`~conformance.core.outcomes.NotChecked` result, which the report lists as ``unsupported`` with the
reason and the example (never a failure, never a silent pass).  Any other exception is a failure.

Plug-ins usually subclass :class:`conformance.backends.plugins.PluginBackend`, which implements this
protocol on top of a smaller, integrator-shaped one.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Protocol, runtime_checkable

import torch

from conformance.backends.results import Raw
from conformance.core.example import Example, RankInputs
from conformance.core.raisers import ApiViolation, NotSupported
from conformance.core.spec import BackendSpec
from conformance.core.views import DispatchOptions, DispatchView

__all__ = ["AdapterBase", "ApiViolation", "Backend", "NotSupported", "Raw", "current_stream_wait"]


@runtime_checkable
class Backend(Protocol):
    """One backend in one rank process."""

    spec: BackendSpec
    api: str  # "v1" or "v2": the API contract the backend follows (e.g. expand mode and the QP cap are V2's)

    def dispatch(self, inputs: RankInputs, example: Example, options: DispatchOptions, rank: int, *,
                 stats: torch.Tensor | None = None, before_epilogue: Any = None) -> tuple[DispatchView, Raw]:
        """Dispatch this rank's ``inputs`` of ``example`` (``options``: async, previous_event, expand, the V2
        dispatch and buffer options, ...).  ``stats``: an int32 ``[num_local_experts]`` tensor the call adds its
        per-local-expert receipts to (``cumulative_local_expert_recv_stats``, capability ``dispatch_options``);
        ``before_epilogue``: an event of :meth:`capture` the call's epilogue waits for
        (``previous_event_before_epilogue``, capability ``epilogue_events``).  Tasks pass both only to backends
        declaring the capability."""
        ...

    def combine(self, raw: Raw, x: torch.Tensor, topk_weights: torch.Tensor | None = None,
                bias: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None = None, async_finish: bool = False, *,
                before_epilogue: Any = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Combine expert outputs ``x`` (rows as received) back to their source tokens (capability ``combine``;
        ``before_epilogue``: as for :meth:`dispatch`, the reduce epilogue waits for it)."""
        ...

    # Optional: ``capture() -> event``, an event on the current stream of the backend's own kind (capability
    # ``epilogue_events``: what ``before_epilogue`` takes).

    def cached_dispatch(self, raw: Raw, x: torch.Tensor) -> torch.Tensor:
        """Dispatch ``x`` through the handle in ``raw`` (capability ``cached_dispatch``)."""
        ...

    def fused_dispatch(self, inputs: RankInputs, example: Example, rank: int, x: torch.Tensor,
                       topk_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, Raw, DispatchView]:
        """Differentiable dispatch of ``x`` / ``topk_weights`` (leaves with ``requires_grad``): ``(recv_x,
        recv_topk_weights, raw, view)``; backward = combine of the gradients (capability ``autograd``)."""
        ...

    def fused_combine(self, raw: Raw, x: torch.Tensor) -> torch.Tensor:
        """Differentiable combine of ``x``; backward = cached dispatch of the gradient (capability ``autograd``)."""
        ...

    def describe_combine(self, example: Example, rank: int) -> str:
        """The combine call, as failure messages show it."""
        ...

    # Optional: ``reduction_group(raw) -> int | None``, the library's reduction tree for the combine of ``raw``:
    # how many consecutive ranks' contributions are summed in float32 and rounded to the payload dtype before
    # the last level (the ranks of one node; the group size when combine rounds once).  With it, the checks
    # predict combine's bytes wherever the float32 sums are exact; without it (or ``None``) they use the
    # error bound only.  (It describes one contribution per rank, as a non-expand combine has; V2 expand mode
    # with allow_multiple_reduction adds a per-rank level first: P21 holds the backend to the source's tree.)

    def destroy(self) -> None:
        """Release the buffers (before the process group goes away)."""
        ...


def current_stream_wait(event: Any, recv_x: Any) -> None:
    """The default wait of an async call's ``EventOverlap`` (``recv_x``: its output, for waits that look at it)."""
    event.current_stream_wait()


class AdapterBase:
    """What the built-in adapters hold: their backend, the deep_ep-like module, the process group, the node count.

    The autograd methods use the suite's own Megatron-shaped wrappers (:mod:`conformance.backends.autograd`).
    """

    api = ""
    #: Whether the buffers are built with ``explicitly_destroy=True`` and released by :meth:`destroy` (the suite's
    #: way); ``False``: built as a user who never destroys them builds them, left to the garbage collector (P25).
    explicitly_destroy = True

    def __init__(self, spec: BackendSpec, module: ModuleType, group: Any, num_nodes: int) -> None:
        self.spec = spec
        self.module = module
        self.group = group
        self.num_nodes = num_nodes

    def fused_dispatch(self, inputs: RankInputs, example: Example, rank: int, x: torch.Tensor,
                       topk_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, Raw, DispatchView]:
        """``FusedDispatch`` over this adapter (see :class:`Backend`)."""
        from conformance.backends.autograd import FusedDispatch

        keep = _KeepView(self)
        state: dict[str, Any] = {}
        recv_x, recv_w = FusedDispatch.apply(x, topk_weights, keep, inputs.topk_idx, example, rank, state)
        assert keep.view is not None
        return recv_x, recv_w, state["raw"], keep.view

    def fused_combine(self, raw: Raw, x: torch.Tensor) -> torch.Tensor:
        """``FusedCombine`` over this adapter (see :class:`Backend`)."""
        from conformance.backends.autograd import FusedCombine

        return FusedCombine.apply(x, self, raw)

    def graph_capture(self, step: Any, static: list[torch.Tensor]) -> Any:
        """``step(*static)`` captured in a CUDA graph (``.outputs``, ``.replay()``): a real backend on a GPU only,
        :class:`NotSupported` otherwise (:mod:`conformance.backends.graphs`)."""
        graphs_supported(self, static[0].device)
        from conformance.backends.graphs import CudaGraph

        return CudaGraph(step, static)

    def build_inside_capture(self, build: Any, device: torch.device) -> BaseException | None:
        """``build()`` inside a CUDA-graph capture: what it raised, ``None`` when it built (a real backend on a GPU
        only, :class:`NotSupported` otherwise)."""
        graphs_supported(self, device)
        from conformance.backends.graphs import build_inside_capture

        return build_inside_capture(build, device)


#: Why P29 (CUDA graphs) is unsupported where it is.
GRAPHS_ON_CPU = "CUDA graphs need a GPU (this run's device is the CPU)"
GRAPHS_EMULATED = ("the emulation models no CUDA-graph capture (its calls synchronise with the host); P29 runs on "
                   "the real library on a GPU")


def graphs_supported(adapter: AdapterBase, device: torch.device) -> None:
    """Raise :class:`NotSupported` unless ``adapter`` is a real backend on a GPU."""
    if device.type != "cuda":
        raise NotSupported(GRAPHS_ON_CPU)
    if not adapter.spec.real:
        raise NotSupported(GRAPHS_EMULATED)


class _KeepView:
    """Forwards to an adapter and keeps the view of its last dispatch (``FusedDispatch`` drops it)."""

    def __init__(self, adapter: Any) -> None:
        self.adapter = adapter
        self.view: DispatchView | None = None

    def dispatch(self, *args: Any, **kwargs: Any) -> tuple[DispatchView, Raw]:
        self.view, raw = self.adapter.dispatch(*args, **kwargs)
        return self.view, raw

    def __getattr__(self, name: str) -> Any:
        return getattr(self.adapter, name)
