"""Two V2 wrappers for P25's meta-test: one that offers its users a teardown, one that leaves its module-global buffer
to the garbage collector (the seed PR's Megatron does the latter)."""

from __future__ import annotations

from typing import Any

from conformance.backends.plugins import Dispatched, PluginBackend

_buffer: Any = None  # a wrapper's module-global buffer, built lazily in the first call


class _V2Wrapper(PluginBackend):
    api = "v2"
    capabilities = frozenset({"combine"})
    explicitly_destroy = False

    def _get_buffer(self) -> Any:
        global _buffer
        if _buffer is None:
            _buffer = self.env.deep_ep.ElasticBuffer(self.env.group, num_max_tokens_per_rank=256, hidden=7168,
                                                     num_topk=8, explicitly_destroy=self.explicitly_destroy)
        return _buffer

    def dispatch_tokens(self, x: Any, topk_idx: Any, topk_weights: Any, num_experts: int, **unused: Any) -> Dispatched:
        recv_x, recv_idx, recv_w, handle, _ = self._get_buffer().dispatch(
            x, topk_idx=topk_idx, topk_weights=topk_weights, num_experts=num_experts, num_max_tokens_per_rank=256)
        return Dispatched(recv_x, recv_idx, recv_w, list(handle.num_recv_tokens_per_expert_list), handle)

    def combine_tokens(self, dispatched: Dispatched, x: Any, **unused: Any) -> Any:
        return self._get_buffer().combine(x, dispatched.handle)[0]

    def destroy(self) -> None:
        global _buffer
        if _buffer is not None and self.explicitly_destroy:
            _buffer.destroy()
        _buffer = None


class TearsDown(_V2Wrapper):
    """Builds its buffer with ``explicitly_destroy=True`` and destroys it in its teardown."""

    explicitly_destroy = True

    def teardown(self) -> None:
        self.destroy()


class LeavesItToTheCollector(_V2Wrapper):
    """Keeps its buffer in a module global and offers no teardown."""
