"""P9 gradients through the integrators' autograd wrappers (``FusedDispatch`` / ``FusedCombine``).

Upstream gradients are deterministic functions of the example seed and of (receiving rank, source rank,
source token), so every backend sees the same gradient for the same received token whatever its row order.
The weight gradients are zero at slots whose expert is not local to the receiving rank (an expert layer
only reads its local slots).  With non-zero gradients there the APIs could not agree: V1's combine sums the
weights of every receiving rank, V2's reads only the owner's slot (DeepEP 2.1.0 ``combine_reduce_epilogue``);
so a wrapper that forwards arbitrary weight gradients gets different ``topk_weights.grad`` from V1 and V2.
The check also combines such unmasked gradients and records the difference as a documented divergence
(``P9-weight-grads-at-non-local-slots``), not a failure.
"""

from __future__ import annotations

from typing import Any

import torch

from conformance.assertions import assert_bytes_equal, assert_close_across, assert_reduction, for_each_backend
from conformance.canonical import source_order
from conformance.core.example import (
    Example,
    build_all_inputs,
    mask_weight_grads,
    upstream_combined_grad,
    upstream_row_grads,
)
from conformance.oracle.reduction import expected_dispatch_backward, expected_rows_by_source
from conformance.properties import CheckContext, Property, register
from conformance.strategies import sized
from conformance.strategies.combine import gradient_examples
from conformance.tasks.combine import GradResult, gradients

SLOTS = ("token", "slot")


def check(ctx: CheckContext, example: Example, per_rank: list[dict[str, Any]]) -> None:
    """Dispatch backward: x.grad = sum over the ranks a token reached of their upstream row gradients, through the
    backend's reduction tree (byte-exact wherever its float32 sums are exact: always for integer gradients, mostly
    for random ones; within the float32-accumulation bound elsewhere); topk_weights.grad[t, k] = the
    owner rank's gradient at slot k (0 at -1 slots), byte-exact; both byte-equal to a direct combine of the
    row gradients.  Combine backward: the gradient of every expert output row = the upstream gradient of its
    source token, byte-exact and byte-equal to a direct cached dispatch.  Pairwise equal across backends."""
    __tracebackhide__ = True
    inputs = build_all_inputs(example)
    two_level = ctx.shape.nodes > 1
    world = example.world_size
    tables = {(dst, src): upstream_row_grads(example, dst, src) for dst in range(world) for src in range(world)}
    upstream_y = [upstream_combined_grad(example, rank) for rank in range(world)]
    expected: dict[int, Any] = {}

    def expected_for(rank: int) -> Any:
        if rank not in expected:
            def grad_rows(dst: int, token: int, src: int = rank) -> tuple[torch.Tensor, torch.Tensor]:
                gx, gw = tables[(dst, src)]
                return gx[token], mask_weight_grads(example, dst, inputs[src].topk_idx[token], gw[token])

            expected[rank] = expected_dispatch_backward(example, inputs, rank, grad_rows, ctx.shape.ranks_per_node)
        return expected[rank]

    def against_oracle(rank: int, backend: str, result: GradResult) -> None:
        expected_x, expected_w = expected_for(rank)
        call = result.call
        assert_reduction(result.grad_x, expected_x, ranks_per_group=result.reduction_group, world_size=world,
                         two_level=two_level, name="x.grad", rank=rank, call=call,
                         require_determined=example.payload == "integers")
        assert_bytes_equal(result.grad_weights, expected_w, name="topk_weights.grad", rank=rank, call=call,
                           labels=SLOTS)
        for part in result.not_checked:
            ctx.not_checked(part)
        if result.direct_x is not None:
            assert_bytes_equal(result.grad_x, result.direct_x, name="x.grad", rank=rank, call=call,
                               against="a direct combine of the row gradients")
        if result.direct_weights is not None:
            assert_bytes_equal(result.grad_weights, result.direct_weights, name="topk_weights.grad", rank=rank,
                               call=call, labels=SLOTS, against="a direct combine of the row gradients")
        expected_rows = expected_rows_by_source(result.src_rank, result.src_token, upstream_y)
        assert_bytes_equal(result.grad_rows, expected_rows, name="expert_output.grad", rank=rank, call=call,
                           labels=("row", "col"), against="the upstream gradient of the row's source token")
        if result.direct_rows is not None:
            assert_bytes_equal(result.grad_rows, result.direct_rows, name="expert_output.grad", rank=rank, call=call,
                               labels=("row", "col"), against="a direct cached dispatch of the gradient")

    def pairwise(rank: int, first: tuple[str, GradResult], other: tuple[str, GradResult]) -> None:
        (name_a, a), (_, b) = first, other
        if a.unmasked_weights is not None and b.unmasked_weights is not None and a.api == b.api:
            assert_bytes_equal(b.unmasked_weights, a.unmasked_weights, labels=SLOTS, rank=rank, call=b.call,
                               name="combined weight gradients (non-zero at non-local slots)", against=name_a)
        elif a.unmasked_weights is not None and b.unmasked_weights is not None and not torch.equal(
            a.unmasked_weights, b.unmasked_weights
        ):
            ctx.record_divergence(
                "P9-weight-grads-at-non-local-slots",
                "combine of weight gradients that are non-zero at slots whose expert is on another rank: V1 "
                "(Buffer) and V2 (ElasticBuffer) differ (V1 sums every receiving rank's slot, V2 reads only the "
                "owner's); a wrapper must zero those gradients",
            )
        if example.payload == "integers":
            assert_bytes_equal(b.grad_x, a.grad_x, name="x.grad", rank=rank, call=b.call, against=name_a)
        else:
            assert_close_across(b.grad_x, a.grad_x, expected_for(rank)[0], two_level=two_level, name="x.grad",
                                rank=rank, call=b.call, against=name_a)
        assert_bytes_equal(b.grad_weights, a.grad_weights, name="topk_weights.grad", rank=rank, call=b.call,
                           labels=SLOTS, against=name_a)
        rows_a = a.grad_rows[source_order(a.src_rank, a.src_token)]
        rows_b = b.grad_rows[source_order(b.src_rank, b.src_token)]
        assert_bytes_equal(rows_b, rows_a, name="expert_output.grad (source order)", rank=rank, call=b.call,
                           labels=("row", "col"), against=name_a)

    for_each_backend(ctx, example, per_rank, against_oracle, pairwise)


PROPERTY = register(Property(
    id="P9-gradients",
    title="autograd wrappers: dispatch backward = combine, combine backward = cached dispatch; grads agree",
    strategy=sized(gradient_examples), task=gradients, check=check, needs=("autograd",),
))
test_gradients = PROPERTY.test
