"""Rank-side construction of adapters (one per backend per rank process, destroyed at shutdown)."""

from __future__ import annotations

import importlib
from typing import Any

from conformance.backends.elastic import ElasticAdapter
from conformance.backends.legacy import LegacyAdapter
from conformance.backends.tracing import trace_classes
from conformance.core.spec import BackendSpec
from conformance.world.rank import cached, context, on_shutdown

MODULES = {"real": "deep_ep", "emulated": "conformance.emulation"}
ADAPTERS = {"v1": LegacyAdapter, "v2": ElasticAdapter}


def get_adapter(spec: BackendSpec) -> Any:
    """The adapter for ``spec`` in this rank process (built on first use)."""

    def build() -> Any:
        ctx = context()
        module = importlib.import_module(MODULES[spec.impl])
        trace_classes(module, spec.impl)
        adapter = ADAPTERS[spec.api](spec, module, ctx.group, ctx.num_nodes)
        on_shutdown(adapter.destroy)
        return adapter

    return cached(("adapter", spec), build)
