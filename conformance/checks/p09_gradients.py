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

import torch

from conformance.backends.views import Unsupported
from conformance.checks.assert_numeric import assert_bytes_equal, assert_close_across, assert_within_bound
from conformance.checks.p07_cached_dispatch import source_order
from conformance.checks.registry import register
from conformance.example import Example, build_all_inputs
from conformance.oracle.reduction import expected_dispatch_backward, expected_rows_by_source
from conformance.tasks.combine import mask_weight_grads, upstream_combined_grad, upstream_row_grads


@register("P9-gradients")
def check_gradients(session, example: Example) -> None:  # noqa: ANN001 - conformance.session.Session
    """Dispatch backward: x.grad = sum over the ranks a token reached of their upstream row gradients (byte-exact
    for integer gradients, within the float32-accumulation bound for random ones); topk_weights.grad[t, k] = the
    owner rank's gradient at slot k (0 at -1 slots), byte-exact; both byte-equal to a direct combine of the
    row gradients.  Combine backward: the gradient of every expert output row = the upstream gradient of its
    source token, byte-exact and byte-equal to a direct cached dispatch.  Pairwise equal across backends."""
    __tracebackhide__ = True
    inputs = build_all_inputs(example)
    shape = session.config.shape
    two_level = shape.nodes > 1
    world = example.world_size
    tables = {(dst, src): upstream_row_grads(example, dst, src) for dst in range(world) for src in range(world)}
    upstream_y = [upstream_combined_grad(example, rank) for rank in range(world)]
    results = session.run("conformance.tasks.combine:gradients", example)
    for rank, per_backend in enumerate(results):

        def grad_rows(dst: int, token: int, src: int = rank) -> tuple[torch.Tensor, torch.Tensor]:
            gx, gw = tables[(dst, src)]
            return gx[token], mask_weight_grads(example, dst, inputs[src].topk_idx[token], gw[token])

        expected_x, expected_w = expected_dispatch_backward(example, inputs, rank, grad_rows, shape.ranks_per_node)
        seen = []
        for backend, result in per_backend.items():
            if isinstance(result, Unsupported):
                session.record_unsupported(result, example)
                continue
            call = result.call
            if example.payload == "integers":
                assert_bytes_equal(result.grad_x, expected_x.rounded(), name="x.grad", rank=rank, call=call)
            else:
                assert_within_bound(result.grad_x, expected_x, two_level=two_level, name="x.grad", rank=rank, call=call)
            assert_bytes_equal(result.grad_weights, expected_w, name="topk_weights.grad", rank=rank, call=call,
                               labels=("token", "slot"))
            assert_bytes_equal(result.grad_x, result.direct_x, name="x.grad", rank=rank, call=call,
                               against="a direct combine of the row gradients")
            assert_bytes_equal(result.grad_weights, result.direct_weights, name="topk_weights.grad", rank=rank,
                               call=call, labels=("token", "slot"), against="a direct combine of the row gradients")
            expected_rows = expected_rows_by_source(result.src_rank, result.src_token, upstream_y)
            assert_bytes_equal(result.grad_rows, expected_rows, name="expert_output.grad", rank=rank, call=call,
                               labels=("row", "col"), against="the upstream gradient of the row's source token")
            assert_bytes_equal(result.grad_rows, result.direct_rows, name="expert_output.grad", rank=rank,
                               call=call, labels=("row", "col"), against="a direct cached dispatch of the gradient")
            seen.append((backend, result))
        for (first, a), (second, b) in zip(seen, seen[1:], strict=False):
            if a.unmasked_weights is not None and b.unmasked_weights is not None and not torch.equal(
                a.unmasked_weights, b.unmasked_weights
            ):
                session.record_divergence(
                    "P9-weight-grads-at-non-local-slots",
                    f"combine of weight gradients that are non-zero at slots whose expert is on another rank: "
                    f"{first} and {second} differ (V1 sums every receiving rank's slot, V2 reads only the owner's); "
                    f"a wrapper must zero those gradients (rank {rank}, e.g. {example.to_json()})",
                )
            if example.payload == "integers":
                assert_bytes_equal(b.grad_x, a.grad_x, name="x.grad", rank=rank, call=b.call, against=first)
            else:
                assert_close_across(b.grad_x, a.grad_x, expected_x, two_level=two_level, name="x.grad", rank=rank,
                                    call=b.call, against=first)
            assert_bytes_equal(b.grad_weights, a.grad_weights, name="topk_weights.grad", rank=rank, call=b.call,
                               labels=("token", "slot"), against=first)
            rows_a = a.grad_rows[source_order(a.src_rank, a.src_token)]
            rows_b = b.grad_rows[source_order(b.src_rank, b.src_token)]
            assert_bytes_equal(rows_b, rows_a, name="expert_output.grad (source order)", rank=rank, call=b.call,
                               labels=("row", "col"), against=first)
