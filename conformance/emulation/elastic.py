"""Emulated elastic API: ``deep_ep.ElasticBuffer`` and ``deep_ep.EPHandle`` (V2).

(Over 400 lines: one class mirroring the library's ``ElasticBuffer``, kept whole so that it reads against
``deep_ep/buffers/elastic.py`` line by line.)
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from . import _checks, _comm, _exchange, _route, _sizing
from ._topology import get_topology
from .utils.event import EventHandle, EventOverlap, async_outputs

XType = torch.Tensor | tuple[torch.Tensor, torch.Tensor]
Bias = torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None


def _value_or(value: object, default: object) -> object:
    return default if value is None else value


class EPHandle:
    """Communication handle returned by ``ElasticBuffer.dispatch`` (same attributes as the real one)."""

    def __init__(
        self,
        do_expand: bool,
        num_experts: int,
        expert_alignment: int,
        num_max_tokens_per_rank: int,
        num_sms: int,
        topk_idx: torch.Tensor,
        num_recv_tokens: int,
        num_expanded_tokens: int,
        num_recv_tokens_per_expert_list: list,
        psum_num_recv_tokens_per_scaleup_rank: torch.Tensor,
        psum_num_recv_tokens_per_expert: torch.Tensor,
        num_unaligned_recv_tokens_per_expert: torch.Tensor,
        recv_src_metadata: torch.Tensor,
        dst_buffer_slot_idx: torch.Tensor,
        token_metadata_at_forward: torch.Tensor | None,
        channel_linked_list: torch.Tensor | None,
    ) -> None:
        assert topk_idx is not None
        self.do_expand = do_expand
        self.num_experts = num_experts
        self.expert_alignment = expert_alignment
        self.num_max_tokens_per_rank = num_max_tokens_per_rank
        self.num_sms = num_sms
        self.topk_idx = topk_idx
        self.psum_num_recv_tokens_per_scaleup_rank = psum_num_recv_tokens_per_scaleup_rank
        self.psum_num_recv_tokens_per_expert = psum_num_recv_tokens_per_expert
        self.num_unaligned_recv_tokens_per_expert = num_unaligned_recv_tokens_per_expert
        self.num_recv_tokens_per_expert_list = num_recv_tokens_per_expert_list
        self.recv_src_metadata = recv_src_metadata
        self.dst_buffer_slot_idx = dst_buffer_slot_idx
        self.token_metadata_at_forward = token_metadata_at_forward
        self.channel_linked_list = channel_linked_list
        self.num_recv_tokens = num_recv_tokens
        self.num_expanded_tokens = num_expanded_tokens
        self.cached_recv_src_metadata_before_sort = None


class ElasticBuffer:
    """Pure-PyTorch model of ``deep_ep.ElasticBuffer`` (expert-parallel dispatch/combine only)."""

    def __init__(
        self,
        group: dist.ProcessGroup,
        num_bytes: int | None = None,
        num_cpu_bytes: int = 0,
        num_max_tokens_per_rank: int = 0,
        hidden: int = 0,
        num_topk: int = 0,
        use_fp8_dispatch: bool = False,
        deterministic: bool = False,
        allow_hybrid_mode: bool = True,
        allow_multiple_reduction: bool = True,
        prefer_overlap_with_compute: bool = True,
        sl_idx: int = 3,
        num_allocated_qps: int = 0,
        num_cpu_timeout_secs: int = 300,
        num_gpu_timeout_secs: int = 100,
        explicitly_destroy: bool = False,
    ) -> None:
        self.group = group
        self.rank_idx = group.rank()
        self.num_ranks = group.size()
        self.allow_hybrid_mode = allow_hybrid_mode
        self.allow_multiple_reduction = allow_multiple_reduction
        self.prefer_overlap_with_compute = prefer_overlap_with_compute
        self.deterministic = deterministic
        self._topo = get_topology(group)
        if num_cpu_bytes > 0:
            assert num_bytes is not None
        if num_bytes is None:
            num_bytes = self._size_hint(
                self.num_ranks, num_max_tokens_per_rank, hidden, num_topk, use_fp8_dispatch, allow_hybrid_mode
            )
        self.num_bytes = num_bytes
        self.num_cpu_bytes = num_cpu_bytes
        self.num_max_tokens_per_rank = num_max_tokens_per_rank
        self.sl_idx = sl_idx
        if num_allocated_qps == 0:
            num_allocated_qps = _sizing.auto_num_allocated_qps(allow_hybrid_mode)
        self.num_allocated_qps = num_allocated_qps
        self.num_cpu_timeout_secs = num_cpu_timeout_secs
        self.num_gpu_timeout_secs = num_gpu_timeout_secs
        self.explicitly_destroy = explicitly_destroy
        self.runtime: object | None = object()
        self._sm_cache: dict[tuple, int] = {}
        #: Emulation-only, documented in DIVERGENCES.md: the SM/QP counts of the last dispatch/combine launch.
        self.last_launch: dict[str, object] | None = None
        self.num_scaleout_ranks, self.num_scaleup_ranks = self.get_logical_domain_size()
        self.scaleout_rank_idx = self.rank_idx // self.num_scaleup_ranks
        self.scaleup_rank_idx = self.rank_idx % self.num_scaleup_ranks
        self.num_rdma_ranks, self.num_nvlink_ranks = self.get_physical_domain_size()
        dist.barrier(group=group)

    # ----------------------------------------------------------------------------------- lifecycle/info
    def destroy(self) -> None:
        """Release the buffer (requires ``explicitly_destroy=True``)."""
        assert self.explicitly_destroy
        self.runtime = None

    def _check_alive(self) -> None:
        if self.runtime is None:
            raise RuntimeError("deep_ep emulation: the buffer was destroyed")

    @staticmethod
    def _size_hint(
        num_ranks: int,
        num_max_tokens_per_rank: int,
        hidden: int,
        num_topk: int,
        use_fp8_dispatch: bool,
        allow_hybrid_mode: bool,
    ) -> int:
        nodes = get_topology_nodes(num_ranks) if allow_hybrid_mode else 1
        return _sizing.buffer_size_hint(
            num_ranks, nodes, num_max_tokens_per_rank, hidden, num_topk, use_fp8_dispatch
        )

    @staticmethod
    def get_buffer_size_hint(
        group: dist.ProcessGroup,
        num_max_tokens_per_rank: int,
        hidden: int,
        num_topk: int = 0,
        use_fp8_dispatch: bool = False,
        allow_hybrid_mode: bool = True,
        allow_multiple_reduction: bool = True,
    ) -> int:
        """Approximate recommended buffer size in bytes (2 MiB aligned)."""
        return ElasticBuffer._size_hint(
            group.size(), num_max_tokens_per_rank, hidden, num_topk, use_fp8_dispatch, allow_hybrid_mode
        )

    def barrier(
        self, use_comm_stream: bool = True, with_cpu_sync: bool = False, sequential: bool = True
    ) -> None:
        """Barrier across the group."""
        self._check_alive()
        dist.barrier(group=self.group)

    @staticmethod
    def capture() -> EventHandle:
        """Capture an event on the current stream."""
        return EventHandle()

    def get_comm_stream(self) -> torch.Stream | None:
        """The emulation runs on the current stream; returns it on CUDA, ``None`` on CPU."""
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            return torch.cuda.current_stream()
        return None

    def get_physical_domain_size(self) -> tuple[int, int]:
        """``(num_rdma_ranks, num_nvlink_ranks)``: nodes and ranks per node."""
        return self._topo.num_nodes, self._topo.ranks_per_node

    def get_logical_domain_size(self) -> tuple[int, int]:
        """``(num_scaleout_ranks, num_scaleup_ranks)``: physical split if hybrid, else ``(1, num_ranks)``."""
        if self.allow_hybrid_mode and self._topo.num_nodes > 1:
            return self._topo.num_nodes, self._topo.ranks_per_node
        return 1, self.num_ranks

    def get_theoretical_num_sms(
        self,
        num_experts: int,
        num_topk: int,
        num_scaleout_topk: int = 0,
        rdma_gbs: float = 0,
        nvlink_gbs: float = 0,
        sm_read_gbs: float = 200,
        sm_write_gbs: float = 50,
    ) -> int:
        """The real bandwidth-model SM count (cached), with the CPU stand-ins of ``_sizing``."""
        key = (num_experts, num_topk, num_scaleout_topk, rdma_gbs, nvlink_gbs, sm_read_gbs, sm_write_gbs)
        if key not in self._sm_cache:
            self._sm_cache[key] = _sizing.theoretical_num_sms(
                num_experts,
                num_topk,
                self.num_ranks,
                self.num_scaleout_ranks,
                self.num_scaleup_ranks,
                self.num_rdma_ranks,
                self.num_nvlink_ranks,
                self.prefer_overlap_with_compute,
                num_scaleout_topk,
                rdma_gbs,
                nvlink_gbs,
                sm_read_gbs,
                sm_write_gbs,
            )
        return self._sm_cache[key]

    def get_theoretical_num_qps(self, num_sms: int) -> int:
        """Recommended QP count for ``num_sms``, capped by ``num_allocated_qps``."""
        return _sizing.theoretical_num_qps(num_sms, self.allow_hybrid_mode, self.num_allocated_qps)

    def __getattr__(self, name: str) -> object:
        if name.startswith(("engram_", "pp_", "agrs_")) or name in (
            "all_gather",
            "create_agrs_session",
            "destroy_agrs_session",
        ):
            raise NotImplementedError(f"deep_ep emulation: ElasticBuffer.{name} is not emulated")
        raise AttributeError(name)

    # ----------------------------------------------------------------------------------------- dispatch
    @async_outputs("async_with_compute_stream", 3)
    def dispatch(
        self,
        x: XType,
        topk_idx: torch.Tensor | None = None,
        topk_weights: torch.Tensor | None = None,
        cumulative_local_expert_recv_stats: torch.Tensor | None = None,
        num_experts: int | None = None,
        num_max_tokens_per_rank: int | None = None,
        expert_alignment: int | None = None,
        num_sms: int = 0,
        num_qps: int = 0,
        previous_event: EventHandle | None = None,
        previous_event_before_epilogue: EventHandle | None = None,
        async_with_compute_stream: bool = False,
        allocate_on_comm_stream: bool = False,
        handle: EPHandle | None = None,
        do_handle_copy: bool = True,
        do_cpu_sync: bool | None = None,
        do_expand: bool = False,
        do_zero_padding: bool = False,
        use_tma_aligned_col_major_sf: bool = False,
    ) -> tuple[XType, torch.Tensor | None, torch.Tensor | None, EPHandle, EventOverlap]:
        """Dispatch tokens to the ranks of their experts (see the real docstring).

        Returns ``(recv_x, recv_topk_idx, recv_topk_weights, handle, event_overlap)``.
        """
        self._check_alive()
        num_topk = (handle.topk_idx if topk_idx is None else topk_idx).shape[1]
        num_sms = self.get_theoretical_num_sms(num_experts, num_topk) if num_sms == 0 else num_sms
        num_qps = self.get_theoretical_num_qps(num_sms) if num_qps == 0 else num_qps
        assert num_qps <= self.num_allocated_qps, "Allocated QPs are not enough"
        self.last_launch = {"op": "dispatch", "num_sms": num_sms, "num_qps": num_qps}

        x, sf = x if isinstance(x, tuple) else (x, None)
        if handle is not None:
            assert topk_idx is None
            assert do_cpu_sync is None or not do_cpu_sync, "Cannot do CPU sync with cached handle"
            topk_idx = handle.topk_idx
            num_max_tokens_per_rank = _value_or(num_max_tokens_per_rank, handle.num_max_tokens_per_rank)
            num_experts = _value_or(num_experts, handle.num_experts)
            expert_alignment = _value_or(expert_alignment, handle.expert_alignment)
            do_cpu_sync = False
            assert (num_experts, expert_alignment, num_max_tokens_per_rank) == (
                handle.num_experts,
                handle.expert_alignment,
                handle.num_max_tokens_per_rank,
            )
            do_expand = handle.do_expand
        num_max_tokens_per_rank = _value_or(num_max_tokens_per_rank, self.num_max_tokens_per_rank)
        expert_alignment = _value_or(expert_alignment, 1)

        if previous_event is not None and not allocate_on_comm_stream:
            raise RuntimeError(_checks.V2_PREVIOUS_EVENT_ASSERT)
        if topk_idx.dtype != torch.int64:
            raise RuntimeError(_checks.V2_TOPK_IDX_ASSERT)
        _checks.expect_dtype(topk_weights, torch.float32)
        if num_experts % self.num_ranks != 0:
            raise RuntimeError("Assertion exception (deep_ep emulation): num_experts % num_ranks == 0")
        for event in (previous_event, previous_event_before_epilogue):
            if event is not None:
                event.current_stream_wait()

        error = _checks.expert_range_error(topk_idx, num_experts)
        if x.shape[0] > num_max_tokens_per_rank:
            error = (
                f"deep_ep emulation: {x.shape[0]} tokens exceed num_max_tokens_per_rank="
                f"{num_max_tokens_per_rank}"
            )
        counts = _comm.preflight(self.group, x.device, x.shape[0], error, "ElasticBuffer.dispatch")
        plan = self._receive(
            x,
            sf,
            topk_idx,
            topk_weights,
            counts,
            num_experts,
            num_max_tokens_per_rank,
            expert_alignment,
            do_expand,
        )
        if cumulative_local_expert_recv_stats is not None:
            cumulative_local_expert_recv_stats += torch.tensor(
                plan["raw"],
                dtype=cumulative_local_expert_recv_stats.dtype,
                device=cumulative_local_expert_recv_stats.device,
            )
        if handle is None:
            handle = EPHandle(
                do_expand,
                num_experts,
                expert_alignment,
                num_max_tokens_per_rank,
                num_sms,
                topk_idx.clone() if do_handle_copy else topk_idx,
                plan["num_recv_tokens"],
                plan["num_expanded_tokens"],
                plan["aligned"],
                plan["psum_scaleup"],
                plan["psum_expert"],
                plan["unaligned"],
                plan["metadata"],
                plan["dst_slots"],
                None,
                None,
            )
        event_overlap = EventOverlap(EventHandle(x.device) if async_with_compute_stream else None)
        if self.deterministic and async_with_compute_stream:
            event_overlap.register_hook_after_wait(
                lambda: None
            )  # order is already final (see DIVERGENCES.md)
        recv_x = (plan["recv_x"], plan["recv_sf"]) if sf is not None else plan["recv_x"]
        return recv_x, plan["recv_topk_idx"], plan["recv_topk_weights"], handle, event_overlap

    def _receive(
        self,
        x: torch.Tensor,
        sf: torch.Tensor | None,
        topk_idx: torch.Tensor,
        topk_weights: torch.Tensor | None,
        counts: list[int],
        num_experts: int,
        num_max_tokens_per_rank: int,
        expert_alignment: int,
        do_expand: bool,
    ) -> dict:
        me, world = self.rank_idx, self.num_ranks
        experts_per_rank = num_experts // world
        fields = {"x": x, "sf": sf, "topk_idx": topk_idx, "topk_weights": topk_weights}
        recv = _exchange.gather_selected(
            self.group,
            counts,
            fields,
            lambda s, f: _route.token_in_rank(f["topk_idx"], num_experts, world)[:, me],
        )
        hybrid = self.num_scaleout_ranks > 1
        group_key = recv.src_rank % self.num_scaleup_ranks if hybrid and not self.deterministic else None
        order = _route.receive_order(recv.src_rank, recv.src_token, num_max_tokens_per_rank, group_key)
        src_rank, src_token = recv.src_rank[order], recv.src_token[order]
        got = {name: (None if t is None else t[order]) for name, t in recv.fields.items()}
        global_topk = got["topk_idx"]
        local_topk = _route.to_local_topk(global_topk, me, experts_per_rank)
        raw = _route.count_per_local_expert(local_topk, experts_per_rank)
        aligned = [_route.align_up(c, expert_alignment) for c in raw]
        n = int(src_rank.numel())
        device = x.device
        scaleup_peer = src_rank % self.num_scaleup_ranks
        per_peer = (
            torch.bincount(scaleup_peer.cpu(), minlength=self.num_scaleup_ranks)
            if n
            else torch.zeros(self.num_scaleup_ranks, dtype=torch.int64)
        )
        metadata = torch.full((n, 2 + topk_idx.shape[1]), -1, dtype=torch.int32, device=device)
        metadata[:, 0] = (src_rank * num_max_tokens_per_rank + src_token).to(torch.int32)
        metadata[:, 1] = (
            src_rank * topk_idx.shape[1] + _route.last_slot_on_rank(global_topk, me, experts_per_rank)
        ).to(torch.int32)
        plan = {
            "raw": raw,
            "aligned": aligned,
            "num_recv_tokens": n,
            "num_expanded_tokens": sum(aligned),
            "psum_scaleup": torch.cumsum(per_peer, 0).to(torch.int32).to(device),
            "unaligned": torch.tensor(raw, dtype=torch.int32, device=device),
            "dst_slots": _route.dst_buffer_slots(
                topk_idx, me, world, experts_per_rank, num_max_tokens_per_rank
            ),
            "metadata": metadata,
        }
        if not do_expand:
            plan["psum_expert"] = (
                torch.cumsum(torch.tensor(aligned, dtype=torch.int64), 0).to(torch.int32).to(device)
            )
            plan.update(
                recv_x=got["x"],
                recv_sf=got["sf"],
                recv_topk_idx=local_topk,
                recv_topk_weights=got["topk_weights"],
            )
            return plan
        slots, raw, starts = _route.expand_layout(local_topk, experts_per_rank, expert_alignment)
        total = plan["num_expanded_tokens"]
        rows = slots[slots >= 0]
        token_of_row = torch.nonzero(slots >= 0)[:, 0]
        recv_x = torch.zeros((total,) + tuple(x.shape[1:]), dtype=x.dtype, device=device)
        recv_x[rows] = got["x"][token_of_row]
        recv_sf = None
        if sf is not None:
            recv_sf = torch.zeros((total,) + tuple(sf.shape[1:]), dtype=sf.dtype, device=device)
            recv_sf[rows] = got["sf"][token_of_row]
        recv_w = None
        if topk_weights is not None:
            recv_w = torch.zeros(total, dtype=topk_weights.dtype, device=device)
            recv_w[rows] = got["topk_weights"][slots >= 0]
        metadata[:, 2:] = slots.to(torch.int32)
        plan["psum_expert"] = torch.tensor(
            [s + c for s, c in zip(starts, raw, strict=False)], dtype=torch.int32, device=device
        )
        plan.update(recv_x=recv_x, recv_sf=recv_sf, recv_topk_idx=None, recv_topk_weights=recv_w)
        return plan

    # ------------------------------------------------------------------------------------------ combine
    @async_outputs("async_with_compute_stream", 2)
    def combine(
        self,
        x: torch.Tensor,
        handle: EPHandle,
        topk_weights: torch.Tensor | None = None,
        bias: Bias = None,
        num_sms: int = 0,
        num_qps: int = 0,
        previous_event: EventHandle | None = None,
        previous_event_before_epilogue: EventHandle | None = None,
        async_with_compute_stream: bool = False,
        allocate_on_comm_stream: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None, EventOverlap]:
        """Reduce expert outputs back to the source tokens (float32 accumulation, bias added).

        Returns ``(combined_x, combined_topk_weights, event_overlap)``.
        """
        self._check_alive()
        num_sms = handle.num_sms if num_sms == 0 else num_sms
        num_qps = self.get_theoretical_num_qps(num_sms) if num_qps == 0 else num_qps
        assert num_qps <= self.num_allocated_qps, "Allocated QPs are not enough"
        self.last_launch = {"op": "combine", "num_sms": num_sms, "num_qps": num_qps}
        biases: list[torch.Tensor] = []
        if isinstance(bias, torch.Tensor):
            biases = [bias]
        elif isinstance(bias, tuple):
            assert len(bias) == 2
            biases = [b for b in bias if b is not None]
        if previous_event is not None and not allocate_on_comm_stream:
            raise RuntimeError(_checks.V2_PREVIOUS_EVENT_ASSERT)
        if not _checks.v2_hidden_supported(x.shape[1], x.element_size()):
            raise RuntimeError(_checks.V2_JIT_FAILURE.format(hidden=x.shape[1]))
        _checks.expect_dtype(topk_weights, torch.float32)
        for event in (previous_event, previous_event_before_epilogue):
            if event is not None:
                event.current_stream_wait()

        meta = handle.recv_src_metadata
        n_max = handle.num_max_tokens_per_rank
        gidx = meta[:, 0].to(torch.int64)
        num_topk = handle.topk_idx.shape[1]
        if handle.do_expand:
            slots = meta[:, 2:].to(torch.int64)
            valid = slots >= 0
            tok, k = torch.nonzero(valid, as_tuple=True)
            rows = slots[valid]
            send_x = x[rows]
            send_g = gidx[tok]
            send_slot = k
            send_w = None
            if topk_weights is not None:
                send_w = torch.zeros((rows.numel(), num_topk), dtype=torch.float32, device=x.device)
                send_w[torch.arange(rows.numel(), device=x.device), k] = topk_weights[rows]
        else:
            n = meta.shape[0]
            send_x, send_g = x[:n], gidx
            send_slot = torch.full((n,), -1, dtype=torch.int64, device=x.device)
            send_w = None if topk_weights is None else topk_weights[:n]
        parts = _exchange.return_to_sources(
            self.group,
            x.device,
            torch.div(send_g, n_max, rounding_mode="floor"),
            {"x": send_x, "token": send_g % n_max, "slot": send_slot, "w": send_w},
        )
        num_tokens = handle.topk_idx.shape[0]
        contributions = [(p["token"], p["x"]) for p in parts]
        if self.num_scaleout_ranks > 1 and self.allow_multiple_reduction:
            per_node: list[list] = [[] for _ in range(self.num_scaleout_ranks)]
            for s, c in enumerate(contributions):
                per_node[s // self.num_scaleup_ranks].append(c)
            combined_x = _route.combine_reduce_two_level(
                num_tokens, x.shape[1], per_node, biases, x.dtype, x.device
            )
        else:
            combined_x = _route.combine_reduce(
                num_tokens, x.shape[1], contributions, biases, x.dtype, x.device
            )
        combined_w = None
        if topk_weights is not None:
            combined_w = torch.zeros((num_tokens, num_topk), dtype=torch.float32, device=x.device)
            owner = _route.expert_owner(handle.topk_idx, handle.num_experts // self.num_ranks)
            for s, p in enumerate(parts):
                tok = p["token"]
                if tok.numel() == 0:
                    continue
                slot_mask = torch.where(
                    (p["slot"] >= 0).unsqueeze(1),
                    torch.arange(num_topk, device=x.device).unsqueeze(0) == p["slot"].unsqueeze(1),
                    owner[tok] == s,
                )
                combined_w[tok] = torch.where(slot_mask, p["w"], combined_w[tok])
        event_overlap = EventOverlap(EventHandle(x.device) if async_with_compute_stream else None)
        return combined_x, combined_w, event_overlap


def get_topology_nodes(num_ranks: int) -> int:
    """Number of nodes implied by ``LOCAL_WORLD_SIZE`` for a group of ``num_ranks``."""
    import os

    rpn = int(os.environ.get("LOCAL_WORLD_SIZE", num_ranks) or num_ranks)
    rpn = max(1, min(rpn, num_ranks))
    return max(num_ranks // rpn, 1)
