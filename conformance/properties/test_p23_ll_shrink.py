"""P23 shrink mode (V1 ``Buffer(..., enable_shrink=True)``): with the ranks of ``case.masked`` failed (each masks
every rank: it neither sends nor waits) and the others masking them, ``low_latency_query_mask_buffer`` gives each
rank's masks (after ``low_latency_update_mask_buffer``; a rank masked and unmasked again, with ``mask`` left at its
default, is unmasked); a low-latency dispatch is the oracle's with the masked sources left out (their blocks
empty, their tokens neither counted nor in the statistics) and the combine of its rows (identity experts) is
``x * sum of the weights of the slots whose expert lives on an unmasked rank`` (a failed rank's result: zeros);
the wait costs of masked ranks do not move (the kernels do not wait for them); the masks survive the calls and
``clean_low_latency_buffer``; ``low_latency_clean_mask_buffer`` unmasks every rank and the next calls are the full
oracle's again (DeepEP 2.1.0 ``internode_ll.cu``: ``is_rank_masked`` at every send and wait;
``tests/legacy/test_low_latency.py --shrink-test``).

On the real library: the real V1 on one GPU without IBGDA ends ``clean_low_latency_buffer`` in shrink mode in an
illegal memory access (docs/real-runs/, runs 10b, 11a; the known defect ``v1-shrink-clean-needs-ibgda``); to be
re-run with one GPU per rank and IBGDA.
"""

from __future__ import annotations

from typing import Any

import torch

from conformance.assertions import assert_counter_accumulates, assert_within_tolerance, for_each_backend
from conformance.backends.low_latency import COST_BASE
from conformance.checks.low_latency import check_dispatch
from conformance.core.cases import ShrinkCase
from conformance.core.example import Example, build_all_inputs
from conformance.oracle.bounds import ll_combine_bound
from conformance.oracle.quantize import expert_rows, weighted_identity_combine
from conformance.properties import CheckContext, Property, register
from conformance.strategies import sized
from conformance.strategies.low_latency import shrink_cases
from conformance.tasks.low_latency import shrink_runs


def check_round_trip(run: dict[str, Any], example: Example, inputs: list, rank: int, masked: set[int]) -> None:
    """One bf16 dispatch and the combine of its rows on ``rank``, which masks ``masked``."""
    __tracebackhide__ = True
    check_dispatch(run, example, inputs, rank, masked)
    rows = expert_rows(example, inputs, rank, masked)
    counts = torch.tensor([sum(len(v) for v in rows[e].values()) for e in range(example.experts_per_rank)],
                          dtype=torch.int32)
    if not torch.equal(run["stats"].to(torch.int32), counts):
        raise AssertionError(f"cumulative_local_expert_recv_stats is {run['stats'].tolist()}, expected "
                             f"{counts.tolist()} (the slots of the unmasked sources) [{run['call']}]")
    base = torch.full((example.world_size,), COST_BASE, dtype=torch.int64)
    why = "a masked rank is neither waited for nor sends: its wait adds 0 cycles"
    for name, got, call in (("dispatch_wait_recv_cost_stats", run["cost"], run["call"]),
                            ("combine_wait_recv_cost_stats", run["combine_cost"], run["combine_call"])):
        assert_counter_accumulates(name, got, base, call=call, why=why, unchanged=sorted(masked))
    exact, magnitude = weighted_identity_combine(inputs, rank, masked, example.experts_per_rank)
    assert_within_tolerance("combined_x", run["combined"], exact, ll_combine_bound(exact, magnitude, example.num_topk),
                            call=f"{run['combine_call']} with ranks {sorted(masked)} masked", rank=rank)


def check(ctx: CheckContext, case: ShrinkCase, per_rank: list[dict[str, Any]]) -> None:
    """Per rank and backend: the queries after every step, the masked round trip, the unmasked one."""
    __tracebackhide__ = True
    example = case.example
    inputs = build_all_inputs(example)
    world = example.world_size

    def one(rank: int, backend: str, result: dict[str, Any]) -> None:
        masked = set(range(world)) if rank in case.masked else set(case.masked)
        view = [1 if r in masked else 0 for r in range(world)]
        steps = {"unmasked": ([0] * world, f"low_latency_update_mask_buffer(r) for every rank r on rank {rank}"),
                 "masked": (view, f"low_latency_update_mask_buffer(r, True) for r in {sorted(masked)} on rank {rank}"
                            + (f", then low_latency_update_mask_buffer({case.toggled}, mask=True) and "
                               f"(..., mask=False)" if case.toggled is not None and rank not in case.masked else "")),
                 "after calls": (view, f"a low-latency dispatch and combine on rank {rank}"),
                 "after clean_low_latency_buffer": (view, f"clean_low_latency_buffer on rank {rank}"),
                 "after low_latency_clean_mask_buffer": ([0] * world, f"low_latency_clean_mask_buffer() on rank "
                                                                      f"{rank}")}
        for step, (want, call) in steps.items():
            got = result["queries"][step]
            if got != want:
                raise AssertionError(f"low_latency_query_mask_buffer {step} is {got}, expected {want} (1 = masked) "
                                     f"[{call}]")
        check_round_trip(result["masked_run"], example, inputs, rank, masked)
        check_round_trip(result["unmasked_run"], example, inputs, rank, set())

    for_each_backend(ctx, case, per_rank, one)


PROPERTY = register(Property(
    id="P23-ll-shrink",
    title="V1 shrink mode: query = the masks set (update/unmask/clean_mask), dispatch and combine with masked ranks "
          "= the oracle without them (masked wait costs unchanged), masks survive clean_low_latency_buffer, "
          "clean_mask_buffer restores the full oracle",
    strategy=sized(shrink_cases), task=shrink_runs, check=check, case_type=ShrinkCase, apis=("v1",),
    needs=("low_latency", "shrink"),
))
test_ll_shrink = PROPERTY.test
