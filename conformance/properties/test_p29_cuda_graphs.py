"""P29 CUDA graphs: serving stacks capture their decode step's dispatch and combine in a CUDA graph and replay it
with new tokens copied into the captured inputs; some build the buffer lazily, i.e. inside a capture.  A replay
must give exactly what the same calls give eagerly on those inputs, and a buffer built inside a capture must work
or be refused clearly.

Per backend (the built-in adapters of both APIs, real library on a GPU: capability ``cuda_graphs``), on one shape:
the host-sync-free calls (V1 ``dispatch(num_worst_tokens=sum of the ranks' tokens)``, V2 ``dispatch(do_cpu_sync=
False)``, each followed by the combine of the received rows: identity experts) are captured once in a
``torch.cuda.CUDAGraph`` on static inputs holding input set 0, after one warm-up run on a side stream (PyTorch's
recipe); then run eagerly on every input set (set ``i`` > 0: same shapes, payloads and routing from another seed),
and the graph replayed once per drawn replay, that set copied into the static inputs first.  Then a buffer is built
inside another capture, and the graph is replayed once more.

Asserted on every rank, for every eager call and every replay: the valid rows (the first
``rank_prefix_matrix[-1, rank]`` rows in V1, ``psum_num_recv_tokens_per_scaleup_rank[-1]`` in V2, as read from the
captured outputs after the replay) hold exactly the oracle's receipts for that input set (sources, local experts,
bytes, weights: the eager bytes, whatever the row order), and the combine is P6's round trip of that set.  A replay
that repeats the captured inputs' results, or reads routing fixed at capture, fails naming the replay and the input set.
The buffer built inside a capture: refused on every rank with a message (the report's artifact ``built inside a
capture`` quotes it), or built on every rank and then dispatching the oracle's rows eagerly; a refusal on some ranks
only, or a crash, fails.  On a CPU, and for the emulation (whose calls synchronise with the host), the property is
unsupported, saying why; its check runs on the CPU only in the self-tests, through the emulation's stand-in for a
graph (mutants ``graph-stand-in``, ``graph-replay-frozen``).

Draws: the shared examples (V1: one node, ``num_worst_tokens`` is intranode only) with one to three input sets and
one to four replays in any order; the corners are a replay on the capture's own inputs after one on other inputs (a
replay must not keep the last set's results), a set whose routing leaves a rank nothing, and empty ranks.
"""

from __future__ import annotations

from typing import Any

from conformance.assertions import assert_view_matches_oracle, per_supported_backend, refused_on_every_rank
from conformance.checks.round_trip import check as round_trip_check
from conformance.core.cases import GraphCase
from conformance.properties import CheckContext, Property, register
from conformance.strategies import sized
from conformance.strategies.cuda_graphs import graph_cases
from conformance.tasks.cuda_graphs import GraphRun, Readout, graph_replays

#: The report's artifact: backend -> what building a buffer inside a capture gave over the examples.
KEY = "built inside a capture"


def check_readouts(ctx: CheckContext, case: GraphCase, backend: str, calls: list[list[Readout]]) -> None:
    """``calls[rank][i]``: the i-th call of every rank, on the same input set: oracle rows, P6's round trip."""
    __tracebackhide__ = True
    sets = case.input_sets()
    for i in range(len(calls[0])):
        example = sets[calls[0][i].input_set]
        for rank, readouts in enumerate(calls):
            assert_view_matches_oracle(ctx, example, rank, readouts[i].dispatch)
        round_trip_check(ctx, example, [{backend: readouts[i].combined} for readouts in calls])
        ctx.checking((backend,))  # P6's check ends by clearing which backend is checked: this one still is


def check(ctx: CheckContext, case: GraphCase, per_rank: list[dict[str, Any]]) -> None:
    """Every eager call and replay against the oracle; the build inside a capture works or is refused everywhere."""
    __tracebackhide__ = True
    for backend, runs in per_supported_backend(ctx, per_rank, case):
        graph_runs: list[GraphRun] = runs
        check_readouts(ctx, case, backend, [run.eager for run in graph_runs])
        check_readouts(ctx, case, backend, [run.replays for run in graph_runs])
        built = [run.built_inside_capture for run in graph_runs]
        call = f"{backend}: a buffer built inside a CUDA-graph capture"
        if refused_on_every_rank(built, call=call):
            ctx.record_seen(KEY, backend, "refused", str(built[0]))
        else:
            check_readouts(ctx, case, backend, [[b] for b in built])
            ctx.record_seen(KEY, backend, "built", "built; dispatched the oracle's rows eagerly")


PROPERTY = register(Property(
    id="P29-cuda-graphs",
    title="worst-case dispatch and combine captured in a CUDA graph and replayed on new inputs give the oracle's "
          "rows and sums; a buffer built inside a capture works or is refused on every rank (GPU only)",
    strategy=sized(graph_cases), task=graph_replays, check=check, case_type=GraphCase,
    needs=("cuda_graphs",),
))
test_cuda_graphs = PROPERTY.test
