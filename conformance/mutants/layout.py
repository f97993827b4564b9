"""Mutants of the dispatch layout: counts, alignment, prefix sums, ``recv_topk_idx``, weights, the V2 expand
layout and the deterministic order (caught by P2, P3, P4, P8, P13); and two benign changes the contract
allows (V2's default receive order varying from call to call, and the bytes of expand-mode padding).

Each planted defect sits where a real one would, at a seam of the emulation's routing math or of the emulated
buffers, so every output derived from it (handles, combine) follows, as in a real library bug.
"""

from __future__ import annotations

import contextlib
import itertools
import weakref
from collections.abc import Iterator
from typing import Any

import torch

from conformance.emulation import ElasticBuffer
from conformance.emulation.elastic import expand_padding_rows
from conformance.mutants.patching import call_argument, seam, through
from conformance.mutants.registry import register


@contextlib.contextmanager
def _wrap_receive(edit: Any) -> Iterator[None]:
    """While active, ``edit(buffer, plan, do_expand)`` edits the V2 receive plan in place (seam ``v2_receive``)."""

    def receive(original: Any, self: Any, *args: Any, **kwargs: Any) -> dict:
        plan = original(self, *args, **kwargs)
        edit(self, plan, call_argument(original, self, args, kwargs, "do_expand"))
        return plan

    with seam("v2_receive", receive):
        yield


# ----------------------------------------------------------------------------------------------- counts
@register(
    "count-off-by-one", "harmful",
    "V2 counts one receipt too many for the last local expert that received any; the raw count, the aligned "
    "count list and the prefix sums all carry it (P2)",
)
def count_off_by_one() -> Iterator[None]:
    def counted(original: Any, recv_topk_idx: torch.Tensor, num_local_experts: int) -> list[int]:
        counts = original(recv_topk_idx, num_local_experts)
        busy = [e for e, c in enumerate(counts) if c > 0]
        if busy:
            counts[busy[-1]] += 1
        return counts

    with seam("count_per_local_expert", counted):
        yield


@register(
    "alignment-rounds-down", "harmful",
    "per-expert counts are rounded DOWN to expert_alignment (floor instead of ceil) when the alignment is "
    "above 1, in both APIs (P2; P8 for the expand layout)",
)
def alignment_rounds_down() -> Iterator[None]:
    def rounded(original: Any, value: int, alignment: int) -> int:
        return value // alignment * alignment if alignment > 1 else original(value, alignment)

    with seam("align_up", rounded):
        yield


@register(
    "psum-exclusive", "harmful",
    "V2 non-expand psum_num_recv_tokens_per_expert is the EXCLUSIVE prefix sum of the aligned counts (P2)",
)
def psum_exclusive() -> Iterator[None]:
    def edit(buffer: ElasticBuffer, plan: dict, do_expand: bool) -> None:
        if not do_expand:
            aligned = torch.tensor(plan["aligned"], dtype=torch.int64)
            plan["psum_expert"] = (torch.cumsum(aligned, 0) - aligned).to(plan["psum_expert"])

    with _wrap_receive(edit):
        yield


# -------------------------------------------------------------------------------------- recv_topk_idx
@register(
    "topk-idx-wrong-local-expert", "harmful",
    "the last received token with a local slot gets the next local expert's index there (wrong local "
    "expert in recv_topk_idx, both APIs; needs >= 2 experts per rank) (P3)",
)
def topk_idx_wrong_local_expert() -> Iterator[None]:
    def localised(original: Any, topk_idx: torch.Tensor, rank: int, experts_per_rank: int) -> torch.Tensor:
        local = original(topk_idx, rank, experts_per_rank)
        hits = torch.nonzero(local >= 0)
        if experts_per_rank > 1 and hits.shape[0]:
            row, slot = hits[-1].tolist()
            local[row, slot] = (local[row, slot] + 1) % experts_per_rank
        return local

    with seam("to_local_topk", localised):
        yield


# -------------------------------------------------------------------------------------------- weights
@register(
    "zero-one-live-weight", "harmful",
    "V2 writes 0 into one weight at a local (recv_topk_idx >= 0) slot: the first received token with a "
    "local slot, on the last rank (P4)",
)
def zero_one_live_weight() -> Iterator[None]:
    def edit(buffer: ElasticBuffer, plan: dict, do_expand: bool) -> None:
        if do_expand or buffer.rank_idx != buffer.num_ranks - 1 or plan["recv_topk_weights"] is None:
            return
        hits = torch.nonzero(plan["recv_topk_idx"] >= 0)
        if hits.shape[0]:
            row, slot = hits[0].tolist()
            plan["recv_topk_weights"] = plan["recv_topk_weights"].clone()
            plan["recv_topk_weights"][row, slot] = 0.0

    with _wrap_receive(edit):
        yield


