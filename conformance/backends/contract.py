"""The contract every backend adapter implements (``Buffer``, ``ElasticBuffer``, and later plug-in backends).

An adapter drives one DeepEP-like API inside a rank process, the way integrators call it, and returns
canonical views (:class:`~conformance.core.views.DispatchView`) plus the raw results a later combine or cached
dispatch needs (the handle).  Rank tasks only call the methods below; anything an API lacks is a capability
it does not declare.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Protocol, runtime_checkable

import torch

from conformance.core.example import Example, RankInputs
from conformance.core.spec import BackendSpec
from conformance.core.views import DispatchOptions, DispatchView

#: ``raw``: what dispatch returns besides the view (the handle, received tensors), passed back to combine.
Raw = dict[str, Any]


@runtime_checkable
class Backend(Protocol):
    """One backend in one rank process."""

    spec: BackendSpec
    api: str  # "v1" or "v2": which properties apply (e.g. expand mode and the QP cap are V2's)

    def dispatch(self, inputs: RankInputs, example: Example, options: DispatchOptions, rank: int
                 ) -> tuple[DispatchView, Raw]: ...

    def combine(self, raw: Raw, x: torch.Tensor, topk_weights: torch.Tensor | None = None,
                bias: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None = None, async_finish: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor | None]: ...

    def cached_dispatch(self, raw: Raw, x: torch.Tensor) -> torch.Tensor: ...

    def describe_combine(self, example: Example, rank: int) -> str: ...

    def destroy(self) -> None: ...


class AdapterBase:
    """What every adapter holds: its backend, the deep_ep-like module, the process group, the node count."""

    api = ""

    def __init__(self, spec: BackendSpec, module: ModuleType, group: Any, num_nodes: int) -> None:
        self.spec = spec
        self.module = module
        self.group = group
        self.num_nodes = num_nodes
