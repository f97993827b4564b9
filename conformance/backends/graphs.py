"""CUDA graphs over the built-in adapters (capability ``cuda_graphs``, P29): the host-sync-free call each API offers
for capture, what a reader reads of it after a replay, and the capture itself.

* :func:`worst_case_step`: one dispatch (V1 ``num_worst_tokens``, V2 ``do_cpu_sync=False``) and the combine of the
  received rows (identity experts), device work only: what a serving stack captures for a decode step.  It returns
  the output tensors by name (a graph's outputs are these tensors, rewritten by every replay).
* :func:`readout`: those outputs read after the call (or a replay) ran: the valid rows as a :class:`DispatchView`
  (the rows past them are worst-case padding the library leaves unwritten, P19/P26) and the combine.
* :class:`CudaGraph`: ``torch.cuda.CUDAGraph`` capture as PyTorch's documentation asks (one warm-up run on a side
  stream, then the capture), replayed on demand; :func:`build_inside_capture`, a buffer built inside a capture.  The
  adapters' seams ``AdapterBase.graph_capture`` and ``AdapterBase.build_inside_capture`` use them for a real backend
  on a GPU and raise ``NotSupported`` otherwise (``contract.graphs_supported``): the emulation's calls synchronise
  with the host and cannot be captured, and a CPU has no graphs.
* :class:`EagerGraph`: the emulation's stand-in for a graph (its "capture" runs the step once, its "replay" runs it
  again and writes the results into the captured outputs, as a replay rewrites them).  No run uses it by itself:
  the mutants ``graph-stand-in`` (benign) and ``graph-replay-frozen`` (harmful) install it, so that P29's check is
  exercised on the CPU too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from conformance.backends.internals import internals
from conformance.core.example import Example
from conformance.core.views import DispatchView

Step = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], dict[str, torch.Tensor]]
#: Why a V1 world with several nodes has no graph step.
V1_INTERNODE = ("V1 num_worst_tokens is intranode only (deep_ep/buffers/legacy.py, Buffer.dispatch: 'this flag is "
                "for intranode only'); this world's buffer takes the internode path")

def worst_case_step(adapter: Any, example: Example) -> Step:
    """``step(x, topk_idx, topk_weights)``: ``adapter``'s host-sync-free dispatch then the combine of its received
    rows, on ``adapter``'s buffer for ``example``'s shape; the outputs by name."""
    if adapter.api == "v1":  # (intranode only: the caller checks, see V1_INTERNODE)
        # every token of every rank at most once: the most a rank can receive (0 would mean "not given": a host sync)
        worst = max(1, sum(example.tokens_per_rank))

        def v1(x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor) -> dict[str, torch.Tensor]:
            buf = adapter.buffer
            per_rank, per_rdma, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, example.num_experts)
            recv_x, recv_idx, recv_w, _, handle, _ = buf.dispatch(
                x, num_tokens_per_rank=per_rank, num_tokens_per_rdma_rank=per_rdma, is_token_in_rank=in_rank,
                num_tokens_per_expert=per_expert, topk_idx=idx, topk_weights=w,
                expert_alignment=example.expert_alignment, num_worst_tokens=worst)
            combined_x = buf.combine(recv_x, handle)[0]
            return {"recv_x": recv_x, "recv_topk_idx": recv_idx, "recv_topk_weights": recv_w,
                    **internals(adapter.spec).v1_graph_fields(handle), "combined_x": combined_x}

        return v1

    buffer = adapter.buffer(example)

    def v2(x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor) -> dict[str, torch.Tensor]:
        recv_x, recv_idx, recv_w, handle, _ = buffer.dispatch(
            x, topk_idx=idx, topk_weights=w, num_experts=example.num_experts,
            num_max_tokens_per_rank=example.num_max_tokens_per_rank, expert_alignment=example.expert_alignment,
            do_cpu_sync=False)
        combined_x = buffer.combine(recv_x, handle, num_sms=0)[0]
        return {"recv_x": recv_x, "recv_topk_idx": recv_idx, "recv_topk_weights": recv_w,
                "psum_num_recv_tokens_per_scaleup_rank": handle.psum_num_recv_tokens_per_scaleup_rank,
                "recv_src_metadata": handle.recv_src_metadata, "combined_x": combined_x}

    return v2


def describe_step(adapter: Any, example: Example, rank: int) -> str:
    """The captured calls, as failure messages show them."""
    t = example.tokens_per_rank[rank]
    if adapter.api == "v1":
        return (f"Buffer.dispatch(x[{t},{example.hidden}] bf16, ..., num_worst_tokens="
                f"{max(1, sum(example.tokens_per_rank))}) + Buffer.combine on rank {rank}")
    return (f"ElasticBuffer.dispatch(x[{t},{example.hidden}] bf16, ..., num_max_tokens_per_rank="
            f"{example.num_max_tokens_per_rank}, do_cpu_sync=False) + ElasticBuffer.combine on rank {rank}")


def readout(adapter: Any, out: dict[str, torch.Tensor], example: Example, rank: int,
            call: str) -> tuple[DispatchView, torch.Tensor]:
    """``(valid rows as a view, combined_x)`` of ``out`` (CPU copies: a replay rewrites ``out``), read after the
    step or a replay ran."""

    def copy(t: torch.Tensor) -> torch.Tensor:
        return t.detach().to("cpu", copy=True)

    if adapter.api == "v1":
        prefix = copy(out["rank_prefix_matrix"][:, rank]).to(torch.int64)  # received rows per source, summed
        valid = int(prefix[-1])
        src_rank = torch.repeat_interleave(torch.arange(prefix.numel()),
                                           torch.diff(prefix, prepend=prefix.new_zeros(1)))
        src_token = copy(out["recv_src_idx"][:valid]).to(torch.int64)
    else:
        valid = int(out["psum_num_recv_tokens_per_scaleup_rank"][-1])
        source = copy(out["recv_src_metadata"][:valid, 0]).to(torch.int64)
        src_rank, src_token = source // example.num_max_tokens_per_rank, source % example.num_max_tokens_per_rank
    view = DispatchView(backend=adapter.spec.name, api=adapter.api, call=f"{call} (its first {valid} rows)",
                        src_rank=src_rank, src_token=src_token, x=copy(out["recv_x"][:valid]),
                        topk_idx=copy(out["recv_topk_idx"][:valid]).to(torch.int64),
                        topk_weights=copy(out["recv_topk_weights"][:valid]), num_recv_tokens_per_expert=[])
    return view, copy(out["combined_x"])


class CudaGraph:
    """``step(*static)`` captured in a ``torch.cuda.CUDAGraph``: one warm-up run on a side stream, then the capture
    (PyTorch's recipe).  :attr:`outputs` are the captured outputs; :meth:`replay` reruns the graph and waits."""

    def __init__(self, step: Step, static: list[torch.Tensor]) -> None:
        current = torch.cuda.current_stream()
        side = torch.cuda.Stream()
        side.wait_stream(current)
        with torch.cuda.stream(side):
            step(*static)
        current.wait_stream(side)
        self._graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self._graph):
            self.outputs = step(*static)
        torch.cuda.synchronize()

    def replay(self) -> None:
        self._graph.replay()
        torch.cuda.synchronize()


