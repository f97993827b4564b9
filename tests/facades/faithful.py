"""A faithful V1-compatible facade over V2: ``deep_ep.Buffer``'s API (normal mode) on ``deep_ep.ElasticBuffer``.

``ElasticBackedBuffer(group, num_nvl_bytes, ...)`` is built like a ``Buffer`` and builds its ``ElasticBuffer`` inside;
``ForwardingBuffer(elastic)`` takes one already built and forwards what it does not define itself (``destroy``,
``capture``, ``get_comm_stream``, ...) through ``__getattr__``; ``ForwardingBufferOnGroup`` is the one-line
construction adapter that makes it a class backend (``--backends v1=tests.facades.faithful:ForwardingBufferOnGroup``).

What the facade does for a V1 caller, from the two APIs' documentation:

- ``get_dispatch_layout(topk_idx, num_experts)``: the layout tensors, computed here (V2 has no such call);
- ``dispatch(x, num_tokens_per_rank=..., is_token_in_rank=..., num_tokens_per_expert=..., topk_idx=...,
  topk_weights=..., expert_alignment=...)``: V2's dispatch with ``num_experts`` taken from ``num_tokens_per_expert``
  and ``num_max_tokens_per_rank`` the largest token count of the group (V2 wants it pinned and equal on every rank);
  ``recv_topk_weights`` is 0 at the ``-1`` slots (V1 writes 0 there, V2 keeps the sender's weight); the counts are
  V2's ``num_recv_tokens_per_expert_list``; ``dispatch(x, handle=handle)`` is V2's cached dispatch;
- ``combine(x, handle, topk_weights, bias)``: V2's combine (``num_sms=0``: the dispatch's SM count);
- ``async_finish=True``: the facade waits on V2's event itself and returns an event that is already complete
  (the outputs are final when the caller's wait returns, as V1 promises); ``previous_event``: V1's ``EventOverlap``
  handed to V2 as its ``EventHandle``;
- the V2 buffer is built with ``deterministic=True``: the rows arrive in V1's order on several nodes too;
- the handle is the facade's own, opaque: any look inside it (``len``, indexing, an attribute) raises, so that a
  suite that reads V1 handle tuples fails on it;
- after ``destroy()`` the V2 buffer is gone: every call raises ``AttributeError`` as V1's does (a second
  ``destroy()`` too);
- the end of a run as V1 promises it (P25): a facade built with ``explicitly_destroy=False`` and never destroyed (a
  module global) ends its process cleanly, even when collected after ``destroy_process_group()``.  V2's own
  ``ElasticBuffer`` built so would run ``destroy()`` in its destructor on the destroyed group's communicator and take
  the process down (the known defect ``v2-buffer-outlives-process-group``), so a facade that builds its buffer
  builds it with ``explicitly_destroy=True`` and releases it itself: in its destructor while the group lives, else
  never (the process's end reclaims it; V2 prints its "can leak resources" warning).

Low-latency mode, shrink mode, ``num_worst_tokens`` and explicit ``config`` objects are not offered: the facade says
so by not having the calls (low latency) and declares what it implements (``conformance_capabilities``, read by the
suite).
"""

from __future__ import annotations

from typing import Any

import deep_ep
import torch
import torch.distributed as dist

from tests.facades import DECLARED

#: V2 buffers are sized in multiples of this (``ElasticBuffer``'s alignment).
_ALIGNMENT = 2 << 20
#: The smallest V2 buffer the facade builds.
_MIN_BYTES = 64 << 20


class OpaqueHandle:
    """The facade's V1 handle: the V2 handle and the buffer that made it.  Opaque to callers: V1 documents the
    handle as something to pass back, nothing to read."""

    __slots__ = ("_ep", "_owner")

    def __init__(self, ep: Any, owner: Any) -> None:
        object.__setattr__(self, "_ep", ep)
        object.__setattr__(self, "_owner", owner)

    def __len__(self) -> int:
        raise TypeError("the facade's handle is opaque: pass it back to dispatch/combine, do not read it")

    def __getitem__(self, item: Any) -> Any:
        raise TypeError("the facade's handle is opaque: pass it back to dispatch/combine, do not index it")

    def __iter__(self) -> Any:
        raise TypeError("the facade's handle is opaque: pass it back to dispatch/combine, do not unpack it")


def _group_alive(group: Any) -> bool:
    """Whether ``group`` still exists (``destroy_process_group()`` forgets it: its ranks are looked up no more)."""
    try:
        dist.get_process_group_ranks(group)
        return True
    except Exception:  # noqa: BLE001 - destroyed, or torch already torn down at the interpreter's exit
        return False


