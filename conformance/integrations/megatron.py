"""Megatron-Core's ``megatron/core/transformer/moe/fused_a2a.py``, unchanged, as a plug-in backend.

``--backends megatron-fused-a2a`` (the entry point this package registers) or
``--backends conformance.integrations.megatron:MegatronFusedA2A``, with ``pip install megatron-core==0.16.1
--no-deps`` (plus numpy and packaging) next to the suite, and ``--deep-ep auto`` (the real DeepEP where it is
usable, else ``conformance.emulation`` under the name ``deep_ep``).

Everything goes through Megatron's public functions, as its ``MoEFlexTokenDispatcher`` calls them:

- dispatch: ``fused_dispatch(x, token_indices, token_probs, num_experts, group, async_finish,
  allocate_on_comm_stream)`` -> ``(recv_x, recv_token_indices, recv_token_probs, tokens_per_expert, handle)``;
  ``async_finish`` comes with ``allocate_on_comm_stream=True`` (the flex dispatcher's defaults), and Megatron
  then orders the dispatch after the current stream itself (``previous_event=EventOverlap(EventHandle())``);
- combine: ``fused_combine(x, group, handle, async_finish, allocate_on_comm_stream)`` -> ``(combined_x, None)``;
  it takes no ``topk_weights`` and no bias (capabilities ``combine_weights`` / ``combine_bias`` not declared);
- cached dispatch: Megatron exposes it only as the backward of ``fused_combine`` (``FusedCombine.backward`` is
  ``buffer.dispatch(grad, handle=handle)``), so it is driven exactly that way;
- autograd: ``fused_dispatch`` / ``fused_combine`` themselves (``FusedDispatch.backward`` = combine of the
  gradients with ``topk_weights=grad_token_probs``, ``FusedCombine.backward`` = cached dispatch).

Not declared, so reported ``unsupported`` (or ``not_checked``) with the reason: ``expert_alignment`` (the wrapper
passes none: DeepEP's default 1), ``combine_weights``, ``combine_bias``, ``layout`` (the layout stays inside
``fused_dispatch``).  V2 (``ElasticBuffer``) is not wrapped: no released Megatron-Core has a V2 path.

**Finding: fused_a2a does not import DeepEP 2.1.0.**  It guards its import of DeepEP with ``from deep_ep.utils import
EventHandle, EventOverlap``; DeepEP 2.1.0 (the EPv2 release) exports ``EventHandle`` only from ``deep_ep.utils``
(``EventOverlap`` moved to ``deep_ep.utils.event``; recorded on the real library, docs/real-runs/), so fused_a2a
sets ``HAVE_DEEP_EP = False`` and ``fused_dispatch`` is ``None``.  The plug-in ``megatron-fused-a2a`` reports
exactly that; ``megatron-fused-a2a-shimmed`` applies the one-line workaround an integrator would
(``deep_ep.utils.EventOverlap = deep_ep.utils.event.EventOverlap`` before Megatron imports) and checks the rest
of the wrapper, labelled as such in the report.
"""

from __future__ import annotations

import importlib
import importlib.util
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import torch

from conformance.backends.plugins import Dispatched, PluginBackend, PluginEnv

MODULE = "megatron.core.transformer.moe.fused_a2a"
#: The release the self-tests pin (the newest that installs on Python 3.11; its V1 code is the same up to 0.19.2).
TESTED_VERSION = "0.16.1"

if importlib.util.find_spec("megatron") is None:
    raise ImportError(f"megatron-core is not installed: pip install megatron-core=={TESTED_VERSION} --no-deps "
                      f"(and numpy, packaging)")
try:
    _VERSION = version("megatron-core")
except PackageNotFoundError:  # a source checkout on the path
    _VERSION = "unknown version"


def _event_overlap_import_error() -> str | None:
    """Why fused_a2a's guard ``from deep_ep.utils import EventHandle, EventOverlap`` fails, if it does."""
    try:
        utils = importlib.import_module("deep_ep.utils")
    except ImportError as exc:
        return f"import deep_ep.utils: {exc}"
    missing = [name for name in ("EventHandle", "EventOverlap") if not hasattr(utils, name)]
    return f"deep_ep.utils has no {', '.join(missing)} (ImportError)" if missing else None


