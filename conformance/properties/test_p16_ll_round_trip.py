"""P16 low-latency round trip: identity experts combined by ``low_latency_combine`` give every token ``x * (sum
of its weights)`` within the derived bound of one float32 accumulation and one bf16 rounding; the ``async_finish``
(waited on), receive-hook and zero-copy combines, and a combine into a caller's ``out=`` tensor (written in place
and returned), give the same bytes; LogFMT-10 stays within its derived bound (a 9-bit log code per 128-channel
block: relative error below ``2^(32/510) - 1``, values under ``amax * 2^-32`` may vanish); and the result agrees
with the normal-mode round trip (``Buffer.dispatch`` / ``combine``) within both bounds (the normal mode's: a bf16
rounding of each rank's scaled rows, of each node's partial sum on several nodes, and of the result).

On the real library: held on the real V1 (docs/real-runs/, run 10b); its recording replays exactly.
"""

from __future__ import annotations

from typing import Any

import torch

from conformance.assertions import assert_bytes_equal, assert_within_tolerance, for_each_backend
from conformance.core.example import Example, build_all_inputs
from conformance.oracle.bounds import BF16_HALF_ULP, BF16_TINY, ll_combine_bound
from conformance.oracle.quantize import weighted_identity_combine
from conformance.properties import CheckContext, Property, register
from conformance.strategies import sized
from conformance.strategies.low_latency import ll_examples
from conformance.tasks.low_latency import low_latency_runs

#: float32 unit roundoff.
FP32_U = 2.0**-24
#: LogFMT-10: the largest relative step of a 9-bit log code over a clipped 32-octave range, and the clip.
LOGFMT_REL = 2.0 ** (32 / 510) - 1
LOGFMT_CLIP = 2.0**-32
#: The variants that must give the plain combine's bytes, and how each is called.
SAME_BYTES = {"async": "async_finish=True, then event.current_stream_wait()",
              "hook": "return_recv_hook=True, out=a caller's tensor, then hook()",
              "zero_copy": "zero_copy=True after get_next_low_latency_combine_buffer"}


def check(ctx: CheckContext, example: Example, per_rank: list[dict[str, Any]]) -> None:
    """Every rank's combines against the oracle's exact weighted sums and the normal-mode round trip."""
    __tracebackhide__ = True
    inputs = build_all_inputs(example)

    def one(rank: int, backend: str, result: dict[str, Any]) -> None:
        exact, magnitude = weighted_identity_combine(inputs, rank)
        k = example.num_topk
        accumulation = 2 * k * FP32_U * magnitude
        plain_bound = ll_combine_bound(exact, magnitude, k)
        combines, call = result["combines"], result["combine_call"]
        assert_within_tolerance("combined_x", combines["plain"], exact, plain_bound, call=call, rank=rank)
        if not result["out_returned"]:
            raise AssertionError(f"the returned combined_x of rank {rank} is not the out tensor passed in, expected "
                                 f"out itself (written in place and returned) [{call} with return_recv_hook=True, "
                                 f"out=out]")
        assert_bytes_equal(result["out_hook"]["after"], combines["plain"], name="out after hook()", rank=rank,
                           call=f"{call} with return_recv_hook=True, out=out", against="the plain combine")
        for variant, how in SAME_BYTES.items():
            assert_bytes_equal(combines[variant], combines["plain"], name=f"combined_x of the {variant} combine",
                               rank=rank, call=f"{call} with {how}", against="the plain combine")
        x = inputs[rank].x.to(torch.float64)
        if x.numel():
            block_amax = x.abs().reshape(x.shape[0], -1, 128).amax(dim=-1).repeat_interleave(128, dim=1)
        else:
            block_amax = x
        valid = (inputs[rank].topk_idx >= 0).to(torch.float64)
        weight_abs = (inputs[rank].topk_weights.to(torch.float64).abs() * valid).sum(dim=1, keepdim=True)
        logfmt_bound = plain_bound + (LOGFMT_REL * 1.001) * magnitude + 2 * LOGFMT_CLIP * block_amax * weight_abs
        assert_within_tolerance("combined_x (use_logfmt=True)", combines["logfmt"], exact, logfmt_bound,
                                call=call + " with use_logfmt=True", rank=rank)
        # the normal mode: each rank's scaled rows rounded to bf16, their sum rounded once more; on several nodes
        # V1's internode combine also rounds each node's partial sum first (the reduction tree P5 checks exactly)
        normal_bound = BF16_HALF_ULP * exact.abs() + BF16_HALF_ULP * magnitude * (1 + BF16_HALF_ULP) \
            + 2 * accumulation + 2 * BF16_TINY
        if ctx.shape.nodes > 1:
            normal_bound = normal_bound + BF16_HALF_ULP * magnitude * (1 + BF16_HALF_ULP) ** 2 + accumulation
        assert_within_tolerance("combined_x against the normal-mode round trip", combines["plain"],
                                result["normal"].to(torch.float64), plain_bound + normal_bound,
                                call=call + " vs Buffer.dispatch + Buffer.combine of the same identity experts",
                                rank=rank)

    for_each_backend(ctx, example, per_rank, one)


PROPERTY = register(Property(
    id="P16-ll-round-trip",
    title="low-latency dispatch -> combine of identity experts gives x * sum(weights) within the derived bound; "
          "async, hook, zero-copy and out= combines give the same bytes (out= written in place and returned); "
          "LogFMT-10 within its bound; agrees with normal mode",
    strategy=sized(ll_examples), task=low_latency_runs, check=check, apis=("v1",), needs=("low_latency",),
))
test_ll_round_trip = PROPERTY.test
