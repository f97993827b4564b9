"""A wrapper that always raises, for the self-test that a broken wrapper costs seconds and leaves the backends
beside it checked (issue 24)."""

from __future__ import annotations

from typing import Any

from conformance.backends.plugins import PluginBackend

MESSAGE = "this wrapper always raises"


class AlwaysRaises(PluginBackend):
    """Declares the V1 wrapper's capabilities and raises in every call, as a wrapper broken by a DeepEP bump might."""

    api = "v1"
    capabilities = frozenset({"combine", "cached_dispatch", "autograd", "events"})

    def dispatch_tokens(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(MESSAGE)

    combine_tokens = cached_dispatch_tokens = autograd_dispatch = autograd_combine = dispatch_tokens
