"""The oracle of the FP8 and low-latency paths: the per-128-channel E4M3 cast of the low-latency dispatch, computed
from its definition with float64 arithmetic and an explicit E4M3 code table, the rows every local expert receives
(with masked ranks in shrink mode), the identity-expert combine, and where the signalling buffers lie.

Definition (DeepEP 2.1.0 ``internode_ll.cu`` send phase, ``utils.cuh:calculate_fp8_scales``): per token and 128
channels ``amax = max(1e-4, max |x|)``; ``scale_inv = fl32(amax * fl32(1/448))`` and ``scale = fl32(448 / amax)``,
or, with ``round_scale``, ``scale_inv = 2^ceil(log2(fl32(amax * fl32(1/448))))`` and ``scale = 1 / scale_inv``; each
value ``fl32(x * scale)`` is rounded to the nearest E4M3 value, ties to the even code, saturated to +-448.  UE8M0
keeps the 8 exponent bits of ``scale_inv``.
"""

from __future__ import annotations

from collections.abc import Collection
from functools import cache

import torch

from conformance.core.example import Example, RankInputs

E4M3_MAX = 448.0


@cache
def _e4m3_table() -> tuple[torch.Tensor, torch.Tensor]:
    """The non-negative finite E4M3 values (codes 0x00..0x7E) ascending, and their codes."""
    codes = torch.arange(0x7F, dtype=torch.uint8)
    values = codes.view(torch.float8_e4m3fn).to(torch.float64)
    return values, codes


def e4m3_codes(values: torch.Tensor) -> torch.Tensor:
    """The E4M3 code (uint8) nearest to each float64 value, ties to the even code, saturated (no NaN input)."""
    table, codes = _e4m3_table()
    magnitude = values.abs().clamp_max(E4M3_MAX).flatten()
    hi = torch.searchsorted(table, magnitude).clamp(1, table.numel() - 1)
    lo = hi - 1
    d_lo, d_hi = magnitude - table[lo], table[hi] - magnitude
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (codes[hi] % 2 == 0))
    pick = torch.where(pick_hi, hi, lo)
    pick = torch.where(magnitude == table[lo], lo, pick)  # exact hits (also 0)
    code = codes[pick].to(torch.int16)
    code = torch.where(torch.signbit(values.flatten()), code | 0x80, code)
    return code.to(torch.uint8).reshape(values.shape)


def _fl32(values: torch.Tensor) -> torch.Tensor:
    """Round float64 values to float32 (nearest even) and back."""
    return values.to(torch.float32).to(torch.float64)


def quantize(x: torch.Tensor, round_scale: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(codes uint8 [n, hidden], scale_inv float32 [n, hidden // 128])`` of bf16 rows ``x`` (see the module)."""
    n, hidden = x.shape
    blocks = x.to(torch.float64).reshape(n, hidden // 128, 128)
    margin = _fl32(torch.tensor(1e-4, dtype=torch.float64))
    inv448 = _fl32(torch.tensor(1 / E4M3_MAX, dtype=torch.float64))
    amax = torch.maximum(blocks.abs().amax(dim=-1), margin)
    scale_inv = _fl32(amax * inv448)
    if round_scale:
        mantissa, exponent = torch.frexp(scale_inv)  # scale_inv = mantissa * 2^exponent, mantissa in [0.5, 1)
        exponents = torch.where(mantissa == 0.5, exponent - 1, exponent).to(torch.float64)
        scale_inv, scale = torch.exp2(exponents), torch.exp2(-exponents)
    else:
        scale = _fl32(E4M3_MAX / amax)
    scaled = _fl32(blocks * scale.unsqueeze(-1))
    return e4m3_codes(scaled).reshape(n, hidden), scale_inv.to(torch.float32)


def ue8m0(scale_inv: torch.Tensor) -> torch.Tensor:
    """The UE8M0 byte of each (power-of-two) float32 scale: its biased exponent."""
    _, exponent = torch.frexp(scale_inv.to(torch.float64))
    return (exponent.to(torch.int64) - 1 + 127).reshape(scale_inv.shape)


def expert_rows(example: Example, inputs: list[RankInputs], rank: int,
                masked: Collection[int] = ()) -> dict[int, dict[int, list[int]]]:
    """``{local expert: {source rank: [source token, ...]}}``: one entry per top-k slot of a source token that
    names the expert (ascending token order; the receive order is not part of the contract).  A source in
    ``masked`` (shrink mode: a rank this rank masked) sends nothing."""
    per_rank = example.experts_per_rank
    out: dict[int, dict[int, list[int]]] = {}
    for e in range(per_rank):
        expert = rank * per_rank + e
        out[e] = {}
        for s, inp in enumerate(inputs):
            tokens = []
            for t, row in enumerate(inp.topk_idx.tolist()):
                tokens.extend([t] * sum(1 for v in row if v == expert))
            out[e][s] = [] if s in masked else tokens
    return out


def weighted_identity_combine(inputs: list[RankInputs], rank: int, masked: Collection[int] = (),
                              experts_per_rank: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """``(exact, magnitude)`` float64 of a low-latency combine of identity experts: token ``t`` of ``rank`` gets
    ``x[t] * sum of its weights over slots with an expert``; ``magnitude`` is ``|x[t]| * sum |w|`` (for bounds).
    Slots whose expert lives on a rank in ``masked`` (``expert // experts_per_rank``) contribute nothing."""
    inp = inputs[rank]
    owner = torch.div(inp.topk_idx, experts_per_rank, rounding_mode="floor")
    dropped = torch.isin(owner, torch.tensor(sorted(masked), dtype=owner.dtype))
    valid = ((inp.topk_idx >= 0) & ~dropped).to(torch.float64)
    weight = (inp.topk_weights.to(torch.float64) * valid).sum(dim=1, keepdim=True)
    x = inp.x.to(torch.float64)
    return x * weight, x.abs() * (inp.topk_weights.to(torch.float64).abs() * valid).sum(dim=1, keepdim=True)


def signal_regions(num_experts: int) -> list[tuple[int, int]]:
    """The byte ranges of the RDMA buffer ``clean_low_latency_buffer(..., num_experts)`` zeroes: the two signalling
    buffers of ``LowLatencyLayout`` (DeepEP 2.1.0 ``csrc/legacy/config.hpp:161-178``), one int32 per expert each,
    at offset 0 and at ``4 * num_experts`` rounded up to 128 bytes."""
    stride = -(-4 * num_experts // 128) * 128
    return [(0, 4 * num_experts), (stride, stride + 4 * num_experts)]