class EagerGraph:
    """The emulation's stand-in for :class:`CudaGraph` (installed only by mutants): "capture" runs ``step`` once;
    :meth:`replay` runs it again on the static inputs and copies the results into :attr:`outputs`."""

    def __init__(self, step: Step, static: list[torch.Tensor]) -> None:
        self._step, self._static = step, static
        self.outputs = step(*static)

    def replay(self) -> None:
        for name, value in self._step(*self._static).items():
            self.outputs[name].copy_(value)


#: Said of a build inside a capture after which PyTorch left the capture's stream current (see below).
STREAM_LEFT = ("torch.cuda.graph's exit left the capture's side stream current (its capture_end raised before it "
               "restored the stream): the suite set the previous stream back; a caller must too")


def build_inside_capture(build: Callable[[], Any], device: torch.device) -> BaseException | None:
    """``build()`` inside a CUDA-graph capture (a buffer made lazily on its first use, in a captured step): what it
    raised (or the capture's end after it), ``None`` when it built.  When the capture fails, PyTorch's
    ``torch.cuda.graph.__exit__`` raises from ``capture_end()`` before it restores the caller's stream (seen on the
    real 2.1.0): the stream is set back here and the error says so (:data:`STREAM_LEFT`).  A device that
    cannot synchronise afterwards raises (the rank cannot go on)."""
    graph = torch.cuda.CUDAGraph()
    before = torch.cuda.current_stream(device)
    error: BaseException | None = None
    try:
        with torch.cuda.graph(graph):
            build()
    except Exception as exc:  # noqa: BLE001 - the outcome the property reports
        error = exc
    if torch.cuda.current_stream(device) != before:
        torch.cuda.set_stream(before)
        if error is not None:
            error.add_note(STREAM_LEFT)
    torch.cuda.synchronize(device)
    return error
