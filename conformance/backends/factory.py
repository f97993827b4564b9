"""Rank-side construction of backends (one per backend per rank process, destroyed at shutdown)."""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import Any

from conformance.backends.elastic import ElasticAdapter
from conformance.backends.legacy import LegacyAdapter
from conformance.backends.public import public_module
from conformance.backends.tracing import trace_classes
from conformance.core.spec import BackendSpec
from conformance.world.rank import cached, context, on_shutdown

MODULES = {"real": "deep_ep", "emulated": "conformance.emulation"}
ADAPTERS = {"v1": LegacyAdapter, "v2": ElasticAdapter}


def library_module(spec: BackendSpec) -> str | None:
    """The deep_ep-like module ``spec`` drives: the real ``deep_ep``, the emulation of the backend's version
    (``spec.contract.emulation``: ``conformance.emulation`` for 2.1.0, ``conformance.emulation.v2_5_0`` for 2.5.0), or
    for a plug-in or a class backend ``deep_ep`` as resolved in this process, if it uses it."""
    if spec.plugin or spec.substitute:
        return "deep_ep" if spec.deep_ep else None
    if spec.impl == "emulated":
        return spec.contract.emulation or MODULES["emulated"]
    return MODULES[spec.impl]


def substitute_module(spec: BackendSpec) -> ModuleType:
    """What a class backend's adapter drives: a module that is ``deep_ep`` as resolved in this process (the real
    library or the emulation: ``EventOverlap``, ``Config``, ... come from there) with the class ``spec.target`` names
    in place of ``Buffer`` (``v1=``) or ``ElasticBuffer`` (``v2=``)."""
    from conformance.backends.plugins import load_factory

    cls = load_factory(spec.target or "")
    try:
        base: Any = importlib.import_module("deep_ep")
    except ImportError:
        base = None
    module = ModuleType(f"deep_ep[{spec.name}]", f"deep_ep with {spec.target} as {spec.class_name}")
    setattr(module, spec.class_name, cls)

    def delegate(name: str) -> Any:
        if base is None:
            raise AttributeError(f"{spec.name}: no deep_ep here to take {name} from")
        return getattr(base, name)

    module.__getattr__ = delegate  # type: ignore[method-assign]  # PEP 562: the rest of deep_ep
    module.__version__ = getattr(base, "__version__", None)
    return module


def trace_library(spec: BackendSpec) -> None:
    """Trace the library calls of ``spec``'s module (once per class), so a crash inside it is named."""
    module = library_module(spec)
    if module is None:
        return
    if (spec.plugin or spec.substitute) and module not in sys.modules:
        try:
            importlib.import_module(module)
        except ImportError:
            return  # the plug-in's own construction will say why
    trace_classes(importlib.import_module(module), spec.impl)


def get_adapter(spec: BackendSpec) -> Any:
    """The backend for ``spec`` in this rank process (built on first use)."""

    def build() -> Any:
        ctx = context()
        if spec.plugin:
            return _build_plugin(spec, ctx)
        if spec.substitute:  # judged through its public API only (conformance/backends/public.py)
            module = substitute_module(spec)
            trace_classes(module, "class")
            module = public_module(module, spec)
        else:
            module = importlib.import_module(library_module(spec) or "")
            trace_classes(module, spec.impl)
        adapter = ADAPTERS[spec.api](spec, module, ctx.group, ctx.num_nodes)
        on_shutdown(adapter.destroy)
        return adapter

    return cached(("adapter", spec), build)


def _build_plugin(spec: BackendSpec, ctx: Any) -> Any:
    from conformance.backends.alias import describe
    from conformance.backends.plugins import PluginEnv, build

    trace_library(spec)
    seen = describe()
    env = PluginEnv(name=spec.name, rank=ctx.rank, world_size=ctx.world_size, num_nodes=ctx.num_nodes,
                    group=ctx.group, device=ctx.torch_device(), deep_ep=sys.modules.get("deep_ep"),
                    deep_ep_kind=seen["kind"])
    backend = build(spec, env)
    on_shutdown(backend.destroy)
    return backend


def seen_deep_ep(spec: BackendSpec) -> dict[str, Any]:
    """Which deep_ep ``spec``'s backend drives in this process: ``kind``, ``version``, ``file`` (the report's)."""
    from conformance.backends.alias import describe

    if spec.plugin or spec.substitute:
        if not spec.deep_ep:
            return {"kind": None, "version": None, "file": None}
        return describe()
    module = sys.modules.get(library_module(spec) or "")
    return {"kind": "real" if spec.impl == "real" else "emulation", "version": getattr(module, "__version__", None),
            "file": getattr(module, "__file__", None)}
