"""Token movement between ranks, built on ``_comm.exchange`` (the emulation's 'network')."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from . import _comm
from .seams import seam

Fields = dict[str, torch.Tensor | None]


@dataclass
class Received:
    """Rows a rank received, concatenated in (source rank, source token) order."""

    src_rank: torch.Tensor  # [n] int64
    src_token: torch.Tensor  # [n] int64
    fields: dict[str, torch.Tensor | None]
    gathered: dict[str, list[torch.Tensor]]  # every rank's full input, per field (and per whole tensor, flat)


@seam("exchange")
def gather_selected(
    group: dist.ProcessGroup,
    device: torch.device,
    num_rows: int,
    error: str | BaseException | None,
    what: str,
    fields: Fields | Callable[[], Fields],
    selector: Callable[[int, dict[str, torch.Tensor]], torch.Tensor],
    whole: Fields | None = None,
) -> Received:
    """The call's preflight and an all-gather of ``fields`` (row-aligned tensors, ``None`` allowed if ``None`` on
    every rank; see :func:`_comm.exchange`), keeping the rows ``selector(source_rank, that rank's fields)`` (a bool
    mask) picks, in source-rank order.  ``whole`` tensors arrive flat in ``gathered`` beside the fields."""
    exchanged = _comm.exchange(group, device, num_rows, error, what, fields, whole=whole)
    gathered = exchanged.fields
    src_rank, src_token = [], []
    picked: dict[str, list[torch.Tensor]] = {name: [] for name in gathered}
    for s in range(group.size()):
        mask = selector(s, {name: parts[s] for name, parts in gathered.items()})
        idx = torch.nonzero(mask).flatten()
        src_rank.append(torch.full((idx.numel(),), s, dtype=torch.int64, device=device))
        src_token.append(idx.to(torch.int64))
        for name, parts in gathered.items():
            picked[name].append(parts[s][idx])
    out_fields: dict[str, torch.Tensor | None] = {name: None for name in exchanged.names}
    for name, parts in picked.items():
        out_fields[name] = torch.cat(parts) if parts else None
    return Received(torch.cat(src_rank), torch.cat(src_token), out_fields, {**gathered, **exchanged.whole})


def return_to_sources(
    group: dist.ProcessGroup, device: torch.device, dst_rank: torch.Tensor, fields: Fields,
    error: str | BaseException | None = None, what: str = "combine", extra: Sequence[int] = (),
) -> tuple[list[dict[str, torch.Tensor]], list[list[int]]]:
    """Send each row to ``dst_rank[row]`` (with the call's preflight: ``error`` and ``extra`` ints, see
    :func:`_comm.exchange`); returns, per source rank in order, the rows addressed to me, and every rank's
    ``[num_rows, *extra]``."""
    exchanged = _comm.exchange(group, device, int(dst_rank.numel()), error, what,
                               lambda: {"__dst_rank": dst_rank.to(torch.int64), **fields}, extra)
    parts = exchanged.fields
    dst_parts = parts.pop("__dst_rank")
    me = group.rank()
    result = []
    for s in range(group.size()):
        idx = torch.nonzero(dst_parts[s] == me).flatten()
        result.append({name: p[s][idx] for name, p in parts.items()})
    return result, exchanged.table
