"""Naming and selecting backends: the built-in ``{emulated,real}-{v1,v2}`` and plug-ins.

A plug-in is an integrator's own dispatch/combine (Megatron-Core's ``fused_a2a``, a serving stack's wrapper)
checked like the built-in adapters.  ``--backends`` names it as ``package.module:factory`` or by the name of an
entry point in the group :data:`ENTRY_POINT_GROUP`; the controller imports it once (in a subprocess, see
:mod:`conformance.backends.plugins`) to read what it declares: the API contract it follows (``v1`` or ``v2``)
and its :data:`CAPABILITIES`.  The resolved :class:`BackendSpec` travels to the ranks whole (pickled), where
the factory is imported again and called.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum

from conformance import versions

APIS = {"v1": "Buffer", "v2": "ElasticBuffer"}
IMPLS = ("emulated", "real")
#: ``impl`` of a plug-in backend.
PLUGIN = "plugin"
#: ``impl`` of a class backend: ``--backends v1=pkg.mod:Class`` / ``v2=pkg.mod:Class``, a class with the ``Buffer`` /
#: ``ElasticBuffer`` API driven by the built-in adapters in place of the library's (a V1-compat shim, a fork).
CLASS = "class"
#: The entry-point group an installed package registers its plug-in backends in.
ENTRY_POINT_GROUP = "deepep_conformance.backends"


class Capability(str, Enum):
    """What a backend can declare: a property that needs a capability the backend lacks reports it ``unsupported``,
    with the reason; an optional part of a check it lacks is listed under ``not_checked``.  Never a failure, never a
    silent pass.  A member is its own name (``Capability.combine == "combine"``, and hashes as that string), so the
    strings plug-ins declare and the members mix in sets and dict keys."""

    combine = "combine"
    combine_weights = "combine_weights"
    combine_bias = "combine_bias"
    expert_alignment = "expert_alignment"
    cached_dispatch = "cached_dispatch"
    autograd = "autograd"
    events = "events"
    layout = "layout"
    expand = "expand"
    deterministic = "deterministic"
    qp_cap = "qp_cap"
    bad_input = "bad_input"
    api_surface = "api_surface"
    fp8 = "fp8"
    worst_case = "worst_case"
    low_latency = "low_latency"
    shrink = "shrink"
    ll_buffer = "ll_buffer"
    dispatch_options = "dispatch_options"
    buffer_options = "buffer_options"
    epilogue_events = "epilogue_events"
    fresh_groups = "fresh_groups"
    cuda_graphs = "cuda_graphs"
    lifecycle = "lifecycle"

    def __str__(self) -> str:
        return self.value


def caps(*names: str) -> frozenset[Capability]:
    """The capabilities ``names`` (an unknown name is a ``ValueError`` at import)."""
    return frozenset(Capability(name) for name in names)

#: What each :class:`Capability` promises (the docs and the reasons of ``unsupported`` verdicts quote it).
_PROMISES: dict[str, str] = {
    "combine": "combine(expert outputs, handle): the rows go back to their source tokens, summed (P5, P6)",
    "combine_weights": "combine takes topk_weights and returns the combined weights (P5, P9, P10)",
    "combine_bias": "combine adds one or two bias tensors (P5 cases with num_bias > 0)",
    "expert_alignment": "dispatch honours expert_alignment > 1 (examples drawn with it)",
    "cached_dispatch": "a dispatch through the handle of an earlier one: same layout, new payload (P7, P9)",
    "autograd": "differentiable dispatch / combine: backward = combine / cached dispatch (P9)",
    "events": "async_finish with a wait, and previous_event ordering after prior compute (P10)",
    "layout": "the API's layout outputs (DispatchView.layout): V1 get_dispatch_layout, V2 handle prefix sums (P2)",
    "expand": "V2 do_expand=True layout (P8)",
    "deterministic": "V2 deterministic=True buffers (P13)",
    "qp_cap": "V2 QP budget, SM reuse and the pinned num_max_tokens_per_rank (P11)",
    "bad_input": "bad calls made on the library's buffer directly: refused on every rank, buffer still usable (P12)",
    "api_surface": "the deep_ep module's own API surface against the snapshot (P14)",
    "fp8": "dispatch of (float8_e4m3fn x, float32 scales) tuples: bytes and scale rows move with their token (P18)",
    "worst_case": "host-sync-free dispatch: V1 num_worst_tokens, V2 do_cpu_sync=False worst-case shapes (P19)",
    "low_latency": "V1 low_latency_dispatch / low_latency_combine: FP8 cast, UE8M0, LogFMT, zero-copy, out=, "
                   "receive hooks, statistics and wait costs (P15, P16, P17)",
    "shrink": "V1 Buffer(enable_shrink=True): low_latency_update/query/clean_mask_buffer; low-latency dispatch and "
              "combine leave masked ranks out (P23)",
    "ll_buffer": "V1 clean_low_latency_buffer and the raw RDMA buffer (get_local_buffer_tensor(use_rdma_buffer=True)): "
                 "what a clean zeroes, the calls after it (P24)",
    "dispatch_options": "V2 dispatch options do_handle_copy, do_zero_padding and cumulative_local_expert_recv_stats "
                        "(DispatchOptions fields, dispatch(stats=...)) (P20)",
    "buffer_options": "V2 buffers built with allow_multiple_reduction / prefer_overlap_with_compute (DispatchOptions "
                      "fields): combine through the reduction tree they select (P21)",
    "epilogue_events": "V2 previous_event_before_epilogue on dispatch and combine (dispatch/combine(before_epilogue="
                       "capture())): the epilogue waits for the event's work (P22)",
    "fresh_groups": "buffers built on process groups the suite makes fresh (dist.new_group, no collective run on them; "
                    "on a GPU also a lazily initialised NCCL group and a gloo group) (P27)",
    "lifecycle": "the suite builds the buffer class itself and drives it through call sequences: re-creation, "
                 "destroy, a use of a destroyed buffer (P30)",
    "cuda_graphs": "host-sync-free dispatch (V1 num_worst_tokens, V2 do_cpu_sync=False) and combine captured in a "
                   "torch.cuda.CUDAGraph and replayed on new inputs, and a buffer built inside a capture; GPU only "
                   "(P29)",
}
CAPABILITIES: dict[Capability, str] = {Capability(name): text for name, text in _PROMISES.items()}
assert set(CAPABILITIES) == set(Capability), "every capability says what it promises"
#: Capabilities only the built-in adapters can have: their checks drive the library's buffer or module directly.
BUILTIN_ONLY = caps("qp_cap", "bad_input", "api_surface", "fresh_groups", "cuda_graphs", "lifecycle")
#: What a plug-in may declare.
PLUGIN_CAPABILITIES: dict[str, str] = {name: text for name, text in CAPABILITIES.items() if name not in BUILTIN_ONLY}
_COMMON = caps("combine", "combine_weights", "combine_bias", "expert_alignment", "cached_dispatch", "autograd",
               "events", "layout", "bad_input", "api_surface", "fresh_groups", "cuda_graphs", "lifecycle")
#: What the built-in adapters declare.
BUILTIN_CAPABILITIES: dict[str, frozenset[str]] = {
    "v1": _COMMON | caps("fp8", "worst_case", "low_latency", "shrink", "ll_buffer"),
    "v2": _COMMON | caps("expand", "deterministic", "qp_cap", "fp8", "worst_case", "dispatch_options", "buffer_options",
                         "epilogue_events"),
}
#: What a class backend (``v1=`` / ``v2=``) cannot have, and why: the checks of these capabilities read what only the
#: library's internals give (its module's own surface, the low-latency handle's layout, the raw RDMA buffer, the V1
#: handle's tensors), and a class backend is judged through its public API only.
CLASS_UNAVAILABLE: dict[str, dict[str, str]] = {
    api: {
        "api_surface": "P14 reads the deep_ep module's own surface, which a substituted class is not",
        **({"low_latency": "the low-latency checks read the handle's src_info / layout_range, and a class backend's "
                           "handle is opaque (judged through its public API only)",
            "shrink": "the shrink-mode checks read the low-latency handle's src_info / layout_range (internals)",
            "ll_buffer": "the clean checks read the library's raw RDMA buffer layout (internals)",
            "cuda_graphs": "the V1 graph step reads the intranode handle's rank_prefix_matrix / recv_src_idx "
                           "(internals)"} if api == "v1" else {}),
    }
    for api in APIS
}
#: What a class backend has only when it declares it: P12's rows are DeepEP 2.1.0's own refusals (the refusal
#: table); a class that declares ``bad_input`` is held to their exception types (never to their messages).
CLASS_DECLARED_ONLY: dict[str, str] = {
    "bad_input": "P12's bad calls are one DeepEP build's own refusals (the refusal table): a class backend is held to "
                 "them only when it declares 'bad_input' in conformance_capabilities",
}
#: What a class backend may declare (``conformance_capabilities``), per API; without a declaration it gets these but
#: :data:`CLASS_DECLARED_ONLY`, and the suite probes its instance at run time (conformance/backends/public.py).
CLASS_CAPABILITIES: dict[str, frozenset[str]] = {
    api: frozenset(c for c in BUILTIN_CAPABILITIES[api] if c not in CLASS_UNAVAILABLE[api]) for api in APIS}
#: The attribute of a class backend's class that declares what it implements (a collection of capability names;
#: ``None`` or absent: probe the instance).
CLASS_DECLARATION = "conformance_capabilities"
#: Which deep_ep a backend drives: the real library, the emulation, or none (a plug-in that does not use it).
DEEP_EP_KINDS = ("real", "emulation")


@dataclass(frozen=True)
class BackendSpec:
    """One backend: an API (``v1`` = ``deep_ep.Buffer``, ``v2`` = ``deep_ep.ElasticBuffer``) of one implementation.

    Built-in: ``impl`` is ``emulated`` or ``real``.  Plug-in: ``impl`` is :data:`PLUGIN`, ``target`` is what
    ``--backends`` named (``pkg.mod:factory`` or an entry-point name), ``api`` the API contract it declares it
    follows, ``capabilities`` what it declares it supports, ``deep_ep`` which deep_ep it sees in the ranks
    (``real``, ``emulation``, or ``None`` when it does not use deep_ep).
    """

    impl: str  # "emulated" | "real" | "plugin"
    api: str  # "v1" | "v2"
    target: str | None = None
    declared: frozenset[str] | None = field(default=None, compare=False)
    description: str = field(default="", compare=False)
    deep_ep: str | None = field(default=None, compare=False)
    source: str = field(default="", compare=False)  # plug-in: where the factory was found (module:attr)
    family: str = field(default="", compare=False)  # plug-in: the wrapper it is one path of (default: its name)
    library: bool = field(default=False, compare=False)  # class backend: the class is the real library's own
    #: The DeepEP version whose contract the backend is driven by (``conformance.versions``): the emulation's for an
    #: emulated backend, the real ``deep_ep``'s for a real one, the resolved ``deep_ep``'s for a plug-in or a class
    #: backend; ``None``: the default version's.
    version: str | None = field(default=None, compare=False)

    @property
    def contract(self) -> versions.Contract:
        """The contract of :attr:`version` (:mod:`conformance.versions`)."""
        return versions.contract(self.version)

    @property
    def removed(self) -> str | None:
        """Why this backend's API does not exist in its version (a built-in backend of an API the version removed,
        e.g. ``emulated-v1`` on DeepEP 2.5.0: ``unsupported`` for every property, said once), else ``None``."""
        if self.plugin or self.substitute:
            return None
        why = self.contract.api_removed(self.api)
        return f"{why}" if why else None

    @property
    def name(self) -> str:
        """``impl-api`` (e.g. ``emulated-v2``), a plug-in's target as given to ``--backends``, or a class backend's
        ``api=target`` (``v2=pkg.mod:Class``)."""
        if self.impl == CLASS:
            return f"{self.api}={self.target}"
        return self.target if self.impl == PLUGIN and self.target else f"{self.impl}-{self.api}"

    @property
    def plugin(self) -> bool:
        """Whether this is a plug-in backend."""
        return self.impl == PLUGIN

    @property
    def substitute(self) -> bool:
        """Whether this is a class backend (``v1=pkg.mod:Class``: the built-in adapters over another class)."""
        return self.impl == CLASS

    @property
    def real(self) -> bool:
        """Whether this backend runs on the real ``deep_ep`` (a plug-in: when the deep_ep it sees is real; a class
        backend: only when its class is the real library's own)."""
        return self.impl == "real" or (self.plugin and self.deep_ep == "real") or (self.substitute and self.library)

    @property
    def class_name(self) -> str:
        """The deep_ep class whose contract this backend follows: its API's class in its version (``EPBuffer`` for
        V2 on DeepEP 2.5.0), the API's original name where the version removed the API."""
        return self.contract.class_name(self.api) or APIS[self.api]

    @property
    def capabilities(self) -> frozenset[str]:
        """What this backend supports (declared by a plug-in; every capability of its API for a built-in)."""
        if self.plugin:
            return self.declared or frozenset()
        if self.substitute:  # declared (conformance_capabilities), else probed at run time (CLASS_CAPABILITIES)
            allowed = CLASS_CAPABILITIES[self.api]
            if self.declared is not None:
                found = frozenset(self.declared) & allowed
            else:
                found = frozenset(c for c in allowed if c not in CLASS_DECLARED_ONLY)
        else:
            found = BUILTIN_CAPABILITIES[self.api]
        return frozenset(c for c in found if not self.contract.capability_lost(c))  # the version's removals

    def why_lacks(self, capability: str) -> str | None:
        """Why this backend does not have ``capability`` where more than "it does not declare it" is to be said (a
        class backend: the capability reads internals, is declared-only, or is left out of its declaration)."""
        if not self.substitute or capability in self.capabilities:
            return None
        if capability in CLASS_UNAVAILABLE[self.api]:
            return f"not offered to class backends: {CLASS_UNAVAILABLE[self.api][capability]}"
        if self.declared is not None:
            return f"not in {self.target}'s {CLASS_DECLARATION}"
        return CLASS_DECLARED_ONLY.get(capability)

    def has(self, capability: str) -> bool:
        """Whether the backend declares ``capability``."""
        return capability in self.capabilities

    def lacks(self, needs: Iterable[str]) -> list[str]:
        """The capabilities of ``needs`` this backend does not declare."""
        return [need for need in needs if need not in self.capabilities]

    def version_excludes(self, needs: Iterable[str]) -> str | None:
        """Why this backend's DeepEP version excludes a property of its API that needs ``needs``: the version removed
        the API (:attr:`removed`) or a capability the property needs (the contract's reason), else ``None``."""
        if self.removed:
            return f"{self.name}: {self.removed}"
        if self.plugin:
            return None
        lost = [why for need in needs if (why := self.contract.capability_lost(need))]
        return f"{self.name}: " + "; ".join(dict.fromkeys(lost)) if lost else None

    @classmethod
    def parse(cls, text: str) -> BackendSpec:
        """Parse ``emulated-v1`` style names; raise ``ValueError`` naming the valid choices."""
        impl, _, api = text.strip().partition("-")
        if impl not in IMPLS or api not in APIS:
            raise ValueError(
                f"unknown backend {text!r}: expected one of "
                + ", ".join(f"{i}-{a}" for i in IMPLS for a in APIS)
                + " (or 'auto', 'emulated', 'real'), a plug-in 'package.module:factory', the name of an "
                f"installed plug-in (entry-point group {ENTRY_POINT_GROUP}), or a class backend "
                "'v1=package.module:Class' / 'v2=package.module:Class'"
            )
        return cls(impl, api)


def is_builtin_name(name: str) -> bool:
    """Whether ``name`` is a built-in backend's (``emulated-v1``, ``real-v2``): the real library's own backends (and
    its model), the only ones held to the library's exact refusal messages."""
    impl, _, api = name.partition("-")
    return impl in IMPLS and api in APIS


def unresolved_plugin(target: str) -> BackendSpec:
    """A plug-in spec before its declaration is read (``api`` empty)."""
    return BackendSpec(PLUGIN, "", target=target)


def resolve_plugin(spec: BackendSpec, declaration: Mapping[str, object], deep_ep: str | None) -> BackendSpec:
    """``spec`` with what the plug-in declared (``api``, ``capabilities``, ``description``, ``uses_deep_ep``)."""
    uses = bool(declaration.get("uses_deep_ep", True))
    return replace(spec, api=str(declaration["api"]), declared=frozenset(declaration.get("capabilities") or ()),
                   description=str(declaration.get("description") or ""), deep_ep=deep_ep if uses else None,
                   source=str(declaration.get("source") or spec.target),
                   family=str(declaration.get("family") or spec.target))


def installed_plugins() -> dict[str, str]:
    """``{name: "module:attr"}`` of the plug-ins installed packages register (entry points; nothing imported)."""
    from importlib.metadata import entry_points

    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def is_plugin_name(text: str, installed: Mapping[str, str] | None = None) -> bool:
    """Whether ``text`` names a plug-in: ``module:attr``, or an installed entry point's name."""
    text = text.strip()
    if ":" in text:
        return True
    return text in (installed if installed is not None else installed_plugins())


def parse_backends(option: str, real_available: bool) -> list[BackendSpec]:
    """Resolve the ``--backends`` option.

    ``auto``: both real APIs when the real ``deep_ep`` is usable here, else both emulated ones.
    ``emulated`` / ``real``: both APIs of that implementation.  Otherwise a comma-separated list of names;
    plug-ins come back unresolved (see :func:`resolve_plugin`).  Raises ``ValueError`` naming the option and
    the allowed values.
    """
    option = option.strip()
    if option == "auto":
        option = "real" if real_available else "emulated"
    if option in IMPLS:
        specs = [BackendSpec(option, api) for api in APIS]
    else:
        installed: dict[str, str] | None = None
        specs = []
        for part in (p.strip() for p in option.split(",")):
            if not part:
                continue
            impl, _, api = part.partition("-")
            if impl in IMPLS and api in APIS:
                specs.append(BackendSpec(impl, api))
                continue
            api, equals, target = part.partition("=")
            if equals:
                if api not in APIS or ":" not in target:
                    raise ValueError(f"--backends {part!r}: a class backend is v1=package.module:Class (a class with "
                                     f"deep_ep.Buffer's API) or v2=package.module:Class (ElasticBuffer's)")
                specs.append(BackendSpec(CLASS, api, target=target.strip()))
                continue
            if installed is None:
                installed = installed_plugins()
            if is_plugin_name(part, installed):
                specs.append(unresolved_plugin(part))
                continue
            error = str(_parse_error(part))
            if installed:
                error += f"; installed plug-ins: {', '.join(sorted(installed))}"
            raise ValueError(error)
    if not specs:
        raise ValueError("--backends selected no backend")
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"--backends names a backend twice: {option!r}")
    return specs


