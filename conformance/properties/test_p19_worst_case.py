"""P19 host-sync-free dispatch: V1 ``num_worst_tokens=W`` returns ``W`` rows (top-k indices -1 past the received
ones, as the library's kernel writes them) and an empty per-expert count list; V2 ``do_cpu_sync=False`` returns
``num_ranks * num_max_tokens_per_rank`` rows, handle ``num_recv_tokens`` of that size, an empty count list, and the
valid count in ``psum_num_recv_tokens_per_scaleup_rank[-1]``; in both the valid rows are exactly P18's.  Padding
payload rows are not checked (the library leaves them uninitialised).

On the real library: held on the real V1 (docs/real-runs/, run 10b) and V2 (run 11b).
"""

from __future__ import annotations

from typing import Any

import torch

from conformance.assertions import for_each_backend
from conformance.checks.fp8_rows import call_of, check_rows
from conformance.core.example import Example, build_all_inputs, fp8_payload
from conformance.core.outcomes import NotChecked, Why
from conformance.oracle import expected_received_tokens
from conformance.properties import CheckContext, Property, register
from conformance.strategies import sized
from conformance.strategies.low_latency import fp8_examples
from conformance.tasks.low_latency import fp8_runs


def check(ctx: CheckContext, example: Example, per_rank: list[dict[str, Any]]) -> None:
    """Shapes, counts and padding of the worst-case variants; their valid rows against the oracle."""
    __tracebackhide__ = True
    inputs = build_all_inputs(example)
    payloads = [fp8_payload(example, r) for r in range(example.world_size)]

    def one(rank: int, backend: str, result: dict[str, Any]) -> None:
        expected = expected_received_tokens(example, inputs, rank)
        variants = [v for v in ("num_worst_tokens", "no_cpu_sync") if v in result]
        if "worst_refused" in result:  # a known limit of the library, excluded like V2's hidden-128 combine
            ctx.not_checked(NotChecked.example(backend, Why.LIMIT, "Buffer.dispatch(num_worst_tokens=W)",
                                               result["worst_refused"], "internode (more than one node)"), example)
            return
        if not variants:
            ctx.not_checked(NotChecked.part(backend, Why.CAPABILITY, "worst-case dispatch (capability worst_case)"))
        for variant in variants:
            run, call = result[variant], call_of(backend, variant, example, rank)
            worst = run["worst"]
            if run["num_valid"] != len(expected):
                raise AssertionError(f"valid rows on rank {rank}: {run['num_valid']}, expected {len(expected)} "
                                     f"[{call}]")
            shapes = {"recv_x rows": run["x"].shape[0], "scale rows": run["scales"].shape[0]}
            if variant == "no_cpu_sync":
                shapes.update({"handle.num_recv_tokens": run["num_recv_tokens"],
                               "recv_src_metadata rows": run["metadata_rows"]})
            for name, value in shapes.items():
                if value != worst:
                    raise AssertionError(f"{name} on rank {rank} is {value}, expected {worst} (the worst case: "
                                         f"num_ranks x num_max_tokens_per_rank) [{call}]")
            if run["counts"] != []:
                raise AssertionError(f"num_recv_tokens_per_expert_list on rank {rank} is {run['counts']}, "
                                     f"expected [] (no host sync) [{call}]")
            if variant == "num_worst_tokens":
                tail = run["topk_idx"][run["num_valid"]:]
                if tail.numel() and not bool((tail == -1).all()):
                    row = int(torch.nonzero((tail != -1).any(dim=1))[0]) + run["num_valid"]
                    raise AssertionError(f"recv_topk_idx row {row} (padding) on rank {rank} is "
                                         f"{run['topk_idx'][row].tolist()}, expected all -1 [{call}]")
            check_rows(run, example, rank, expected, payloads, call)

    for_each_backend(ctx, example, per_rank, one)


PROPERTY = register(Property(
    id="P19-worst-case",
    title="V1 num_worst_tokens and V2 do_cpu_sync=False: worst-case shapes, empty count lists, -1 padding of V1 "
          "top-k indices, valid rows as the oracle's",
    strategy=sized(fp8_examples), task=fp8_runs, check=check, needs=("fp8", "worst_case"),
))
test_worst_case = PROPERTY.test
