"""A class backend as the suite sees it: ``Buffer``'s or ``ElasticBuffer``'s public API, nothing else.

A class backend (``--backends v1=pkg.mod:Class`` / ``v2=pkg.mod:Class``) is driven by the built-in adapters, which
also drive the real library; what they may touch on it is the API's public surface (:data:`PUBLIC`): the methods of
the recorded API surface (``conformance/data/api-surface``) and the attributes the library documents (the classes'
docstrings, and the constructor arguments it keeps).  The adapters and tasks get the class and its instances wrapped
(:func:`public_module`):

- a public name the instance (or, for static calls, the class) does not have is a
  :class:`~conformance.core.raisers.NotSupported` naming it: the property is ``unsupported`` for that backend, with
  that reason (the run-time probe of a class that declares nothing; a method provided on the instance through
  ``__getattr__`` counts: it is looked up on the instance);
- a name outside the public surface (``runtime``, a private attribute, the emulation's ``last_launch``) is the
  suite's own mistake: :class:`InternalReach`, a suite error (an ``AttributeError`` too, so that an optional
  ``getattr(buffer, name, default)`` falls back to its default).

What the library documents is data of one version (DeepEP 2.1.0 here); it moves with the per-version contract data.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

from conformance.core.raisers import NotSupported, SuiteError
from conformance.core.spec import APIS, BackendSpec

#: Attributes each API documents (``Buffer``'s and ``ElasticBuffer``'s docstrings, DeepEP 2.1.0, ``runtime`` left
#: out: the C++ runtime is the library's internals) and the constructor arguments the library keeps as attributes.
DOCUMENTED_ATTRIBUTES: dict[str, frozenset[str]] = {
    "v1": frozenset({"num_sms", "rank", "group_size", "group", "num_nvl_bytes", "num_rdma_bytes", "low_latency_mode",
                     "explicitly_destroy", "enable_shrink"}),
    "v2": frozenset({"group", "rank_idx", "num_ranks", "allow_hybrid_mode", "allow_multiple_reduction",
                     "prefer_overlap_with_compute", "deterministic", "num_bytes", "num_max_tokens_per_rank",
                     "num_allocated_qps", "explicitly_destroy", "num_scaleout_ranks", "num_scaleup_ranks",
                     "scaleout_rank_idx", "scaleup_rank_idx", "num_rdma_ranks", "num_nvlink_ranks"}),
}


class InternalReach(SuiteError, AttributeError):
    """The suite reached past a class backend's public API (a suite error)."""


@functools.cache
def public_names(api: str) -> frozenset[str]:
    """The public surface of ``api``'s class: the recorded API surface's methods and the documented attributes."""
    from conformance.core.api_surface import load_snapshot

    methods = load_snapshot()["classes"].get(APIS[api], {})
    return frozenset(name for name in methods if not name.startswith("_")) | DOCUMENTED_ATTRIBUTES[api]


def _lookup(target: Any, name: str, spec: BackendSpec, where: str, seen: set[str]) -> Any:
    if name.startswith("_") or name not in public_names(spec.api):
        raise InternalReach(f"the suite read {spec.class_name}.{name} of {spec.name}, which is not part of "
                            f"{spec.class_name}'s public API (conformance/backends/public.py)")
    try:
        value = getattr(target, name)
    except AttributeError:
        if name in seen:  # it was there before: this is the backend's own behaviour (e.g. after destroy())
            raise
        raise NotSupported(f"{spec.name}: {where} has no {spec.class_name}.{name} (the run-time probe of its public "
                           f"API; declare 'conformance_capabilities' on the class to say what it implements)") from None
    seen.add(name)
    return value


class PublicInstance:
    """A class backend's buffer, its public API only (module docstring)."""

    __slots__ = ("_target", "_spec", "_seen")

    def __init__(self, target: Any, spec: BackendSpec) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_spec", spec)
        object.__setattr__(self, "_seen", set())

    def __getattr__(self, name: str) -> Any:
        return _lookup(self._target, name, self._spec, "its instance", self._seen)

    def __setattr__(self, name: str, value: Any) -> None:
        raise InternalReach(f"the suite set {self._spec.class_name}.{name} of {self._spec.name}")

    def __repr__(self) -> str:
        return f"<public API of {self._target!r}>"


class PublicClass:
    """A class backend's class: calling it builds a :class:`PublicInstance`; its static calls and class attributes
    are looked up on the class (public names only)."""

    __slots__ = ("_cls", "_spec", "_seen")

    def __init__(self, cls: type, spec: BackendSpec) -> None:
        object.__setattr__(self, "_cls", cls)
        object.__setattr__(self, "_spec", spec)
        object.__setattr__(self, "_seen", set())

    def __call__(self, *args: Any, **kwargs: Any) -> PublicInstance:
        return PublicInstance(self._cls(*args, **kwargs), self._spec)

    def __getattr__(self, name: str) -> Any:
        return _lookup(self._cls, name, self._spec, "its class", self._seen)

    def __setattr__(self, name: str, value: Any) -> None:
        raise InternalReach(f"the suite set {self._spec.class_name}.{name} on {self._spec.name}'s class")


def public_module(module: ModuleType, spec: BackendSpec) -> ModuleType:
    """``module`` (a class backend's deep_ep, :func:`conformance.backends.factory.substitute_module`) with its class
    wrapped as :class:`PublicClass`; the rest of deep_ep (``EventOverlap``, ``Config``) is the library's."""
    wrapped = ModuleType(module.__name__, module.__doc__)
    setattr(wrapped, spec.class_name, PublicClass(getattr(module, spec.class_name), spec))
    wrapped.__getattr__ = lambda name: getattr(module, name)  # type: ignore[method-assign]  # PEP 562
    wrapped.__version__ = getattr(module, "__version__", None)
    return wrapped


def release(buffer: Any) -> None:
    """``buffer.destroy()`` at the suite's clean-up: a class backend whose instance has no ``destroy`` keeps its
    buffer (the suite's clean-up is no verdict)."""
    try:
        destroy = buffer.destroy
    except NotSupported:
        return
    destroy()
