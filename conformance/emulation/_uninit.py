"""Memory the library allocates and never writes (``torch::empty``): the emulation hands it out recognisably
uninitialised, every byte :data:`POISON_BYTE`, instead of a value a reader could take for a defined one.

The real library's worst-case outputs (V2 ``do_cpu_sync=False``, V1 ``num_worst_tokens``, the low-latency packed
layouts) hold stale bytes of earlier tensors past their valid rows (the caching allocator's reuse); a client that
reads them (a MoE GEMM over every row) computes on whatever was there.  Zeros in the emulation would hide such a
client bug on every CPU run.  0x7F in every byte reads as a huge finite number in bf16 / float32
(3.39e38), NaN in float8 e4m3, and a huge positive id in int32 / int64 (0x7F7F7F7F...): never a valid expert,
never "no expert" (-1).  On a GPU the suite's worst-case property fills the caching allocator with the same byte
before the call (``conformance.tasks.worst_case``), so the real library's untouched rows read the same.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from conformance.versions import POISON_BYTE

from .seams import seam

__all__ = ["POISON_BYTE", "pad_filled", "pad_uninitialised", "uninitialised"]


@seam("uninitialised")
def uninitialised(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """A tensor the library allocates and does not write: :data:`POISON_BYTE` in every byte."""
    out = torch.empty(shape, dtype=dtype, device=device)
    if out.numel():
        out.view(-1).view(torch.uint8).fill_(POISON_BYTE)
    return out


def pad_uninitialised(t: torch.Tensor | None, rows: int) -> torch.Tensor | None:
    """``t`` followed by uninitialised rows up to ``rows`` (unchanged when it has that many already)."""
    return _pad(t, rows, uninitialised)


def pad_filled(t: torch.Tensor | None, rows: int, value: float) -> torch.Tensor | None:
    """``t`` followed by rows of ``value`` up to ``rows``: rows the library's kernel does write (V1's top-k -1)."""
    return _pad(t, rows, lambda shape, dtype, device: torch.full(shape, value, dtype=dtype, device=device))


def _pad(t: torch.Tensor | None, rows: int, make: Callable[..., torch.Tensor]) -> torch.Tensor | None:
    if t is None or t.shape[0] >= rows:
        return t
    return torch.cat([t, make((rows - t.shape[0],) + tuple(t.shape[1:]), t.dtype, t.device)])
