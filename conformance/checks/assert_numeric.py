"""Assert helpers for computed results (combine, round trip, gradients): byte-exact or within a derived bound.

Error bound of a bf16 combine (``reduction_bound``)
-------------------------------------------------
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
``n 2**-53 A``, included too.  The bound assumes no overflow and finite terms (strategies for the bounded
mode draw random normal payloads, never NaN or Inf).
"""

from __future__ import annotations

import torch

from conformance.oracle.reduction import ExpectedSum

#: float32 unit roundoff.
U32 = 2.0**-24
#: How many differing elements a message lists.
MAX_LISTED = 3


def gamma(k: torch.Tensor) -> torch.Tensor:
    """Higham's ``gamma_k = k u / (1 - k u)`` for float32, elementwise over ``k`` (float64)."""
    k = k.to(torch.float64).clamp(min=0)
    return k * U32 / (1 - k * U32)


def bf16_ulp(values: torch.Tensor) -> torch.Tensor:
    """The spacing of bf16 numbers at ``values`` (float64): ``2**(max(e, -126) - 7)``, ``2**-133`` at 0."""
    v = values.to(torch.float64).abs()
    _, exponent = torch.frexp(v)  # v = m * 2**exponent, 0.5 <= m < 1
    e = torch.where(v > 0, exponent.to(torch.float64) - 1, torch.full_like(v, -126.0)).clamp(min=-126)
    return torch.pow(2.0, e - 7)


def reduction_bound(result: torch.Tensor, expected: ExpectedSum, two_level: bool) -> torch.Tensor:
    """The largest ``|result - exact|`` the float32-accumulate, bf16-round combine may produce (see module doc)."""
    n = expected.num_terms.to(torch.float64).unsqueeze(1)
    a = expected.abs_sum
    half_ulp = bf16_ulp(result) / 2
    oracle_error = n * 2.0**-53 * a
    g = gamma(n - 1)
    if not two_level:
        return half_ulp + g * a + oracle_error
    groups = expected.num_groups.to(torch.float64).unsqueeze(1)
    e1 = ((g + 2.0**-8) * a + groups * 2.0**-134) / (1 - 2.0**-8)
    return half_ulp + e1 + g * (a + e1) + oracle_error


def hex_row(row: torch.Tensor, columns: list[int]) -> str:
    """Show ``row``'s values at ``columns`` as bit patterns (bf16: 16 bits, float32: 32 bits) and values."""
    if row.dtype in (torch.bfloat16, torch.float16):
        bits, mask, digits = row.contiguous().view(torch.int16), 0xFFFF, 4
    elif row.dtype == torch.float32:
        bits, mask, digits = row.contiguous().view(torch.int32), 0xFFFFFFFF, 8
    else:
        return ", ".join(f"[{c}]={row[c].item()!r}" for c in columns)
    return ", ".join(f"[{c}]=0x{int(bits[c]) & mask:0{digits}x} ({float(row[c])!r})" for c in columns)


def _where(name: str, rank: int, index: tuple[int, ...], labels: tuple[str, ...]) -> str:
    inner = ", ".join(f"{label} {i}" for label, i in zip(labels, index, strict=True))
    return f"{name}[rank {rank}, {inner}]"


def assert_bytes_equal(
    got: torch.Tensor,
    expected: torch.Tensor,
    *,
    name: str,
    rank: int,
    call: str,
    labels: tuple[str, ...] = ("token", "col"),
    against: str = "the oracle",
) -> None:
    """Fail unless ``got`` and ``expected`` have the same shape, dtype and bytes; the message names the first
    differing element by ``labels`` (e.g. token and column) with its bit pattern."""
    __tracebackhide__ = True
    if got.shape != expected.shape or got.dtype != expected.dtype:
        raise AssertionError(
            f"{name}[rank {rank}] has shape {tuple(got.shape)} {got.dtype}, expected {tuple(expected.shape)} "
            f"{expected.dtype} ({against}) [{call}]"
        )
    width = got.element_size()
    int_dtype = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[width]
    differs = got.contiguous().view(int_dtype) != expected.contiguous().view(int_dtype)
    if not bool(differs.any()):
        return
    bad = differs.nonzero()
    first = tuple(int(i) for i in bad[0])
    row = first[:-1] if got.dim() > 1 else ()
    columns = differs[row].nonzero().flatten().tolist() if got.dim() > 1 else [first[0]]
    got_row, exp_row = (got[row], expected[row]) if got.dim() > 1 else (got, expected)
    raise AssertionError(
        f"{_where(name, rank, first, labels[: len(first)])} differs from {against} "
        f"({len(bad)} element(s) in all): got {hex_row(got_row, columns[:MAX_LISTED])}; "
        f"expected {hex_row(exp_row, columns[:MAX_LISTED])} [{call}]"
    )


def assert_within_bound(
    got: torch.Tensor,
    expected: ExpectedSum,
    *,
    two_level: bool,
    name: str,
    rank: int,
    call: str,
) -> None:
    """Fail unless every element of bf16 ``got`` is within :func:`reduction_bound` of the exact sum."""
    __tracebackhide__ = True
    if got.shape != expected.exact.shape:
        raise AssertionError(
            f"{name}[rank {rank}] has shape {tuple(got.shape)}, expected {tuple(expected.exact.shape)} [{call}]"
        )
    value = got.to(torch.float64)
    bound = reduction_bound(got, expected, two_level)
    error = (value - expected.exact).abs()
    bad = ~(error <= bound)  # NaN errors count as violations
    if not bool(bad.any()):
        return
    token, col = (int(i) for i in bad.nonzero()[0])
    raise AssertionError(
        f"{name}[rank {rank}, token {token}, col {col}] = {float(got[token, col])!r} is "
        f"{float(error[token, col]):.6g} from the exact sum {float(expected.exact[token, col])!r}, more than the "
        f"bound {float(bound[token, col]):.6g} (1/2 ulp_bf16 + float32 accumulation over "
        f"{int(expected.num_terms[token])} term(s){', two-level' if two_level else ''}); "
        f"{int(bad.sum())} element(s) out of bound [{call}]"
    )


