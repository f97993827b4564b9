"""Expected results of the reductions: combine with scaled experts, round trip, combined weights, gradients.

Plain loops over tokens and receiving ranks, reading only the inputs of every rank and tensors the caller
built from the example (biases, upstream gradients).  Nothing here imports the emulation or the backends.

Vocabulary: a token of ``src_rank`` *reaches* ``dst_rank`` when one of its top-k experts lives there
(``expert // experts_per_rank == dst_rank``).  Combine returns, for each token, one contribution per rank
it reached (never one per slot), plus the bias tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from conformance.core.example import Example, RankInputs
from conformance.oracle.tree import TreePrediction, predict_tokens, tree_groups

__all__ = [
    "ExpectedSum",
    "expected_combined_weights",
    "expected_dispatch_backward",
    "expected_expanded_combine",
    "expanded_expert_scale",
    "expected_round_trip_bf16",
    "expected_round_trip_sum",
    "expected_rows_by_source",
    "expected_scaled_combine",
    "reach_counts",
    "reached_ranks",
    "scaled_expanded_row",
    "scaled_expert_row",
    "scaled_weight",
]


def expert_scale(dst_rank: int) -> int:
    """The factor the test's expert on ``dst_rank`` multiplies every received row (and weight) by."""
    return 1 + dst_rank


def owner_rank(example: Example, expert: int) -> int:
    """The rank that owns global ``expert`` (-1 for a masked slot)."""
    return expert // example.experts_per_rank if expert >= 0 else -1


def reached_ranks(example: Example, topk_row: list[int]) -> list[int]:
    """The ranks a token with top-k experts ``topk_row`` reaches, ascending, each once."""
    return sorted({owner_rank(example, e) for e in topk_row if e >= 0})


@dataclass
class ExpectedSum:
    """The exact per-element sum of a reduction and what its error bound needs.

    ``exact`` is the float64 sum of the terms (exact up to float64 rounding, which the bound accounts
    for); ``abs_sum`` the float64 sum of their magnitudes; ``num_terms`` and ``num_groups`` count, per
    token, the terms (contributions plus biases) and the scale-out nodes the contributions came from.
    """

    exact: torch.Tensor  # [T, H] float64
    abs_sum: torch.Tensor  # [T, H] float64
    num_terms: torch.Tensor  # [T] int64
    num_groups: torch.Tensor  # [T] int64
    #: per token, the ``(dst_rank, row)`` contributions and the bias rows (for :meth:`tree`)
    terms: list[tuple[list[tuple[int, torch.Tensor]], list[torch.Tensor]]] = field(default_factory=list, repr=False)
    _trees: dict[tuple[int, ...], TreePrediction] = field(default_factory=dict, repr=False)

    def rounded(self) -> torch.Tensor:
        """The exact sum rounded once to bfloat16 (through float32, exact for the integer payloads)."""
        return self.exact.to(torch.float32).to(torch.bfloat16)

    def tree(self, ranks_per_group: int, world_size: int) -> TreePrediction:
        """The result of the library's reduction tree (:mod:`conformance.oracle.tree`) with first-level groups of
        ``ranks_per_group`` consecutive ranks (one level when that covers ``world_size``), and where it is
        determined byte for byte."""
        return self.tree_of(tree_groups(ranks_per_group, world_size))

    def tree_of(self, groups: tuple[int, ...]) -> TreePrediction:
        """The tree of :func:`conformance.oracle.tree.predict_levels` with these inner levels (innermost first)."""
        if groups not in self._trees:
            shape = tuple(self.exact.shape)
            value, determined = predict_tokens(self.terms, groups, shape[1])
            self._trees[groups] = TreePrediction(value.reshape(shape), determined.reshape(shape), 1 + len(groups))
        return self._trees[groups]


