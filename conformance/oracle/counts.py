"""Expected counts, prefix sums, layout outputs and ``recv_topk_idx`` rows of dispatch.

Plain loops over every rank's inputs, like :mod:`conformance.oracle.receipts`; nothing here is shared with
the emulation or the backends.
"""

from __future__ import annotations

from conformance.core.example import Example, RankInputs


def round_up(value: int, alignment: int) -> int:
    """``value`` rounded up to the next multiple of ``alignment`` (``value`` itself if it is one)."""
    remainder = value % alignment
    return value if remainder == 0 else value + (alignment - remainder)


def expected_raw_counts(example: Example, inputs: list[RankInputs], dst_rank: int) -> list[int]:
    """Raw number of (token, slot) pairs each local expert of ``dst_rank`` receives."""
    per_rank = example.experts_per_rank
    counts = [0] * per_rank
    for rank_inputs in inputs:
        for row in rank_inputs.topk_idx.tolist():
            for expert in row:
                if expert >= 0 and expert // per_rank == dst_rank:
                    counts[expert - dst_rank * per_rank] += 1
    return counts


def expected_aligned_counts(example: Example, inputs: list[RankInputs], dst_rank: int) -> list[int]:
    """``num_recv_tokens_per_expert_list``: raw counts rounded up to ``expert_alignment``."""
    return [round_up(c, example.expert_alignment) for c in expected_raw_counts(example, inputs, dst_rank)]


def inclusive_prefix_sum(values: list[int]) -> list[int]:
    """``[v0, v0 + v1, ...]``."""
    out, total = [], 0
    for v in values:
        total += v
        out.append(total)
    return out


def expected_psum_per_expert(example: Example, inputs: list[RankInputs], dst_rank: int, do_expand: bool) -> list[int]:
    """V2 ``psum_num_recv_tokens_per_expert``.

    Non-expand: the inclusive prefix sum of the aligned counts.  Expand: the aligned sum of the experts
    before ``i`` plus expert ``i``'s raw count (the end of expert ``i``'s rows in the expanded ``recv_x``).
    """
    raw = expected_raw_counts(example, inputs, dst_rank)
    aligned = [round_up(c, example.expert_alignment) for c in raw]
    if not do_expand:
        return inclusive_prefix_sum(aligned)
    out, start = [], 0
    for expert in range(len(raw)):
        out.append(start + raw[expert])
        start += aligned[expert]
    return out


def expected_tokens_per_source_rank(example: Example, inputs: list[RankInputs], dst_rank: int) -> list[int]:
    """How many tokens (each counted once) ``dst_rank`` receives from each source rank."""
    per_rank = example.experts_per_rank
    out = []
    for rank_inputs in inputs:
        n = 0
        for row in rank_inputs.topk_idx.tolist():
            if any(e >= 0 and e // per_rank == dst_rank for e in row):
                n += 1
        out.append(n)
    return out


def expected_recv_topk_idx(example: Example, inputs: list[RankInputs], dst_rank: int, src_rank: int,
                           src_token: int) -> list[int]:
    """The ``recv_topk_idx`` row of a received token: the local expert index for every slot whose expert
    lives on ``dst_rank``, ``-1`` for every other slot (experts elsewhere and masked slots)."""
    per_rank = example.experts_per_rank
    row = []
    for expert in inputs[src_rank].topk_idx[src_token].tolist():
        row.append(expert - dst_rank * per_rank if expert >= 0 and expert // per_rank == dst_rank else -1)
    return row


def expected_layout(example: Example, rank_inputs: RankInputs) -> dict[str, list]:
    """V1 ``get_dispatch_layout`` of one rank's ``topk_idx``.

    Returns ``num_tokens_per_rank`` (tokens with at least one expert on each rank), ``num_tokens_per_expert``
    (slots per global expert) and ``is_token_in_rank`` (``[T][world]`` booleans).
    """
    per_rank, world = example.experts_per_rank, example.world_size
    tokens_per_rank = [0] * world
    tokens_per_expert = [0] * example.num_experts
    in_rank = []
    for row in rank_inputs.topk_idx.tolist():
        reached = [False] * world
        for expert in row:
            if expert >= 0:
                tokens_per_expert[expert] += 1
                reached[expert // per_rank] = True
        for r in range(world):
            tokens_per_rank[r] += int(reached[r])
        in_rank.append(reached)
    return {"num_tokens_per_rank": tokens_per_rank, "num_tokens_per_expert": tokens_per_expert,
            "is_token_in_rank": in_rank}


def expected_padding_rows(example: Example, inputs: list[RankInputs], dst_rank: int) -> list[int]:
    """The alignment padding of ``dst_rank``'s V2 expand-mode ``recv_x``: for every local expert, the rows between
    its raw count and its aligned count, ``[start + raw, start + aligned)`` (what ``do_zero_padding=True`` zeroes,
    deep_ep/include/deep_ep/impls/dispatch_copy_epilogue.cuh:231-322)."""
    rows, start = [], 0
    for raw in expected_raw_counts(example, inputs, dst_rank):
        aligned = round_up(raw, example.expert_alignment)
        rows.extend(range(start + raw, start + aligned))
        start += aligned
    return rows


def expected_worst_expanded_rows(example: Example) -> int:
    """Rows of a V2 expand-mode dispatch without CPU sync: the library allocates ``num_ranks *
    num_max_tokens_per_rank * min(num_topk, num_local_experts) + (alignment - 1) * num_local_experts``, rounded up
    to the alignment (csrc/elastic/buffer.hpp:1067-1070)."""
    local = example.experts_per_rank
    rows = (example.world_size * example.num_max_tokens_per_rank * min(example.num_topk, local)
            + (example.expert_alignment - 1) * local)
    return round_up(rows, example.expert_alignment)
