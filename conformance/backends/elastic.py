"""Adapter for the elastic API ("V2": ``deep_ep.ElasticBuffer`` in DeepEP 2.1.0, ``deep_ep.EPBuffer`` in 2.5.0), with
production call conventions.

One buffer per (pinned ``num_max_tokens_per_rank``, hidden, top-k, deterministic, allow_multiple_reduction,
prefer_overlap_with_compute), ``num_allocated_qps=0``
(the automatic cap), ``explicitly_destroy=True`` with :meth:`ElasticAdapter.destroy` run before the
process group goes away (the real V2 crashed with an illegal memory access otherwise).

What differs by DeepEP version is the contract of the backend's version (``spec.contract``,
:mod:`conformance.versions`), which the adapter consults and no property does: the class it builds, and the keywords
the version takes (a keyword it removed is dropped where the call passes its old default; any other use, e.g.
``previous_event_before_epilogue`` or ``do_handle_copy=True`` on 2.5.0, is :class:`NotSupported` with the version's
reason).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from conformance import versions
from conformance.backends.contract import AdapterBase, NotSupported, Raw, current_stream_wait
from conformance.backends.public import release
from conformance.core.example import Example, RankInputs
from conformance.core.spec import BackendSpec
from conformance.core.views import DispatchOptions, DispatchView, V2Layout

#: Live buffers kept per rank; the least recently used one is destroyed beyond this.
MAX_LIVE_BUFFERS = 4


class ElasticAdapter(AdapterBase):
    """Drives the V2 class of ``module`` (the real ``deep_ep`` or the emulation of the backend's version) that the
    backend's DeepEP version names (``ElasticBuffer``, ``EPBuffer``)."""

    api = "v2"

    def __init__(self, spec: BackendSpec, module: ModuleType, group: Any, num_nodes: int) -> None:
        super().__init__(spec, module, group, num_nodes)
        self._buffers: OrderedDict[tuple, Any] = OrderedDict()
        self.contract = spec.contract
        #: The V2 class the backend drives (its version's: ``ElasticBuffer`` 2.1.0, ``EPBuffer`` 2.5.0).
        self.class_name = spec.class_name
        self.buffer_class = getattr(module, self.class_name)

    def call_kwargs(self, call: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        """``kwargs`` of ``call`` (``__init__``, ``dispatch``, ``combine``) as the backend's version takes them
        (``Contract.call_kwargs``); :class:`NotSupported` with the version's reason where it removed what they ask."""
        try:
            return self.contract.call_kwargs("v2", call, kwargs)
        except versions.NotInVersion as exc:
            raise NotSupported(f"{self.spec.name}: {exc}") from None

    def buffer(self, example: Example, deterministic: bool = False, allow_multiple_reduction: bool = True,
               prefer_overlap_with_compute: bool = True, use_fp8_dispatch: bool = False) -> Any:
        """The buffer pinned to this example's (num_max_tokens_per_rank, hidden, top-k) with these options
        (``use_fp8_dispatch``: sized for FP8 dispatches, deep_ep/buffers/elastic.py:306-309)."""
        key = (example.num_max_tokens_per_rank, example.hidden, example.num_topk, deterministic,
               allow_multiple_reduction, prefer_overlap_with_compute, use_fp8_dispatch)
        if key in self._buffers:
            self._buffers.move_to_end(key)
            return self._buffers[key]
        while len(self._buffers) >= MAX_LIVE_BUFFERS:
            _, old = self._buffers.popitem(last=False)
            release(old)
        self._buffers[key] = self.buffer_class(
            self.group,
            num_max_tokens_per_rank=example.num_max_tokens_per_rank,
            hidden=example.hidden,
            num_topk=example.num_topk,
            use_fp8_dispatch=use_fp8_dispatch,
            deterministic=deterministic,
            allow_multiple_reduction=allow_multiple_reduction,
            prefer_overlap_with_compute=prefer_overlap_with_compute,
            num_allocated_qps=0,
            explicitly_destroy=self.explicitly_destroy,
        )
        return self._buffers[key]

    def new_buffer(self, group: Any, **kwargs: Any) -> Any:
        """A buffer of the backend's class built with ``kwargs`` as its version takes them (:meth:`call_kwargs`):
        for tasks that build their own (an explicit ``num_bytes``, a fresh group)."""
        return self.buffer_class(group, **self.call_kwargs("__init__", kwargs))

    def size_hint(self, example: Example, **options: bool) -> int:
        """``ElasticBuffer.get_buffer_size_hint`` for this example's shape (``options``: ``use_fp8_dispatch``,
        ``allow_hybrid_mode``, ``allow_multiple_reduction``; none: what :meth:`buffer` gets by default)."""
        return self.shape_hint(example.num_max_tokens_per_rank, example.hidden, example.num_topk, **options)

    def shape_hint(self, num_max_tokens_per_rank: int, hidden: int, num_topk: int, **options: bool) -> int:
        """``ElasticBuffer.get_buffer_size_hint(group, num_max_tokens_per_rank, hidden, num_topk, **options)``."""
        return int(self.buffer_class.get_buffer_size_hint(
            self.group, num_max_tokens_per_rank, hidden, num_topk, **options))

    def capture(self) -> Any:
        """An event on the current stream (``ElasticBuffer.capture()``), for ``before_epilogue``."""
        return self.buffer_class.capture()

    def destroy(self) -> None:
        """Destroy every buffer (before the process group goes away)."""
        while self._buffers:
            _, buffer = self._buffers.popitem()
            release(buffer)

    def reduction_group(self, raw: Raw) -> int:
        """Hybrid mode with ``allow_multiple_reduction`` rounds each scale-out node's sum first; otherwise
        combine rounds once."""
        buffer = raw.buffer
        if int(buffer.num_scaleout_ranks) > 1 and bool(buffer.allow_multiple_reduction):
            return int(buffer.num_scaleup_ranks)
        return int(self.group.size())

    def describe_dispatch(self, example: Example, rank: int, options: DispatchOptions) -> str:
        """The call, as failure messages show it."""
        t = example.tokens_per_rank[rank]
        return (
            f"{self.class_name}.dispatch(x[{t},{example.hidden}] bf16, topk_idx[{t},{example.num_topk}], "
            f"topk_weights, num_experts={example.num_experts}, "
            f"num_max_tokens_per_rank={example.num_max_tokens_per_rank}, "
            f"expert_alignment={example.expert_alignment}, do_expand={options.do_expand}"
            + "".join(f", {name}={value}" for name, value in options.non_default().items()
                      if name not in ("allow_multiple_reduction", "prefer_overlap_with_compute"))
            + f") on rank {rank}"
            + (" [deterministic buffer]" if options.deterministic else "")
            + "".join(f" [buffer {name}={value}]" for name, value in options.non_default().items()
                      if name in ("allow_multiple_reduction", "prefer_overlap_with_compute"))
        )

    def dispatch(self, inputs: RankInputs, example: Example, options: DispatchOptions, rank: int, *,
                 stats: torch.Tensor | None = None, before_epilogue: Any = None, buffer: Any = None,
                 num_qps: int = 0, wait: Callable[[Any, Any], None] | None = None) -> tuple:
        """Dispatch; returns ``(view, raw)`` where raw keeps the handle for combine.  ``stats`` /
        ``before_epilogue``: ``cumulative_local_expert_recv_stats`` / ``previous_event_before_epilogue``;
        ``buffer``: a buffer the caller built (instead of the one of :meth:`buffer`), ``num_qps``: passed as is;
        ``wait(event, recv_x)``: how an async dispatch's event is waited on (default: ``current_stream_wait()``)."""
        if buffer is None:
            buffer = self.buffer(example, options.deterministic, options.allow_multiple_reduction,
                                 options.prefer_overlap_with_compute)
        kwargs = self.call_kwargs("dispatch", {
            "previous_event_before_epilogue": before_epilogue,  # needs no allocate_on_comm_stream (2.1.0)
            **({} if options.do_handle_copy is None else {"do_handle_copy": options.do_handle_copy}),
        })
        previous = buffer.capture() if options.previous_event else None  # orders dispatch after prior compute
        recv_x, recv_idx, recv_w, handle, event = buffer.dispatch(
            inputs.x,
            topk_idx=inputs.topk_idx,
            topk_weights=inputs.topk_weights,
            cumulative_local_expert_recv_stats=stats,
            num_experts=example.num_experts,
            num_max_tokens_per_rank=example.num_max_tokens_per_rank,
            expert_alignment=example.expert_alignment,
            num_qps=num_qps,
            previous_event=previous,
            async_with_compute_stream=options.async_finish,
            allocate_on_comm_stream=previous is not None,  # V2 refuses previous_event otherwise
            do_cpu_sync=options.do_cpu_sync,
            do_expand=options.do_expand,
            do_zero_padding=options.do_zero_padding,
            **kwargs,
        )
        if options.async_finish:
            (wait or current_stream_wait)(event, recv_x)
        source = handle.recv_src_metadata[:, 0].to(torch.int64).cpu()
        stride = handle.num_max_tokens_per_rank
        view = DispatchView(
            backend=self.spec.name,
            api=self.api,
            call=self.describe_dispatch(example, rank, options)
            + (f" [num_qps={num_qps}, buffer num_allocated_qps={buffer.num_allocated_qps}]" if num_qps else ""),
            src_rank=source // stride,
            src_token=source % stride,
            x=recv_x.cpu(),
            topk_idx=recv_idx.to(torch.int64).cpu() if recv_idx is not None else torch.empty(0),
            topk_weights=recv_w.cpu(),
            num_recv_tokens_per_expert=list(handle.num_recv_tokens_per_expert_list),
            layout=V2Layout(
                num_unaligned_recv_tokens_per_expert=handle.num_unaligned_recv_tokens_per_expert.cpu(),
                psum_num_recv_tokens_per_expert=handle.psum_num_recv_tokens_per_expert.cpu(),
                psum_num_recv_tokens_per_scaleup_rank=handle.psum_num_recv_tokens_per_scaleup_rank.cpu(),
                num_recv_tokens=int(handle.num_recv_tokens),
                recv_src_metadata=handle.recv_src_metadata.cpu(),
                num_sms=handle.num_sms,
                num_bytes=int(buffer.num_bytes),
                # do_handle_copy=False keeps the caller's topk_idx in the handle (deep_ep/buffers/elastic.py:1005)
                handle_topk_idx_is_input=handle.topk_idx is inputs.topk_idx or (
                    inputs.topk_idx.numel() > 0 and handle.topk_idx.data_ptr() == inputs.topk_idx.data_ptr()),
            ),
        )
        return view, Raw(recv_x, recv_w, handle=handle, buffer=buffer)

    def combine(
        self,
        raw: Raw,
        x: torch.Tensor,
        topk_weights: torch.Tensor | None = None,
        bias: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None = None,
        async_finish: bool = False,
        *,
        before_epilogue: Any = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``ElasticBuffer.combine`` with ``num_sms=0``: the SM count of the dispatch handle is reused
        (``before_epilogue``: ``previous_event_before_epilogue``)."""
        kwargs = self.call_kwargs("combine", {"previous_event_before_epilogue": before_epilogue})
        combined_x, combined_w, event = raw.buffer.combine(
            x, raw.handle, topk_weights=topk_weights, bias=bias, num_sms=0, async_with_compute_stream=async_finish,
            **kwargs,
        )
        if async_finish:
            event.current_stream_wait()
        return combined_x, combined_w

    def cached_dispatch(self, raw: Raw, x: torch.Tensor) -> torch.Tensor:
        """Cached dispatch as production calls it: ``num_experts`` passed explicitly.

        (Without ``num_experts`` and with ``num_sms=0`` the real DeepEP 2.1.0 raises a TypeError: the SM
        count is computed before ``num_experts`` is read from the handle.  P12 covers that defect.)
        """
        handle = raw.handle
        return raw.buffer.dispatch(x, handle=handle, num_experts=handle.num_experts)[0]

    def describe_combine(self, example: Example, rank: int) -> str:
        """The combine call, as failure messages show it."""
        return (f"{self.class_name}.combine(x, handle, topk_weights, num_sms=0, hidden={example.hidden}) on rank "
                f"{rank}")

    # ------------------------------------------------------------------------------------------------ FP8
    def fp8_dispatch(self, inputs: RankInputs, example: Example, x: torch.Tensor, scales: torch.Tensor,
                     col_major: bool = False, do_cpu_sync: bool = True, fp8_buffer: bool = False) -> dict[str, Any]:
        """``ElasticBuffer.dispatch((x, scales), ..., use_tma_aligned_col_major_sf=col_major,
        do_cpu_sync=do_cpu_sync)`` (capability ``fp8``; ``do_cpu_sync=False``: capability ``worst_case``) on the
        example's buffer (``fp8_buffer``: the one built with ``use_fp8_dispatch=True``); CPU copies of the received
        rows, scales (and their strides), source ids, counts and valid-row count, and the buffer's size."""
        buffer = self.buffer(example, use_fp8_dispatch=fp8_buffer)
        (recv_x, recv_scales), recv_idx, recv_w, handle, _ = buffer.dispatch(
            (x, scales), topk_idx=inputs.topk_idx, topk_weights=inputs.topk_weights, num_experts=example.num_experts,
            num_max_tokens_per_rank=example.num_max_tokens_per_rank, expert_alignment=example.expert_alignment,
            use_tma_aligned_col_major_sf=col_major, do_cpu_sync=do_cpu_sync)
        num_valid = int(handle.psum_num_recv_tokens_per_scaleup_rank[-1])
        source = handle.recv_src_metadata[:num_valid, 0].to(torch.int64).cpu()
        stride = handle.num_max_tokens_per_rank
        return {"x": recv_x.cpu().view(torch.uint8), "scales": recv_scales.cpu().contiguous(),
                "scales_stride": tuple(recv_scales.stride()),
                "topk_idx": recv_idx.cpu(), "src_rank": source // stride, "src_token": source % stride,
                "counts": list(handle.num_recv_tokens_per_expert_list), "num_valid": num_valid,
                "num_recv_tokens": int(handle.num_recv_tokens), "metadata_rows": int(handle.recv_src_metadata.shape[0]),
                "num_bytes": int(buffer.num_bytes)}
