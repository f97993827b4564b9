"""Token movement between ranks, built on ``_comm.all_gather_rows`` (the emulation's 'network')."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from . import _comm

Fields = dict[str, torch.Tensor | None]


@dataclass
class Received:
    """Rows a rank received, concatenated in (source rank, source token) order."""

    src_rank: torch.Tensor  # [n] int64
    src_token: torch.Tensor  # [n] int64
    fields: dict[str, torch.Tensor | None]
    gathered: dict[str, list[torch.Tensor]]  # every rank's full input, per field


def gather_selected(
    group: dist.ProcessGroup,
    counts: Sequence[int],
    fields: Fields,
    selector: Callable[[int, dict[str, torch.Tensor]], torch.Tensor],
) -> Received:
    """All-gather ``fields`` (row-aligned tensors, ``None`` allowed if ``None`` on every rank) and keep the
    rows ``selector(source_rank, that rank's fields)`` (a bool mask) picks, in source-rank order."""
    # one collective for every field (the bytes of each row side by side)
    gathered = _comm.all_gather_fields(group, {n: t for n, t in fields.items() if t is not None}, counts)
    device = next(t for t in fields.values() if t is not None).device
    src_rank, src_token = [], []
    picked: dict[str, list[torch.Tensor]] = {name: [] for name in gathered}
    for s in range(group.size()):
        mask = selector(s, {name: parts[s] for name, parts in gathered.items()})
        idx = torch.nonzero(mask).flatten()
        src_rank.append(torch.full((idx.numel(),), s, dtype=torch.int64, device=device))
        src_token.append(idx.to(torch.int64))
        for name, parts in gathered.items():
            picked[name].append(parts[s][idx])
    out_fields: dict[str, torch.Tensor | None] = {name: None for name in fields}
    for name, parts in picked.items():
        out_fields[name] = torch.cat(parts) if parts else None
    return Received(torch.cat(src_rank), torch.cat(src_token), out_fields, gathered)


def return_to_sources(
    group: dist.ProcessGroup, device: torch.device, dst_rank: torch.Tensor, fields: Fields
) -> list[dict[str, torch.Tensor]]:
    """Send each row to ``dst_rank[row]``; returns, per source rank in order, the rows addressed to me."""
    counts = _comm.preflight(group, device, int(dst_rank.numel()), None, "combine")
    parts = _comm.all_gather_fields(
        group, {"__dst_rank": dst_rank.to(torch.int64), **{n: t for n, t in fields.items() if t is not None}}, counts)
    dst_parts = parts.pop("__dst_rank")
    me = group.rank()
    result = []
    for s in range(group.size()):
        idx = torch.nonzero(dst_parts[s] == me).flatten()
        result.append({name: p[s][idx] for name, p in parts.items()})
    return result