def _event_handle(previous_event: Any) -> Any:
    """V2's ``previous_event`` (an ``EventHandle``) from V1's (an ``EventOverlap``)."""
    return None if previous_event is None else previous_event.event


class _V1OverV2:
    """The V1 calls, over ``self._elastic`` (``None`` once destroyed)."""

    _elastic: Any
    #: Capabilities of the suite this facade implements (docs/integrators.md, "testing a compatibility layer").
    conformance_capabilities = DECLARED
    #: Whether the facade built its V2 buffer (then it owns it and keeps V1's end of a run: :meth:`_own`).
    _owns_buffer = False

    def _own(self, group: Any, explicitly_destroy: bool, **options: Any) -> Any:
        """The V2 buffer this facade builds and owns: built with ``explicitly_destroy=True`` whatever the V1 caller
        asked (V2's destructor would destroy it on a destroyed group, the known defect
        ``v2-buffer-outlives-process-group``); a V1 caller's ``explicitly_destroy=False`` is kept by
        :meth:`__del__`."""
        self.explicitly_destroy = explicitly_destroy
        self._owns_buffer = True
        return deep_ep.ElasticBuffer(group, deterministic=True, explicitly_destroy=True, **options)

    def __del__(self) -> None:
        """V1 without ``explicitly_destroy``: the destructor releases the buffer, and a process whose buffer is
        collected after ``destroy_process_group()`` still ends cleanly.  Released here while the group lives, else
        left to the process's end."""
        if not self._owns_buffer or self.explicitly_destroy:
            return
        elastic = self.__dict__.get("_elastic")
        if elastic is not None and _group_alive(elastic.group):
            self._elastic = None
            elastic.destroy()

    # ---------------------------------------------------------------------------------------------- layout
    def get_dispatch_layout(self, topk_idx: torch.Tensor, num_experts: int, previous_event: Any = None,
                            async_finish: bool = False, allocate_on_comm_stream: bool = False) -> tuple:
        """V1's layout: tokens per rank (and per node), per expert, and ``is_token_in_rank``."""
        elastic = self._elastic
        if previous_event is not None:
            previous_event.current_stream_wait()
        num_ranks = elastic.group.size()
        per_rank_experts = num_experts // num_ranks
        valid = (topk_idx >= 0) & (topk_idx < per_rank_experts * num_ranks)
        owner = torch.where(valid, topk_idx // max(per_rank_experts, 1), torch.full_like(topk_idx, -1))
        in_rank = (owner.unsqueeze(-1) == torch.arange(num_ranks, device=topk_idx.device)).any(dim=1)
        per_rank = in_rank.sum(dim=0).to(torch.int32)
        ids = topk_idx[(topk_idx >= 0) & (topk_idx < num_experts)]
        per_expert = torch.bincount(ids, minlength=num_experts).to(torch.int32)
        num_nodes, per_node = elastic.get_physical_domain_size()
        per_rdma = None
        if num_nodes > 1:
            per_rdma = in_rank.reshape(in_rank.shape[0], num_nodes, per_node).any(dim=2).sum(dim=0).to(torch.int32)
        return per_rank, per_rdma, self._layout_experts(per_expert, num_experts), in_rank, deep_ep.EventOverlap(
            deep_ep.ElasticBuffer.capture() if async_finish else None)

    def _layout_experts(self, per_expert: torch.Tensor, num_experts: int) -> torch.Tensor:
        """What the layout hands on per expert (the defective facade changes this)."""
        return per_expert

    # -------------------------------------------------------------------------------------------- dispatch
    def dispatch(self, x: Any, handle: OpaqueHandle | None = None, num_tokens_per_rank: torch.Tensor | None = None,
                 num_tokens_per_rdma_rank: torch.Tensor | None = None, is_token_in_rank: torch.Tensor | None = None,
                 num_tokens_per_expert: torch.Tensor | None = None, topk_idx: torch.Tensor | None = None,
                 topk_weights: torch.Tensor | None = None, expert_alignment: int = 1, num_worst_tokens: int = 0,
                 config: Any = None, previous_event: Any = None, async_finish: bool = False,
                 allocate_on_comm_stream: bool = False) -> tuple:
        """V1's dispatch (a cached one with ``handle``): ``(recv_x, recv_topk_idx, recv_topk_weights,
        num_recv_tokens_per_expert_list, handle, event)``."""
        if num_worst_tokens or config is not None:
            raise NotImplementedError("this facade offers no num_worst_tokens and no explicit config")
        elastic = self._elastic
        events = {"previous_event": _event_handle(previous_event), "allocate_on_comm_stream": allocate_on_comm_stream}
        if handle is not None:
            ep = handle._ep
            recv_x, _, _, _, event = elastic.dispatch(x, handle=ep, num_experts=ep.num_experts,
                                                      async_with_compute_stream=async_finish, **events)
            return recv_x, None, None, None, None, self._finished(event, async_finish)
        assert num_tokens_per_expert is not None and topk_idx is not None, "a dispatch needs the layout and topk_idx"
        rows = (x[0] if isinstance(x, tuple) else x).shape[0]
        most = torch.tensor([rows], dtype=torch.int64, device=topk_idx.device)
        dist.all_reduce(most, op=dist.ReduceOp.MAX, group=elastic.group)
        recv_x, recv_idx, recv_w, ep, event = elastic.dispatch(
            x, topk_idx=topk_idx, topk_weights=topk_weights, num_experts=self._num_experts(num_tokens_per_expert),
            num_max_tokens_per_rank=max(1, int(most.item())), expert_alignment=expert_alignment,
            async_with_compute_stream=async_finish, **events)
        finished = self._finished(event, async_finish)
        if recv_w is not None and recv_idx is not None:
            recv_w = recv_w.masked_fill(recv_idx < 0, 0)  # V1 writes 0 at the slots of other ranks' experts
        return recv_x, recv_idx, recv_w, self._counts(ep), OpaqueHandle(ep, self), finished

    def _num_experts(self, num_tokens_per_expert: torch.Tensor) -> int:
        """The expert count of the call (V1: the length of the layout's per-expert counts)."""
        return num_tokens_per_expert.numel()

    def _counts(self, ep: Any) -> list[int]:
        """V1's ``num_recv_tokens_per_expert_list``: V2's, aligned per local expert."""
        return list(ep.num_recv_tokens_per_expert_list)

    @staticmethod
    def _finished(event: Any, async_finish: bool) -> Any:
        """V1's returned event: with ``async_finish``, V2's event waited on here and one already complete returned
        (the outputs are final when the caller's wait returns)."""
        if not async_finish:
            return deep_ep.EventOverlap(None)
        event.current_stream_wait()
        return deep_ep.EventOverlap(deep_ep.ElasticBuffer.capture())

    # --------------------------------------------------------------------------------------------- combine
    def combine(self, x: torch.Tensor, handle: OpaqueHandle, topk_weights: torch.Tensor | None = None,
                bias: Any = None, config: Any = None, previous_event: Any = None, async_finish: bool = False,
                allocate_on_comm_stream: bool = False) -> tuple:
        """V1's combine: ``(combined_x, combined_topk_weights, event)``.  V2's combine takes a hidden size that is a
        multiple of 256 only: other sizes (V1 takes them) are padded with zero columns and cut back.  V1 sums each
        token's weights over the ranks that received it, V2 takes each slot's weight from its expert's rank: the
        weights are summed here (they differ where a caller passes weights at other ranks' slots, e.g. gradients)."""
        if config is not None:
            raise NotImplementedError("this facade offers no explicit config")
        ep, hidden = handle._ep, x.shape[1]
        padded = -(-hidden // 256) * 256
        if padded != hidden:
            if previous_event is not None:  # x may still be being written: wait before copying it
                previous_event.current_stream_wait()
                previous_event, allocate_on_comm_stream = None, False
            x = torch.nn.functional.pad(x, (0, padded - hidden))
            bias = tuple(torch.nn.functional.pad(b, (0, padded - hidden)) for b in bias) if isinstance(
                bias, tuple) else None if bias is None else torch.nn.functional.pad(bias, (0, padded - hidden))
        combined_x, _, event = self._elastic.combine(
            x, ep, bias=bias, num_sms=0, previous_event=_event_handle(previous_event),
            allocate_on_comm_stream=allocate_on_comm_stream, async_with_compute_stream=async_finish)
        finished = self._finished(event, async_finish)
        combined_w = None if topk_weights is None else self._summed_weights(ep, topk_weights)
        return combined_x[:, :hidden].contiguous(), combined_w, finished

    def _summed_weights(self, ep: Any, topk_weights: torch.Tensor) -> torch.Tensor:
        """V1's combined weights: for each of this rank's tokens, the sum of the weights every rank received it with
        (where received rows came from: V2's ``recv_src_metadata``, column 0 = ``src_rank * num_max + src_token``)."""
        group = self._elastic.group
        rows = topk_weights.shape[0]
        source = ep.recv_src_metadata[:rows, 0].to(torch.int64)
        sizes = [torch.zeros(1, dtype=torch.int64, device=source.device) for _ in range(group.size())]
        dist.all_gather(sizes, torch.tensor([rows], dtype=torch.int64, device=source.device), group=group)
        most = max(int(n.item()) for n in sizes)
        mine = torch.cat([source.to(torch.float64).unsqueeze(1), topk_weights.to(torch.float64)], dim=1)
        mine = torch.nn.functional.pad(mine, (0, 0, 0, most - rows))
        gathered = [torch.empty_like(mine) for _ in range(group.size())]
        dist.all_gather(gathered, mine, group=group)
        num_tokens, n_max, rank = ep.topk_idx.shape[0], ep.num_max_tokens_per_rank, group.rank()
        out = torch.zeros((num_tokens, topk_weights.shape[1]), dtype=torch.float32, device=topk_weights.device)
        for size, chunk in zip(sizes, gathered, strict=True):
            chunk = chunk[: int(size.item())]
            src = chunk[:, 0].to(torch.int64)
            here = src // n_max == rank
            out.index_add_(0, src[here] % n_max, chunk[here, 1:].to(torch.float32))
        return out


class ElasticBackedBuffer(_V1OverV2):
    """``deep_ep.Buffer``'s constructor and calls, with an ``ElasticBuffer`` inside."""

    def __init__(self, group: Any, num_nvl_bytes: int = 0, num_rdma_bytes: int = 0, low_latency_mode: bool = False,
                 num_qps_per_rank: int = 24, allow_nvlink_for_low_latency_mode: bool = True, allow_mnnvl: bool = False,
                 explicitly_destroy: bool = False, enable_shrink: bool = False, comm: Any = None) -> None:
        if low_latency_mode or enable_shrink:
            raise NotImplementedError("this facade offers normal mode only (no low-latency, no shrink mode)")
        num_bytes = max(_MIN_BYTES, -(-max(num_nvl_bytes, num_rdma_bytes) // _ALIGNMENT) * _ALIGNMENT)
        # deterministic=True (_own): V1's receive order (V2's own order differs across nodes; P13 holds V2's
        # deterministic order to V1's)
        self._elastic = self._own(group, explicitly_destroy, num_bytes=num_bytes)

    def destroy(self) -> None:
        """Release the buffer (``explicitly_destroy=True`` only, as V1); any call after it raises AttributeError."""
        assert self.explicitly_destroy, "`explicitly_destroy` flag must be set"
        self._elastic.destroy()
        self._elastic = None

    @staticmethod
    def capture() -> Any:
        """An event on the current stream (V1: an ``EventOverlap``)."""
        return deep_ep.EventOverlap(deep_ep.ElasticBuffer.capture())

    def get_comm_stream(self) -> Any:
        """The communication stream (V2's)."""
        return self._elastic.get_comm_stream()


class ForwardingBuffer(_V1OverV2):
    """A V1 facade around an ``ElasticBuffer`` built by the caller: it defines the V1 calls V2 lacks and forwards
    the rest (``destroy``, ``capture``, ``get_comm_stream``, ``barrier``) to the buffer through ``__getattr__``.
    Declares nothing: the suite probes the instance."""

    conformance_capabilities = None  # probe the instance (methods forwarded through __getattr__ count)

    def __init__(self, elastic: Any) -> None:
        self._elastic = elastic

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name == "capture":
            return lambda: deep_ep.EventOverlap(deep_ep.ElasticBuffer.capture())
        if name == "destroy":
            return self._destroy_forwarded
        return getattr(self._elastic, name)

    def _destroy_forwarded(self) -> None:
        self._elastic.destroy()  # after it the wrapper forgets the buffer: every call raises AttributeError, as V1
        self._elastic = None


class ForwardingBufferOnGroup(ForwardingBuffer):
    """The one-line construction adapter: a ``Buffer``-shaped constructor for :class:`ForwardingBuffer`."""

    def __init__(self, group: Any, num_nvl_bytes: int = 0, num_rdma_bytes: int = 0, explicitly_destroy: bool = False,
                 **_: Any) -> None:
        super().__init__(self._own(group, explicitly_destroy, num_bytes=1 << 30))

    def _destroy_forwarded(self) -> None:
        assert self.explicitly_destroy, "`explicitly_destroy` flag must be set"  # V1's check (its buffer is built
        super()._destroy_forwarded()  # with explicitly_destroy=True: _own)
