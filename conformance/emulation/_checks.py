"""Input validation that reproduces the real library's exception types and messages."""

from __future__ import annotations

import torch

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

V2_TOPK_IDX_ASSERT = (
    "Assertion exception (csrc/elastic/buffer.hpp:777): "
    "topk_idx.scalar_type() == c10::CppTypeToScalarType<topk_idx_t>::value"
)
V2_PREVIOUS_EVENT_ASSERT = "Assertion exception (csrc/elastic/buffer.hpp:540): allocate_on_comm_stream"
V2_JIT_FAILURE = (
    'Assertion exception (csrc/jit/compiler.hpp:239): false and "NVCC compilation failed" '
    '[deep_ep emulation: mimics the real JIT static assertion "Invalid hidden" for hidden={hidden}]'
)


def scalar_type_name(dtype: torch.dtype) -> str:
    """c10's name of a dtype, as used in ``expected scalar type X but found Y``."""
    return _TORCH_TYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))


def expect_dtype(tensor: torch.Tensor | None, dtype: torch.dtype) -> None:
    """Raise torch's ``RuntimeError: expected scalar type X but found Y`` (what ``data_ptr<T>()`` raises)."""
    if tensor is not None and tensor.dtype != dtype:
        raise RuntimeError(
            f"expected scalar type {scalar_type_name(dtype)} but found {scalar_type_name(tensor.dtype)}"
        )


def expert_range_error(topk_idx: torch.Tensor | None, num_experts: int) -> str | None:
    """A message if any expert id is outside ``[-1, num_experts)``, else ``None``."""
    if topk_idx is None or topk_idx.numel() == 0:
        return None
    lo, hi = int(topk_idx.min()), int(topk_idx.max())
    if lo < -1 or hi >= num_experts:
        return (
            f"deep_ep emulation: topk_idx holds expert ids in [{lo}, {hi}], outside [-1, {num_experts}) "
            f"(num_experts={num_experts}); the real kernels would read/write out of bounds"
        )
    return None


def v2_hidden_supported(hidden: int, element_size: int) -> bool:
    """Whether the emulated V2 combine JIT accepts this hidden size (assumption: 512-byte multiples)."""
    return (hidden * element_size) % 512 == 0
