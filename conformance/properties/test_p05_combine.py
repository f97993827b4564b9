"""P5 combine: the sum over receiving ranks of the expert outputs (plus bias), and the combined top-k weights.

The expert on rank ``d`` returns every received row as ``bf16(row * (1 + d))`` and every received weight
as the float32 ``weight * (1 + d)``, so each receiving rank contributes something different and a lost,
doubled or misplaced contribution changes the result.  V1 dispatches and combines with its default configs, or
with explicit ones: the library's table entries for the world built with a drawn SM count (``Buffer.set_num_sms``
then ``get_dispatch_config`` / ``get_combine_config``); the dispatch handle has one channel per two SMs of its
config.

The reduction tree (P5, P6, P9, P21). Combine sums bf16 terms in float32 and rounds to bf16. On one node the library
rounds once; on several it rounds twice (V1 internode: each node's NVLink forwarder rounds its ranks' sum before the
RDMA receiver adds the biases and rounds again; V2 hybrid mode with `allow_multiple_reduction`, the same per scale-out
node). A V2 expand-mode combine with `allow_multiple_reduction` (the default) adds a first level: each rank sums and
rounds its own rows of a token before they leave it; without the option every row travels unreduced and is rounded
once (P21, `conformance/oracle/tree.py: v2_combine_groups`). Each backend says which tree its buffer uses
(`reduction_group` in the backend contract), and the oracle (`conformance/oracle/tree.py`) predicts that tree's bytes
wherever every float32 sum on the way is exact in any order (all terms multiples of one power of two `2**q`,
magnitudes summing below `2**(24+q)`): every element for integer payloads, more than 99.9% of the elements for random
ones (measured over the main job's draws). Only the remaining elements are held to the derived error bound. P5 draws
its cases so that one rounding more than the tree changes bytes (`conformance/strategies/combine.py` says why): exact
mode's `wide` integer payloads and biases (exact in float32, but sums of two or more are mostly not bf16 values), a
bias in four cases of five, tokens spread over every rank of a small world in two of three. So a combine that rounds
once too often, or once too few times, fails on one node and on two, on the first few examples (mutants
`combine-extra-rounding`, `hybrid-reduction-rounds-once`); P6's round trip is held to the tree on several nodes too.
"""

from __future__ import annotations

from typing import Any

from conformance.assertions import (
    assert_bytes_equal,
    assert_close_across,
    assert_reduction,
    assert_value_equal,
    for_each_backend,
)
from conformance.core.cases import CombineCase
from conformance.core.example import build_all_inputs, build_biases
from conformance.oracle.reduction import expected_combined_weights, expected_scaled_combine, scaled_weight
from conformance.properties import CheckContext, Property, register
from conformance.strategies import sized
from conformance.strategies.combine import combine_cases
from conformance.tasks.combine import CombineResult, combine_outputs

#: ``Buffer.num_sms``, the SM count of V1's default configs (deep_ep/buffers/legacy.py:31).
DEFAULT_V1_NUM_SMS = 20


def check(ctx: CheckContext, case: CombineCase, per_rank: list[dict[str, Any]]) -> None:
    """combined_x = sum over the ranks a token reached of their expert outputs, plus the biases, through the
    backend's reduction tree (one rounding on one node; per-node partials rounded first on several): byte-exact
    wherever the tree's float32 sums are exact (every element in ``exact`` mode, most in ``bounded`` mode; and
    byte-identical across backends with the same tree in ``exact`` mode), within the float32-accumulation bound
    elsewhere.  The cases are drawn so that one rounding more than the tree changes bytes (see
    ``conformance.strategies.combine``).
    combined_topk_weights[t, k] = the weight the owner of slot k's expert returned (0 at -1 slots),
    byte-exact and byte-identical across backends.  A backend's known combine limit is reported unsupported."""
    __tracebackhide__ = True
    example = case.example
    inputs = build_all_inputs(example)
    two_level = ctx.shape.nodes > 1
    expected = [expected_scaled_combine(example, inputs, rank, build_biases(example, rank, case.num_bias),
                                        ctx.shape.ranks_per_node) for rank in range(example.world_size)]

    def against_oracle(rank: int, backend: str, result: CombineResult) -> None:
        own = inputs[rank].topk_weights
        weights = expected_combined_weights(
            example, inputs, rank, lambda dst, token, slot, w=own: scaled_weight(w[token, slot], dst))
        if result.num_channels is not None:
            assert_value_equal("channels of the dispatch handle", result.num_channels,
                               (case.v1_num_sms or DEFAULT_V1_NUM_SMS) // 2, call=result.call,
                               why=f"config num_sms={case.v1_num_sms or DEFAULT_V1_NUM_SMS} // 2, one per channel "
                                   f"(csrc/legacy/buffer.hpp:437, 900)")
        assert_reduction(result.combined_x, expected[rank], ranks_per_group=result.reduction_group,
                         world_size=example.world_size, two_level=two_level, name="combined_x", rank=rank,
                         call=result.call, require_determined=case.mode == "exact")
        if result.not_checked:
            ctx.not_checked(result.not_checked)
            return
        if result.combined_topk_weights is None:
            raise AssertionError(f"combined_topk_weights[rank {rank}] is None though topk_weights were passed "
                                 f"[{result.call}]")
        assert_bytes_equal(result.combined_topk_weights, weights, name="combined_topk_weights", rank=rank,
                           call=result.call, labels=("token", "slot"))

    def pairwise(rank: int, first: tuple[str, CombineResult], other: tuple[str, CombineResult]) -> None:
        (name, a), (_, b) = first, other
        if case.mode == "exact" and a.reduction_group == b.reduction_group:  # one tree, every byte determined
            assert_bytes_equal(b.combined_x, a.combined_x, name="combined_x", rank=rank, call=b.call, against=name)
        else:
            assert_close_across(b.combined_x, a.combined_x, expected[rank], two_level=two_level, name="combined_x",
                                rank=rank, call=b.call, against=name)
        if not (a.not_checked or b.not_checked):
            assert_bytes_equal(b.combined_topk_weights, a.combined_topk_weights, name="combined_topk_weights",
                               rank=rank, call=b.call, labels=("token", "slot"), against=name)

    for_each_backend(ctx, example, per_rank, against_oracle, pairwise)


PROPERTY = register(Property(
    id="P5-combine",
    title="combine = sum over receiving ranks (+ bias), byte-exact with exactly-summable payloads, bounded error "
          "otherwise",
    strategy=sized(combine_cases), task=combine_outputs, check=check, case_type=CombineCase, needs=("combine",),
))
test_combine = PROPERTY.test
