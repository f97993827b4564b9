"""Rank task of P29 (CUDA graphs): per backend declaring ``cuda_graphs``, the host-sync-free dispatch and combine
(:func:`conformance.backends.graphs.worst_case_step`) captured once on static inputs holding input set 0, then run
eagerly on every input set, replayed once per entry of the case's ``replays`` (that set copied into the static
inputs first), a buffer built inside a capture (and, if it built, used eagerly), and the captured graph replayed
once more on set 0 after that; every call's outputs read right after it ran."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from conformance.backends.contract import NotSupported, Raw
from conformance.backends.graphs import V1_INTERNODE, describe_step, readout, worst_case_step
from conformance.core.cases import GraphCase
from conformance.core.example import build_rank_inputs
from conformance.core.views import DispatchView, Raised
from conformance.tasks.combine import CombineResult
from conformance.tasks.env import RankEnv, rank_task


@dataclass
class Readout:
    """One call (eager or a replay) on one input set, as read after it ran: its valid rows and its combine."""

    input_set: int
    dispatch: DispatchView
    combined: CombineResult


@dataclass
class GraphRun:
    """One backend on one rank: the eager calls (one per input set, in order), the replays (in the case's order,
    then the replay after the build inside a capture), and that build's outcome: what it raised, or (it built) the
    eager call on the buffer it built."""

    eager: list[Readout]
    replays: list[Readout]
    built_inside_capture: Raised | Readout | None = None


def refusal(exc: BaseException) -> Raised:
    """What building inside a capture raised; where the capture's end raised over the build's own error (PyTorch's
    ``torch.cuda.graph`` exit: "operation failed due to a previous error during capture"), that first error too."""
    first = exc.__context__
    message = " ".join(str(exc).split())
    if first is not None:
        message += f" (raised first, inside the capture: {type(first).__name__}: {' '.join(str(first).split())})"
    for note in getattr(exc, "__notes__", ()):
        message += f"; {note}"
    return Raised(type(exc).__name__, message)


@rank_task
def graph_replays(env: RankEnv) -> dict[str, Any]:
    """``{backend: GraphRun}`` for every backend declaring ``cuda_graphs`` (``NotChecked`` where it cannot)."""
    case: GraphCase = env.case
    sets = case.input_sets()
    inputs = [build_rank_inputs(example, env.rank).to(env.device) for example in sets]
    tensors = [(i.x, i.topk_idx, i.topk_weights) for i in inputs]

    def read(adapter: Any, out: dict, k: int, what: str) -> Readout:
        call = f"{describe_step(adapter, sets[k], env.rank)}, {what} on input set {k}"
        view, combined_x = readout(adapter, out, sets[k], env.rank, call)
        group = adapter.reduction_group(Raw(out["recv_x"], out["recv_topk_weights"],
                                            buffer=adapter.buffer(sets[k]) if adapter.api == "v2" else None))
        return Readout(k, view, CombineResult(call, combined_x, None, reduction_group=group))

    def run(adapter: Any) -> GraphRun:
        if adapter.api == "v1" and adapter.internode:
            raise NotSupported(V1_INTERNODE)
        step = worst_case_step(adapter, case.example)
        static = [t.clone() for t in tensors[0]]
        graph = adapter.graph_capture(step, static)
        eager = [read(adapter, step(*tensors[k]), k, "eager") for k in range(len(sets))]
        replays = []
        for n, k in enumerate(case.replays, 1):
            for dst, src in zip(static, tensors[k], strict=True):
                dst.copy_(src)
            graph.replay()
            replays.append(read(adapter, graph.outputs, k, f"replay {n} (of the graph captured on input set 0)"))
        fresh = type(adapter)(adapter.spec, adapter.module, adapter.group, adapter.num_nodes)
        try:
            raised = adapter.build_inside_capture(
                (lambda: fresh.buffer) if adapter.api == "v1" else (lambda: fresh.buffer(case.example)), env.device)
            built: Raised | Readout = refusal(raised) if raised is not None else read(
                fresh, worst_case_step(fresh, case.example)(*tensors[0]), 0,
                "eager, on a buffer built inside a CUDA-graph capture")
        finally:
            fresh.destroy()
        for dst, src in zip(static, tensors[0], strict=True):
            dst.copy_(src)
        graph.replay()
        replays.append(read(adapter, graph.outputs, 0, "replay after a buffer was built inside another capture"))
        return GraphRun(eager, replays, built)

    return env.each_backend("dispatch", run, capability="cuda_graphs", also=("combine",))
