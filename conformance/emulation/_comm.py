"""Collectives used by the emulation: only ``all_gather`` of fixed-size tensors (works on gloo and NCCL).

Every payload travels as raw bytes (``uint8``), so NaN bit patterns, -0.0 and +-Inf survive and any dtype
(bfloat16, float8) is supported by every backend.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

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


def preflight(
    group: dist.ProcessGroup,
    device: torch.device,
    num_rows: int,
    error: str | BaseException | None,
    what: str,
) -> list[int]:
    """Exchange each rank's row count and local validation verdict.

    Raises ``error`` on the rank that found the problem (an exception as given, e.g. the library's own
    refusal; a message as ``ValueError``) and ``PeerRefused`` on the others, so that a bad input on one rank
    produces an exception on every rank instead of a hang.

    Returns:
        the row count of every rank.
    """
    return [row[0] for row in preflight_with(group, device, num_rows, error, what)]


def preflight_with(
    group: dist.ProcessGroup,
    device: torch.device,
    num_rows: int,
    error: str | BaseException | None,
    what: str,
    extra: Sequence[int] = (),
) -> list[list[int]]:
    """:func:`preflight` that also exchanges ``extra`` ints of every rank (the same count on every rank): per rank
    ``[num_rows, *extra]``."""
    table = all_gather_ints(group, [num_rows, 0 if error is None else 1, *extra], device)
    if isinstance(error, BaseException):
        raise error
    if error is not None:
        raise ValueError(error)
    bad = [r for r in range(group.size()) if int(table[r, 1]) != 0]
    if bad:
        raise PeerRefused(
            f"{what}: rank(s) {bad} refused their input (see the exception on those ranks); "
            f"nothing was communicated"
        )
    return [[int(row[0]), *(int(v) for v in row[2:])] for row in table]


def all_gather_rows(
    group: dist.ProcessGroup, tensor: torch.Tensor, counts: Sequence[int]
) -> list[torch.Tensor]:
    """All-gather a tensor whose first dimension differs between ranks.

    Arguments:
        tensor: this rank's ``[counts[rank], ...]`` tensor (any dtype); trailing dims must match on all ranks.
        counts: the first-dimension size on every rank.

    Returns:
        one tensor per rank, with that rank's rows, on ``tensor``'s device.
    """
    row_shape = tuple(tensor.shape[1:])
    row_elems = math.prod(row_shape)
    max_rows = max(max(counts), 1)
    row_bytes = row_elems * tensor.element_size()
    local = torch.zeros((max_rows, max(row_bytes, 1)), dtype=torch.uint8, device=tensor.device)
    if tensor.shape[0] > 0 and row_bytes > 0:
        # clone(contiguous_format), not contiguous(): a one-row column slice (stride 2) counts as contiguous
        # but cannot be viewed as bytes.
        rows = tensor.reshape(tensor.shape[0], row_elems).clone(memory_format=torch.contiguous_format)
        local[: tensor.shape[0], :row_bytes] = rows.view(torch.uint8)
    gathered = [torch.empty_like(local) for _ in range(group.size())]
    all_gather(gathered, local, group)
    result = []
    for rows, buf in zip(counts, gathered, strict=False):
        part = buf[:rows, :row_bytes].contiguous()
        if row_bytes > 0:
            part = part.view(tensor.dtype)
        else:
            part = torch.empty((rows, 0), dtype=tensor.dtype, device=tensor.device)
        result.append(part.reshape((rows,) + row_shape))
    return result


def all_gather_fields(
    group: dist.ProcessGroup, fields: dict[str, torch.Tensor], counts: Sequence[int]
) -> dict[str, list[torch.Tensor]]:
    """:func:`all_gather_rows` of several row-aligned tensors (same first dimension) in one collective: each row's
    bytes of every field side by side, gathered once, split again.  Returns, per field, one tensor per rank."""
    if len(fields) <= 1:
        return {name: all_gather_rows(group, tensor, counts) for name, tensor in fields.items()}
    first = next(iter(fields.values()))
    widths, parts = [], []
    for tensor in fields.values():
        width = math.prod(tensor.shape[1:]) * tensor.element_size()
        if tensor.numel():
            flat = tensor.reshape(tensor.shape[0], -1).clone(memory_format=torch.contiguous_format)
            row = flat.view(torch.uint8).reshape(tensor.shape[0], width)
        else:  # no rows here (or empty rows): a [rows, width] block of nothing to send
            row = torch.empty((tensor.shape[0], width), dtype=torch.uint8, device=tensor.device)
        widths.append(width)
        parts.append(row)
    packed = torch.cat(parts, dim=1) if parts else torch.empty((first.shape[0], 0), dtype=torch.uint8)
    gathered = all_gather_rows(group, packed, counts)
    out: dict[str, list[torch.Tensor]] = {name: [] for name in fields}
    for buf in gathered:
        offset = 0
        for (name, tensor), width in zip(fields.items(), widths, strict=True):
            piece = buf[:, offset:offset + width].clone(memory_format=torch.contiguous_format)
            offset += width
            shape = (buf.shape[0], *tensor.shape[1:])
            out[name].append(piece.view(tensor.dtype).reshape(shape) if width else
                             torch.empty(shape, dtype=tensor.dtype, device=tensor.device))
    return out