@register(
    "v2-zeroes-minus-one-weights", "harmful",
    "V2 writes 0 at the -1 slots of recv_topk_weights (V1's behaviour leaking into V2): V2 changed its "
    "own behaviour (P4)",
)
def v2_zeroes_minus_one_weights() -> Iterator[None]:
    def edit(buffer: ElasticBuffer, plan: dict, do_expand: bool) -> None:
        weights = plan["recv_topk_weights"]
        if not do_expand and weights is not None:
            plan["recv_topk_weights"] = torch.where(plan["recv_topk_idx"] >= 0, weights, torch.zeros_like(weights))

    with _wrap_receive(edit):
        yield


@register(
    "v1-keeps-minus-one-weights", "harmful",
    "V1 keeps the sender's weight at the -1 slots of recv_topk_weights instead of writing 0 (V2's "
    "behaviour leaking into V1): V1 changed its own behaviour (P4)",
)
def v1_keeps_minus_one_weights() -> Iterator[None]:
    def weights(original: Any, recv_topk_idx: torch.Tensor, sent: torch.Tensor) -> torch.Tensor:
        return sent.clone()

    with seam("v1_recv_topk_weights", weights):
        yield


# ---------------------------------------------------------------------------------------- expand mode
@register(
    "expand-not-contiguous", "harmful",
    "V2 expand mode puts the last row of each expert that has padding at the END of its aligned segment, "
    "leaving a gap inside the expert's rows (slot pointers, recv_x and combine follow) (P8)",
)
def expand_not_contiguous() -> Iterator[None]:
    def layout(original: Any, recv_topk_idx: torch.Tensor, num_local_experts: int, alignment: int) -> tuple:
        slots, raw, starts = original(recv_topk_idx, num_local_experts, alignment)
        for count, start in zip(raw, starts, strict=True):
            end = start + through("align_up", count, alignment)
            if 0 < count < end - start:
                slots[slots == start + count - 1] = end - 1
        return slots, raw, starts

    with seam("expand_layout", layout):
        yield


@register(
    "expand-psum-non-expand-semantics", "harmful",
    "V2 expand mode reports psum_num_recv_tokens_per_expert with the non-expand meaning (inclusive prefix "
    "sum of the ALIGNED counts) instead of aligned start + raw count (P8)",
)
def expand_psum_non_expand_semantics() -> Iterator[None]:
    def edit(buffer: ElasticBuffer, plan: dict, do_expand: bool) -> None:
        if do_expand:
            aligned = torch.tensor(plan["aligned"], dtype=torch.int64)
            plan["psum_expert"] = torch.cumsum(aligned, 0).to(plan["psum_expert"])

    with _wrap_receive(edit):
        yield


# ------------------------------------------------------------------------------------------ ordering
def _token_major_order(original: Any, src_ranks: torch.Tensor, src_tokens: torch.Tensor, num_max_tokens_per_rank: int,
                       group_key: torch.Tensor | None = None, deterministic: bool = False) -> torch.Tensor:
    """A wrong sort key when the deterministic order was asked for: by source token first, then source rank (the two
    halves of the key swapped)."""
    if not deterministic:
        return original(src_ranks, src_tokens, num_max_tokens_per_rank, group_key, deterministic=deterministic)
    key = src_tokens.to(torch.int64) * (1 << 20) + src_ranks.to(torch.int64)
    return torch.sort(key, stable=True).indices


@register(
    "deterministic-not-sorted", "harmful",
    "V2 deterministic=True sorts received tokens by (source token, source rank) instead of (source rank, "
    "source token): a stable order, but not V1's (P13)",
)
def deterministic_not_sorted() -> Iterator[None]:
    with seam("receive_order", _token_major_order):
        yield


# -------------------------------------------------------------------------------------------- benign
#: Seeds of fresh V2 dispatches in this rank process (a new arrival order every call).
_ARRIVALS = itertools.count(1)
#: The seed of each live handle's dispatch (its cached dispatches receive in the same order).
_SEEDS: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def _seed_of(handle: Any) -> int | None:
    """The seed of ``handle``'s dispatch (``None``: a fresh dispatch, or an argument that is no handle at all, e.g. a
    bad call's V1 tuple, which takes no weak reference)."""
    try:
        return None if handle is None else _SEEDS.get(handle)
    except TypeError:
        return None


