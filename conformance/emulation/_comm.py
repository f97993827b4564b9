"""Collectives used by the emulation: only ``all_gather`` of fixed-size tensors (works on gloo and NCCL).

Every payload travels as raw bytes (``uint8``), so NaN bit patterns, -0.0 and +-Inf survive and any dtype
(bfloat16, float8) is supported by every backend.  :func:`exchange` is what a call uses: its preflight (row
counts, the local verdict) and its rows in one collective where they fit in :data:`EAGER_BYTES`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist


def all_gather(gathered: list[torch.Tensor], local: torch.Tensor, group: dist.ProcessGroup) -> None:
    """``dist.all_gather``; over gloo, CUDA tensors travel through host memory (gloo gathers CPU tensors only).

    A transport detail: two ranks sharing one GPU must use a gloo group (NCCL refuses them)."""
    if local.is_cuda and dist.get_backend(group) == "gloo":
        staged = [torch.empty_like(local, device="cpu") for _ in gathered]
        dist.all_gather(staged, local.cpu(), group=group)
        for out, part in zip(gathered, staged, strict=True):
            out.copy_(part)
        return
    dist.all_gather(gathered, local, group=group)


class PeerRefused(RuntimeError):
    """Raised on every rank when some rank's preflight check failed (so no rank hangs in a collective)."""


def all_gather_ints(group: dist.ProcessGroup, values: Sequence[int], device: torch.device) -> torch.Tensor:
    """All-gather a short vector of Python ints; returns an int64 CPU tensor ``[num_ranks, len(values)]``."""
    local = torch.tensor(list(values), dtype=torch.int64, device=device)
    gathered = [torch.empty_like(local) for _ in range(group.size())]
    all_gather(gathered, local, group)
    return torch.stack(gathered).cpu()


#: Payload bytes every rank sends with its header in :func:`exchange`'s first collective.  Up to about this size a
#: gloo ``all_gather`` costs its latency, not its bytes (2-core machine, 2 and 4 ranks: 24 B and 64 KiB alike), so
#: a small call's preflight and rows cost one collective; a larger one sends its rows in a second.  A constant,
#: never learnt from earlier calls: every rank must size every collective alike without keeping state in step.
EAGER_BYTES = 64 * 1024

Fields = Mapping[str, "torch.Tensor | None"]
_HEADER = 3  # [num_rows, refused, payload bytes], then the caller's extra ints, then one byte count per whole


def _pack(fields: Fields, whole: Fields, device: torch.device) -> tuple[torch.Tensor, list[int]]:
    """This rank's payload bytes: every row's bytes of every field side by side, then every whole tensor's bytes;
    and the byte count of each whole tensor."""
    parts, sizes = [], []
    rows = [t for t in fields.values() if t is not None]
    if rows:
        n = rows[0].shape[0]
        packed = [t.reshape(n, -1).clone(memory_format=torch.contiguous_format).view(torch.uint8).reshape(n, -1)
                  if t.numel() else torch.empty((n, 0), dtype=torch.uint8, device=t.device) for t in rows]
        parts.append(torch.cat(packed, dim=1).reshape(-1).to(device))
    for t in whole.values():
        flat = (t.reshape(-1).clone(memory_format=torch.contiguous_format).view(torch.uint8) if t is not None and
                t.numel() else torch.empty(0, dtype=torch.uint8, device=device))
        sizes.append(flat.numel())
        parts.append(flat.to(device))
    payload = torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8, device=device)
    return payload, sizes


def _layout(fields: Fields) -> list[tuple[str, torch.dtype, tuple[int, ...], int]]:
    """``(name, dtype, trailing shape, bytes per row)`` of every field present, in payload order (every rank's rows
    arrive with this rank's dtypes and trailing shapes)."""
    return [(name, t.dtype, tuple(t.shape[1:]), math.prod(t.shape[1:]) * t.element_size())
            for name, t in fields.items() if t is not None]