def assert_close_across(
    got: torch.Tensor,
    other: torch.Tensor,
    expected: ExpectedSum,
    *,
    two_level: bool,
    name: str,
    rank: int,
    call: str,
    against: str,
) -> None:
    """Fail unless two backends' bf16 results differ by at most the sum of their bounds (triangle inequality)."""
    __tracebackhide__ = True
    bound = reduction_bound(got, expected, two_level) + reduction_bound(other, expected, two_level)
    error = (got.to(torch.float64) - other.to(torch.float64)).abs()
    bad = ~(error <= bound)
    if bool(bad.any()):
        token, col = (int(i) for i in bad.nonzero()[0])
        raise AssertionError(
            f"{name}[rank {rank}, token {token}, col {col}] = {float(got[token, col])!r}, {against} gives "
            f"{float(other[token, col])!r}: further apart than both bounds allow ({float(bound[token, col]):.6g}) "
            f"[{call}]"
        )


#: Below this magnitude a value is subnormal (bf16 shares float32's exponent range).
SMALLEST_NORMAL = torch.finfo(torch.float32).tiny


def same_value(got: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """Elementwise: same bytes, or both NaN (any payload), or both zero (either sign), or a subnormal
    expected value flushed to zero (GPU float32 reductions may run flush-to-zero; seen on CUDA with the
    emulation).  Dispatch moves bytes and must keep subnormals (P1); only reductions may flush them."""
    width = got.element_size()
    int_dtype = {2: torch.int16, 4: torch.int32}[width]
    same_bytes = got.contiguous().view(int_dtype) == expected.contiguous().view(int_dtype)
    both_nan = torch.isnan(got) & torch.isnan(expected)
    both_zero = (got == 0) & (expected == 0)
    flushed = (got == 0) & (expected.float().abs() < SMALLEST_NORMAL)
    return same_bytes | both_nan | both_zero | flushed


def assert_same_values(
    got: torch.Tensor, expected: torch.Tensor, *, name: str, rank: int, call: str, against: str = "the oracle"
) -> None:
    """Fail unless every element has the same bytes, except that any NaN matches any NaN, -0.0 matches +0.0
    and a subnormal may be flushed to zero (the reduction converts to float32 and back: NaN payloads, the
    sign of a zero sum and subnormal results are not promised)."""
    __tracebackhide__ = True
    if got.shape != expected.shape or got.dtype != expected.dtype:
        raise AssertionError(
            f"{name}[rank {rank}] has shape {tuple(got.shape)} {got.dtype}, expected {tuple(expected.shape)} "
            f"{expected.dtype} ({against}) [{call}]"
        )
    bad = ~same_value(got, expected)
    if not bool(bad.any()):
        return
    token, col = (int(i) for i in bad.nonzero()[0])
    columns = bad[token].nonzero().flatten().tolist()
    raise AssertionError(
        f"{name}[rank {rank}, token {token}, col {col}] differs from {against} ({int(bad.sum())} element(s) in all): "
        f"got {hex_row(got[token], columns[:MAX_LISTED])}; expected {hex_row(expected[token], columns[:MAX_LISTED])} "
        f"[{call}]"
    )


def assert_sum_or_special(
    got: torch.Tensor,
    expected: ExpectedSum,
    expected_bf16: torch.Tensor,
    *,
    two_level: bool,
    name: str,
    rank: int,
    call: str,
) -> None:
    """Bounded comparison that also admits special values: where the exact sum is NaN or +-Inf, ``got`` must be
    NaN (any payload) or the same infinity; everywhere else it must be within :func:`reduction_bound`."""
    __tracebackhide__ = True
    special = ~torch.isfinite(expected.exact)
    if bool(special.any()):
        wrong = special & ~same_value(got, expected_bf16)
        if bool(wrong.any()):
            token, col = (int(i) for i in wrong.nonzero()[0])
            raise AssertionError(
                f"{name}[rank {rank}, token {token}, col {col}] = {hex_row(got[token], [col])}, expected "
                f"{hex_row(expected_bf16[token], [col])} (a non-finite sum; NaN matches any NaN) "
                f"({int(wrong.sum())} element(s) in all) [{call}]"
            )
    zero = torch.zeros((), dtype=torch.float64)
    finite = ExpectedSum(
        torch.where(special, zero, expected.exact),
        torch.where(special, zero, expected.abs_sum),
        expected.num_terms,
        expected.num_groups,
    )
    assert_within_bound(
        torch.where(special, torch.zeros_like(got), got), finite, two_level=two_level, name=name, rank=rank, call=call
    )


def assert_positive_zero_rows(got: torch.Tensor, tokens: list[int], *, name: str, rank: int, call: str) -> None:
    """Fail unless the rows ``tokens`` of ``got`` are all +0.0 (bit pattern 0), as combine returns for a token
    that reached no rank."""
    __tracebackhide__ = True
    for token in tokens:
        bits = got[token].contiguous().view(torch.int16)
        if bool((bits != 0).any()):
            columns = (bits != 0).nonzero().flatten().tolist()
            raise AssertionError(
                f"{name}[rank {rank}, token {token}] reached no rank and must come back as +0.0, got "
                f"{hex_row(got[token], columns[:MAX_LISTED])} ({len(columns)} non-+0.0 column(s)) [{call}]"
            )
