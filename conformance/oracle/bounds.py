"""Error bounds derived for the reductions (combine, round trip, gradients): how far a correct result may be.

Error bound of a bf16 combine (:func:`reduction_bound`)
-------------------------------------------------------
The kernels convert every bf16 term ``t_i`` (expert rows and bias rows) to float32, add them in some
order, and round the float32 sum once to bf16 (round to nearest even).  With ``S = sum t_i`` (exact),
``A = sum |t_i|``, ``n`` terms, unit roundoff ``u = 2**-24`` and ``gamma_k = k u / (1 - k u)``:

* float32 recursive summation in any order (Higham, *Accuracy and Stability of Numerical Algorithms*,
  eq. 4.4): ``|s - S| <= gamma_{n-1} * A`` (conversions bf16 -> float32 are exact);
* the final rounding: ``|r - s| <= ulp_bf16(r) / 2``, where ``ulp_bf16(v) = 2**(max(e, -126) - 7)`` for
  ``2**e <= |v| < 2**(e+1)`` (``2**-133`` at 0).  Using the ulp of the *result* is safe: rounding never
  moves to a smaller binade, and crossing up to the next binade only makes ``ulp(r)`` larger.

So ``|r - S| <= ulp_bf16(r) / 2 + gamma_{n-1} * A``.  Two-level reductions (several nodes: each node's
contributions are summed in float32 and rounded to bf16 on the forwarder, the ``G`` partials plus biases
are summed again and rounded once more) add, per partial ``p_j`` over ``A_j``, an error
``e_j <= gamma_{n_j-1} A_j + ulp_bf16(p_j)/2 <= gamma A_j + 2**-8 |p_j| + 2**-134`` with
``|p_j| <= A_j + e_j``, hence ``sum e_j <= E1 = ((gamma_{n-1} + 2**-8) A + G 2**-134) / (1 - 2**-8)``; the
second stage sums terms of total magnitude at most ``A + E1``: bound
``ulp_bf16(r)/2 + E1 + gamma_{n-1} (A + E1)``.  The oracle's own float64 sum adds at most
``n 2**-53 A``, included too.  A tree of ``L > 2`` levels (V2 expand mode with ``allow_multiple_reduction``: each
rank's rows first, then per node) repeats the inner step: ``E_l = E_{l-1} + ((gamma_{n-1} + 2**-8) (A + E_{l-1}) +
n 2**-134) / (1 - 2**-8)`` for ``l = 1 .. L-1`` (``E_0 = 0``; at most ``n`` partials per level), bound
``ulp_bf16(r)/2 + E_{L-1} + gamma_{n-1} (A + E_{L-1})``.  The bound assumes no overflow and finite terms
(strategies for the bounded mode draw random normal payloads, never NaN or Inf).
"""

from __future__ import annotations

import torch

from conformance.oracle.reduction import ExpectedSum
from conformance.oracle.tree import bf16_ulp

#: float32 unit roundoff.
U32 = 2.0**-24
#: How many differing elements a message lists.
MAX_LISTED = 3


def gamma(k: torch.Tensor) -> torch.Tensor:
    """Higham's ``gamma_k = k u / (1 - k u)`` for float32, elementwise over ``k`` (float64)."""
    k = k.to(torch.float64).clamp(min=0)
    return k * U32 / (1 - k * U32)


def reduction_bound(result: torch.Tensor, expected: ExpectedSum, two_level: bool, levels: int | None = None
                    ) -> torch.Tensor:
    """The largest ``|result - exact|`` the float32-accumulate, bf16-round combine may produce (see module doc).
    ``levels``: the roundings of the tree (1, 2 or more; ``None``: 2 if ``two_level`` else 1)."""
    levels = (2 if two_level else 1) if levels is None else levels
    n = expected.num_terms.to(torch.float64).unsqueeze(1)
    a = expected.abs_sum
    half_ulp = bf16_ulp(result) / 2
    oracle_error = n * 2.0**-53 * a
    g = gamma(n - 1)
    if levels <= 1:
        return half_ulp + g * a + oracle_error
    if levels == 2:
        groups = expected.num_groups.to(torch.float64).unsqueeze(1)
        e1 = ((g + 2.0**-8) * a + groups * 2.0**-134) / (1 - 2.0**-8)
        return half_ulp + e1 + g * (a + e1) + oracle_error
    e = torch.zeros_like(a)
    for _ in range(levels - 1):
        e = e + ((g + 2.0**-8) * (a + e) + n * 2.0**-134) / (1 - 2.0**-8)
    return half_ulp + e + g * (a + e) + oracle_error


#: Half an ulp of bf16 (8 significant bits), relative; the smallest bf16 subnormal step; float32 unit roundoff.
BF16_HALF_ULP = 2.0**-8
BF16_TINY = 2.0**-133


def ll_combine_bound(exact: torch.Tensor, magnitude: torch.Tensor, num_topk: int) -> torch.Tensor:
    """How far a low-latency combine of ``num_topk`` slots may be from its float64 ``exact`` sum (``magnitude``:
    the sum of the terms' magnitudes): one float32 accumulation (``2 k u`` relative to ``magnitude``) and one bf16
    rounding (half an ulp of the result, at least the smallest subnormal step)."""
    accumulation = 2 * num_topk * U32 * magnitude
    return BF16_HALF_ULP * exact.abs() + accumulation * (1 + BF16_HALF_ULP) + BF16_TINY
