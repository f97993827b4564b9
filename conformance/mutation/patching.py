"""Helpers to patch what backends return, for mutants that model a library returning wrong data."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from conformance.backends.elastic import ElasticAdapter
from conformance.backends.legacy import LegacyAdapter


@contextlib.contextmanager
def patch_dispatch_views(mutate: Callable[..., None], apis: tuple[str, ...] = ("v1", "v2")) -> Iterator[None]:
    """While active, ``mutate(view, rank, world_size)`` edits every dispatch view of the given APIs."""
    from conformance.world.rank import context

    originals = {}
    for cls in (LegacyAdapter, ElasticAdapter):
        if cls.api not in apis:
            continue
        original = cls.dispatch
        originals[cls] = original

        def patched(self, *args, _original=original, **kwargs):
            view, raw = _original(self, *args, **kwargs)
            mutate(view, context().rank, context().world_size)
            return view, raw

        cls.dispatch = patched
    try:
        yield
    finally:
        for cls, original in originals.items():
            cls.dispatch = original
