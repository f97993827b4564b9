"""P16 low-latency round trip: identity experts combined by ``low_latency_combine`` give every token ``x * (sum
of its weights)`` within the derived bound of one float32 accumulation and one bf16 rounding; the receive-hook,
async (``async_finish=True``, read after the event wait) and zero-copy combines give the same bytes; LogFMT-10
stays within its derived bound (a 9-bit log code per 128-channel block: relative error below ``2^(32/510) - 1``,
values under ``amax * 2^-32`` may vanish); and the result agrees with the normal-mode round trip
(``Buffer.dispatch`` / ``combine``) within both bounds."""

from __future__ import annotations

from typing import Any

import torch

from conformance.assertions import for_each_backend
from conformance.core.example import Example, build_all_inputs
from conformance.oracle.quantize import weighted_identity_combine
from conformance.properties import CheckContext, Property, register
from conformance.strategies import sized
from conformance.strategies.low_latency import ll_examples
from conformance.tasks.low_latency import low_latency_runs

#: Half an ulp of bf16 (8 significant bits), relative; the smallest bf16 subnormal step; float32 unit roundoff.
BF16_HALF_ULP = 2.0**-8
BF16_TINY = 2.0**-133
FP32_U = 2.0**-24
#: LogFMT-10: the largest relative step of a 9-bit log code over a clipped 32-octave range, and the clip.
LOGFMT_REL = 2.0 ** (32 / 510) - 1
LOGFMT_CLIP = 2.0**-32


def _assert_within(name: str, got: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor, call: str,
                   rank: int) -> None:
    __tracebackhide__ = True
    err = (got.to(torch.float64) - expected).abs()
    bad = ~(err <= bound)
    if bool(bad.any()):
        t, c = torch.nonzero(bad)[0].tolist()
        raise AssertionError(f"{name}[rank {rank}][token {t}, col {c}] is {float(got[t, c])}, expected "
                             f"{float(expected[t, c])} within {float(bound[t, c]):.3g} (error {float(err[t, c]):.3g}) "
                             f"[{call}]")


def check(ctx: CheckContext, example: Example, per_rank: list[dict[str, Any]]) -> None:
    """Every rank's combines against the oracle's exact weighted sums and the normal-mode round trip."""
    __tracebackhide__ = True
    inputs = build_all_inputs(example)

    def one(rank: int, backend: str, result: dict[str, Any]) -> None:
        exact, magnitude = weighted_identity_combine(inputs, rank)
        k = example.num_topk
        accumulation = 2 * k * FP32_U * magnitude
        plain_bound = BF16_HALF_ULP * exact.abs() + accumulation * (1 + BF16_HALF_ULP) + BF16_TINY
        combines, call = result["combines"], result["combine_call"]
        _assert_within("combined_x", combines["plain"], exact, plain_bound, call, rank)
        for variant in ("hook", "async", "zero_copy"):
            if not torch.equal(combines[variant].view(torch.int16), combines["plain"].view(torch.int16)):
                bad = torch.nonzero(combines[variant].view(torch.int16) != combines["plain"].view(torch.int16))
                t, c = bad[0].tolist()
                how = {"hook": "return_recv_hook=True, then hook()",
                       "async": "async_finish=True, then event.current_stream_wait()",
                       "zero_copy": "zero_copy=True after get_next_low_latency_combine_buffer"}[variant]
                raise AssertionError(
                    f"combined_x[rank {rank}][token {t}, col {c}] of the {variant} combine is "
                    f"{float(combines[variant][t, c])}, expected {float(combines['plain'][t, c])} (the plain "
                    f"combine's bytes) [{call} with {how}]")
        x = inputs[rank].x.to(torch.float64)
        if x.numel():
            block_amax = x.abs().reshape(x.shape[0], -1, 128).amax(dim=-1).repeat_interleave(128, dim=1)
        else:
            block_amax = x
        valid = (inputs[rank].topk_idx >= 0).to(torch.float64)
        weight_abs = (inputs[rank].topk_weights.to(torch.float64).abs() * valid).sum(dim=1, keepdim=True)
        logfmt_bound = plain_bound + (LOGFMT_REL * 1.001) * magnitude + 2 * LOGFMT_CLIP * block_amax * weight_abs
        _assert_within("combined_x (use_logfmt=True)", combines["logfmt"], exact, logfmt_bound,
                       call + " with use_logfmt=True", rank)
        normal_bound = BF16_HALF_ULP * exact.abs() + BF16_HALF_ULP * magnitude * (1 + BF16_HALF_ULP) \
            + 2 * accumulation + 2 * BF16_TINY
        _assert_within("combined_x against the normal-mode round trip", combines["plain"],
                       result["normal"].to(torch.float64), plain_bound + normal_bound,
                       call + " vs Buffer.dispatch + Buffer.combine of the same identity experts", rank)

    for_each_backend(ctx, example, per_rank, one)


PROPERTY = register(Property(
    id="P16-ll-round-trip",
    title="low-latency dispatch -> combine of identity experts gives x * sum(weights) within the derived bound; "
          "hook, async and zero-copy combines give the same bytes; LogFMT-10 within its bound; agrees with normal mode",
    strategy=sized(ll_examples), task=low_latency_runs, check=check, apis=("v1",), needs=("low_latency",),
))
test_ll_round_trip = PROPERTY.test
