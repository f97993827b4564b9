"""P15 low-latency dispatch: per local expert, the rows of every source rank sit in the block its
``layout_range`` names, ``recv_count`` counts them, ``src_info`` names the oracle's tokens, and each row is the
oracle's: bf16 bytes unchanged; with ``use_fp8`` the per-128-channel E4M3 cast (bytes and ``round_scale`` scales
exact; without ``round_scale`` scales exact and each byte the oracle's or its E4M3 neighbour, a bound derived
from a one-ulp float32 ``448 / amax``), ``use_ue8m0`` scales packed four exponents per int32, column-major; one
dispatch is made with ``async_finish=True`` and read after ``event.current_stream_wait()``.

On the real library: held on the real V1 (one H200, two ranks sharing it: docs/real-runs/, run 10b); its recording
replays exactly.
"""

from __future__ import annotations

from typing import Any

from conformance.assertions import for_each_backend
from conformance.checks.low_latency import check_dispatch
from conformance.core.example import Example, build_all_inputs
from conformance.properties import CheckContext, Property, register
from conformance.strategies import sized
from conformance.strategies.low_latency import ll_examples
from conformance.tasks.low_latency import low_latency_runs


def check(ctx: CheckContext, example: Example, per_rank: list[dict[str, Any]]) -> None:
    """Every dispatch of every rank and backend against the oracle; backends pairwise by the same oracle."""
    __tracebackhide__ = True
    inputs = build_all_inputs(example)

    def one(rank: int, backend: str, result: dict[str, Any]) -> None:
        for run in result["dispatches"]:
            check_dispatch(run, example, inputs, rank)

    for_each_backend(ctx, example, per_rank, one)


PROPERTY = register(Property(
    id="P15-ll-dispatch",
    title="low-latency dispatch: per local expert, layout_range blocks, recv_count and src_info are the oracle's; "
          "rows are the source bytes (bf16) or the oracle's per-128-channel E4M3 cast with its scales (use_fp8, "
          "round_scale, use_ue8m0 packed column-major; async_finish read after the event wait)",
    strategy=sized(ll_examples), task=low_latency_runs, check=check, apis=("v1",), needs=("low_latency",),
))
test_ll_dispatch = PROPERTY.test