def _arrival_order(seed: int) -> Any:
    """A ``receive_order``: rows grouped by the scale-up peer they arrive through (the source rank on one node, like
    the real library's per-peer blocks), shuffled inside each group by ``seed``."""

    def order(src_ranks: torch.Tensor, src_tokens: torch.Tensor, num_max_tokens_per_rank: int,
              group_key: torch.Tensor | None = None) -> torch.Tensor:
        gidx = src_ranks.to(torch.int64).cpu() * num_max_tokens_per_rank + src_tokens.to(torch.int64).cpu()
        group = (group_key if group_key is not None else src_ranks).to(torch.int64).cpu()
        if gidx.numel() == 0:
            return torch.empty(0, dtype=torch.int64, device=src_ranks.device)
        generator = torch.Generator().manual_seed(seed)
        rank_of = torch.randperm(int(gidx.max()) + 1, generator=generator)  # a random priority per global index
        key = group * (1 << 32) + rank_of[gidx]
        return torch.sort(key, stable=True).indices.to(src_ranks.device)

    return order


@register(
    "v2-shuffled-receive-order", "benign",
    "V2 default (non-deterministic) mode: every fresh dispatch receives in a new arrival order (shuffled "
    "within each scale-up peer's block); recv_x, weights, recv_src_metadata, the expand layout, cached "
    "dispatch (same order as its handle) and combine all follow. Allowed: order is not part of the contract",
)
def v2_shuffled_receive_order() -> Iterator[None]:
    current: list[int] = []

    def dispatch(original: Any, self: Any, *args: Any, **kwargs: Any) -> tuple:
        if self.deterministic:
            return original(self, *args, **kwargs)
        handle = call_argument(original, self, args, kwargs, "handle")
        seed = _seed_of(handle)
        seed = next(_ARRIVALS) if seed is None else seed
        current.append(seed)
        try:
            out = original(self, *args, **kwargs)
        finally:
            current.pop()
        _SEEDS[out[3]] = seed
        return out

    def order(original: Any, src_ranks: torch.Tensor, src_tokens: torch.Tensor, num_max_tokens_per_rank: int,
              group_key: torch.Tensor | None = None, deterministic: bool = False) -> torch.Tensor:
        if deterministic or not current:
            return original(src_ranks, src_tokens, num_max_tokens_per_rank, group_key, deterministic=deterministic)
        return _arrival_order(current[-1])(src_ranks, src_tokens, num_max_tokens_per_rank, group_key)

    with seam("ElasticBuffer.dispatch", dispatch), seam("receive_order", order):
        yield


def garble_expand_padding(out: tuple, n: int) -> None:
    """Write call ``n``'s garbage into the padding rows (rows no slot pointer names) of an expand-mode dispatch's
    outputs ``out``: x rows of bytes ``0xFF - n``, weights NaN or huge, in place."""
    recv_x, weights, handle = out[0], out[2], out[3]
    if not handle.do_expand or not isinstance(recv_x, torch.Tensor):
        return
    # the valid rows' pointers only: past them a no-sync handle's metadata is uninitialised
    valid = int(handle.psum_num_recv_tokens_per_scaleup_rank[-1])
    pad = expand_padding_rows(recv_x.shape[0], handle.recv_src_metadata[:valid, 2:])
    if pad.numel() == 0:
        return
    recv_x.view(torch.uint8).view(recv_x.shape[0], -1)[pad] = (0xFF - n) % 256
    if weights is not None:
        weights[pad] = float("nan") if n % 2 else 3.0e38


@register(
    "expand-padding-garbage", "benign",
    "V2 expand mode without do_zero_padding leaves different bytes in the alignment padding rows on every call (x "
    "rows of 0xFF.., NaN/huge weights), as the real library does. Allowed: padding is not part of the contract "
    "unless do_zero_padding=True",
)
def expand_padding_garbage() -> Iterator[None]:
    calls = itertools.count(1)

    def dispatch(original: Any, self: Any, *args: Any, **kwargs: Any) -> tuple:
        out = original(self, *args, **kwargs)
        if not call_argument(original, self, args, kwargs, "do_zero_padding"):
            garble_expand_padding(out, next(calls))
        return out

    with seam("ElasticBuffer.dispatch", dispatch):
        yield
