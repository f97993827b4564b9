"""How a mutant plants its defect: through a named seam, and nowhere else.

The seams are the emulation's (``conformance/emulation/seams.py``: call seams inside it, and its entry points, the
library's public names) and the adapters' (``conformance/backends/seams.py``).  :func:`seam` wraps one of them and
refuses any other name, so that a refactor of the emulation cannot silently disarm a mutant: a seam it patches either
still exists (the emulation calls through it) or the mutant fails loudly.  ``tests/quality/test_mutant_seams.py`` checks
that every registered mutant changes nothing but seams.

Mutants run inside the rank processes, around each task (``conformance.mutants.activate``).  Every helper here is a
context manager that restores what it changed on exit, even when the task fails.  A mutant keeps state between calls
in its own module (e.g. a ``WeakKeyDictionary`` keyed by buffer or handle), never on the emulation's objects.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import time
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import torch

import conformance.emulation as emulation
from conformance.backends import seams as adapter_seams
from conformance.backends.tracing import TARGET
from conformance.core.views import DispatchView
from conformance.emulation import seams as emulation_seams


def seam_names() -> list[str]:
    """Every seam a mutant may patch: the emulation's call seams and entry points, the adapters' seams."""
    return sorted({*emulation_seams.CALLS, *emulation_seams.ENTRY_POINTS, *adapter_seams.SEAMS})


def _attribute_of(name: str) -> tuple[Any, str]:
    """``(owner, attribute)`` of entry point or adapter seam ``name`` (a ``KeyError`` naming the seams otherwise)."""
    if name in emulation_seams.ENTRY_POINTS and name != "deep_ep":
        return emulation_seams.entry_point(emulation, name)
    if name in adapter_seams.SEAMS:
        return adapter_seams.resolve(name)
    raise KeyError(f"unknown seam {name!r}; a mutant patches only these: {', '.join(seam_names())}")


@contextlib.contextmanager
def seam(name: str, wrapper: Callable[..., Any]) -> Iterator[None]:
    """While active, seam ``name`` runs ``wrapper(original, *args, **kwargs)`` instead (a method's first argument
    is ``self``).  Refuses a name that is not a seam.

    A call seam is swapped in the emulation's seam registry.  An entry point or adapter seam is wrapped where its
    class defines it; a traced method (``conformance.backends.tracing``) is patched inside its trace wrapper, so the
    trace stays outermost, as around the real library's code, and the call is still named when it crashes.
    """
    if name in emulation_seams.CALLS:
        with emulation_seams.replaced(name, wrapper):
            yield
        return
    owner, attribute_name = _attribute_of(name)
    attribute = vars(owner)[attribute_name]
    static = isinstance(attribute, staticmethod)
    function = attribute.__func__ if static else attribute
    traced = hasattr(function, TARGET)
    original = getattr(function, TARGET) if traced else function

    @functools.wraps(original)  # keeps name, docstring and signature: the API surface (P14) is unchanged
    def patched(*args: Any, **kwargs: Any) -> Any:
        return wrapper(original, *args, **kwargs)

    if traced:
        setattr(function, TARGET, patched)
    else:
        setattr(owner, attribute_name, staticmethod(patched) if static else patched)
    try:
        yield
    finally:
        if traced:
            setattr(function, TARGET, original)
        else:
            setattr(owner, attribute_name, attribute)


def through(name: str, *args: Any, **kwargs: Any) -> Any:
    """Call seam ``name`` as the emulation does now (with whatever replaces it)."""
    return emulation_seams.current(name)(*args, **kwargs)


def call_argument(original: Any, self: Any, args: tuple, kwargs: dict, name: str) -> Any:
    """The value of parameter ``name`` in a call of ``original(self, *args, **kwargs)`` (defaults applied)."""
    bound = inspect.signature(original).bind(self, *args, **kwargs)
    bound.apply_defaults()
    return bound.arguments[name]


def rebinding(name: str, edit: Callable[[Any, dict[str, Any]], None]) -> Any:
    """Seam ``name`` (a method) with its bound arguments rewritten by ``edit(self, arguments)`` before it runs."""

    def rebound(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        bound = inspect.signature(original).bind(*args, **kwargs)
        bound.apply_defaults()
        edit(args[0], bound.arguments)
        return original(*bound.args, **bound.kwargs)

    return seam(name, rebound)


@contextlib.contextmanager
def resigned(name: str, edit: Callable[[list[inspect.Parameter]], list[inspect.Parameter]],
             translate: dict[str, str]) -> Iterator[None]:
    """Entry point ``name`` with its signature ``edit``-ed (the API surface itself changes, so the attribute is
    replaced, trace and all); calls using the new keyword names are translated back (``translate``: new -> old)."""
    if name not in emulation_seams.ENTRY_POINTS:
        raise KeyError(f"{name!r} is not an entry point: only the library's own names have a signature to change")
    owner, attribute_name = _attribute_of(name)
    original = getattr(owner, attribute_name)
    signature = inspect.signature(original)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        for new, old in translate.items():
            if new in kwargs:
                kwargs[old] = kwargs.pop(new)
        return original(*args, **kwargs)

    wrapper.__signature__ = signature.replace(parameters=edit(list(signature.parameters.values())))
    wrapper.__doc__ = original.__doc__
    with mock.patch.object(owner, attribute_name, wrapper):
        yield


@contextlib.contextmanager
def renamed_export(old: str, new: str) -> Iterator[None]:
    """Entry point ``deep_ep``: the package exports its ``old`` name as ``new`` only (a renamed class)."""
    namespace = vars(emulation)
    with mock.patch.dict(namespace):
        namespace[new] = namespace.pop(old)
        yield


@contextlib.contextmanager
def after_library_dispatch(edit: Callable[[Any, torch.Tensor, float], None]) -> Iterator[None]:
    """While active, both APIs' ``dispatch`` (entry points ``Buffer.dispatch``, ``ElasticBuffer.dispatch``) end with
    ``edit(buffer, recv_x, seconds)``: the received payload as the library returns it (the FP8 payload of an
    ``(x, scales)`` pair), edited in place, and how long the call took.  Unlike :func:`patch_dispatch_views`, every
    caller sees the edit (the handle's rows, a wrapper over the library)."""

    def dispatch(original: Callable[..., Any], self: Any, *args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        result = original(self, *args, **kwargs)
        edit(self, result[0][0] if isinstance(result[0], tuple) else result[0], time.monotonic() - started)
        return result

    with seam("Buffer.dispatch", dispatch), seam("ElasticBuffer.dispatch", dispatch):
        yield


@contextlib.contextmanager
def patch_dispatch_views(mutate: Callable[..., None], apis: tuple[str, ...] = ("v1", "v2")) -> Iterator[None]:
    """While active, ``mutate(view, rank, world_size)`` edits every dispatch view of the given APIs (seams
    ``LegacyAdapter.dispatch``, ``ElasticAdapter.dispatch``).

    Only the canonical view changes (what the adapter reports), not the handle: use it for defects in
    what dispatch returns, which properties reading the received rows must catch.
    """
    from conformance.world.rank import context

    def after(original: Callable[..., tuple], self: Any, *args: Any, **kwargs: Any) -> tuple:
        view, raw = original(self, *args, **kwargs)
        mutate(view, context().rank, context().world_size)
        return view, raw

    with contextlib.ExitStack() as stack:
        for name, api in (("LegacyAdapter.dispatch", "v1"), ("ElasticAdapter.dispatch", "v2")):
            if api in apis:
                stack.enter_context(seam(name, after))
        yield


def has_token_rows(view: DispatchView) -> bool:
    """Whether the view's rows are one per received token (not the V2 expanded layout)."""
    n = view.src_rank.shape[0]
    return view.x.shape[0] == n and view.topk_idx.shape[0] == n and view.topk_weights.shape[0] == n


def select_rows(view: DispatchView, index: torch.Tensor) -> None:
    """Keep (or repeat) the received rows ``index`` in every per-row field of ``view``, in place."""
    for name in ("src_rank", "src_token", "x", "topk_idx", "topk_weights"):
        setattr(view, name, getattr(view, name)[index])
