"""The faithful facade (:mod:`tests.facades.faithful`) with one planted defect each, like those found in V1-compat
shims integrators publish: the suite must report each as that backend's failure, with a message naming the value,
and leave the other backends' verdicts as they are (tests/quality/test_facades.py).

- :class:`DiscardsNumExperts`: ``get_dispatch_layout`` drops the ``num_experts`` its caller passes, and ``dispatch``
  hands V2 ``num_experts=None``: every dispatch raises (inside V2);
- :class:`NoneCounts`: the per-expert counts are read from an attribute V2's handle does not have, so every dispatch
  returns ``num_recv_tokens_per_expert_list=None``;
- :class:`DestroysTwice`: a second ``destroy()`` succeeds (V1 refuses it with ``AttributeError``);
- :class:`WrongErrorAfterDestroy`: a dispatch after ``destroy()`` fails in the facade's own bookkeeping with a
  ``RuntimeError`` from ``max()`` instead of V1's ``AttributeError``;
- :class:`LeavesBufferToCollector`: the ``explicitly_destroy`` a V1 caller passes is handed to V2 as is, so a facade
  never destroyed (a module global) leaves its ``ElasticBuffer`` to be collected after ``destroy_process_group()``:
  V2's own known defect ``v2-buffer-outlives-process-group`` takes the process down at exit, where V1 ends cleanly.
"""

from __future__ import annotations

from typing import Any

import deep_ep
import torch

from tests.facades.faithful import ElasticBackedBuffer


class DiscardsNumExperts(ElasticBackedBuffer):
    """Defect: the expert count given to ``get_dispatch_layout`` is not kept; ``dispatch`` passes ``None``."""

    _kept_num_experts: int | None = None

    def get_dispatch_layout(self, topk_idx: torch.Tensor, num_experts: int, *args: Any, **kwargs: Any) -> tuple:
        out = super().get_dispatch_layout(topk_idx, num_experts, *args, **kwargs)
        self._kept_num_experts = None  # the defect: should be num_experts
        return out

    def _num_experts(self, num_tokens_per_expert: torch.Tensor) -> Any:
        return self._kept_num_experts


class NoneCounts(ElasticBackedBuffer):
    """Defect: the counts come from ``handle.num_recv_tokens_per_expert``, which V2's ``EPHandle`` does not have (its
    attribute is ``num_recv_tokens_per_expert_list``): ``None``."""

    def _counts(self, ep: Any) -> Any:
        return getattr(ep, "num_recv_tokens_per_expert", None)


class DestroysTwice(ElasticBackedBuffer):
    """Defect: a second ``destroy()`` returns (V1 refuses it: ``AttributeError``, the runtime is gone)."""

    def destroy(self) -> None:
        assert self.explicitly_destroy, "`explicitly_destroy` flag must be set"
        if self._elastic is not None:  # the defect: the second call returns instead of raising
            self._elastic.destroy()
            self._elastic = None


class WrongErrorAfterDestroy(ElasticBackedBuffer):
    """Defect: a dispatch after ``destroy()`` fails in the facade's own bookkeeping, ``RuntimeError`` from ``max()``
    of an emptied tensor, instead of V1's refusal (``AttributeError``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._rows_seen: torch.Tensor | None = None

    def destroy(self) -> None:
        super().destroy()
        self._rows_seen = torch.empty(0, dtype=torch.int64)

    def dispatch(self, x: Any, *args: Any, **kwargs: Any) -> tuple:
        if self._rows_seen is not None:  # destroyed: the facade's own bookkeeping, emptied by destroy()
            torch.max(self._rows_seen)  # the defect: RuntimeError (max() of an empty tensor) instead of a refusal
        return super().dispatch(x, *args, **kwargs)


class LeavesBufferToCollector(ElasticBackedBuffer):
    """Defect: V1's ``explicitly_destroy=False`` handed to V2 as is: the V2 buffer's own destructor destroys it, on
    a destroyed group when it is collected at the interpreter's exit (V2's known defect, passed on)."""

    def _own(self, group: Any, explicitly_destroy: bool, **options: Any) -> Any:
        self.explicitly_destroy = explicitly_destroy
        return deep_ep.ElasticBuffer(group, deterministic=True, explicitly_destroy=explicitly_destroy, **options)
