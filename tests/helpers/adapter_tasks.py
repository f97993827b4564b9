"""Rank tasks for the adapter self-tests: drive the adapters over a spying deep_ep-like module."""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.distributed as dist

import conformance.emulation as emulation
from conformance.backends.elastic import MAX_LIVE_BUFFERS, ElasticAdapter
from conformance.backends.legacy import LegacyAdapter
from conformance.core.example import Example, build_rank_inputs
from conformance.core.spec import BackendSpec
from conformance.core.views import DispatchOptions
from conformance.world import rank as rank_module
from conformance.world.rank import context


def _simple(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Keep what can travel and be asserted on: plain values, and which tensors/handles were passed."""
    out: dict[str, Any] = {}
    for key, value in kwargs.items():
        if value is None or isinstance(value, bool | int | float | str):
            out[key] = value
        else:
            out[key] = type(value).__name__
    return out


def spy_module(log: list) -> types.SimpleNamespace:
    """A deep_ep-like module whose buffers log every constructor and call (keyword arguments)."""

    class SpyElasticBuffer(emulation.ElasticBuffer):
        def __init__(self, group: Any, **kwargs: Any) -> None:
            log.append(("ElasticBuffer", _simple(kwargs)))
            super().__init__(group, **kwargs)

        def dispatch(self, x: Any, *args: Any, **kwargs: Any) -> Any:
            log.append(("ElasticBuffer.dispatch", _simple(kwargs)))
            return super().dispatch(x, *args, **kwargs)

        def combine(self, x: Any, handle: Any, **kwargs: Any) -> Any:
            log.append(("ElasticBuffer.combine", _simple(kwargs)))
            return super().combine(x, handle, **kwargs)

        def destroy(self) -> None:
            log.append(("ElasticBuffer.destroy", {"process_group_alive": dist.is_initialized()}))
            super().destroy()

    class SpyBuffer(emulation.Buffer):
        def __init__(self, group: Any, **kwargs: Any) -> None:
            log.append(("Buffer", _simple(kwargs)))
            super().__init__(group, **kwargs)

        def destroy(self) -> None:
            log.append(("Buffer.destroy", {"process_group_alive": dist.is_initialized()}))
            super().destroy()

    return types.SimpleNamespace(ElasticBuffer=SpyElasticBuffer, Buffer=SpyBuffer)


def v2_conventions() -> dict[str, Any]:
    """Dispatch, combine, cached dispatch and buffer reuse through the V2 adapter; return the call log."""
    ctx = context()
    log: list = []
    adapter = ElasticAdapter(BackendSpec("emulated", "v2"), spy_module(log), ctx.group, ctx.num_nodes)
    example = Example((5, 3), 256, 2, 4, seed=1)
    inputs = build_rank_inputs(example, ctx.rank)
    _, raw = adapter.dispatch(inputs, example, DispatchOptions(), ctx.rank)
    adapter.combine(raw, raw.recv_x, raw.recv_topk_weights)
    cached = adapter.cached_dispatch(raw, inputs.x)
    same_bytes = torch.equal(cached.view(torch.int16), raw.recv_x.view(torch.int16))
    num_allocated_qps = raw.buffer.num_allocated_qps
    adapter.dispatch(inputs, example, DispatchOptions(), ctx.rank)  # same pinned key: no new buffer
    for hidden in (512, 1024, 2048, 4096):  # new keys: the least recently used buffer is destroyed
        bigger = Example((5, 3), hidden, 2, 4, seed=1)
        adapter.dispatch(build_rank_inputs(bigger, ctx.rank), bigger, DispatchOptions(), ctx.rank)
    adapter.destroy()
    return {"log": log, "cached_same_bytes": same_bytes, "num_allocated_qps": num_allocated_qps,
            "max_live": MAX_LIVE_BUFFERS}


def v1_buffer_arguments() -> list:
    """The V1 adapter's constructor arguments on this world."""
    ctx = context()
    log: list = []
    adapter = LegacyAdapter(BackendSpec("emulated", "v1"), spy_module(log), ctx.group, ctx.num_nodes)
    example = Example((4, 4), 256, 2, 4, seed=2)
    adapter.dispatch(build_rank_inputs(example, ctx.rank), example, DispatchOptions(), ctx.rank)
    adapter.destroy()
    return log


def destroy_happens_before_the_process_group() -> list:
    """Register adapters like the factory does, then run the world's shutdown path; return the log."""
    ctx = context()
    log: list = []
    for cls, api in ((ElasticAdapter, "v2"), (LegacyAdapter, "v1")):
        adapter = cls(BackendSpec("emulated", api), spy_module(log), ctx.group, ctx.num_nodes)
        rank_module.on_shutdown(adapter.destroy)
        example = Example((4, 4), 256, 2, 4, seed=3)
        adapter.dispatch(build_rank_inputs(example, ctx.rank), example, DispatchOptions(), ctx.rank)
    rank_module._shutdown()  # noqa: SLF001 - the path World.close() takes in every rank
    return log


def v2_previous_event_convention() -> list:
    """An async dispatch ordered after prior compute, through the V2 adapter; return the call log."""
    ctx = context()
    log: list = []
    adapter = ElasticAdapter(BackendSpec("emulated", "v2"), spy_module(log), ctx.group, ctx.num_nodes)
    example = Example((5, 3), 256, 2, 4, seed=4)
    options = DispatchOptions(async_finish=True, previous_event=True)
    adapter.dispatch(build_rank_inputs(example, ctx.rank), example, options, ctx.rank)
    adapter.destroy()
    return log


def v2_option_conventions() -> list:
    """The V2 dispatch / buffer options and the epilogue event through the V2 adapter; return the call log."""
    ctx = context()
    log: list = []
    adapter = ElasticAdapter(BackendSpec("emulated", "v2"), spy_module(log), ctx.group, ctx.num_nodes)
    example = Example((5, 3), 256, 2, 4, seed=5, expert_alignment=2)
    inputs = build_rank_inputs(example, ctx.rank)
    stats = torch.zeros(example.experts_per_rank, dtype=torch.int32)
    options = DispatchOptions(do_handle_copy=False, allow_multiple_reduction=False, prefer_overlap_with_compute=False)
    _, raw = adapter.dispatch(inputs, example, options, ctx.rank, stats=stats, before_epilogue=adapter.capture())
    adapter.combine(raw, raw.recv_x, before_epilogue=adapter.capture())
    expand = DispatchOptions(do_expand=True, do_zero_padding=True, do_cpu_sync=False)
    adapter.dispatch(inputs, example, expand, ctx.rank)  # the default buffer options: another buffer
    adapter.destroy()
    return log
