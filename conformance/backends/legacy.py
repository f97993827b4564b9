"""Adapter for the legacy API, ``deep_ep.Buffer`` ("V1"), called the way integrators call it."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from conformance.backends.contract import AdapterBase, Raw, current_stream_wait
from conformance.backends.identity import decode_identity, identity_payload
from conformance.backends.internals import has_internals, internals
from conformance.backends.public import release
from conformance.backends.results import counts_list, kind, returned, tensors
from conformance.core.example import Example, RankInputs
from conformance.core.raisers import ApiViolation
from conformance.core.spec import BackendSpec
from conformance.core.views import DispatchOptions, DispatchView, V1Layout

#: Buffer sizes (NVLink and RDMA) big enough for every example the strategies draw.
NUM_NVL_BYTES = 1 << 30
NUM_RDMA_BYTES = 1 << 30


class LegacyAdapter(AdapterBase):
    """Drives ``module.Buffer`` (``module`` is the real ``deep_ep``, ``conformance.emulation``, or a class backend's
    public API: :mod:`conformance.backends.public`).

    Everything it learns comes from public results (the handle is passed back, never read), except, for the
    built-in backends only, what the seam :mod:`conformance.backends.internals` reads: the intranode handle's
    sources and channel count, the runtime's RDMA rank count."""

    api = "v1"

    def __init__(self, spec: BackendSpec, module: ModuleType, group: Any, num_nodes: int) -> None:
        super().__init__(spec, module, group, num_nodes)
        self._buffer: Any = None
        self._internals = internals(spec) if has_internals(spec) else None

    @property
    def buffer(self) -> Any:
        """The one ``Buffer`` of this rank (created on first use, destroyed by :meth:`destroy`)."""
        if self._buffer is None:
            self._buffer = self.module.Buffer(
                self.group,
                num_nvl_bytes=NUM_NVL_BYTES,
                num_rdma_bytes=NUM_RDMA_BYTES if self.num_nodes > 1 else 0,
                explicitly_destroy=self.explicitly_destroy,
            )
        return self._buffer

    def destroy(self) -> None:
        """Release the buffers (before the process group goes away)."""
        self.destroy_low_latency()
        if self._buffer is not None:
            buffer, self._buffer = self._buffer, None
            release(buffer)

    @property
    def internode(self) -> bool:
        """Whether the V1 contract's internode path applies: the library's ``runtime.get_num_rdma_ranks() > 1``
        (built-ins, through the internals seam), else the world the suite built (several nodes)."""
        if self._internals is not None:
            return self._internals.v1_num_rdma_ranks(self.buffer) > 1
        return self.num_nodes > 1

    def reduction_group(self, raw: Raw) -> int | None:
        """Intranode combine rounds once; internode (``get_num_rdma_ranks() > 1``) each node's NVLink forwarder
        rounds its ranks' sum first (``internode::combine``).  ``None`` for a class backend: its reduction tree is
        not part of its public API (the checks use the error bound)."""
        if self._internals is None:
            return None
        num_ranks = self.group.size()
        return num_ranks // max(1, self._internals.v1_num_rdma_ranks(self.buffer))

    def describe_dispatch(self, example: Example, rank: int) -> str:
        """The call, as failure messages show it."""
        t = example.tokens_per_rank[rank]
        return (
            f"Buffer.dispatch(x[{t},{example.hidden}] bf16, topk_idx[{t},{example.num_topk}], topk_weights, "
            f"num_experts={example.num_experts}, expert_alignment={example.expert_alignment}) on rank {rank}"
        )

    def dispatch(self, inputs: RankInputs, example: Example, options: DispatchOptions, rank: int, *,
                 wait: Callable[[Any, Any], None] | None = None) -> tuple:
        """Layout + dispatch; returns ``(view, raw)`` where raw keeps the handle for combine.  ``wait(event,
        recv_x)``: how an async dispatch's event is waited on (default ``event.current_stream_wait()``)."""
        buffer = self.buffer
        num_per_rank, num_per_rdma, num_per_expert, in_rank, _ = returned(
            "Buffer.get_dispatch_layout", buffer.get_dispatch_layout(inputs.topk_idx, example.num_experts), 5)
        previous = buffer.capture() if options.previous_event else None  # orders dispatch after prior compute
        config = {"config": self.table_config("dispatch", options.v1_num_sms)} if options.v1_num_sms else {}
        call = self.describe_dispatch(example, rank)
        recv_x, recv_idx, recv_w, counts, handle, event = returned("Buffer.dispatch", buffer.dispatch(
            inputs.x,
            num_tokens_per_rank=num_per_rank,
            num_tokens_per_rdma_rank=num_per_rdma,
            is_token_in_rank=in_rank,
            num_tokens_per_expert=num_per_expert,
            topk_idx=inputs.topk_idx,
            topk_weights=inputs.topk_weights,
            expert_alignment=example.expert_alignment,
            async_finish=options.async_finish,
            previous_event=previous,
            allocate_on_comm_stream=previous is not None,
            **config,
        ), 6, call)
        if options.async_finish:
            (wait or current_stream_wait)(event, recv_x)
        tensors(call, recv_x=recv_x, recv_topk_idx=recv_idx, recv_topk_weights=recv_w)
        layout = tensors("Buffer.get_dispatch_layout", num_tokens_per_rank=num_per_rank,
                         num_tokens_per_expert=num_per_expert, is_token_in_rank=in_rank)
        src_rank, src_token = self.sources(handle, inputs, rank, config)
        view = DispatchView(
            backend=self.spec.name,
            api=self.api,
            call=call + (
                f" [config: the table's for {self.config_ranks} ranks with num_sms={options.v1_num_sms}]"
                if options.v1_num_sms else ""),
            src_rank=src_rank,
            src_token=src_token,
            x=recv_x.cpu(),
            topk_idx=recv_idx.to(torch.int64).cpu(),
            topk_weights=recv_w.cpu(),
            num_recv_tokens_per_expert=counts_list(counts, call),
            layout=V1Layout(
                num_tokens_per_rank=layout["num_tokens_per_rank"].cpu(),
                num_tokens_per_expert=layout["num_tokens_per_expert"].cpu(),
                is_token_in_rank=layout["is_token_in_rank"].cpu(),
                # the handle's channel prefix matrix: one column per channel (config.num_sms // 2); built-ins only
                num_channels=None if self._internals is None else self._internals.v1_num_channels(handle),
            ),
        )
        return view, Raw(recv_x, recv_w, handle=handle, v1_num_sms=options.v1_num_sms)

    def sources(self, handle: Any, inputs: RankInputs, rank: int, config: dict[str, Any] | None = None,
                rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(src_rank, src_token)`` of every row a dispatch delivered: a built-in's intranode handle says (the
        internals seam); otherwise a cached dispatch of identity rows through the handle (public API: the handle is
        passed back, never read)."""
        if self._internals is not None and self._internals.v1_is_intranode_handle(handle):
            return self._internals.v1_sources(handle, rank, rows)
        ident = identity_payload(inputs.x.shape[0], inputs.x.shape[1], rank, inputs.x)
        out = self.buffer.dispatch(ident, handle=handle, **(config or {}))
        if not isinstance(out, tuple) or not out or not isinstance(out[0], torch.Tensor):
            raise ApiViolation(f"{self.spec.name}: Buffer.dispatch(x, handle=handle) returned {kind(out)}, a tuple "
                               f"whose first entry is recv_x expected [the cached dispatch of identity rows]")
        return decode_identity(out[0].cpu())

    @property
    def config_ranks(self) -> int:
        """The rank count the library's config tables are looked up for: the group's on one node; on several, eight
        NVLink ranks per RDMA rank (the tables' internode rows are written for full 8-GPU nodes).  The RDMA rank
        count is the runtime's for a built-in backend, the world's node count otherwise."""
        rdma_ranks = (self._internals.v1_num_rdma_ranks(self.buffer) if self._internals is not None
                      else self.num_nodes)
        return 8 * rdma_ranks if rdma_ranks > 1 else int(self.group.size())

    def table_config(self, kind: str, num_sms: int) -> Any:
        """The library's ``get_dispatch_config`` / ``get_combine_config`` entry (``kind``) for this world, built
        with ``num_sms`` SMs: ``Buffer.set_num_sms(num_sms)``, the lookup, then the previous SM count back."""
        cls = self.module.Buffer
        previous = cls.num_sms
        cls.set_num_sms(num_sms)
        try:
            return getattr(cls, f"get_{kind}_config")(self.config_ranks)
        finally:
            cls.set_num_sms(previous)

    def combine(
        self,
        raw: Raw,
        x: torch.Tensor,
        topk_weights: torch.Tensor | None = None,
        bias: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None = None,
        async_finish: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``Buffer.combine`` of expert outputs ``x`` (rows as received) back to their source ranks (with the table's
        combine config of the dispatch's SM count where the dispatch had an explicit config)."""
        config = {"config": self.table_config("combine", raw.v1_num_sms)} if raw.v1_num_sms else {}
        combined_x, combined_w, event = returned("Buffer.combine", self.buffer.combine(
            x, raw.handle, topk_weights=topk_weights, bias=bias, async_finish=async_finish, **config
        ), 3)
        if async_finish:
            event.current_stream_wait()
        return combined_x, combined_w

    def cached_dispatch(self, raw: Raw, x: torch.Tensor) -> torch.Tensor:
        """``Buffer.dispatch(x, handle=handle)``: same layout, new payload (the dispatch's config, if it had one)."""
        config = {"config": self.table_config("dispatch", raw.v1_num_sms)} if raw.v1_num_sms else {}
        return returned("Buffer.dispatch(x, handle=handle)", self.buffer.dispatch(x, handle=raw.handle, **config),
                        6)[0]

    def describe_combine(self, example: Example, rank: int) -> str:
        """The combine call, as failure messages show it."""
        return f"Buffer.combine(x, handle, topk_weights, hidden={example.hidden}) on rank {rank}"

    # ------------------------------------------------------------------------------------ low latency, FP8
    def low_latency(self, inputs: RankInputs, example: Example, rank: int, world_size: int) -> dict[str, Any]:
        """Every low-latency call of one example (capability ``low_latency``; see
        :mod:`conformance.backends.low_latency`)."""
        from conformance.backends import low_latency

        return low_latency.run(self, inputs, example, rank, world_size)

    def low_latency_shrink(self, inputs: RankInputs, case: Any, rank: int, world_size: int) -> dict[str, Any]:
        """The mask calls and the low-latency calls of a shrink-mode case (capability ``shrink``; see
        :func:`conformance.backends.low_latency.run_shrink`)."""
        from conformance.backends import low_latency

        return low_latency.run_shrink(self, inputs, case, rank, world_size)

    def low_latency_clean(self, inputs: RankInputs, case: Any, rank: int, world_size: int) -> dict[str, Any]:
        """``clean_low_latency_buffer`` on a dirty RDMA buffer and the calls after it (capability ``ll_buffer``;
        see :func:`conformance.backends.low_latency.run_clean`)."""
        from conformance.backends import low_latency

        return low_latency.run_clean(self, inputs, case, rank, world_size)

    def fp8_dispatch(self, inputs: RankInputs, example: Example, x: torch.Tensor, scales: torch.Tensor,
                     num_worst_tokens: int = 0) -> dict[str, Any]:
        """``Buffer.dispatch((x, scales), ...)`` (capability ``fp8``; ``num_worst_tokens``: capability
        ``worst_case``); CPU copies of the received rows, scales, source ids and counts."""
        buffer = self.buffer
        num_per_rank, num_per_rdma, num_per_expert, in_rank, _ = returned(
            "Buffer.get_dispatch_layout", buffer.get_dispatch_layout(inputs.topk_idx, example.num_experts), 5)
        call = f"Buffer.dispatch((x, scales), ..., num_worst_tokens={num_worst_tokens})"
        received, recv_idx, recv_w, counts, handle, _ = returned("Buffer.dispatch", buffer.dispatch(
            (x, scales), num_tokens_per_rank=num_per_rank, num_tokens_per_rdma_rank=num_per_rdma,
            is_token_in_rank=in_rank, num_tokens_per_expert=num_per_expert, topk_idx=inputs.topk_idx,
            topk_weights=inputs.topk_weights, expert_alignment=example.expert_alignment,
            num_worst_tokens=num_worst_tokens), 6, call)
        if not isinstance(received, tuple) or len(received) != 2:
            raise ApiViolation(f"{self.spec.name}: {call} returned recv_x={kind(received)}, a (recv_x, "
                               f"recv_scales) tuple expected for an FP8 (x, scales) dispatch")
        recv_x, recv_scales = received
        tensors(call, recv_x=recv_x, recv_scales=recv_scales, recv_topk_idx=recv_idx)
        rank = self.group.rank()
        if self._internals is not None and self._internals.v1_is_intranode_handle(handle):
            src_rank, src_token = self._internals.v1_sources(handle, rank)
            src_token = src_token[: src_rank.numel()]
        else:  # internode handles do not name the source token: a cached dispatch of bf16 identity rows does
            src_rank, src_token = self.sources(handle, inputs, rank)
        return {"x": recv_x.cpu().view(torch.uint8), "scales": recv_scales.cpu(),
                "scales_stride": tuple(recv_scales.stride()),
                "topk_idx": recv_idx.cpu(), "src_rank": src_rank, "src_token": src_token,
                "counts": [] if counts is None and num_worst_tokens else counts_list(counts, call),
                "num_valid": int(src_rank.numel())}

    def destroy_low_latency(self) -> None:
        from conformance.backends import low_latency

        low_latency.destroy_ll(self)

