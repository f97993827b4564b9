"""The library's reduction tree, predicted byte for byte wherever its float32 arithmetic is exact.

Combine (and the gradient of dispatch, which is a combine) sums bf16 terms in float32 and rounds to bf16.
On one node it rounds once.  On several nodes the library rounds twice (DeepEP 2.1.0: V1 internode,
``csrc/kernels/legacy/internode.cu`` ``combine_token``: each node's NVLink forwarder sums the contributions
of that node's ranks in float32 and writes them as bf16 into the RDMA buffer, and the receiver sums the
biases and the nodes' partials in float32 and rounds again; V2 hybrid mode with
``allow_multiple_reduction=True``: the same two levels, per scale-out node; V2 expand mode with
``allow_multiple_reduction=True`` adds a first level: each rank sums and rounds its own rows of a token before
they leave it).

The order of the float32 additions is the library's business and varies between kernels and runs, so a
bound (:mod:`conformance.oracle.bounds`) is all that can be said in general.  But a float32 sum is *exact*
(the same in every order) when all terms are multiples of one power of two ``2**q`` and the sum of their
magnitudes stays below ``2**(24 + q)``: every partial sum is then an integer multiple of ``2**q`` smaller
than ``2**24 * 2**q``, which float32 represents; ``2**q`` is the smallest of the terms' lowest set bits.
Where that holds at every level of the tree, the result is the exact sum of each level rounded once to bf16
(round to nearest even): a prediction of the bytes.  Everywhere else the checks fall back to the bound.

Subnormal terms or sums are never predicted (whether the kernels flush them is not recorded), nor are
non-finite ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: float32 significand bits (with the hidden bit).
F32_DIGITS = 24
#: Smallest normal float32 (and bf16) magnitude.
MIN_NORMAL = 2.0**-126


def bf16_ulp(values: torch.Tensor) -> torch.Tensor:
    """The spacing of bf16 numbers at ``values`` (float64): ``2**(max(e, -126) - 7)``, ``2**-133`` at 0."""
    v = values.to(torch.float64).abs()
    _, exponent = torch.frexp(v)  # v = m * 2**exponent, 0.5 <= m < 1
    e = torch.where(v > 0, exponent.to(torch.float64) - 1, torch.full_like(v, -126.0)).clamp(min=-126)
    return torch.pow(2.0, e - 7)


def lowest_bit(values: torch.Tensor) -> torch.Tensor:
    """The largest power of two dividing each finite nonzero float64 value (``inf`` at 0)."""
    v = values.to(torch.float64)
    mantissa, exponent = torch.frexp(v)  # v = m * 2**e, 0.5 <= |m| < 1: m * 2**53 is an integer
    k = (mantissa.abs() * 2.0**53).to(torch.int64)
    low = (k & -k).to(torch.float64)
    return torch.where(v != 0, torch.ldexp(low, exponent - 53), torch.full_like(v, float("inf")))


def exact_float32_sum(terms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sum, exact)`` over the first dimension of bf16-valued ``terms`` ``[n, ...]``: the float64 sum and
    whether a float32 accumulation of these terms gives it in every order (see the module doc)."""
    if terms.shape[0] == 0:
        shape = terms.shape[1:]
        return torch.zeros(shape, dtype=torch.float64), torch.ones(shape, dtype=torch.bool)
    t = terms.to(torch.float64)
    finite = torch.isfinite(t).all(dim=0)
    t = torch.where(torch.isfinite(t), t, torch.zeros_like(t))
    magnitude = t.abs()
    nonzero = magnitude > 0
    quantum = lowest_bit(t).amin(dim=0)
    total = magnitude.sum(dim=0)
    no_subnormal = ~(nonzero & (magnitude < MIN_NORMAL)).any(dim=0)
    exact = finite & no_subnormal & ((total == 0) | (total < quantum * 2.0**F32_DIGITS))
    result = t.sum(dim=0)
    exact &= (result == 0) | (result.abs() >= MIN_NORMAL)
    return result, exact


def round_bf16(values: torch.Tensor) -> torch.Tensor:
    """A float64 value that float32 holds exactly, rounded once to bf16 (to nearest even)."""
    return values.to(torch.float32).to(torch.bfloat16)


@dataclass
class TreePrediction:
    """The predicted bf16 result and where it is determined (every level's float32 sum exact)."""

    value: torch.Tensor  # [T, H] bf16
    determined: torch.Tensor  # [T, H] bool
    levels: int  # roundings on the way: 1 + the number of inner levels


