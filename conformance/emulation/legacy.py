"""Emulated legacy API: ``deep_ep.Buffer`` (intranode and internode high-throughput dispatch/combine).

(Over 400 lines: one class mirroring the library's one class, whose dispatch, combine and handle layout must
stay side by side to be compared with ``deep_ep/buffers/legacy.py``.)
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from . import _checks, _comm, _exchange, _route
from ._topology import get_topology
from .config import Config
from .utils.event import EventHandle, EventOverlap, async_outputs

Bias = torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None

_DISPATCH_CONFIGS = {
    2: (24, 256, 6, 128),
    4: (6, 256, 6, 128),
    8: (6, 256, 6, 128),
    16: (36, 288, 20, 128),
    24: (32, 288, 8, 128),
    32: (32, 288, 8, 128),
    48: (32, 288, 8, 128),
    64: (32, 288, 8, 128),
    96: (20, 480, 12, 128),
    128: (20, 560, 12, 128),
    144: (32, 720, 12, 128),
    160: (28, 720, 12, 128),
}
_COMBINE_CONFIGS = {
    2: (10, 256, 6, 128),
    4: (9, 256, 6, 128),
    8: (4, 256, 6, 128),
    16: (4, 288, 12, 128),
    24: (1, 288, 8, 128),
    32: (1, 288, 8, 128),
    48: (1, 288, 8, 128),
    64: (1, 288, 8, 128),
    96: (1, 480, 8, 128),
    128: (1, 560, 8, 128),
    144: (2, 720, 8, 128),
    160: (2, 720, 8, 128),
}


def _event(device: torch.device, async_finish: bool) -> EventHandle | None:
    return EventHandle(device) if async_finish else None


def _unpack_bias(bias: Bias) -> list[torch.Tensor]:
    if isinstance(bias, torch.Tensor):
        return [bias]
    if isinstance(bias, tuple):
        assert len(bias) == 2
        return [b for b in bias if b is not None]
    return []


def _wait_previous(previous_event: EventOverlap | None) -> None:
    event = getattr(previous_event, "event", None)
    if event is not None:
        event.current_stream_wait()


class Buffer:
    """Pure-PyTorch model of ``deep_ep.Buffer`` running over any ``torch.distributed`` process group.

    Arguments mirror the real constructor; buffer sizes are recorded but not needed.  Low-latency kernels
    are not emulated.
    """

    num_sms: int = 20

    def __init__(
        self,
        group: dist.ProcessGroup | None,
        num_nvl_bytes: int = 0,
        num_rdma_bytes: int = 0,
        low_latency_mode: bool = False,
        num_qps_per_rank: int = 24,
        allow_nvlink_for_low_latency_mode: bool = True,
        allow_mnnvl: bool = False,
        explicitly_destroy: bool = False,
        enable_shrink: bool = False,
        comm: object | None = None,
    ) -> None:
        if group is None:
            if comm is not None:
                raise NotImplementedError("deep_ep emulation: mpi4py communicators are not supported")
            raise ValueError("Either 'group' or 'comm' must be provided.")
        self.rank = group.rank()
        self.group = group
        self.group_size = group.size()
        self.num_nvl_bytes = num_nvl_bytes
        self.num_rdma_bytes = num_rdma_bytes
        self.low_latency_mode = low_latency_mode
        self.num_qps_per_rank = num_qps_per_rank
        self.allow_nvlink_for_low_latency_mode = allow_nvlink_for_low_latency_mode
        self.allow_mnnvl = allow_mnnvl
        self.explicitly_destroy = explicitly_destroy
        self.enable_shrink = enable_shrink
        self._topo = get_topology(group)
        self.runtime: object | None = object()

    # ----------------------------------------------------------------------------------------- lifecycle
    def destroy(self) -> None:
        """Release the buffer (requires ``explicitly_destroy=True``)."""
        assert self.explicitly_destroy, "`explicitly_destroy` flag must be set"
        self.runtime = None

    def _check_alive(self) -> None:
        if self.runtime is None:
            raise RuntimeError("deep_ep emulation: the buffer was destroyed")

    @staticmethod
    def is_sm90_compiled() -> bool:
        """The emulation reports an SM90 build (no FP8 kernels are actually compiled)."""
        return True

    @staticmethod
    def set_num_sms(new_num_sms: int) -> None:
        """Set the SM count used by the default configs (must be even)."""
        assert new_num_sms % 2 == 0, "The SM count must be even"
        Buffer.num_sms = new_num_sms

    @staticmethod
    def capture() -> EventOverlap:
        """Capture an event on the current stream."""
        return EventOverlap(EventHandle())

    @staticmethod
    def get_low_latency_rdma_size_hint(
        num_max_dispatch_tokens_per_rank: int, hidden: int, num_ranks: int, num_experts: int
    ) -> int:
        """Approximate low-latency RDMA buffer size (not byte-exact with the real hint)."""
        per_msg = hidden * 2 + 16 + hidden // 128 * 4
        num_bytes = 2 * num_experts * num_max_dispatch_tokens_per_rank * per_msg * 2
        return _route.align_up(num_bytes, 128)

    def get_comm_stream(self) -> torch.Stream | None:
        """The emulation runs on the current stream; returns it on CUDA, ``None`` on CPU."""
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            return torch.cuda.current_stream()
        return None

    def get_local_buffer_tensor(self, *args: object, **kwargs: object) -> torch.Tensor:
        """Not emulated: there is no raw communication buffer."""
        raise NotImplementedError("deep_ep emulation: raw buffer tensors are not emulated")

    @staticmethod
    def get_dispatch_config(num_ranks: int) -> Config:
        """The real library's recommended dispatch config for ``num_ranks``."""
        assert num_ranks in _DISPATCH_CONFIGS, f"Unsupported number of EP ranks: {num_ranks}"
        return Config(Buffer.num_sms, *_DISPATCH_CONFIGS[num_ranks])

    @staticmethod
    def get_combine_config(num_ranks: int) -> Config:
        """The real library's recommended combine config for ``num_ranks``."""
        assert num_ranks in _COMBINE_CONFIGS, f"Unsupported number of EP ranks: {num_ranks}"
        return Config(Buffer.num_sms, *_COMBINE_CONFIGS[num_ranks])

    # ------------------------------------------------------------------------------------------ layout
    def get_dispatch_layout(
        self,
        topk_idx: torch.Tensor,
        num_experts: int,
        previous_event: EventOverlap | None = None,
        async_finish: bool = False,
        allocate_on_comm_stream: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor, EventOverlap]:
        """Per-rank / per-RDMA-rank / per-expert token counts and ``is_token_in_rank`` (see real docs).

        Unlike the real (communication-free) kernel, the emulation runs a tiny preflight collective so an
        invalid ``topk_idx`` on one rank raises on every rank instead of leaving peers hanging later.
        """
        self._check_alive()
        _checks.expect_dtype(topk_idx, torch.int64)
        _wait_previous(previous_event)
        error = None
        if num_experts % self.group_size != 0:
            error = (
                f"deep_ep emulation: num_experts={num_experts} is not divisible by {self.group_size} ranks"
            )
        error = error or _checks.expert_range_error(topk_idx, num_experts)
        _comm.preflight(self.group, topk_idx.device, topk_idx.shape[0], error, "Buffer.get_dispatch_layout")
        per_rank, per_rdma, per_expert, in_rank = _route.compute_layout(
            topk_idx, num_experts, self.group_size, self._topo.ranks_per_node
        )
        return per_rank, per_rdma, per_expert, in_rank, EventOverlap(_event(topk_idx.device, async_finish))

    # ---------------------------------------------------------------------------------------- dispatch
    @async_outputs("async_finish", 3)
    def dispatch(
        self,
        x: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        handle: tuple | None = None,
        num_tokens_per_rank: torch.Tensor | None = None,
        num_tokens_per_rdma_rank: torch.Tensor | None = None,
        is_token_in_rank: torch.Tensor | None = None,
        num_tokens_per_expert: torch.Tensor | None = None,
        topk_idx: torch.Tensor | None = None,
        topk_weights: torch.Tensor | None = None,
        expert_alignment: int = 1,
        num_worst_tokens: int = 0,
        config: Config | None = None,
        previous_event: EventOverlap | None = None,
        async_finish: bool = False,
        allocate_on_comm_stream: bool = False,
    ) -> tuple[
        tuple[torch.Tensor, torch.Tensor] | torch.Tensor,
        torch.Tensor | None,
        torch.Tensor | None,
        list[int] | None,
        tuple | None,
        EventOverlap,
    ]:
        """Dispatch tokens to the ranks holding their experts; cached when ``handle`` is given.

        Returns ``(recv_x, recv_topk_idx, recv_topk_weights, num_recv_tokens_per_expert_list, handle,
        event)``.
        """
        self._check_alive()
        config = self.get_dispatch_config(self.group_size) if config is None else config
        if self._topo.num_nodes > 1:
            assert num_worst_tokens == 0, "Internode dispatch does not support `num_worst_tokens > 0`"
            return self.internode_dispatch(
                x,
                handle,
                num_tokens_per_rank,
                num_tokens_per_rdma_rank,
                is_token_in_rank,
                num_tokens_per_expert,
                topk_idx,
                topk_weights,
                expert_alignment,
                config,
                previous_event,
                async_finish,
                allocate_on_comm_stream,
            )
        x, x_scales = x if isinstance(x, tuple) else (x, None)
        if handle is not None:
            assert topk_idx is None and topk_weights is None
            rank_prefix_matrix, channel_prefix_matrix, recv_cpm, recv_src_idx, is_token_in_rank, send_head = (
                handle
            )
            _wait_previous(previous_event)
            recv = self._exchange(x, x_scales, None, None, is_token_in_rank, None, "Buffer.dispatch")
            recv_x = self._pad_rows(recv.fields["x"], num_worst_tokens, 0)
            recv_scales = self._pad_rows(recv.fields["x_scales"], num_worst_tokens, 0)
            event = EventOverlap(_event(x.device, async_finish))
            return (recv_x, recv_scales) if x_scales is not None else recv_x, None, None, None, None, event

        recv, recv_topk_idx, recv_topk_weights, local_counts = self._receive(
            x, x_scales, topk_idx, topk_weights, num_tokens_per_rank, is_token_in_rank, num_tokens_per_expert,
            previous_event,
        )
        counts_list = (
            []
            if num_worst_tokens > 0
            else [_route.align_up(int(c), expert_alignment) for c in local_counts.cpu()]
        )

        handle = self._intranode_handle(recv, config, is_token_in_rank)
        recv_x = self._pad_rows(recv.fields["x"], num_worst_tokens, 0)
        recv_scales = self._pad_rows(recv.fields["x_scales"], num_worst_tokens, 0)
        recv_topk_idx = self._pad_rows(recv_topk_idx, num_worst_tokens, -1)
        recv_topk_weights = self._pad_rows(recv_topk_weights, num_worst_tokens, 0)
        event = EventOverlap(_event(x.device, async_finish))
        return (
            (recv_x, recv_scales) if x_scales is not None else recv_x,
            recv_topk_idx,
            recv_topk_weights,
            counts_list,
            handle,
            event,
        )

    def _receive(
        self,
        x: torch.Tensor,
        x_scales: torch.Tensor | None,
        topk_idx: torch.Tensor | None,
        topk_weights: torch.Tensor | None,
        num_tokens_per_rank: torch.Tensor | None,
        is_token_in_rank: torch.Tensor | None,
        num_tokens_per_expert: torch.Tensor | None,
        previous_event: EventOverlap | None,
    ) -> tuple[_exchange.Received, torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
        """The non-cached receive shared by intranode and internode dispatch.

        Returns the exchange result, ``recv_topk_idx`` (local or -1), ``recv_topk_weights`` (zeroed at -1
        slots, as the real V1 does) and the raw per-local-expert counts.
        """
        assert (
            num_tokens_per_rank is not None
            and is_token_in_rank is not None
            and num_tokens_per_expert is not None
        )
        _checks.expect_dtype(topk_idx, torch.int64)
        _checks.expect_dtype(topk_weights, torch.float32)
        _wait_previous(previous_event)
        num_experts = num_tokens_per_expert.numel()
        recv = self._exchange(
            x,
            x_scales,
            topk_idx,
            topk_weights,
            is_token_in_rank,
            num_tokens_per_expert,
            "Buffer.dispatch",
            num_experts,
        )
        experts_per_rank = num_experts // self.group_size
        recv_topk_idx = recv_topk_weights = None
        if topk_idx is not None:
            recv_topk_idx = _route.to_local_topk(recv.fields["topk_idx"], self.rank, experts_per_rank)
            if topk_weights is not None:
                w = recv.fields["topk_weights"]
                recv_topk_weights = torch.where(recv_topk_idx >= 0, w, torch.zeros_like(w))
        per_expert = torch.stack(recv.gathered["num_tokens_per_expert"]).reshape(self.group_size, num_experts)
        local_counts = per_expert[:, self.rank * experts_per_rank : (self.rank + 1) * experts_per_rank].sum(0)
        return recv, recv_topk_idx, recv_topk_weights, local_counts

    @staticmethod
    def _pad_rows(t: torch.Tensor | None, rows: int, value: float) -> torch.Tensor | None:
        if t is None or rows <= t.shape[0]:
            return t
        pad = torch.full((rows - t.shape[0],) + tuple(t.shape[1:]), value, dtype=t.dtype, device=t.device)
        return torch.cat([t, pad])

    def _exchange(
        self,
        x: torch.Tensor,
        x_scales: torch.Tensor | None,
        topk_idx: torch.Tensor | None,
        topk_weights: torch.Tensor | None,
        is_token_in_rank: torch.Tensor,
        num_tokens_per_expert: torch.Tensor | None,
        what: str,
        num_experts: int | None = None,
    ) -> _exchange.Received:
        error = None
        if num_experts is not None:
            if num_experts % self.group_size != 0:
                error = f"deep_ep emulation: {num_experts} experts not divisible by {self.group_size} ranks"
            error = error or _checks.expert_range_error(topk_idx, num_experts)
        if is_token_in_rank.shape != (x.shape[0], self.group_size):
            error = error or (
                f"deep_ep emulation: is_token_in_rank has shape {tuple(is_token_in_rank.shape)}, "
                f"expected {(x.shape[0], self.group_size)}"
            )
        counts = _comm.preflight(self.group, x.device, x.shape[0], error, what)
        fields = {
            "x": x,
            "x_scales": x_scales,
            "topk_idx": topk_idx,
            "topk_weights": topk_weights,
            "in_rank": is_token_in_rank.to(torch.bool),
        }
        recv = _exchange.gather_selected(self.group, counts, fields, lambda s, f: f["in_rank"][:, self.rank])
        if num_tokens_per_expert is not None:
            recv.gathered["num_tokens_per_expert"] = _comm.all_gather_rows(
                self.group, num_tokens_per_expert.reshape(1, -1), [1] * self.group_size
            )
        return recv

    def _intranode_handle(
        self, recv: _exchange.Received, config: Config, is_token_in_rank: torch.Tensor
    ) -> tuple:
        num_channels = config.num_channels
        device = is_token_in_rank.device
        world, me = self.group_size, self.rank
        per_src = torch.tensor([int(p[:, me].sum()) for p in recv.gathered["in_rank"]], dtype=torch.int32)
        rank_prefix_matrix = torch.zeros((world, world), dtype=torch.int32)
        rank_prefix_matrix[:, me] = torch.cumsum(per_src, 0).to(torch.int32)
        cpm = _route.channel_prefix_matrix(is_token_in_rank.to(torch.bool), num_channels)
        recv_cpm = torch.stack(
            [
                _route.recv_channel_prefix_row(_route.channel_prefix_matrix(p, num_channels)[me])
                for p in recv.gathered["in_rank"]
            ]
        )
        send_head = _route.send_head(is_token_in_rank.to(torch.bool), num_channels)
        return (
            rank_prefix_matrix.to(device),
            cpm,
            recv_cpm.to(device),
            recv.src_token.to(torch.int32),
            is_token_in_rank,
            send_head,
        )

    # ----------------------------------------------------------------------------------------- combine
    @async_outputs("async_finish", 2)
    def combine(
        self,
        x: torch.Tensor,
        handle: tuple,
        topk_weights: torch.Tensor | None = None,
        bias: Bias = None,
        config: Config | None = None,
        previous_event: EventOverlap | None = None,
        async_finish: bool = False,
        allocate_on_comm_stream: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None, EventOverlap]:
        """Reduce (unweighted sum, float32, one rounding) the received tokens back to their source ranks."""
        self._check_alive()
        config = self.get_combine_config(self.group_size) if config is None else config
        if self._topo.num_nodes > 1:
            return self.internode_combine(
                x, handle, topk_weights, bias, config, previous_event, async_finish, allocate_on_comm_stream
            )
        rank_prefix_matrix, _, _, src_idx, is_recv_token_in_rank, send_head = handle
        _checks.expect_dtype(topk_weights, torch.float32)
        _wait_previous(previous_event)
        column = rank_prefix_matrix[:, self.rank].to(torch.int64).cpu()
        num_recv = int(column[-1])
        starts = torch.cat([torch.zeros(1, dtype=torch.int64), column[:-1]])
        src_rank = torch.repeat_interleave(torch.arange(self.group_size), column - starts).to(x.device)
        combined_x, combined_w = self._reduce_back(
            x[:num_recv],
            src_rank,
            src_idx[:num_recv].to(torch.int64),
            None if topk_weights is None else topk_weights[:num_recv],
            is_recv_token_in_rank.shape[0],
            bias,
        )
        _route.rewrite_send_head_for_combine(send_head, config.num_channels)
        return combined_x, combined_w, EventOverlap(_event(x.device, async_finish))

    def _reduce_back(
        self,
        x: torch.Tensor,
        src_rank: torch.Tensor,
        src_token: torch.Tensor,
        topk_weights: torch.Tensor | None,
        num_tokens: int,
        bias: Bias,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        parts = _exchange.return_to_sources(
            self.group, x.device, src_rank, {"x": x, "token": src_token, "w": topk_weights}
        )
        contributions = [(p["token"], p["x"]) for p in parts]
        combined_x = _route.combine_reduce(
            num_tokens, x.shape[1], contributions, _unpack_bias(bias), x.dtype, x.device
        )
        combined_w = None
        if topk_weights is not None:
            combined_w = torch.zeros(
                (num_tokens, topk_weights.shape[1]), dtype=torch.float32, device=x.device
            )
            for p in parts:
                combined_w.index_add_(0, p["token"], p["w"])
        return combined_x, combined_w

    # --------------------------------------------------------------------------------------- internode
    def internode_dispatch(
        self,
        x: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        handle: tuple | None = None,
        num_tokens_per_rank: torch.Tensor | None = None,
        num_tokens_per_rdma_rank: torch.Tensor | None = None,
        is_token_in_rank: torch.Tensor | None = None,
        num_tokens_per_expert: torch.Tensor | None = None,
        topk_idx: torch.Tensor | None = None,
        topk_weights: torch.Tensor | None = None,
        expert_alignment: int = 1,
        config: Config | None = None,
        previous_event: EventOverlap | None = None,
        async_finish: bool = False,
        allocate_on_comm_stream: bool = False,
    ) -> tuple[
        tuple[torch.Tensor, torch.Tensor] | torch.Tensor,
        torch.Tensor | None,
        torch.Tensor | None,
        list[int] | None,
        tuple | None,
        EventOverlap,
    ]:
        """Multi-node dispatch; same results as intranode, internode handle tuple (see DIVERGENCES.md)."""
        assert config is not None
        x, x_scales = x if isinstance(x, tuple) else (x, None)
        if handle is not None:
            assert topk_idx is None and topk_weights is None
            is_token_in_rank = handle[0]
            _wait_previous(previous_event)
            recv = self._exchange(x, x_scales, None, None, is_token_in_rank, None, "Buffer.dispatch")
            event = EventOverlap(_event(x.device, async_finish))
            recv_x = recv.fields["x"]
            return (
                (recv_x, recv.fields["x_scales"]) if x_scales is not None else recv_x,
                None,
                None,
                None,
                None,
                event,
            )
        recv, recv_topk_idx, recv_topk_weights, local_counts = self._receive(
            x, x_scales, topk_idx, topk_weights, num_tokens_per_rank, is_token_in_rank, num_tokens_per_expert,
            previous_event,
        )
        counts_list = [_route.align_up(int(c), expert_alignment) for c in local_counts.cpu()]
        handle = self._internode_handle(recv, config, is_token_in_rank)
        event = EventOverlap(_event(x.device, async_finish))
        recv_x = recv.fields["x"]
        return (
            (recv_x, recv.fields["x_scales"]) if x_scales is not None else recv_x,
            recv_topk_idx,
            recv_topk_weights,
            counts_list,
            handle,
            event,
        )

    def _internode_handle(
        self, recv: _exchange.Received, config: Config, is_token_in_rank: torch.Tensor
    ) -> tuple:
        topo, me, world = self._topo, self.rank, self.group_size
        nodes, rpn = topo.num_nodes, topo.ranks_per_node
        num_channels = config.num_channels
        device = is_token_in_rank.device
        in_rank = is_token_in_rank.to(torch.bool)
        in_node = in_rank.reshape(in_rank.shape[0], nodes, rpn).any(dim=2)
        rdma_cpm = _route.channel_prefix_matrix(in_node, num_channels)
        gbl_cpm = _route.channel_prefix_matrix(in_rank, num_channels)
        peers = [n * rpn + topo.local_rank for n in range(nodes)]
        peer_in_node = [
            p.reshape(p.shape[0], nodes, rpn).any(dim=2) for p in (recv.gathered["in_rank"][q] for q in peers)
        ]
        recv_rdma_cpm = torch.stack(
            [
                _route.recv_channel_prefix_row(_route.channel_prefix_matrix(p, num_channels)[topo.node])
                for p in peer_in_node
            ]
        )
        recv_rdma_rank_prefix_sum = torch.cumsum(
            torch.tensor([int(p[:, topo.node].sum()) for p in peer_in_node]), 0
        ).to(torch.int32)
        recv_gbl_cpm = torch.stack(
            [
                _route.recv_channel_prefix_row(_route.channel_prefix_matrix(p, num_channels)[me])
                for p in recv.gathered["in_rank"]
            ]
        )
        recv_gbl_rank_prefix_sum = torch.cumsum(
            torch.tensor([int(p[:, me].sum()) for p in recv.gathered["in_rank"]]), 0
        ).to(torch.int32)
        recv_src_meta = torch.stack([recv.src_rank, recv.src_token], dim=1).to(torch.int32)
        send_rdma_head = _route.send_head(in_node, num_channels)
        rdma_rows = torch.cat(
            [
                recv.gathered["in_rank"][q][peer_in_node[i][:, topo.node]].reshape(-1, nodes, rpn)[
                    :, topo.node
                ]
                for i, q in enumerate(peers)
            ]
        )
        send_nvl_head = _route.send_head(rdma_rows, num_channels)
        del world
        return (
            is_token_in_rank,
            rdma_cpm,
            gbl_cpm,
            recv_rdma_cpm.to(device),
            recv_rdma_rank_prefix_sum.to(device),
            recv_gbl_cpm.to(device),
            recv_gbl_rank_prefix_sum.to(device),
            recv_src_meta,
            send_rdma_head,
            send_nvl_head.to(device),
        )

    def internode_combine(
        self,
        x: torch.Tensor,
        handle: tuple | list,
        topk_weights: torch.Tensor | None = None,
        bias: Bias = None,
        config: Config | None = None,
        previous_event: EventOverlap | None = None,
        async_finish: bool = False,
        allocate_on_comm_stream: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None, EventOverlap]:
        """Multi-node combine (same numerics as the intranode one in the emulation)."""
        assert config is not None
        is_combined_token_in_rank = handle[0]
        src_meta = handle[7]
        _checks.expect_dtype(topk_weights, torch.float32)
        _wait_previous(previous_event)
        num_recv = src_meta.shape[0]
        combined_x, combined_w = self._reduce_back(
            x[:num_recv],
            src_meta[:, 0].to(torch.int64),
            src_meta[:, 1].to(torch.int64),
            None if topk_weights is None else topk_weights[:num_recv],
            is_combined_token_in_rank.shape[0],
            bias,
        )
        return combined_x, combined_w, EventOverlap(_event(x.device, async_finish))

    # ------------------------------------------------------------------------------------- low latency
    def clean_low_latency_buffer(self, *args: object, **kwargs: object) -> None:
        """Not emulated (see DIVERGENCES.md)."""
        raise NotImplementedError("deep_ep emulation: low-latency kernels are not emulated")

    low_latency_dispatch = clean_low_latency_buffer
    low_latency_combine = clean_low_latency_buffer
    get_next_low_latency_combine_buffer = clean_low_latency_buffer
