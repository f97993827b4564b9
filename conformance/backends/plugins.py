"""Plug-in backends: your own dispatch/combine, checked against the oracle and side by side with DeepEP's APIs.

A plug-in is named on the command line as ``--backends my_pkg.ep:make_backend`` (any importable
``module:attribute``), or registered by an installed package under the entry-point group
``deepep_conformance.backends`` and named by its entry-point name.  The attribute is a *factory*: a callable
that gets a :class:`PluginEnv` and returns a :class:`~conformance.backends.contract.Backend`, and that carries
its declaration as attributes (:class:`BackendFactory`):

- ``api``: ``"v1"`` or ``"v2"``, the DeepEP contract the wrapper follows (``Buffer``-shaped or
  ``ElasticBuffer``-shaped); it decides which properties apply, and how, e.g. V1 weights at -1 slots;
- ``capabilities``: the names of :data:`conformance.core.spec.CAPABILITIES` it supports;
- ``description`` (optional): one line for the report; ``uses_deep_ep`` (optional, default true): whether it
  imports ``deep_ep`` (the report then says which deep_ep it saw, the real one or the emulation);
- ``family`` (optional, default the backend's name): the wrapper it is one path of: the report compares the V1 and
  V2 members of a family with each other;
- ``unavailable()`` (optional): a reason this plug-in cannot run here (read by the controller's probe: the run stops
  with that one line), or ``None``;
- ``wrapper_checks()`` (optional): what the wrapper itself checks to decide whether it drives DeepEP here, as
  ``{"checked": {name: value}, "drives_deep_ep": bool, "why": str}`` (Megatron: ``HAVE_DEEP_EP``,
  ``HAVE_DEEP_EP_V2``, whether ``fused_dispatch`` is ``None``).  Read by the same probe and kept in the report
  (``environment.backends[].wrapper``), so that the version gate can say "this wrapper drove DeepEP before the bump
  and silently does not now" with what it checked.  A wrapper that does not drive DeepEP still runs (its
  construction says why, and fails): the run tells, rather than stops.

A subclass of :class:`PluginBackend` is such a factory (class attributes, constructor taking the env); a
function can get the attributes from :func:`declare`.  The controller imports the module once in a fresh
interpreter to read the declaration (``python -m conformance.backends.plugins TARGET``); a target that does not
import, or declares nothing valid, stops the run with one line.  The ranks import it again and call it.

:class:`PluginBackend` lets a wrapper implement an integrator-shaped interface (``dispatch_tokens``,
``combine_tokens``, ...) and does the suite's side: the canonical view, the capability checks
(:class:`~conformance.backends.contract.NotSupported` for what the wrapper does not declare), and where each
received row came from (from the wrapper, or found with a cached dispatch of identity rows).
docs/integrators.md has a complete example.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Collection
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Protocol, runtime_checkable

import torch

from conformance.backends.contract import Backend, NotSupported, Raw
from conformance.backends.identity import decode_identity, identity_payload
from conformance.backends.results import counts_list, kind, tensors
from conformance.core.example import Example, RankInputs
from conformance.core.raisers import ApiViolation
from conformance.core.spec import APIS, BUILTIN_ONLY, ENTRY_POINT_GROUP, PLUGIN_CAPABILITIES, BackendSpec
from conformance.core.views import DispatchOptions, DispatchView, Layout, V1Layout, V2Layout, layout_of

__all__ = ["Backend", "BackendFactory", "Dispatched", "NotSupported", "PluginBackend", "PluginEnv", "declare",
           "load_factory", "declaration_of"]


@dataclass(frozen=True)
class PluginEnv:
    """What a plug-in factory gets in a rank process."""

    name: str  # the backend's name in the reports (what --backends said)
    rank: int
    world_size: int
    num_nodes: int
    group: Any  # torch.distributed.ProcessGroup of the EP world
    device: torch.device  # where this rank's tensors live (cpu with gloo, cuda with NCCL)
    deep_ep: ModuleType | None  # what ``import deep_ep`` gives in this process (the real library or the emulation)
    deep_ep_kind: str | None  # "real", "emulation", or None (deep_ep does not import)


@runtime_checkable
class BackendFactory(Protocol):
    """What ``--backends module:attribute`` must name: a declared callable returning a backend."""

    api: str
    capabilities: Collection[str]

    def __call__(self, env: PluginEnv) -> Backend: ...


def declare(*, api: str, capabilities: Collection[str], description: str = "", uses_deep_ep: bool = True,
            family: str = "") -> Any:
    """Decorator giving a factory function its declaration (see the module docstring)."""

    def mark(factory: Any) -> Any:
        factory.api = api
        factory.capabilities = frozenset(capabilities)
        factory.description = description
        factory.uses_deep_ep = uses_deep_ep
        factory.family = family
        return factory

    return mark


@dataclass
class Dispatched:
    """What a wrapper's dispatch returned, as :class:`PluginBackend` needs it.

    ``recv_topk_idx``: the API's convention (V1: local expert index or -1).  ``num_recv_tokens_per_expert``:
    per local expert.  ``src_rank`` / ``src_token``: where each received row came from, if the wrapper knows;
    otherwise :class:`PluginBackend` finds out with a cached dispatch of identity rows (capability
    ``cached_dispatch``).  ``extras``: the API's layout if the wrapper exposes it (capability ``layout``): a
    :class:`~conformance.core.views.V1Layout` / :class:`~conformance.core.views.V2Layout`, or a dict of their fields.
    ``state``: anything else combine needs.
    """

    recv_x: torch.Tensor
    recv_topk_idx: torch.Tensor
    recv_topk_weights: torch.Tensor
    num_recv_tokens_per_expert: list[int]
    handle: Any
    src_rank: torch.Tensor | None = None
    src_token: torch.Tensor | None = None
    extras: Layout | dict[str, Any] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)


class PluginBackend:
    """Base of a plug-in: implement the ``*_tokens`` methods your capabilities need; the rest is done here.

    Class attributes are the declaration (the class is its own factory: ``--backends my_pkg.ep:MyBackend``).
    """

    api: str = "v1"
    capabilities: Collection[str] = frozenset({"combine"})
    description: str = ""
    uses_deep_ep: bool = True
    #: Plug-ins of one family are one wrapper's paths (``megatron-fused-a2a-v1`` / ``-v2``): the report compares a
    #: family's V1 and V2 members with each other ("what changes for the wrapper's users").  Default: the name.
    family: str = ""

    def __init__(self, env: PluginEnv) -> None:
        self.env = env
        self.spec: BackendSpec = BackendSpec("plugin", self.api, target=env.name)

    @staticmethod
    def unavailable() -> str | None:
        """Why this plug-in cannot run here, found by the controller's probe before any rank starts (the run stops
        with that one line), or ``None``.  Override for a precondition a declaration cannot express (a wrapper whose
        installed version lacks the path this backend drives)."""
        return None

    # ------------------------------------------------------------------ what a plug-in implements
    def dispatch_tokens(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, num_experts: int,
                        *, expert_alignment: int = 1, async_finish: bool = False, previous_event: bool = False
                        ) -> Dispatched:
        """Dispatch this rank's tokens.  ``expert_alignment > 1`` comes only with the capability
        ``expert_alignment`` (else 1), ``async_finish`` / ``previous_event`` only with ``events`` (return results
        that are complete: wait on the event as your code does)."""
        raise NotImplementedError

    def combine_tokens(self, dispatched: Dispatched, x: torch.Tensor, *, topk_weights: torch.Tensor | None = None,
                       bias: Any = None, async_finish: bool = False) -> Any:
        """Combine expert outputs ``x``: the combined tensor, or ``(combined_x, combined_topk_weights)``."""
        raise NotImplementedError

    def cached_dispatch_tokens(self, dispatched: Dispatched, x: torch.Tensor) -> torch.Tensor:
        """Dispatch ``x`` through ``dispatched``'s handle (capability ``cached_dispatch``)."""
        raise NotImplementedError

    def autograd_dispatch(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, num_experts: int
                          ) -> tuple[torch.Tensor, torch.Tensor, Dispatched]:
        """Differentiable dispatch (capability ``autograd``): ``(recv_x, recv_topk_weights, dispatched)``."""
        raise NotImplementedError

    def autograd_combine(self, dispatched: Dispatched, x: torch.Tensor) -> torch.Tensor:
        """Differentiable combine (capability ``autograd``)."""
        raise NotImplementedError

    def teardown(self) -> None:
        """The wrapper's own end of a run, as its users call it before ``destroy_process_group()`` (P25 checks that
        the processes then exit cleanly).  Default: nothing, i.e. the wrapper offers no teardown."""

    def destroy(self) -> None:
        """The suite's clean-up of its persistent rank world (called before the process group goes away): release
        what the plug-in holds, even where the wrapper offers its users no way to."""

    # ------------------------------------------------------------------ the suite's side (Backend protocol)
    def _require(self, capability: str, what: str) -> None:
        if capability not in self.capabilities:
            raise NotSupported(f"{self.spec.name} does not declare the capability '{capability}' ({what})")

    def low_latency(self, inputs: RankInputs, example: Example, rank: int, world_size: int) -> dict[str, Any]:
        """Capability ``low_latency``: override with the calls of ``conformance.backends.low_latency.run`` (same
        result layout) to opt in."""
        self._require("low_latency", "low_latency_dispatch / low_latency_combine")
        raise NotSupported(f"{self.spec.name} declares 'low_latency' but does not override PluginBackend.low_latency")

    def low_latency_shrink(self, inputs: RankInputs, case: Any, rank: int, world_size: int) -> dict[str, Any]:
        """Capability ``shrink``: override with the calls of ``conformance.backends.low_latency.run_shrink`` (same
        result layout) to opt in."""
        self._require("shrink", "Buffer(enable_shrink=True) mask calls and masked low-latency calls")
        raise NotSupported(f"{self.spec.name} declares 'shrink' but does not override "
                           "PluginBackend.low_latency_shrink")

    def low_latency_clean(self, inputs: RankInputs, case: Any, rank: int, world_size: int) -> dict[str, Any]:
        """Capability ``ll_buffer``: override with the calls of ``conformance.backends.low_latency.run_clean`` (same
        result layout) to opt in."""
        self._require("ll_buffer", "clean_low_latency_buffer on the raw RDMA buffer")
        raise NotSupported(f"{self.spec.name} declares 'll_buffer' but does not override "
                           "PluginBackend.low_latency_clean")

    def fp8_dispatch(self, inputs: RankInputs, example: Example, x: torch.Tensor, scales: torch.Tensor,
                     **options: Any) -> dict[str, Any]:
        """Capabilities ``fp8`` / ``worst_case``: override (result layout of the built-in adapters' ``fp8_dispatch``)
        to opt in."""
        self._require("fp8", "dispatch of (x, scales) tuples")
        raise NotSupported(f"{self.spec.name} declares 'fp8' but does not override PluginBackend.fp8_dispatch")

    def describe_dispatch(self, example: Example, rank: int, options: DispatchOptions = DispatchOptions()) -> str:
        """The call, as failure messages show it."""
        t = example.tokens_per_rank[rank]
        flags = "".join(f", {name}=True" for name in ("async_finish", "previous_event") if getattr(options, name))
        return (f"{self.spec.name}: {type(self).__name__}.dispatch_tokens(x[{t},{example.hidden}] bf16, "
                f"topk_idx[{t},{example.num_topk}], topk_weights, num_experts={example.num_experts}"
                + (f", expert_alignment={example.expert_alignment}" if example.expert_alignment > 1 else "")
                + f"{flags}) on rank {rank}")

    def describe_combine(self, example: Example, rank: int) -> str:
        """The combine call, as failure messages show it."""
        return (f"{self.spec.name}: {type(self).__name__}.combine_tokens(x, handle, hidden={example.hidden}) "
                f"on rank {rank}")

    def _check_dispatch(self, example: Example, options: DispatchOptions) -> None:
        if options.do_expand:
            self._require("expand", "dispatch(do_expand=True)")
        if options.deterministic:
            self._require("deterministic", "a deterministic=True dispatch")
        if options.async_finish or options.previous_event:
            self._require("events", "async_finish / previous_event")
        self._unsupported_options(options.non_default(), stats=None, before_epilogue=None)

    #: The capability each V2 dispatch / buffer option belongs to.
    OPTION_CAPABILITIES = {"do_handle_copy": "dispatch_options", "do_zero_padding": "dispatch_options",
                           "stats": "dispatch_options", "do_cpu_sync": "worst_case",
                           "allow_multiple_reduction": "buffer_options",
                           "prefer_overlap_with_compute": "buffer_options",
                           "before_epilogue": "epilogue_events"}

    def _unsupported_options(self, options: dict[str, Any], **extra: Any) -> None:
        """Refuse (``NotSupported``) the V2 options ``dispatch_tokens`` / ``combine_tokens`` do not take: a plug-in
        that declares their capability overrides ``dispatch`` / ``combine`` (and ``capture``) to honour them."""
        given = {**options, **{name: value for name, value in extra.items() if value is not None}}
        for name in given:
            capability = self.OPTION_CAPABILITIES[name]
            self._require(capability, name)
            raise NotSupported(f"{self.spec.name} declares '{capability}' but PluginBackend's dispatch_tokens / "
                               f"combine_tokens take no {name}: override dispatch / combine to pass it")

    def capture(self) -> Any:
        """Capability ``epilogue_events``: override to return an event of your library (what ``before_epilogue``
        takes)."""
        self._require("epilogue_events", "capture()")
        raise NotSupported(f"{self.spec.name} declares 'epilogue_events' but does not override PluginBackend.capture")

    def alignment(self, example: Example) -> int:
        """The ``expert_alignment`` the wrapper gets: the example's with the capability ``expert_alignment``, else
        1 (DeepEP's default, what a wrapper that passes none applies; the view says so, and P2 checks its counts
        against it and lists the example's alignment as not checked)."""
        return example.expert_alignment if "expert_alignment" in self.capabilities else 1

    def identity_width(self, example: Example) -> int:
        """The row width of the identity rows the suite sends through :meth:`cached_dispatch_tokens` to find where
        received rows came from: one the wrapper's API takes for every call a cached dispatch may make (a wrapper
        such as Megatron's runs a combine first).  V1: the example's hidden; V2: the smallest multiple of 256 at
        least as wide (ElasticBuffer's combine JIT asserts ``hidden % 256 == 0``).  Override for other limits."""
        if self.api == "v2":
            return max(256, -(-example.hidden // 256) * 256)
        return max(example.hidden, 3)

    def sources(self, dispatched: Dispatched, example: Example, rank: int, x: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(src_rank, src_token)`` of every received row: what the wrapper said (``Dispatched.src_rank`` /
        ``src_token``), else what a V2 handle says (``EPHandle.recv_src_metadata``: column 0 is
        ``src_rank * num_max_tokens_per_rank + src_token``), else a cached dispatch of identity rows at
        :meth:`identity_width` (capability ``cached_dispatch``)."""
        if dispatched.src_rank is not None and dispatched.src_token is not None:
            return dispatched.src_rank, dispatched.src_token
        handle = dispatched.handle
        metadata, stride = getattr(handle, "recv_src_metadata", None), getattr(handle, "num_max_tokens_per_rank", None)
        if self.api == "v2" and isinstance(metadata, torch.Tensor) and stride:
            source = metadata[: dispatched.recv_x.shape[0], 0].to(torch.int64).cpu()
            return source // int(stride), source % int(stride)
        if "cached_dispatch" in self.capabilities:
            ident = identity_payload(x.shape[0], self.identity_width(example), rank, x)
            return decode_identity(self.cached_dispatch_tokens(dispatched, ident).detach().cpu())
        raise ApiViolation(f"{self.spec.name}: Dispatched must give src_rank/src_token, or the plug-in must declare "
                        f"'cached_dispatch' so that the suite can find where each received row came from")

    def _view(self, dispatched: Dispatched, example: Example, rank: int, options: DispatchOptions,
              x: torch.Tensor) -> DispatchView:
        call = self.describe_dispatch(example, rank, options)
        if not isinstance(dispatched, Dispatched):
            raise ApiViolation(f"{self.spec.name}: dispatch_tokens returned {kind(dispatched)}, a Dispatched expected "
                               f"[{call}]")
        tensors(call, recv_x=dispatched.recv_x, recv_topk_idx=dispatched.recv_topk_idx,
                recv_topk_weights=dispatched.recv_topk_weights)
        counts = counts_list(dispatched.num_recv_tokens_per_expert, call)
        src_rank, src_token = self.sources(dispatched, example, rank, x)
        return DispatchView(
            backend=self.spec.name,
            api=self.api,
            call=call,
            src_rank=src_rank.to(torch.int64).cpu(),
            src_token=src_token.to(torch.int64).cpu(),
            x=dispatched.recv_x.detach().cpu(),
            topk_idx=dispatched.recv_topk_idx.detach().to(torch.int64).cpu(),
            topk_weights=dispatched.recv_topk_weights.detach().cpu(),
            num_recv_tokens_per_expert=counts,
            layout=self._layout(dispatched),
            expert_alignment=self.alignment(example),
        )

    def _layout(self, dispatched: Dispatched) -> Layout | None:
        """The layout the wrapper exposes, typed (capability ``layout``), or ``None``."""
        if "layout" not in self.capabilities:
            return None
        given = dispatched.extras
        return given if isinstance(given, (V1Layout, V2Layout)) else layout_of(self.api, dict(given))

    @staticmethod
    def _raw(dispatched: Dispatched) -> Raw:
        return Raw(dispatched.recv_x, dispatched.recv_topk_weights, handle=dispatched.handle, dispatched=dispatched)

    def dispatch(self, inputs: RankInputs, example: Example, options: DispatchOptions, rank: int, *,
                 stats: torch.Tensor | None = None, before_epilogue: Any = None) -> tuple[DispatchView, Raw]:
        """See :class:`~conformance.backends.contract.Backend`."""
        self._check_dispatch(example, options)
        self._unsupported_options({}, stats=stats, before_epilogue=before_epilogue)
        dispatched = self.dispatch_tokens(inputs.x, inputs.topk_idx, inputs.topk_weights, example.num_experts,
                                          expert_alignment=self.alignment(example), async_finish=options.async_finish,
                                          previous_event=options.previous_event)
        return self._view(dispatched, example, rank, options, inputs.x), self._raw(dispatched)

    def combine(self, raw: Raw, x: torch.Tensor, topk_weights: torch.Tensor | None = None, bias: Any = None,
                async_finish: bool = False, *, before_epilogue: Any = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """See :class:`~conformance.backends.contract.Backend`."""
        self._require("combine", "combine")
        self._unsupported_options({}, before_epilogue=before_epilogue)
        if topk_weights is not None:
            self._require("combine_weights", "combine(topk_weights=...)")
        if bias is not None:
            self._require("combine_bias", "combine(bias=...)")
        if async_finish:
            self._require("events", "combine(async_finish=True)")
        out = self.combine_tokens(raw.dispatched, x, topk_weights=topk_weights, bias=bias, async_finish=async_finish)
        return (out[0], out[1]) if isinstance(out, tuple) else (out, None)

    def cached_dispatch(self, raw: Raw, x: torch.Tensor) -> torch.Tensor:
        """See :class:`~conformance.backends.contract.Backend`."""
        self._require("cached_dispatch", "a dispatch through the handle")
        return self.cached_dispatch_tokens(raw.dispatched, x)

    def fused_dispatch(self, inputs: RankInputs, example: Example, rank: int, x: torch.Tensor,
                       topk_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, Raw, DispatchView]:
        """See :class:`~conformance.backends.contract.Backend`."""
        self._require("autograd", "differentiable dispatch")
        self._check_dispatch(example, DispatchOptions())
        recv_x, recv_w, dispatched = self.autograd_dispatch(x, inputs.topk_idx, topk_weights, example.num_experts)
        view = self._view(dispatched, example, rank, DispatchOptions(), inputs.x)
        return recv_x, recv_w, self._raw(dispatched), view

    def fused_combine(self, raw: Raw, x: torch.Tensor) -> torch.Tensor:
        """See :class:`~conformance.backends.contract.Backend`."""
        self._require("autograd", "differentiable combine")
        return self.autograd_combine(raw.dispatched, x)


# ---------------------------------------------------------------------------------------- loading


def load_factory(target: str) -> Any:
    """The object ``target`` names: ``module:attr.path``, or an entry point's name in the plug-in group."""
    if ":" in target:
        module_name, _, attr = target.partition(":")
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
        return obj
    from importlib.metadata import entry_points

    found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == target]
    if not found:
        raise LookupError(f"no plug-in named {target!r} is installed (entry-point group {ENTRY_POINT_GROUP})")
    return found[0].load()


def source_of(target: str) -> str:
    """``module:attr`` behind ``target`` (an entry point's value, or the target itself)."""
    if ":" in target:
        return target
    from importlib.metadata import entry_points

    return next((ep.value for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == target), target)


def declaration_of(factory: Any, target: str) -> dict[str, Any]:
    """What ``factory`` declares, checked: ``api``, ``capabilities`` (sorted), ``description``, ``uses_deep_ep``.

    Raises ``TypeError`` naming what is missing or invalid."""
    api = getattr(factory, "api", None)
    capabilities = getattr(factory, "capabilities", None)
    if not callable(factory) or api is None or capabilities is None:
        raise TypeError(f"{target} is not a plug-in factory: it must be callable(env) -> backend and declare 'api' "
                        f"and 'capabilities' (subclass conformance.backends.plugins.PluginBackend, or decorate a "
                        f"function with conformance.backends.plugins.declare(...))")
    if api not in APIS:
        raise TypeError(f"{target} declares api={api!r}: it must be one of {', '.join(APIS)}")
    if isinstance(capabilities, str):
        raise TypeError(f"{target} declares capabilities={capabilities!r}: a collection of names is needed")
    unknown = sorted(set(capabilities) - set(PLUGIN_CAPABILITIES))
    if unknown:
        builtin = sorted(set(unknown) & BUILTIN_ONLY)
        raise TypeError(f"{target} declares unknown capabilities {unknown}; a plug-in may declare "
                        f"{', '.join(PLUGIN_CAPABILITIES)}"
                        + (f" ({', '.join(builtin)}: only the built-in adapters, whose checks drive the library's "
                           f"buffer directly)" if builtin else ""))
    unavailable = getattr(factory, "unavailable", None)
    reason = unavailable() if callable(unavailable) else None
    if reason:
        raise RuntimeError(reason)
    declaration = {"api": api, "capabilities": sorted(capabilities),
                   "description": getattr(factory, "description", "") or "",
                   "uses_deep_ep": bool(getattr(factory, "uses_deep_ep", True)), "source": source_of(target),
                   "family": str(getattr(factory, "family", "") or "")}
    checks = getattr(factory, "wrapper_checks", None)
    if callable(checks):
        declaration["wrapper"] = wrapper_state(checks, target)
    return declaration


def wrapper_state(checks: Any, target: str) -> dict[str, Any]:
    """``checks()`` (a plug-in's ``wrapper_checks``) as JSON: ``checked`` (values as ``repr``, ``None`` kept as
    ``None``), ``drives_deep_ep``, ``why``; ``TypeError`` naming what is wrong."""
    state = checks()
    if not isinstance(state, dict) or not isinstance(state.get("drives_deep_ep"), bool):
        raise TypeError(f"{target}.wrapper_checks() returned {state!r}: a dict with 'drives_deep_ep' (bool), "
                        f"'checked' ({{name: value}}) and 'why' is needed")
    checked = {str(k): (v if isinstance(v, bool | int | str) or v is None else repr(v))
               for k, v in dict(state.get("checked") or {}).items()}
    return {"checked": checked, "drives_deep_ep": state["drives_deep_ep"], "why": str(state.get("why") or "")}


def build(spec: BackendSpec, env: PluginEnv) -> Backend:
    """Call ``spec``'s factory in this rank process; check that what it returns is a backend of the declared API."""
    factory = load_factory(spec.target or "")
    backend = factory(env)
    if not isinstance(backend, Backend):
        missing = [name for name in ("dispatch", "combine", "cached_dispatch", "fused_dispatch", "fused_combine",
                                     "describe_combine", "destroy") if not callable(getattr(backend, name, None))]
        raise ApiViolation(f"{spec.name}: the factory returned {type(backend).__name__}, which is not a "
                        f"conformance backend (missing: {', '.join(missing) or 'spec/api'}); subclass "
                        f"conformance.backends.plugins.PluginBackend")
    backend.spec = spec
    if getattr(backend, "api", spec.api) != spec.api:
        raise ApiViolation(f"{spec.name}: the backend says api={backend.api!r}, its factory declared {spec.api!r}")
    return backend


def probe(target: str, deep_ep: str | None = None, mutant: str | None = None) -> dict[str, Any]:
    """Import ``target`` (with deep_ep resolved as ``deep_ep`` says and the run's ``mutant`` planted, as on the
    ranks) and read its declaration: ``{"importable": True, "api", "capabilities", ...}`` or ``{"importable": False,
    "error": ...}``."""
    try:
        if deep_ep:
            from conformance.backends.alias import use

            use(deep_ep)
        from conformance.mutants import activate

        with activate(mutant):  # what the wrapper checks at import is what the ranks' deep_ep offers
            return {"target": target, "importable": True, **declaration_of(load_factory(target), target)}
    except Exception as exc:
        return {"target": target, "importable": False, "error": f"{type(exc).__name__}: {exc}"}


#: The methods a class backend's class must have, per API, unless its instances provide them (a class with
#: ``__getattr__``): without them no property can drive it.  Every other call is probed on the instance at run time
#: (conformance/backends/public.py).
CLASS_METHODS = {"v1": ("get_dispatch_layout", "dispatch"), "v2": ("dispatch",)}


def class_declaration(cls: type, target: str, api: str) -> list[str] | None:
    """The capabilities ``cls`` declares (its ``conformance_capabilities``), checked, sorted; ``None``: it declares
    nothing (the suite probes its instance).  Raises ``TypeError`` naming what is invalid."""
    from conformance.core.spec import CAPABILITIES, CLASS_DECLARATION, CLASS_UNAVAILABLE

    declared = getattr(cls, CLASS_DECLARATION, None)
    if declared is None:
        return None
    if isinstance(declared, str) or not isinstance(declared, Collection):
        raise TypeError(f"{target} declares {CLASS_DECLARATION}={declared!r}: a collection of capability names is "
                        f"needed")
    unknown = sorted(set(declared) - set(CAPABILITIES))
    if unknown:
        raise TypeError(f"{target} declares unknown capabilities {unknown} in {CLASS_DECLARATION}; a class backend "
                        f"may declare {', '.join(sorted(set(CAPABILITIES) - set(CLASS_UNAVAILABLE[api])))}")
    unavailable = sorted(set(declared) & set(CLASS_UNAVAILABLE[api]))
    if unavailable:
        raise TypeError(f"{target} declares {', '.join(unavailable)} in {CLASS_DECLARATION}, which a class backend "
                        f"cannot have: " + "; ".join(CLASS_UNAVAILABLE[api][c] for c in unavailable))
    return sorted(str(c) for c in declared)


def probe_class(target: str, api: str, deep_ep: str | None = None) -> dict[str, Any]:
    """Import a class backend's class (``v1=`` / ``v2=`` ``target``) with deep_ep resolved as on the ranks and check
    it can be driven: ``{"importable": True, "library": bool, "description", "uses_deep_ep", "capabilities"}``
    (``library``: it is the real library's own class; ``capabilities``: what it declares, ``None`` when it declares
    nothing), or ``{"importable": False, "error": ...}``.  Methods its instances provide through ``__getattr__``
    count: only a class without ``__getattr__`` must have :data:`CLASS_METHODS` itself."""
    try:
        if deep_ep:
            from conformance.backends.alias import use

            use(deep_ep)
        cls = load_factory(target)
        if not isinstance(cls, type):
            raise TypeError(f"{target} is a {type(cls).__name__}, not a class with the {APIS[api]} API")
        forwards = callable(getattr(cls, "__getattr__", None))
        missing = [m for m in CLASS_METHODS[api] if not callable(getattr(cls, m, None))]
        if missing and not forwards:
            raise TypeError(f"{target} lacks {', '.join(missing)} of the {APIS[api]} API (on the class, and it has no "
                            f"__getattr__ through which its instances could provide them)")
        declared = class_declaration(cls, target, api)
        real = sys.modules.get("deep_ep")
        from conformance.backends.alias import is_emulation

        library = real is not None and not is_emulation(real) and getattr(real, APIS[api], None) is cls
        base = next((k for k in cls.__mro__[1:] if k.__name__ == APIS[api]), None)
        return {"target": target, "importable": True, "library": library, "uses_deep_ep": "deep_ep" in sys.modules,
                "capabilities": declared,
                "description": f"{cls.__module__}.{cls.__qualname__} in place of deep_ep.{APIS[api]}"
                               + (f" (a subclass of {base.__module__}.{base.__qualname__})" if base else "")}
    except Exception as exc:
        return {"target": target, "importable": False, "error": f"{type(exc).__name__}: {exc}"}


def probe_in_subprocess(target: str, deep_ep: str | None = None, timeout_s: float = 180.0,
                        api: str | None = None, mutant: str | None = None) -> dict[str, Any]:
    """:func:`probe` (or, with ``api``, :func:`probe_class`) in an interpreter of its own (an import that crashes or
    hangs cannot take the caller with it), forked from the controller's fork server
    (:mod:`conformance.serve.forkserver`: torch imported, ``deep_ep`` not)."""
    import subprocess

    from conformance.serve.forkserver import run_module

    args = ((["--class", api] if api else []) + (["--mutant", mutant] if mutant and not api else []) + [target]
            + ([deep_ep] if deep_ep else []))
    try:
        proc = run_module("conformance.backends.plugins", args, timeout_s=timeout_s)
    except subprocess.TimeoutExpired:
        return {"target": target, "importable": False, "error": f"import did not finish in {timeout_s:.0f} s"}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode == 0 and lines:
        return json.loads(lines[-1])
    tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
    return {"target": target, "importable": False,
            "error": f"importing {target} killed the interpreter (exit {proc.returncode}): {tail}"}


if __name__ == "__main__":
    if sys.argv[1] == "--class":
        print(json.dumps(probe_class(sys.argv[3], sys.argv[2], sys.argv[4] if len(sys.argv) > 4 else None)))
    else:
        argv = sys.argv[1:]
        planted = argv[1] if argv[0] == "--mutant" else None
        argv = argv[2:] if planted else argv
        print(json.dumps(probe(argv[0], argv[1] if len(argv) > 1 else None, planted)))
