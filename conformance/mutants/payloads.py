"""Mutants of what dispatch delivers: bytes, rows and their source ids (caught by P1), and one benign
reordering that the contract allows (V2's default receive order is not part of the contract)."""

from __future__ import annotations

import inspect
from collections.abc import Iterator

import torch

from conformance.mutants.patching import has_token_rows, patch_dispatch_views, seam, select_rows
from conformance.mutants.registry import register


@register("flip-one-byte", "harmful", "one bit of one byte of one received token flips (last rank, row 0)")
def flip_one_byte() -> Iterator[None]:
    def mutate(view, rank: int, world_size: int) -> None:
        if rank == world_size - 1 and view.x.shape[0] > 0:
            view.x.view(-1).view(torch.uint8)[0] ^= 0x01

    with patch_dispatch_views(mutate):
        yield


@register("drop-one-token", "harmful", "V2 dispatch loses its last received token on the last rank")
def drop_one_token() -> Iterator[None]:
    def mutate(view, rank: int, world_size: int) -> None:
        n = view.src_rank.shape[0]
        if rank == world_size - 1 and n > 0 and has_token_rows(view):
            select_rows(view, torch.arange(n - 1))

    with patch_dispatch_views(mutate, apis=("v2",)):
        yield


@register("duplicate-one-token", "harmful", "V1 dispatch delivers its first received token twice on rank 0")
def duplicate_one_token() -> Iterator[None]:
    def mutate(view, rank: int, world_size: int) -> None:
        n = view.src_rank.shape[0]
        if rank == 0 and n > 0 and has_token_rows(view):
            select_rows(view, torch.cat([torch.zeros(1, dtype=torch.int64), torch.arange(n)]))

    with patch_dispatch_views(mutate, apis=("v1",)):
        yield


@register(
    "swap-two-payloads", "harmful",
    "V1 dispatch swaps the payload rows of its first two received tokens on the last rank (ids stay put)",
)
def swap_two_payloads() -> Iterator[None]:
    def mutate(view, rank: int, world_size: int) -> None:
        if rank == world_size - 1 and view.x.shape[0] >= 2 and has_token_rows(view):
            view.x = view.x[torch.tensor([1, 0] + list(range(2, view.x.shape[0])))]

    with patch_dispatch_views(mutate, apis=("v1",)):
        yield


@register(
    "wrong-source-index", "harmful",
    "V2 handle: recv_src_metadata[0, 0] (source token of the first received row) off by one on the last rank",
)
def wrong_source_index() -> Iterator[None]:
    def receive(original, self, *args, **kwargs) -> dict:
        plan = original(self, *args, **kwargs)
        meta = plan["metadata"]
        stride = inspect.signature(original).bind(self, *args, **kwargs).arguments["num_max_tokens_per_rank"]
        if self.rank_idx == self.num_ranks - 1 and meta.shape[0] > 0:
            token = int(meta[0, 0]) % stride
            meta[0, 0] += 1 if token + 1 < stride else -1  # stay within the source rank's range
        return plan

    with seam("v2_receive", receive):
        yield


def _reversed_within_source(src_ranks, src_tokens, num_max_tokens_per_rank, group_key=None) -> torch.Tensor:
    """Like the emulation's ``receive_order`` but each source rank's tokens arrive last-first."""
    reversed_token = num_max_tokens_per_rank - 1 - src_tokens.to(torch.int64)
    key = src_ranks.to(torch.int64) * num_max_tokens_per_rank + reversed_token
    if group_key is not None:
        key = key + group_key.to(torch.int64) * (1 << 40)
    return torch.sort(key, stable=True).indices


@register(
    "v2-reversed-receive-order", "benign",
    "V2 default (non-deterministic) mode receives each source rank's tokens last-first; recv_x, weights, "
    "recv_src_metadata, the expand layout and combine all follow the new order (allowed: order is not "
    "part of the contract unless deterministic=True)",
)
def v2_reversed_receive_order() -> Iterator[None]:
    def order(original, src_ranks, src_tokens, num_max_tokens_per_rank, group_key=None, deterministic=False):
        if deterministic:
            return original(src_ranks, src_tokens, num_max_tokens_per_rank, group_key, deterministic=deterministic)
        return _reversed_within_source(src_ranks, src_tokens, num_max_tokens_per_rank, group_key)

    with seam("receive_order", order):
        yield
