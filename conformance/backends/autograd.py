"""Autograd wrappers shaped like integrators' ``FusedDispatch`` / ``FusedCombine`` (Megatron style).

Dispatch's backward is a combine of the gradients (through the same handle); combine's backward is a
cached dispatch of the gradient.  They take an adapter, so V1 and V2 (real or emulated) share them.
"""

from __future__ import annotations

from typing import Any

import torch

from conformance.backends.results import Raw
from conformance.core.example import Example, RankInputs
from conformance.core.views import DispatchOptions


class FusedDispatch(torch.autograd.Function):
    """``recv_x, recv_topk_weights = dispatch(x, topk_weights)``; backward = combine of the grads."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, topk_weights: torch.Tensor, adapter: Any, topk_idx: torch.Tensor,
                example: Example, rank: int, state: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        inputs = RankInputs(x.detach(), topk_idx, topk_weights.detach())
        _, raw = adapter.dispatch(inputs, example, DispatchOptions(), rank)
        ctx.adapter, ctx.raw = adapter, raw
        state["raw"] = raw  # the handle, for a FusedCombine that follows
        return raw.recv_x, raw.recv_topk_weights

    @staticmethod
    def backward(ctx: Any, grad_recv_x: torch.Tensor, grad_recv_weights: torch.Tensor) -> tuple:
        grad_x, grad_weights = ctx.adapter.combine(
            ctx.raw, grad_recv_x.contiguous(), topk_weights=grad_recv_weights.float().contiguous()
        )
        return grad_x, grad_weights, None, None, None, None, None


class FusedCombine(torch.autograd.Function):
    """``combined_x = combine(x)`` through a dispatch handle; backward = cached dispatch of the grad."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, adapter: Any, raw: Raw) -> torch.Tensor:
        ctx.adapter, ctx.raw = adapter, raw
        combined_x, _ = adapter.combine(raw, x.detach().contiguous())
        return combined_x

    @staticmethod
    def backward(ctx: Any, grad_combined: torch.Tensor) -> tuple:
        return ctx.adapter.cached_dispatch(ctx.raw, grad_combined.contiguous()), None, None