def reduce_terms(
    num_tokens: int,
    hidden: int,
    contributions: Callable[[int], list[tuple[int, torch.Tensor]]],
    biases: list[torch.Tensor],
    ranks_per_node: int,
) -> ExpectedSum:
    """Sum, per token, ``contributions(token)`` (``(dst_rank, row)`` pairs) and the bias rows."""
    exact = torch.zeros(num_tokens, hidden, dtype=torch.float64)
    abs_sum = torch.zeros(num_tokens, hidden, dtype=torch.float64)
    num_terms = torch.zeros(num_tokens, dtype=torch.int64)
    num_groups = torch.zeros(num_tokens, dtype=torch.int64)
    kept = []
    for token in range(num_tokens):
        terms = contributions(token)
        rows = [row for _, row in terms] + [b[token] for b in biases]
        for row in rows:
            exact[token] += row.double()
            abs_sum[token] += row.double().abs()
        num_terms[token] = len(rows)
        num_groups[token] = len({dst // ranks_per_node for dst, _ in terms})
        kept.append((terms, [b[token] for b in biases]))
    return ExpectedSum(exact, abs_sum, num_terms, num_groups, kept)


def scaled_expert_row(row: torch.Tensor, dst_rank: int) -> torch.Tensor:
    """What the test's expert on ``dst_rank`` returns for received ``row``: ``bf16(row * (1 + dst_rank))``."""
    return (row.float() * expert_scale(dst_rank)).to(torch.bfloat16)


def expected_scaled_combine(
    example: Example,
    inputs: list[RankInputs],
    src_rank: int,
    biases: list[torch.Tensor],
    ranks_per_node: int,
) -> ExpectedSum:
    """``combined_x`` of ``src_rank`` when every rank's expert scales its rows by ``1 + rank``, plus biases."""
    rank_inputs = inputs[src_rank]

    def contributions(token: int) -> list[tuple[int, torch.Tensor]]:
        row = rank_inputs.x[token]
        return [
            (dst, scaled_expert_row(row, dst))
            for dst in reached_ranks(example, rank_inputs.topk_idx[token].tolist())
        ]

    return reduce_terms(rank_inputs.x.shape[0], example.hidden, contributions, biases, ranks_per_node)


def expanded_expert_scale(expert: int) -> int:
    """The factor the test's expert ``expert`` (global index) multiplies its expanded rows by (V2 expand mode): odd
    and above 32, so that a rank's experts return different rows for one token and integer rows (at most 8 in
    magnitude) sum past bf16's 8 significant bits, where every rounding of the reduction tree shows."""
    return 33 + 2 * expert


def scaled_expanded_row(row: torch.Tensor, expert: int) -> torch.Tensor:
    """What the test's expert ``expert`` returns for one of its expanded rows: ``bf16(row * expanded_expert_scale)``."""
    return (row.float() * expanded_expert_scale(expert)).to(torch.bfloat16)


def expected_expanded_combine(
    example: Example,
    inputs: list[RankInputs],
    src_rank: int,
    biases: list[torch.Tensor],
    ranks_per_node: int,
) -> ExpectedSum:
    """``combined_x`` of ``src_rank`` after an expand-mode dispatch whose experts return
    :func:`scaled_expanded_row`: one contribution per valid top-k slot (from the rank owning its expert, so a rank
    holding several of a token's experts contributes several rows), plus the biases."""
    rank_inputs = inputs[src_rank]

    def contributions(token: int) -> list[tuple[int, torch.Tensor]]:
        row = rank_inputs.x[token]
        return [(owner_rank(example, e), scaled_expanded_row(row, e)) for e in rank_inputs.topk_idx[token].tolist()
                if e >= 0]

    return reduce_terms(rank_inputs.x.shape[0], example.hidden, contributions, biases, ranks_per_node)


def expected_combined_weights(
    example: Example, inputs: list[RankInputs], src_rank: int, slot_values: Callable[[int, int, int], float]
) -> torch.Tensor:
    """``combined_topk_weights`` of ``src_rank``: slot k of a token holds the value the rank owning that slot's
    expert returned for slot k (``slot_values(dst_rank, token, k)``, a float32), and 0 where the slot is -1.

    This is what the recordings show (V1 and V2 byte-identical): the weights are not summed over the ranks
    a token reached; each slot comes back from its owner only.
    """
    rank_inputs = inputs[src_rank]
    num_tokens = rank_inputs.topk_idx.shape[0]
    out = torch.zeros(num_tokens, example.num_topk, dtype=torch.float32)
    for token in range(num_tokens):
        for slot in range(example.num_topk):
            owner = owner_rank(example, int(rank_inputs.topk_idx[token, slot]))
            if owner >= 0:
                out[token, slot] = slot_values(owner, token, slot)
    return out


def scaled_weight(weight: torch.Tensor, dst_rank: int) -> float:
    """What the test's expert on ``dst_rank`` returns for a received float32 weight (float32 product)."""
    return float(weight.to(torch.float32) * torch.tensor(float(expert_scale(dst_rank)), dtype=torch.float32))


def expected_round_trip_bf16(example: Example, inputs: list[RankInputs], src_rank: int) -> torch.Tensor:
    """combine(dispatch(x)) with identity experts, as bf16: per token, float32 +0.0 plus x once per reached
    rank, rounded once.  A token that reached no rank comes back as +0.0 (as recorded)."""
    rank_inputs = inputs[src_rank]
    out = torch.zeros(rank_inputs.x.shape, dtype=torch.bfloat16)
    for token in range(rank_inputs.x.shape[0]):
        acc = torch.zeros(example.hidden, dtype=torch.float32)
        for _ in reached_ranks(example, rank_inputs.topk_idx[token].tolist()):
            acc = acc + rank_inputs.x[token].float()
        out[token] = acc.to(torch.bfloat16)
    return out


def expected_round_trip_sum(
    example: Example, inputs: list[RankInputs], src_rank: int, ranks_per_node: int,
    biases: list[torch.Tensor] | None = None,
) -> ExpectedSum:
    """The exact round trip of ``src_rank``: x once per reached rank (for the bounded comparison), plus ``biases``."""
    rank_inputs = inputs[src_rank]

    def contributions(token: int) -> list[tuple[int, torch.Tensor]]:
        row = rank_inputs.x[token]
        return [(dst, row) for dst in reached_ranks(example, rank_inputs.topk_idx[token].tolist())]

    return reduce_terms(rank_inputs.x.shape[0], example.hidden, contributions, biases or [], ranks_per_node)


def reach_counts(example: Example, inputs: list[RankInputs], src_rank: int) -> list[int]:
    """How many ranks each token of ``src_rank`` reached."""
    return [len(reached_ranks(example, row)) for row in inputs[src_rank].topk_idx.tolist()]


def expected_dispatch_backward(
    example: Example,
    inputs: list[RankInputs],
    src_rank: int,
    grad_rows: Callable[[int, int], tuple[torch.Tensor, torch.Tensor]],
    ranks_per_node: int,
) -> tuple[ExpectedSum, torch.Tensor]:
    """Gradients of ``x`` and ``topk_weights`` of ``src_rank`` through dispatch.

    ``grad_rows(dst_rank, token)`` gives the upstream gradient ``dst_rank`` holds for the received row of
    (``src_rank``, token): a bf16 ``[hidden]`` row for ``recv_x`` and a float32 ``[num_topk]`` row for
    ``recv_topk_weights``.  grad x = sum of the row gradients over the ranks the token reached; grad
    weight of slot k = the owner's gradient at slot k (0 for a masked slot).
    """
    rank_inputs = inputs[src_rank]

    def contributions(token: int) -> list[tuple[int, torch.Tensor]]:
        return [
            (dst, grad_rows(dst, token)[0]) for dst in reached_ranks(example, rank_inputs.topk_idx[token].tolist())
        ]

    grad_x = reduce_terms(rank_inputs.x.shape[0], example.hidden, contributions, [], ranks_per_node)
    grad_w = expected_combined_weights(
        example, inputs, src_rank, lambda dst, token, slot: float(grad_rows(dst, token)[1][slot])
    )
    return grad_x, grad_w


def expected_rows_by_source(
    src_rank: torch.Tensor, src_token: torch.Tensor, payloads: list[torch.Tensor]
) -> torch.Tensor:
    """The rows a (cached) dispatch must deliver, in the given row order: row i is
    ``payloads[src_rank[i]][src_token[i]]`` (``payloads[r]`` is what rank r sent)."""
    hidden, dtype = payloads[0].shape[1], payloads[0].dtype
    out = torch.empty(src_rank.numel(), hidden, dtype=dtype)
    for i, (rank, token) in enumerate(zip(src_rank.tolist(), src_token.tolist(), strict=True)):
        out[i] = payloads[rank][token]
    return out
