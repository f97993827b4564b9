"""P17 receive hooks and statistics: a low-latency dispatch returns a hook exactly when ``return_recv_hook=True``;
until the hook runs nothing is received (the statistics have not moved); after it the call's results hold (P15
checks their contents); and ``cumulative_local_expert_recv_stats``, passed to every call, equals the oracle's
per-local-expert slot counts accumulated over the calls made so far."""

from __future__ import annotations

from typing import Any

import torch

from conformance.assertions import for_each_backend
from conformance.core.example import Example, build_all_inputs
from conformance.oracle.quantize import expert_rows
from conformance.properties import CheckContext, Property, register
from conformance.strategies import sized
from conformance.strategies.low_latency import ll_examples
from conformance.tasks.low_latency import low_latency_runs


def check(ctx: CheckContext, example: Example, per_rank: list[dict[str, Any]]) -> None:
    """Per rank, backend and call: hook presence, statistics before the hook and after the call."""
    __tracebackhide__ = True
    inputs = build_all_inputs(example)

    def one(rank: int, backend: str, result: dict[str, Any]) -> None:
        rows = expert_rows(example, inputs, rank)
        per_call = torch.tensor([sum(len(v) for v in rows[e].values()) for e in range(example.experts_per_rank)],
                                dtype=torch.int32)
        previous = torch.zeros_like(per_call)
        for i, run in enumerate(result["dispatches"]):
            hook_on = run["options"][3]
            if run["hook_is_none"] == hook_on:
                raise AssertionError(f"the returned hook is {'None' if run['hook_is_none'] else 'a callable'}, "
                                     f"expected {'a callable' if hook_on else 'None'} [{run['call']}]")
            if hook_on and not torch.equal(run["stats_before_hook"], previous):
                raise AssertionError(
                    f"cumulative_local_expert_recv_stats before hook() is {run['stats_before_hook'].tolist()}, "
                    f"expected {previous.tolist()} (nothing received before the hook runs) [{run['call']}]")
            expected = per_call * (i + 1)
            if not torch.equal(run["stats_after"].to(torch.int32), expected):
                raise AssertionError(
                    f"cumulative_local_expert_recv_stats after call {i + 1} is {run['stats_after'].tolist()}, "
                    f"expected {expected.tolist()} (the oracle's slot counts per local expert "
                    f"{per_call.tolist()} accumulated over {i + 1} calls) [{run['call']}]")
            previous = expected

    for_each_backend(ctx, example, per_rank, one)


PROPERTY = register(Property(
    id="P17-ll-hooks-stats",
    title="low-latency receive hooks: returned iff requested, nothing received before the hook; "
          "cumulative_local_expert_recv_stats = oracle counts accumulated over the calls",
    strategy=sized(ll_examples), task=low_latency_runs, check=check, apis=("v1",), needs=("low_latency",),
))
test_ll_hooks_stats = PROPERTY.test