def predict_token(contributions: list[tuple[int, torch.Tensor]], biases: list[torch.Tensor],
                  ranks_per_group: int, world_size: int, hidden: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One token's combine through the tree: ``contributions`` are ``(dst_rank, bf16 row)`` pairs, ``biases``
    bf16 rows; ranks ``d`` with the same ``d // ranks_per_group`` are summed and rounded first when the tree has
    two levels (``ranks_per_group < world_size``)."""
    return predict_levels(contributions, biases, tree_groups(ranks_per_group, world_size), hidden)


def tree_groups(ranks_per_group: int, world_size: int) -> tuple[int, ...]:
    """The inner levels (for :func:`predict_levels`) of a tree that rounds groups of ``ranks_per_group`` consecutive
    ranks first: none when one group is the whole world."""
    return (ranks_per_group,) if ranks_per_group < world_size else ()


def predict_levels(contributions: list[tuple[int, torch.Tensor]], biases: list[torch.Tensor],
                   groups: tuple[int, ...], hidden: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One token's combine through a tree of ``len(groups)`` inner levels, innermost first: at the level of group
    size ``g``, the rows whose ``dst_rank // g`` agree are summed in float32 and rounded to bf16 (a group of one row
    keeps it: rounding a bf16 value changes nothing); the last level sums the biases and what is left, rounded once
    more.  ``groups=()``: one rounding; ``(ranks_per_node,)``: per node, then across nodes; ``(1, ranks_per_node)``:
    each rank's several rows of the token (V2 expand mode), then per node, then across nodes."""
    value, determined = predict_tokens([(contributions, biases)], groups, hidden)
    return value[0], determined[0]


def _stacked(rows: list[list[torch.Tensor]], hidden: int) -> torch.Tensor:
    """``[max rows, tokens, hidden]`` float64: token ``t``'s rows, padded with zero rows (a zero term changes neither
    a float32 sum nor whether it is exact)."""
    depth = max((len(r) for r in rows), default=0)
    out = torch.zeros(depth, len(rows), hidden, dtype=torch.float64)
    for t, token_rows in enumerate(rows):
        for i, row in enumerate(token_rows):
            out[i, t] = row
    return out


def predict_tokens(terms: list[tuple[list[tuple[int, torch.Tensor]], list[torch.Tensor]]], groups: tuple[int, ...],
                   hidden: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`predict_levels` of every token at once (``terms[t]``: token ``t``'s contributions and bias rows):
    ``[T, hidden]`` bf16 values and where they are determined."""
    rows = [[(dst, row.double()) for dst, row in contributions] for contributions, _ in terms]
    determined = torch.ones(len(terms), hidden, dtype=torch.bool)
    for g in groups:
        merged: list[list[tuple[int, torch.Tensor]]] = [[] for _ in rows]
        for key in sorted({dst // g for token_rows in rows for dst, _ in token_rows}):
            members = [[row for dst, row in token_rows if dst // g == key] for token_rows in rows]
            partial, exact = exact_float32_sum(_stacked(members, hidden))
            determined &= exact
            rounded = round_bf16(partial).double()
            for t, token_members in enumerate(members):
                if token_members:
                    merged[t].append((key * g, rounded[t]))
        rows = merged
    last = [[b.double() for b in biases] + [row for _, row in token_rows]
            for (_, biases), token_rows in zip(terms, rows, strict=True)]
    total, exact = exact_float32_sum(_stacked(last, hidden))
    return round_bf16(total), determined & exact


def v2_combine_groups(allow_multiple_reduction: bool, do_expand: bool, num_nodes: int, ranks_per_node: int
                      ) -> tuple[int, ...]:
    """The inner levels of V2 ``ElasticBuffer.combine``'s reduction tree (for :func:`predict_levels`), as DeepEP
    2.1.0's kernels build it (``allow_hybrid_mode=True``, so several nodes mean hybrid mode):

    * ``allow_multiple_reduction=True`` and expand mode: each rank first sums its own rows of a token in float32 and
      rounds them to bf16 (deep_ep/include/deep_ep/impls/combine.cuh:126-176, hybrid_combine.cuh:234-274); without
      expand mode a rank holds one row per token, nothing to reduce;
    * ``allow_multiple_reduction=True`` on several nodes: each node's forwarder sums its ranks' rows and rounds
      (hybrid_combine.cuh:495-571) before the receiver's epilogue sums the nodes (combine_reduce_epilogue.cuh);
    * ``allow_multiple_reduction=False``: every row travels to the receiver unreduced ("expanded send",
      combine.cuh:177-213, hybrid_combine.cuh:453-494) and the epilogue rounds once.
    """
    if not allow_multiple_reduction:
        return ()
    return ((1,) if do_expand else ()) + ((ranks_per_node,) if num_nodes > 1 else ())
