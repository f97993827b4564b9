"""Pure routing math shared by the emulated ``Buffer`` and ``ElasticBuffer``.

Every function here is side-effect free (except ``rewrite_send_head_for_combine``, which mirrors an
in-place kernel).  The ones a planted defect may replace are call seams (``@seam``, ``seams.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .seams import seam

#: ``send_head`` base the real ``cached_notify_combine`` uses when no later token of the channel
#: reached the rank.
SEND_HEAD_SENTINEL = 1 << 25


@seam("align_up")
def align_up(value: int, alignment: int) -> int:
    """Round ``value`` up to a multiple of ``alignment``."""
    return (value + alignment - 1) // alignment * alignment


def expert_owner(topk_idx: torch.Tensor, experts_per_rank: int) -> torch.Tensor:
    """Rank owning each selected expert (``-1`` where no expert is selected)."""
    return torch.where(
        topk_idx >= 0,
        torch.div(topk_idx, experts_per_rank, rounding_mode="floor"),
        torch.full_like(topk_idx, -1),
    )


def token_in_rank(topk_idx: torch.Tensor, num_experts: int, num_ranks: int) -> torch.Tensor:
    """``[num_tokens, num_ranks]`` bool: whether any of a token's experts lives on each rank.

    As the real layout kernel: rank ``r`` owns experts ``[r * E // R, (r + 1) * E // R)``; ids outside
    ``[0, num_ranks * (E // R))`` (out of range, or past the last whole rank) belong to no rank.
    """
    experts_per_rank = num_experts // num_ranks
    ranks = torch.arange(num_ranks, device=topk_idx.device)
    if experts_per_rank == 0:
        return torch.zeros((topk_idx.shape[0], num_ranks), dtype=torch.bool, device=topk_idx.device)
    owner = expert_owner(topk_idx, experts_per_rank)
    owner = torch.where(topk_idx < num_ranks * experts_per_rank, owner, torch.full_like(owner, -1))
    return (owner.unsqueeze(-1) == ranks).any(dim=1)


def compute_layout(
    topk_idx: torch.Tensor, num_experts: int, num_ranks: int, ranks_per_node: int
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """The legacy ``get_dispatch_layout`` result (csrc/kernels/legacy/layout.cu).

    Per-expert counts count (token, slot) pairs with an id in ``[0, num_experts)``; other ids are ignored.

    Returns:
        num_tokens_per_rank ``[num_ranks]`` int32, num_tokens_per_rdma_rank ``[num_nodes]`` int32 or ``None``
        on one node, num_tokens_per_expert ``[num_experts]`` int32,
        is_token_in_rank ``[num_tokens, num_ranks]``.
    """
    in_rank = token_in_rank(topk_idx, num_experts, num_ranks)
    per_rank = in_rank.sum(dim=0).to(torch.int32)
    valid = topk_idx[(topk_idx >= 0) & (topk_idx < num_experts)]
    per_expert = (
        torch.bincount(valid, minlength=num_experts).to(torch.int32)
        if valid.numel()
        else torch.zeros(num_experts, dtype=torch.int32, device=topk_idx.device)
    )
    per_rdma = None
    num_nodes = num_ranks // ranks_per_node
    if num_nodes > 1:
        per_rdma = (
            in_rank.reshape(in_rank.shape[0], num_nodes, ranks_per_node).any(dim=2).sum(dim=0).to(torch.int32)
        )
    return per_rank, per_rdma, per_expert, in_rank


@seam("to_local_topk")
def to_local_topk(topk_idx: torch.Tensor, rank: int, experts_per_rank: int) -> torch.Tensor:
    """Global expert ids -> this rank's local expert index, ``-1`` for experts elsewhere (or none)."""
    lo = rank * experts_per_rank
    local = topk_idx - lo
    keep = (topk_idx >= lo) & (topk_idx < lo + experts_per_rank)
    return torch.where(keep, local, torch.full_like(topk_idx, -1))


@seam("count_per_local_expert")
def count_per_local_expert(recv_topk_idx: torch.Tensor, num_local_experts: int) -> list[int]:
    """Raw number of received (token, slot) pairs per local expert."""
    valid = recv_topk_idx[recv_topk_idx >= 0]
    if valid.numel() == 0:
        return [0] * num_local_experts
    return [int(v) for v in torch.bincount(valid.cpu(), minlength=num_local_experts)[:num_local_experts]]


def channel_bounds(num_tokens: int, num_channels: int) -> list[tuple[int, int]]:
    """Token range of each channel: ``ceil(num_tokens / num_channels)`` tokens each, the tail shorter."""
    per = (num_tokens + num_channels - 1) // num_channels
    bounds = []
    for c in range(num_channels):
        start = min(per * c, num_tokens)
        bounds.append((start, min(start + per, num_tokens)))
    return bounds


def channel_prefix_matrix(is_token_in_rank: torch.Tensor, num_channels: int) -> torch.Tensor:
    """``[num_ranks, num_channels]`` int32: inclusive prefix over channels of tokens sent to each rank."""
    num_tokens, num_ranks = is_token_in_rank.shape
    counts = torch.zeros((num_ranks, num_channels), dtype=torch.int32, device=is_token_in_rank.device)
    for c, (start, end) in enumerate(channel_bounds(num_tokens, num_channels)):
        counts[:, c] = is_token_in_rank[start:end].sum(dim=0).to(torch.int32)
    return torch.cumsum(counts, dim=1).to(torch.int32)


def recv_channel_prefix_row(sender_channel_prefix_to_me: torch.Tensor) -> torch.Tensor:
    """Exclusive prefix (start offset per channel) of what one sender sends to this rank."""
    out = torch.zeros_like(sender_channel_prefix_to_me)
    out[1:] = sender_channel_prefix_to_me[:-1]
    return out


def send_head(is_token_in_rank: torch.Tensor, num_channels: int) -> torch.Tensor:
    """``[num_tokens, num_ranks]`` int32: a token's position in its channel's queue to each rank, else -1."""
    num_tokens, num_ranks = is_token_in_rank.shape
    head = torch.full((num_tokens, num_ranks), -1, dtype=torch.int32, device=is_token_in_rank.device)
    for start, end in channel_bounds(num_tokens, num_channels):
        if end <= start:
            continue
        sent = is_token_in_rank[start:end].to(torch.int32)
        pos = torch.cumsum(sent, dim=0) - 1
        head[start:end] = torch.where(sent.bool(), pos.to(torch.int32), head[start:end])
    return head


def rewrite_send_head_for_combine(head: torch.Tensor, num_channels: int) -> torch.Tensor:
    """In place, as the real ``cached_notify_combine``: each -1 becomes ``-(next valid head in channel) - 1``.

    The "next valid head" is the head of the nearest later token of the same channel that reached the
    rank, or ``1 << 25`` when there is none.  Returns ``head``.
    """
    num_tokens, num_ranks = head.shape
    cpu = head.cpu()
    for start, end in channel_bounds(num_tokens, num_channels):
        for r in range(num_ranks):
            last = SEND_HEAD_SENTINEL
            for t in range(end - 1, start - 1, -1):
                value = int(cpu[t, r])
                if value < 0:
                    cpu[t, r] = -last - 1
                else:
                    last = value
    head.copy_(cpu)
    return head


@seam("receive_order")
def receive_order(
    src_ranks: torch.Tensor,
    src_tokens: torch.Tensor,
    num_max_tokens_per_rank: int,
    group_key: torch.Tensor | None = None,
    deterministic: bool = False,
) -> torch.Tensor:
    """Permutation putting received tokens in (group_key, source rank, source token) order.

    ``deterministic`` (whether the caller asked for the deterministic order) does not change it: the emulation's
    arrival order is this sorted one either way (DIVERGENCES.md); a planted defect may tell the two apart."""
    del deterministic
    key = src_ranks.to(torch.int64) * num_max_tokens_per_rank + src_tokens.to(torch.int64)
    if group_key is not None:
        key = key + group_key.to(torch.int64) * (1 << 40)
    return torch.sort(key, stable=True).indices


def last_slot_on_rank(topk_idx: torch.Tensor, rank: int, experts_per_rank: int) -> torch.Tensor:
    """Index of the last top-k slot whose expert lives on ``rank`` (``-1`` if none)."""
    on_rank = expert_owner(topk_idx, experts_per_rank) == rank
    k = torch.arange(topk_idx.shape[1], device=topk_idx.device).expand_as(topk_idx)
    return (
        torch.where(on_rank, k, torch.full_like(k, -1)).max(dim=1).values
        if topk_idx.shape[1]
        else torch.full((topk_idx.shape[0],), -1, dtype=torch.int64, device=topk_idx.device)
    )


def dst_buffer_slots(
    topk_idx: torch.Tensor, rank: int, num_ranks: int, experts_per_rank: int, num_max_tokens_per_rank: int
) -> torch.Tensor:
    """Sender-side ``dst_buffer_slot_idx`` ``[num_tokens, num_topk]`` int32.

    At the last slot pointing at each destination rank: ``rank * num_max_tokens_per_rank + position of the
    token among this rank's tokens sent to that destination`` (token order); every other slot is -1.
    """
    out = torch.full(topk_idx.shape, -1, dtype=torch.int32, device=topk_idx.device)
    for dst in range(num_ranks):
        last = last_slot_on_rank(topk_idx, dst, experts_per_rank)
        sent = last >= 0
        pos = torch.cumsum(sent.to(torch.int64), dim=0) - 1
        rows = torch.nonzero(sent).flatten()
        out[rows, last[rows]] = (rank * num_max_tokens_per_rank + pos[rows]).to(torch.int32)
    return out


@seam("expand_layout")
def expand_layout(
    recv_topk_idx: torch.Tensor, num_local_experts: int, alignment: int
) -> tuple[torch.Tensor, list[int], list[int]]:
    """Expanded (one row per (token, local expert slot)) layout, experts contiguous, aligned starts.

    Within an expert, rows follow the received-token order, then slot order.

    Returns:
        slots ``[num_recv_tokens, num_topk]`` int64 (expanded row of each slot, -1 if not local),
        raw counts per expert, aligned start offset per expert.
    """
    raw = count_per_local_expert(recv_topk_idx, num_local_experts)
    starts, offset = [], 0
    for count in raw:
        starts.append(offset)
        offset += align_up(count, alignment)
    slots = torch.full(recv_topk_idx.shape, -1, dtype=torch.int64, device=recv_topk_idx.device)
    cursor = list(starts)
    cpu_idx = recv_topk_idx.cpu()
    cpu_slots = slots.cpu()
    for e in range(num_local_experts):
        hits = torch.nonzero(cpu_idx == e)  # row-major: token order, then slot order
        for n, (t, k) in enumerate(hits.tolist()):
            cpu_slots[t, k] = cursor[e] + n
    slots.copy_(cpu_slots)
    return slots, raw, starts


@seam("combine_reduce")
def combine_reduce(
    num_tokens: int,
    hidden: int,
    contributions: Sequence[tuple[torch.Tensor, torch.Tensor]],
    bias: Sequence[torch.Tensor],
    out_dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """Sum contributions in float32 (bias first, then contributions in the given order), round once.

    Arguments:
        contributions: ``(token_index [n], rows [n, hidden])`` pairs, added in order.
        bias: 0, 1 or 2 ``[num_tokens, hidden]`` tensors.
    """
    acc = torch.zeros((num_tokens, hidden), dtype=torch.float32, device=device)
    for b in bias:
        acc += b.to(torch.float32)
    for tokens, rows in contributions:
        if tokens.numel():
            acc.index_add_(0, tokens.to(torch.int64), rows.to(torch.float32))
    return acc.to(out_dtype)


@seam("combine_reduce_two_level")
def combine_reduce_two_level(
    num_tokens: int,
    hidden: int,
    groups: Sequence[Sequence[tuple[torch.Tensor, torch.Tensor]]],
    bias: Sequence[torch.Tensor],
    out_dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """Hierarchical (hybrid V2) reduction: each group (one scale-out node's contributions) is summed in
    float32 and rounded to ``out_dtype`` (the forwarder's payload), then the partial sums plus bias are
    summed in float32 and rounded once more."""
    partials = []
    for contributions in groups:
        part = combine_reduce(num_tokens, hidden, contributions, [], out_dtype, device)
        rows = torch.arange(num_tokens, device=device)
        partials.append((rows, part))
    return combine_reduce(num_tokens, hidden, partials, bias, out_dtype, device)