class MegatronFusedA2A(PluginBackend):
    """Megatron-Core ``fused_a2a`` over ``deep_ep.Buffer`` (the V1 contract), exactly as installed."""

    api = "v1"
    capabilities = frozenset({"combine", "cached_dispatch", "autograd", "events"})
    description = (f"Megatron-Core {_VERSION} {MODULE}: fused_dispatch / fused_combine and their autograd, "
                   f"over deep_ep.Buffer")
    #: Apply the deep_ep.utils.EventOverlap workaround before Megatron imports (the ``-shimmed`` backend only).
    shim = False

    def __init__(self, env: PluginEnv) -> None:
        super().__init__(env)
        reason = _event_overlap_import_error()  # in the rank, after --deep-ep resolved deep_ep
        if reason is not None and self.shim:
            # The workaround lasts only while Megatron imports (it binds the names then): deep_ep.utils stays as the
            # library ships it for every other backend and property in this rank.
            utils, event = importlib.import_module("deep_ep.utils"), importlib.import_module("deep_ep.utils.event")
            utils.EventOverlap = event.EventOverlap
            try:
                self.fa: Any = importlib.import_module(MODULE)
                if not getattr(self.fa, "HAVE_DEEP_EP", False):
                    self.fa = importlib.reload(self.fa)  # imported earlier in this rank without the workaround
            finally:
                del utils.EventOverlap
        else:
            self.fa = importlib.import_module(MODULE)
        if not getattr(self.fa, "HAVE_DEEP_EP", False) or self.fa.fused_dispatch is None:
            if reason is not None:
                raise RuntimeError(
                    f"{MODULE} cannot use this deep_ep: its guard 'from deep_ep.utils import EventHandle, "
                    f"EventOverlap' fails ({reason}); DeepEP 2.1.0 exports EventOverlap from deep_ep.utils.event "
                    f"only, so fused_a2a sets HAVE_DEEP_EP = False. The backend megatron-fused-a2a-shimmed applies "
                    f"the one-line workaround and checks the rest of the wrapper")
            raise RuntimeError(f"{MODULE} found no deep_ep (HAVE_DEEP_EP is False): it binds fused_dispatch at import "
                               f"time; pass --deep-ep emulation (or auto), or install DeepEP")
        self.group = env.group

    # ------------------------------------------------------------------------------------ dispatch
    def dispatch_tokens(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, num_experts: int,
                        *, expert_alignment: int = 1, async_finish: bool = False, previous_event: bool = False
                        ) -> Dispatched:
        """``fused_dispatch`` (no autograd).  ``previous_event``: Megatron's async path captures the current stream
        itself, so an async dispatch is what orders it after prior compute."""
        overlap = async_finish or previous_event
        with torch.no_grad():
            recv_x, recv_idx, recv_probs, tokens_per_expert, handle = self.fa.fused_dispatch(
                x, topk_idx, topk_weights, num_experts, self.group, async_finish=overlap,
                allocate_on_comm_stream=overlap)
        return Dispatched(recv_x, recv_idx, recv_probs, [int(c) for c in tokens_per_expert.tolist()], handle)

    def autograd_dispatch(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, num_experts: int
                          ) -> tuple[torch.Tensor, torch.Tensor, Dispatched]:
        """``fused_dispatch`` with autograd: backward is Megatron's ``FusedDispatch.backward``."""
        recv_x, recv_idx, recv_probs, tokens_per_expert, handle = self.fa.fused_dispatch(
            x, topk_idx, topk_weights, num_experts, self.group)
        dispatched = Dispatched(recv_x.detach(), recv_idx, recv_probs.detach(),
                                [int(c) for c in tokens_per_expert.tolist()], handle)
        return recv_x, recv_probs, dispatched

    # ------------------------------------------------------------------------------------- combine
    def combine_tokens(self, dispatched: Dispatched, x: torch.Tensor, *, topk_weights: torch.Tensor | None = None,
                       bias: Any = None, async_finish: bool = False) -> torch.Tensor:
        """``fused_combine`` (no autograd); its second output is always ``None``."""
        with torch.no_grad():
            combined, second = self.fa.fused_combine(x, self.group, dispatched.handle, async_finish=async_finish,
                                                     allocate_on_comm_stream=async_finish)
        if second is not None:
            raise AssertionError(f"fused_combine's second output is {type(second).__name__}, expected None")
        return combined

    def autograd_combine(self, dispatched: Dispatched, x: torch.Tensor) -> torch.Tensor:
        """``fused_combine`` with autograd: backward is Megatron's ``FusedCombine.backward`` (a cached dispatch)."""
        return self.fa.fused_combine(x, self.group, dispatched.handle)[0]

    def cached_dispatch_tokens(self, dispatched: Dispatched, x: torch.Tensor) -> torch.Tensor:
        """The gradient of ``fused_combine`` for the upstream gradient ``x``: Megatron's cached dispatch."""
        rows = torch.zeros(dispatched.recv_x.shape[0], x.shape[1], dtype=x.dtype, device=x.device,
                           requires_grad=True)
        with torch.enable_grad():
            combined = self.fa.fused_combine(rows, self.group, dispatched.handle)[0]
            combined.backward(x.contiguous())
        assert rows.grad is not None
        return rows.grad

    def destroy(self) -> None:
        """Megatron keeps one module-global ``Buffer`` and never destroys it: drop it before the group goes."""
        self.fa._buffer = None


class MegatronFusedA2AShimmed(MegatronFusedA2A):
    """:class:`MegatronFusedA2A` with the workaround for DeepEP 2.1.0's ``deep_ep.utils`` (see the module doc)."""

    shim = True
    description = (f"Megatron-Core {_VERSION} {MODULE} with the workaround deep_ep.utils.EventOverlap = "
                   f"deep_ep.utils.event.EventOverlap (DeepEP 2.1.0 no longer exports it from deep_ep.utils): "
                   f"fused_dispatch / fused_combine and their autograd, over deep_ep.Buffer")