def _parse_error(part: str) -> ValueError:
    try:
        BackendSpec.parse(part)
    except ValueError as exc:
        return exc
    return ValueError(f"unknown backend {part!r}")  # pragma: no cover - parse accepted what the caller refused


@dataclass(frozen=True)
class AskedBackends:
    """What ``--backends`` asks for, before the machine is known: the backends it names (``None``: ``auto``, decided
    once the machine is), and whether it insists on a real built-in one."""

    named: tuple[BackendSpec, ...] | None
    real: bool
    #: ``auto``'s two outcomes: both real APIs where the real deep_ep is usable, else both emulated ones.
    if_auto: dict[bool, tuple[BackendSpec, ...]] = field(default_factory=dict)

    def chosen(self, real_usable: bool) -> tuple[BackendSpec, ...]:
        """The backends named, or ``auto``'s choice."""
        return self.named if self.named is not None else self.if_auto[real_usable]


def asked_backends(option: str) -> AskedBackends:
    """``--backends`` read (plug-ins unresolved); ``ValueError`` as :func:`parse_backends` raises it."""
    if option.strip() == "auto":
        return AskedBackends(None, False, {usable: tuple(parse_backends("auto", real_available=usable))
                                           for usable in (True, False)})
    return AskedBackends(tuple(parse_backends(option, real_available=False)), wants_real(option))


def wants_real(option: str) -> bool:
    """Whether ``--backends`` explicitly asks for a real built-in backend (``auto`` does not insist)."""
    return any(part.strip() == "real" or part.strip().startswith("real-") for part in option.split(","))
