"""Input validation helpers that reproduce the real library's exception types and messages.

Most refusals come straight from the refusal table (``_refusals.check``); the helpers here produce the
messages that depend on the offending value (torch's dtype errors, c10's dimension errors).
"""

from __future__ import annotations

import torch

from . import _refusals

_TORCH_TYPE_NAMES = {
    torch.int64: "Long",
    torch.int32: "Int",
    torch.int16: "Short",
    torch.int8: "Char",
    torch.uint8: "Byte",
    torch.float32: "Float",
    torch.float64: "Double",
    torch.float16: "Half",
    torch.bfloat16: "BFloat16",
    torch.bool: "Bool",
}

#: ``INT_MAX``: ``std::numeric_limits<int>::max()``.
INT_MAX = 2**31 - 1


def scalar_type_name(dtype: torch.dtype) -> str:
    """c10's name of a dtype, as used in ``expected scalar type X but found Y``."""
    return _TORCH_TYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))


def expect_dtype(tensor: torch.Tensor | None, dtype: torch.dtype, row_id: str | None = None) -> None:
    """Raise torch's ``RuntimeError: expected scalar type X but found Y`` (what ``data_ptr<T>()`` raises).

    ``row_id`` names the refusal-table row, so that a mutant can drop this check.
    """
    if tensor is not None and tensor.dtype != dtype and (row_id is None or _refusals.enforced(row_id)):
        raise RuntimeError(
            f"expected scalar type {scalar_type_name(dtype)} but found {scalar_type_name(tensor.dtype)}"
        )


def size(tensor: torch.Tensor, dim: int, row_id: str | None = None) -> int:
    """``tensor.size(dim)`` as C++ evaluates it: c10's ``IndexError`` when ``dim`` is out of range."""
    if dim < tensor.dim():
        return int(tensor.shape[dim])
    if row_id is not None and not _refusals.enforced(row_id):
        return 0
    if tensor.dim() == 0:
        raise IndexError(f"Dimension specified as {dim} but tensor has no dimensions")
    raise IndexError(
        f"Dimension out of range (expected to be in range of [{-tensor.dim()}, {tensor.dim() - 1}], but got {dim})"
    )


def has_event(previous_event: object) -> bool:
    """Whether the V1 wrapper passes an event (``getattr(previous_event, 'event', None) is not None``)."""
    return getattr(previous_event, "event", None) is not None


def deterministic_fill_enabled() -> bool:
    """``check_torch_deterministic``'s condition: deterministic algorithms with uninitialised-memory filling."""
    return bool(torch.are_deterministic_algorithms_enabled() and torch.utils.deterministic.fill_uninitialized_memory)


def expert_range_error(topk_idx: torch.Tensor | None, num_experts: int) -> str | None:
    """A message if any expert id is outside ``[-1, num_experts)``, else ``None`` (V2 only: emulation refusal)."""
    if topk_idx is None or topk_idx.numel() == 0:
        return None
    lo, hi = int(topk_idx.min()), int(topk_idx.max())
    if lo < -1 or hi >= num_experts:
        return (
            f"deep_ep emulation: topk_idx holds expert ids in [{lo}, {hi}], outside [-1, {num_experts}) "
            f"(num_experts={num_experts}); the real kernels would read/write out of bounds"
        )
    return None