def _unpack(payload: torch.Tensor, num_rows: int, layout: list[tuple[str, torch.dtype, tuple[int, ...], int]],
            whole: Fields, whole_sizes: Sequence[int], device: torch.device
            ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """One rank's payload split again: its rows of every field and its whole tensors (flat, this rank's dtype)."""
    row_bytes = sum(width for *_, width in layout)
    block = payload[: num_rows * row_bytes].reshape(num_rows, row_bytes)
    out_rows: dict[str, torch.Tensor] = {}
    offset = 0
    for name, dtype, trailing, width in layout:
        shape = (num_rows, *trailing)
        out_rows[name] = (block[:, offset:offset + width].clone(memory_format=torch.contiguous_format)
                          .view(dtype).reshape(shape) if width else torch.empty(shape, dtype=dtype, device=device))
        offset += width
    out_whole: dict[str, torch.Tensor] = {}
    cursor = num_rows * row_bytes
    for (name, t), size in zip(whole.items(), whole_sizes, strict=True):
        dtype = t.dtype if t is not None else torch.uint8
        out_whole[name] = payload[cursor:cursor + size].clone().view(dtype) if size else \
            torch.empty(0, dtype=dtype, device=device)
        cursor += size
    return out_rows, out_whole


@dataclass
class Exchanged:
    """What :func:`exchange` brought: per rank its ``[num_rows, *extra]`` (``table``), its rows of every field
    (``fields[name][rank]``) and its whole tensors (``whole[name][rank]``, flat); ``names``: every field asked for,
    ``None`` ones included."""

    table: list[list[int]]
    fields: dict[str, list[torch.Tensor]]
    whole: dict[str, list[torch.Tensor]]
    names: list[str]


def exchange(
    group: dist.ProcessGroup,
    device: torch.device,
    num_rows: int,
    error: str | BaseException | None,
    what: str,
    fields: Fields | Callable[[], Fields],
    extra: Sequence[int] = (),
    whole: Fields | None = None,
) -> Exchanged:
    """A call's preflight and its data in one all-gather (two where some rank's payload exceeds
    :data:`EAGER_BYTES`): every rank's row count, verdict and ``extra`` ints (the same count on every rank), its
    ``num_rows`` rows of every field (row-aligned tensors; ``None`` where ``None`` on every rank) and its ``whole``
    tensors (any shape, flat on arrival).

    Raises ``error`` on the rank that found it (an exception as given, a message as
    ``ValueError``) and ``PeerRefused`` on the others, and then nothing of anybody's data is used.  ``fields`` may
    be a function returning them, called only where this rank found no error (its inputs may be unusable)."""
    whole = dict(whole or {})
    if error is None:
        present = dict(fields() if callable(fields) else fields)
        payload, whole_sizes = _pack(present, whole, device)
    else:
        present = {}
        payload, whole_sizes = torch.empty(0, dtype=torch.uint8, device=device), [0] * len(whole)
    header = torch.tensor([num_rows, 0 if error is None else 1, payload.numel(), *extra, *whole_sizes],
                          dtype=torch.int64).view(torch.uint8)
    local = torch.zeros(header.numel() + EAGER_BYTES, dtype=torch.uint8, device=device)
    local[: header.numel()] = header.to(device)
    if 0 < payload.numel() <= EAGER_BYTES:
        local[header.numel(): header.numel() + payload.numel()] = payload
    gathered = [torch.empty_like(local) for _ in range(group.size())]
    all_gather(gathered, local, group)
    heads = torch.stack([g[: header.numel()] for g in gathered]).cpu().view(torch.int64).reshape(group.size(), -1)
    table = heads.tolist()
    if isinstance(error, BaseException):
        raise error
    if error is not None:
        raise ValueError(error)
    bad = [r for r in range(group.size()) if table[r][1] != 0]
    if bad:
        raise PeerRefused(
            f"{what}: rank(s) {bad} refused their input (see the exception on those ranks); "
            f"nothing was communicated"
        )
    largest = max(row[2] for row in table)
    if largest > EAGER_BYTES:  # a second round, sized alike on every rank from the headers
        second = torch.zeros(largest, dtype=torch.uint8, device=device)
        second[: payload.numel()] = payload
        payloads = [torch.empty_like(second) for _ in range(group.size())]
        all_gather(payloads, second, group)
    else:
        payloads = [g[header.numel():] for g in gathered]
    n_extra = len(extra)
    layout = _layout(present)
    out_fields: dict[str, list[torch.Tensor]] = {name: [] for name, *_ in layout}
    out_whole: dict[str, list[torch.Tensor]] = {name: [] for name in whole}
    for row, data in zip(table, payloads, strict=True):
        rows, wholes = _unpack(data, row[0], layout, whole, row[_HEADER + n_extra:], device)
        for name, value in rows.items():
            out_fields[name].append(value)
        for name, value in wholes.items():
            out_whole[name].append(value)
    return Exchanged([[row[0], *row[_HEADER:_HEADER + n_extra]] for row in table], out_fields, out_whole,
                     list(present))
