"""Helpers to plant defects narrowly: wrap one method, rewrite a call's arguments, edit dispatch views, select
received rows.

Mutants run inside the rank processes, around each task (``conformance.mutation.activate``).  Every helper
here is a context manager that restores what it changed on exit, even when the task fails.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import torch

from conformance.backends.elastic import ElasticAdapter
from conformance.backends.legacy import LegacyAdapter
from conformance.backends.tracing import TARGET
from conformance.core.views import DispatchView


@contextlib.contextmanager
def wrap_method(cls: type, name: str, wrapper: Callable[..., Any]) -> Iterator[None]:
    """While active, ``cls.<name>(self, *a, **kw)`` runs ``wrapper(original, self, *a, **kw)`` instead.

    Use it on emulation internals (``ElasticBuffer._receive``, ``Buffer.dispatch``) to model a library
    bug at the place a real one would sit, so every output derived from it (handles, combine) is affected.
    """
    attribute = cls.__dict__[name]
    traced = hasattr(attribute, TARGET)  # patch inside the trace wrapper: the call is still named when it crashes
    original = getattr(attribute, TARGET) if traced else attribute

    @functools.wraps(original)  # keeps name, docstring and signature: the API surface (P14) is unchanged
    def patched(self: Any, *args: Any, **kwargs: Any) -> Any:
        return wrapper(original, self, *args, **kwargs)

    if traced:
        setattr(attribute, TARGET, patched)
    else:
        setattr(cls, name, patched)
    try:
        yield
    finally:
        if traced:
            setattr(attribute, TARGET, original)
        else:
            setattr(cls, name, original)


def call_argument(original: Any, self: Any, args: tuple, kwargs: dict, name: str) -> Any:
    """The value of parameter ``name`` in a call of ``original(self, *args, **kwargs)`` (defaults applied)."""
    bound = inspect.signature(original).bind(self, *args, **kwargs)
    bound.apply_defaults()
    return bound.arguments[name]


def rebinding(cls: type, name: str, edit: Callable[[Any, dict[str, Any]], None]) -> Any:
    """``mock.patch.object(cls, name, ...)`` with a wrapper that lets ``edit(self, arguments)`` rewrite the
    bound arguments before the original runs."""
    original = getattr(cls, name)
    signature = inspect.signature(original)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        edit(args[0], bound.arguments)
        return original(*bound.args, **bound.kwargs)

    return mock.patch.object(cls, name, wrapper)


@contextlib.contextmanager
def patch_dispatch_views(mutate: Callable[..., None], apis: tuple[str, ...] = ("v1", "v2")) -> Iterator[None]:
    """While active, ``mutate(view, rank, world_size)`` edits every dispatch view of the given APIs.

    Only the canonical view changes (what the adapter reports), not the handle: use it for defects in
    what dispatch returns, which properties reading the received rows must catch.
    """
    from conformance.world.rank import context

    def after(original: Callable[..., tuple], self: Any, *args: Any, **kwargs: Any) -> tuple:
        view, raw = original(self, *args, **kwargs)
        mutate(view, context().rank, context().world_size)
        return view, raw

    with contextlib.ExitStack() as stack:
        for cls in (LegacyAdapter, ElasticAdapter):
            if cls.api in apis:
                stack.enter_context(wrap_method(cls, "dispatch", after))
        yield


def has_token_rows(view: DispatchView) -> bool:
    """Whether the view's rows are one per received token (not the V2 expanded layout)."""
    n = view.src_rank.shape[0]
    return view.x.shape[0] == n and view.topk_idx.shape[0] == n and view.topk_weights.shape[0] == n


def select_rows(view: DispatchView, index: torch.Tensor) -> None:
    """Keep (or repeat) the received rows ``index`` in every per-row field of ``view``, in place."""
    for name in ("src_rank", "src_token", "x", "topk_idx", "topk_weights"):
        setattr(view, name, getattr(view, name)[index])
