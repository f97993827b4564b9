"""P17 receive hooks, events and statistics: a low-latency dispatch returns a hook exactly when
``return_recv_hook=True`` and an event exactly when ``async_finish=True`` (csrc/legacy/buffer.hpp:1580-1592,
:1699-1711; a combine too); until the hook runs nothing is received (the statistics and the wait costs have not
moved; a combine's ``out=`` tensor keeps its contents); after it (or the wait on the event) the call's results hold
(P15, P16 check their contents); ``cumulative_local_expert_recv_stats``, passed to every call, equals the oracle's
per-local-expert slot counts accumulated over the calls made so far; and the wait-cost counters
``dispatch_wait_recv_cost_stats`` / ``combine_wait_recv_cost_stats`` (clock cycles per source rank, from a running
value) only grow.

The cost values themselves are timing (``clock64()`` differences of the receive phase's polling loop,
``internode_ll.cu:384-416`` and ``:948-974``): a wait whose data had arrived at the first poll adds 0, so no value,
not even a positive one, can be predicted; P23 checks that masked ranks add nothing.

On the real library: held on the real V1 (docs/real-runs/, run 10b); its recording replays exactly.
"""

from __future__ import annotations

from typing import Any

import torch

from conformance.assertions import (
    assert_bytes_equal,
    assert_counter_accumulates,
    assert_returned_iff,
    for_each_backend,
)
from conformance.backends.low_latency import COST_BASE
from conformance.core.example import Example, build_all_inputs
from conformance.oracle.quantize import expert_rows
from conformance.properties import CheckContext, Property, register
from conformance.strategies import sized
from conformance.strategies.low_latency import ll_examples
from conformance.tasks.low_latency import low_latency_runs


def check(ctx: CheckContext, example: Example, per_rank: list[dict[str, Any]]) -> None:
    """Per rank, backend and call: hook presence, statistics and costs before the hook and after the call."""
    __tracebackhide__ = True
    inputs = build_all_inputs(example)
    base = torch.full((example.world_size,), COST_BASE, dtype=torch.int64)

    def one(rank: int, backend: str, result: dict[str, Any]) -> None:
        rows = expert_rows(example, inputs, rank)
        per_call = torch.tensor([sum(len(v) for v in rows[e].values()) for e in range(example.experts_per_rank)],
                                dtype=torch.int32)
        previous, cost = torch.zeros_like(per_call), base
        for i, run in enumerate(result["dispatches"]):
            hook_on, call = run["options"][3], run["call"]
            assert_returned_iff("the returned hook", not run["hook_is_none"], "return_recv_hook", hook_on,
                                what="a callable", call=call)
            _assert_event_iff(not run["event_is_none"], run["async_finish"], call)
            if hook_on and not torch.equal(run["stats_before_hook"], previous):
                raise AssertionError(
                    f"cumulative_local_expert_recv_stats before hook() is {run['stats_before_hook'].tolist()}, "
                    f"expected {previous.tolist()} (nothing received before the hook runs) [{call}]")
            if hook_on and not torch.equal(run["cost_before_hook"], cost):
                raise AssertionError(
                    f"dispatch_wait_recv_cost_stats before hook() is {run['cost_before_hook'].tolist()}, expected "
                    f"{cost.tolist()} (the receive phase, which waits, has not run) [{call}]")
            expected = per_call * (i + 1)
            if not torch.equal(run["stats_after"].to(torch.int32), expected):
                raise AssertionError(
                    f"cumulative_local_expert_recv_stats after call {i + 1} is {run['stats_after'].tolist()}, "
                    f"expected {expected.tolist()} (the oracle's slot counts per local expert "
                    f"{per_call.tolist()} accumulated over {i + 1} calls) [{call}]")
            assert_counter_accumulates("dispatch_wait_recv_cost_stats", run["cost_after"], cost, call=call)
            previous, cost = expected, run["cost_after"]
        cost = base
        for name, before_hook, after in result["combine_costs"]:
            call = f"{result['combine_call']} ({name})"
            _assert_event_iff(not result["combine_events"][name], name == "async", call)
            if name == "hook" and not torch.equal(before_hook, cost):
                raise AssertionError(f"combine_wait_recv_cost_stats before hook() is {before_hook.tolist()}, "
                                     f"expected {cost.tolist()} (the receive phase has not run) [{call}]")
            assert_counter_accumulates("combine_wait_recv_cost_stats", after, cost, call=call)
            cost = after
        out = result["out_hook"]
        call = f"{result['combine_call']} with return_recv_hook=True, out=out"
        assert_bytes_equal(out["before_hook"], out["pattern"], name="out before hook()", rank=rank, call=call,
                           against="its contents before the call (the result lands in the receive phase)")

    for_each_backend(ctx, example, per_rank, one)


def _assert_event_iff(returned: bool, async_finish: bool, call: str) -> None:
    assert_returned_iff("the returned EventOverlap's event", returned, "async_finish", async_finish, what="an event",
                        call=call)


PROPERTY = register(Property(
    id="P17-ll-hooks-stats",
    title="low-latency receive hooks and events: returned iff requested, nothing received before the hook "
          "(statistics, wait costs, out= untouched); cumulative_local_expert_recv_stats = oracle counts accumulated "
          "over the calls; wait-cost counters only grow",
    strategy=sized(ll_examples), task=low_latency_runs, check=check, apis=("v1",), needs=("low_latency",),
))
test_ll_hooks_stats = PROPERTY.test
