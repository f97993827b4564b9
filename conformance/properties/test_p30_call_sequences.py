"""P30 call sequences: one Buffer and one ElasticBuffer driven side by side through a sequence of calls, as a
training or serving loop drives them: dispatches with fresh routings or reused shapes, cached dispatches through any
live handle, combines of any dispatch in any order, async calls left in flight and chained by ``previous_event``,
autograd round trips, ``destroy`` followed by a use, re-creation.

After every step: each completed result equals the oracle for its own inputs (rows byte for byte, per-expert
counts, combine and gradients byte-exact for integer payloads), the backends agree with each other, a call on a
destroyed buffer raises the library's exception on every rank (its type and message for the library's own
backends, its type for a class backend; V2's second ``destroy()`` does nothing, as the library's), and nothing hangs
(the example timeout).  Each backend's calls end on every rank together: one backend raising is that backend's
failure at that step, and the other backends' results of the step are still checked.  The pytest run drives a
Hypothesis state machine, one step per task on the persistent world (:mod:`conformance.strategies.sequences`,
:mod:`conformance.tasks.sequences`); a failure shrinks to the shortest failing sequence and its message lists the
calls that reproduce it.

Real users keep one buffer for a whole training run and interleave calls; P30 drives one `Buffer` and one
`ElasticBuffer` per backend side by side through sequences drawn by a Hypothesis `RuleBasedStateMachine`
(`conformance/strategies/sequences.py`). Its rules: dispatch (fresh routing, or the token counts of an earlier
dispatch with other contents), cached dispatch through any live handle, combine of any dispatch not combined yet, in
any order, async calls left in flight (`async_finish` / `async_with_compute_stream`) and chained by `previous_event`
(a combine may run on the event of its dispatch still in flight, never on rows read before it), waits in any order,
an autograd round trip, `destroy()` then a use of the destroyed buffer (it must raise the refusal table's exception
on every rank; V2's second `destroy()` does nothing, as the library's), re-creation. Every step is one task on the
persistent world (the ranks keep the sequence's buffers between tasks; each sequence starts clean) and is checked at
once: each completed result equals the oracle for its own inputs (received rows as a multiset, per-expert counts,
combine and gradients byte-exact for integer payloads), the backends agree, nothing hangs. A failure shrinks to the
shortest failing sequence; the report prints it as calls (the counterexample's `calls`, also under the failure in
conformance.md) and its reproduction line replays it whole. This one was found and shrunk by the run, with the
mutant `stale-handle-after-newer-dispatch` planted (a buffer that combines through its newest handle instead of the
one passed):

```
0. s0 = Buffer(group, ...) and ElasticBuffer(group, ...)  # (re-)create the live buffers
1. s1 = dispatch(x, topk_idx, topk_weights, async_finish/async_with_compute_stream=True)
   # tokens_per_rank=[0, 1], routing=random, mask_ratio=0.0, payload=integers, seed=0, expert_alignment=1
2. s2 = dispatch(x, topk_idx, topk_weights)
   # tokens_per_rank=[0, 0], routing=random, mask_ratio=0.0, payload=integers, seed=0, expert_alignment=1
3. s3 = combine(s1.recv_x, s1.handle, async_finish/async_with_compute_stream=True, previous_event=s1.event,
                allocate_on_comm_stream=True)  # identity experts
```

Four mutants only sequences can find (`conformance/mutants/sequences.py`: a stale handle reused after a newer
dispatch, an async result read before its event has covered it, two in-flight calls sharing a receive tensor, a
destroyed buffer revived by a re-created one) are killed by P30 and by no other property (`python -m
conformance.mutation --mutants
stale-handle-after-newer-dispatch,event-misses-own-work-when-busy,async-calls-share-receive-slot,destroyed-buffer-revived-by-new-buffer`).
A sequence is up to 10 calls; the pytest run draws `--max-examples` / 4 sequences (6 by default).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch

from conformance.assertions import (
    assert_bytes_equal,
    assert_ints_equal,
    assert_positive_zero_rows,
    assert_raised_everywhere,
    assert_same_values,
    assert_sum_or_special,
    consecutive_pairs,
    hex_row,
)
from conformance.core.cases import SequenceCase
from conformance.core.example import Example, RankInputs, build_all_inputs, second_payload, upstream_combined_grad
from conformance.core.ids import column_of
from conformance.core.outcomes import NotChecked
from conformance.core.raisers import SuiteError
from conformance.core.spec import is_builtin_name
from conformance.core.views import Raised
from conformance.oracle.counts import expected_aligned_counts
from conformance.oracle.reduction import (
    expected_round_trip_bf16,
    expected_round_trip_sum,
    owner_rank,
    reach_counts,
)
from conformance.properties import BackendsFailed, CheckContext, Property, Stateful, register
from conformance.strategies import sized
from conformance.strategies.sequences import explicit_sequences, sequence_cases, sequence_machine
from conformance.tasks.sequences import NotMade, StepRaised, run_sequence, sequence_end, sequence_step

#: The refusal-table rows a call on a destroyed buffer raises, per (API, use); ``None``: the call does nothing.
DESTROYED_ROWS: dict[tuple[str, str], str | None] = {
    ("v1", "dispatch"): "v1_dispatch_after_destroy",
    ("v1", "combine"): "v1_combine_after_destroy",
    ("v1", "destroy"): "v1_destroy_twice",
    ("v2", "dispatch"): "v2_dispatch_after_destroy",
    ("v2", "combine"): "v2_combine_after_destroy",
    ("v2", "destroy"): None,  # deep_ep/buffers/elastic.py:375: `if self.runtime is not None:` (no refusal)
}

RowKey = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]


# ------------------------------------------------------------------------------------------------ the oracle


def expected_rows(example: Example, inputs: list[RankInputs], rank: int, payloads: list[torch.Tensor] | None = None
                  ) -> dict[RowKey, list[tuple[int, int]]]:
    """The rows ``rank`` must receive, as a multiset: key (x bits, local expert or -1 per slot, weight bits where
    the slot is local) -> the sources (rank, token) sending that row.  ``payloads`` replaces x (cached dispatch)."""
    per_rank = example.experts_per_rank
    out: dict[RowKey, list[tuple[int, int]]] = {}
    for src, rank_inputs in enumerate(inputs):
        x = rank_inputs.x if payloads is None else payloads[src]
        for token, row in enumerate(rank_inputs.topk_idx.tolist()):
            if rank not in {owner_rank(example, e) for e in row if e >= 0}:
                continue
            local = tuple(e - rank * per_rank if e >= 0 and owner_rank(example, e) == rank else -1 for e in row)
            weights = rank_inputs.topk_weights[token].contiguous().view(torch.int32).tolist()
            key = (tuple(x[token].contiguous().view(torch.int16).tolist()), local,
                   tuple(w if i >= 0 else 0 for i, w in zip(local, weights, strict=True)))
            out.setdefault(key, []).append((src, token))
    return out


def received_rows(x: torch.Tensor, topk_idx: torch.Tensor | None, topk_weights: torch.Tensor | None) -> list[RowKey]:
    """The received rows as keys of :func:`expected_rows` (weights at -1 slots are masked: V1 writes 0 there and
    V2 keeps the sender's weight, P4's documented divergence)."""
    xs = x.contiguous().view(torch.int16).tolist()
    if topk_idx is None:
        return [(tuple(r), (), ()) for r in xs]
    idx, ws = topk_idx.to(torch.int64).tolist(), topk_weights.contiguous().view(torch.int32).tolist()
    return [(tuple(r), tuple(i), tuple(w if k >= 0 else 0 for k, w in zip(i, wr, strict=True)))
            for r, i, wr in zip(xs, idx, ws, strict=True)]


def _x_only(rows: dict[RowKey, list[tuple[int, int]]]) -> dict[RowKey, list[tuple[int, int]]]:
    out: dict[RowKey, list[tuple[int, int]]] = {}
    for (x, _, _), sources in rows.items():
        out.setdefault((x, (), ()), []).extend(sources)
    return out


def assert_rows(got: list[RowKey], expected: dict[RowKey, list[tuple[int, int]]], *, name: str, rank: int,
                call: str, against: str = "the oracle") -> None:
    """The received rows are exactly the expected multiset; the message names the missing sources and the first
    row nobody sent."""
    __tracebackhide__ = True
    got_count = Counter(got)
    want_count = Counter({key: len(sources) for key, sources in expected.items()})
    if got_count == want_count:
        return
    missing = sorted(src for key, n in (want_count - got_count).items() for src in expected[key][-n:])
    extra = list((got_count - want_count).elements())
    first_extra = ""
    if extra:
        bits = torch.tensor(extra[0][0], dtype=torch.int16).view(torch.bfloat16)
        first_extra = (f"; first row that no rank sent: x={hex_row(bits, list(range(min(4, bits.numel()))))}, "
                       f"local experts {list(extra[0][1])}")
    raise AssertionError(
        f"{name}[rank {rank}] has {len(got)} rows, {against} {sum(want_count.values())}: "
        f"{len(missing)} expected row(s) missing or wrong (sources (rank, token) {missing[:6]}"
        f"{' ...' if len(missing) > 6 else ''}), {len(extra)} unexpected{first_extra} [{call}]")


# ------------------------------------------------------------------------------------------------- the check


def _call(case: SequenceCase, index: int, backend: str, rank: int) -> str:
    return f"step {index} `{case.steps[index].describe(index)}` on {backend}, rank {rank}"


def _combined(ctx: CheckContext, example: Example, inputs: list[RankInputs], got: torch.Tensor, rank: int, *,
              name: str, call: str) -> None:
    """A round trip with identity experts: x times the number of ranks each token reached (as P6)."""
    __tracebackhide__ = True
    expected = expected_round_trip_bf16(example, inputs, rank)
    unreached = [t for t, n in enumerate(reach_counts(example, inputs, rank)) if n == 0]
    if got.shape != expected.shape or got.dtype != expected.dtype:
        raise AssertionError(f"{name}[rank {rank}] has shape {tuple(got.shape)} {got.dtype}, expected "
                             f"{tuple(expected.shape)} bfloat16 [{call}]")
    assert_positive_zero_rows(got, unreached, name=name, rank=rank, call=call)
    if example.payload == "integers":
        assert_bytes_equal(got, expected, name=name, rank=rank, call=call)
    elif ctx.shape.nodes == 1:
        assert_same_values(got, expected, name=name, rank=rank, call=call)
    else:
        assert_sum_or_special(got, expected_round_trip_sum(example, inputs, rank, ctx.shape.ranks_per_node),
                              expected, two_level=True, name=name, rank=rank, call=call)


def check_result(ctx: CheckContext, case: SequenceCase, index: int, backend: str, rank: int, result: Any) -> None:
    """One backend's result of step ``index`` on ``rank`` against the oracle (``index`` names the call whose
    outputs ``result`` holds: the step itself, or the async step a ``wait`` read)."""
    __tracebackhide__ = True
    step = case.steps[index]
    call = _call(case, index, backend, rank)
    if step.op in ("create", "destroy"):
        if result is not None:
            raise AssertionError(f"unexpected result {result!r} [{call}]")
        return
    if step.op == "use_destroyed":
        return  # judged on every rank at once (check_step)
    if isinstance(result, dict) and "pending" in result:
        return  # still in flight: read and checked by its wait
    if step.op == "wait":
        check_result(ctx, case, step.ref, backend, rank, result)
        return
    dispatch = case.steps[step.ref] if step.op in ("cached", "combine") else step
    example = dispatch.example
    assert example is not None
    inputs = build_all_inputs(example)
    if step.op == "dispatch":
        assert_rows(received_rows(result["x"], result["topk_idx"], result["topk_weights"]),
                    expected_rows(example, inputs, rank), name="received rows (recv_x, recv_topk_idx, weights)",
                    rank=rank, call=call)
        assert_ints_equal(f"num_recv_tokens_per_expert_list[rank {rank}]", result["counts"],
                          expected_aligned_counts(example, inputs, rank), call=call)
    elif step.op == "cached":
        payloads = [second_payload(example, src) for src in range(example.world_size)]
        assert_rows(received_rows(result["x"], None, None), _x_only(expected_rows(example, inputs, rank, payloads)),
                    name=f"recv_x of the cached dispatch through s{step.ref}.handle", rank=rank, call=call)
    elif step.op == "combine":
        _combined(ctx, example, inputs, result["x"], rank, name="combined_x", call=call)
    elif step.op == "grad":
        _combined(ctx, example, inputs, result["combined"], rank, name="combined_x (forward)", call=call)
        grads = [RankInputs(upstream_combined_grad(example, r), inputs[r].topk_idx, inputs[r].topk_weights)
                 for r in range(example.world_size)]
        _combined(ctx, example, grads, result["grad_x"], rank, name="x.grad (backward: cached dispatch, then combine)",
                  call=call)


def _agree(case: SequenceCase, index: int, rank: int, first: tuple[str, Any], other: tuple[str, Any]) -> None:
    """Two backends read the same rows (as multisets) and the same combined bytes for one step."""
    __tracebackhide__ = True
    (name_a, a), (name_b, b) = first, other
    if not isinstance(a, dict) or not isinstance(b, dict) or "pending" in a or "pending" in b:
        return
    call = _call(case, index, name_b, rank) + f", against {name_a}"
    if "counts" in a:
        if Counter(received_rows(a["x"], a["topk_idx"], a["topk_weights"])) != Counter(
                received_rows(b["x"], b["topk_idx"], b["topk_weights"])):
            raise AssertionError(f"received rows[rank {rank}] differ between {name_a} and {name_b} [{call}]")
        assert_ints_equal(f"num_recv_tokens_per_expert_list[rank {rank}]", b["counts"], a["counts"], call=call,
                          why=name_a)
    elif a.get("kind") == "cached":
        if Counter(received_rows(a["x"], None, None)) != Counter(received_rows(b["x"], None, None)):
            raise AssertionError(f"cached recv_x rows[rank {rank}] differ between {name_a} and {name_b} [{call}]")
    else:
        for field in ("x", "combined", "grad_x"):
            if field in a and field in b:
                assert_same_values(b[field], a[field], name=field, rank=rank, call=call, against=name_a)


def check_step(ctx: CheckContext, case: SequenceCase, index: int, per_rank: list[dict[str, Any]],
               failed: frozenset[str] = frozenset()) -> None:
    """Step ``index`` of ``case``: every backend's result on every rank against the oracle, then pairwise (but the
    backends in ``failed``: they failed earlier in the sequence).  Each backend and pair is checked to its end (one
    that held is counted as held, ``complete``).  Where some backends failed and others held, the step raises
    :class:`~conformance.properties.BackendsFailed` (the sequence goes on for the others: a backend's failure never
    changes another backend's verdict); where none is left, the first failure."""
    __tracebackhide__ = True
    complete = getattr(ctx, "complete", None)
    backends = [name for name in (per_rank[0] if per_rank else {}) if name not in failed]
    failures: list[tuple[tuple[str, ...], BaseException]] = []
    broken: set[str] = set()
    for backend in backends:
        ctx.checking((backend,))
        results = [ranks[backend] for ranks in per_rank]
        try:
            _check_backend(ctx, case, index, backend, results)
        except (AssertionError, SuiteError) as failure:
            failures.append(((backend,), failure))
            broken.add(backend)
            continue
        if complete is not None:
            complete((backend,))
    for first, other in (getattr(ctx, "pairs", None) or consecutive_pairs)(backends):
        if first in broken or other in broken or any(
                isinstance(ranks[name], NotChecked | NotMade) for ranks in per_rank for name in (first, other)):
            continue  # nothing to compare: recorded as unsupported, or a failure of its own above
        ctx.checking((first, other))
        try:
            for rank, ranks in enumerate(per_rank):
                _agree(case, index, rank, (first, ranks[first]), (other, ranks[other]))
        except AssertionError as failure:
            failures.append(((first, other), failure))
            continue
        if complete is not None:
            complete((first, other))
    ctx.checking(None)
    if not failures:
        return
    where, failure = next(((w, f) for w, f in failures if isinstance(f, SuiteError)), failures[0])
    ctx.checking(where)
    listing = "\n".join(f"  {line}" for line in case.calls()[: index + 1])
    failure.args = (f"{failure.args[0]}\nthe call sequence (steps 0..{index}, shrunk by Hypothesis), on every "
                    f"backend side by side:\n{listing}",) + failure.args[1:]
    if isinstance(failure, SuiteError):
        raise failure
    columns = {column_of(tuple(w)): str(f) for w, f in failures if isinstance(f, AssertionError)}
    if any(name not in broken and not all(isinstance(ranks[name], NotChecked) for ranks in per_rank)
           for name in backends):  # others go on
        raise BackendsFailed(failure, columns, broken)  # type: ignore[arg-type]
    failure.failed_columns = columns  # type: ignore[attr-defined]  # every column that failed, with its message
    raise failure


def _check_backend(ctx: CheckContext, case: SequenceCase, index: int, backend: str, results: list[Any]) -> None:
    """One backend's results of step ``index`` (one per rank)."""
    __tracebackhide__ = True
    step = case.steps[index]
    raised = next((r for r in results if isinstance(r, StepRaised)), None)
    if raised is not None:
        _raised_in_step(case, index, backend, results)
    if any(isinstance(r, NotMade) for r in results):
        return  # failed at an earlier step (raised there)
    if step.op == "use_destroyed" and not any(isinstance(r, NotChecked) for r in results):
        _check_destroyed(case, index, backend, results[0]["api"], [r["raised"] for r in results],
                         ctx.contract(backend).refusals)
        return
    for rank, result in enumerate(results):
        if isinstance(result, NotChecked):
            ctx.not_checked(result, case)
            continue
        check_result(ctx, case, index, backend, rank, result)


def _raised_in_step(case: SequenceCase, index: int, backend: str, results: list[Any]) -> None:
    """A backend's call raised at step ``index``: its failure (its traceback), or a suite error where the suite's own
    code raised."""
    __tracebackhide__ = True
    first = next(r for r in results if isinstance(r, StepRaised))
    own = {rank: r for rank, r in enumerate(results) if isinstance(r, StepRaised) and r.traceback}
    suite = {rank: r.suite for rank, r in own.items() if r.suite}
    shown = min(own) if own else first.ranks[0]
    text = (own[shown].traceback or "").rstrip() if own else ""
    last = text.splitlines()[-1] if text else "(no traceback)"
    call = _call(case, index, backend, shown)
    if suite:
        raise SuiteError(f"the suite's own code raised at {suite[min(suite)]} (rank {min(suite)}) while making "
                         f"{call}: {last}; no verdict on {backend} for this step\n{text}")
    raise AssertionError(f"{backend} raised on rank(s) {first.ranks}: {last} [{call}]\n--- rank {shown} ---\n{text}")


def _check_destroyed(case: SequenceCase, index: int, backend: str, api: str, results: list[Raised],
                     refusals: Any) -> None:
    """A call on a destroyed buffer raises the refusal table's exception (``refusals``: the table of the backend's
    DeepEP version) on every rank (or does nothing, V2's second destroy), never crashes or hangs."""
    __tracebackhide__ = True
    step = case.steps[index]
    row = DESTROYED_ROWS[(api, step.use)]
    call = f"step {index} `{step.describe(index)}` on {backend}"
    if row is None:
        raised = [r for r in results if r.type is not None]
        if raised:
            raise AssertionError(f"{raised[0]} on a destroyed buffer's destroy(); the library returns (its runtime is "
                                 f"None: elastic.py:375) [{call}]")
        return
    # the library family's exception type for every backend; its exact message for the library's own backends only
    exact = is_builtin_name(backend)
    assert_raised_everywhere(results, call=call + f" (refusal-table row {row}" + ("" if exact else ": its exception "
                             "type; a class backend's message is its own") + ")", expected_type=refusals.exception(row),
                             message_pattern=refusals.message_pattern(row) if exact else None)


def check(ctx: CheckContext, case: SequenceCase, per_rank: list[list[dict[str, Any]]]) -> None:
    """A whole sequence run at once (``run_sequence``: replays and the kill matrix): every step, in order; a backend
    that failed is left out of the later steps, and the first failure is raised at the end."""
    __tracebackhide__ = True
    failed: set[str] = set()
    deferred: list[BackendsFailed] = []
    for index in range(len(case.steps)):
        try:
            check_step(ctx, case, index, [steps[index] for steps in per_rank], frozenset(failed))
        except BackendsFailed as partial:
            deferred.append(partial)
            failed |= partial.backends
        except AssertionError as failure:  # no backend left: the earlier failures are charged too
            if deferred:
                columns = ended_failure(deferred).failed_columns  # type: ignore[attr-defined]
                failure.failed_columns = {**columns, **getattr(failure, "failed_columns", {})}  # type: ignore
            raise
    if deferred:
        raise ended_failure(deferred)


def ended_failure(deferred: list[BackendsFailed]) -> AssertionError:
    """The failure a sequence with partial failures ends with: the first, charged to every column that failed."""
    failure = deferred[0].failure
    failure.failed_columns = {column: message for partial in reversed(deferred)  # type: ignore[attr-defined]
                              for column, message in partial.columns.items()}
    return failure


PROPERTY = register(Property(
    id="P30-call-sequences",
    title="call sequences on live V1 and V2 buffers (dispatch, cached, combine in any order, async in flight with "
          "previous_event, autograd, destroy then use, re-create): every result equals the oracle, the APIs agree",
    strategy=sized(sequence_cases), task=run_sequence, check=check, case_type=SequenceCase,
    explicit=explicit_sequences,
    needs=("combine", "cached_dispatch", "events", "lifecycle"),
    stateful=Stateful(machine=sequence_machine, step_task=sequence_step, end_task=sequence_end, check_step=check_step),
    shapes="small",
))
test_call_sequences = PROPERTY.test
