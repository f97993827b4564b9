"""Rank-side preflight: make sure every rank pins the same V2 ``num_max_tokens_per_rank`` before dispatching.

DeepEP requires the value to be equal on every rank ("all the ranks must hold the same value"); when
ranks disagree the real kernels index each other's buffers with different strides and hang or corrupt
memory.  This check exchanges the value with one tiny all-gather of the suite's own (not the library's)
and raises :class:`PinnedMaxMismatch`, naming which ranks hold which value, on every rank at once.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


class PinnedMaxMismatch(RuntimeError):
    """Ranks disagree on a value that must be equal everywhere; ``holders`` maps each value to its ranks."""

    def __init__(self, name: str, holders: dict[int, list[int]]) -> None:
        self.name = name
        self.holders = holders
        described = "; ".join(f"{value} on rank(s) {ranks}" for value, ranks in sorted(holders.items()))
        super().__init__(f"ranks disagree on {name}: {described} (every rank must pin the same value)")


def gather_values(group: Any, value: int, device: torch.device) -> list[int]:
    """Every rank's ``value`` (one all-gather)."""
    if dist.get_backend(group) == "gloo":  # gloo gathers CPU tensors only (ranks sharing one GPU use gloo)
        device = torch.device("cpu")
    local = torch.tensor([value], dtype=torch.int64, device=device)
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, local, group=group)
    return [int(t.item()) for t in gathered]


def check_pinned_max(group: Any, value: int, device: torch.device, name: str = "num_max_tokens_per_rank") -> None:
    """Raise :class:`PinnedMaxMismatch` on every rank unless every rank passes the same ``value``."""
    values = gather_values(group, value, device)
    holders: dict[int, list[int]] = {}
    for rank, v in enumerate(values):
        holders.setdefault(v, []).append(rank)
    if len(holders) > 1:
        raise PinnedMaxMismatch(name, holders)
