"""P21 V2 buffer options: ``ElasticBuffer(..., allow_multiple_reduction=..., prefer_overlap_with_compute=...)``.

``allow_multiple_reduction`` chooses combine's reduction tree (:func:`conformance.oracle.tree.v2_combine_groups`,
from the kernels): with it, each node's forwarder rounds its ranks' partial sum before the receiver rounds again
(several nodes), and in expand mode each rank first sums and rounds its own rows of a token; without it every row
travels unreduced and the receiver rounds once.  So on one node a plain combine is the same either way, and an
expand-mode combine is not.  ``prefer_overlap_with_compute`` only changes how many SMs / channels the kernels use,
never the bytes.  Every case runs both values of ``allow_multiple_reduction``, each with a plain and an expand-mode
dispatch and combine, on buffers built with the case's ``prefer_overlap_with_compute``.  The check: combine (P5's
experts without expand; in expand mode each expert ``e`` returns its rows times ``33 + 2 e``) equals the oracle
through the tree the options select, byte for byte wherever its float32 sums are exact, within the bound of that
many roundings elsewhere; the combined weights (the experts' weights passed to combine: ``[rows, num_topk]``
without expand; the 1-D ``[rows]`` weights of expand mode, a contract that changed between V2 releases, with
``allow_multiple_reduction`` only: without it the kernel takes none, combine.cuh:68) hold, per
token and slot, the value the slot's own row came back with, byte for byte (0 where the slot is -1); the backend's
own statement of its tree (``reduction_group``, plain mode) agrees;
``get_buffer_size_hint`` with the same ``allow_multiple_reduction`` is the size the buffer was built with, never
smaller without it (its combine layouts hold ``num_topk`` rows per token instead of ``min(num_ranks, num_topk)``,
csrc/elastic/buffer.hpp:616-648); and every option of the hint (``use_fp8_dispatch``, ``allow_hybrid_mode``,
``allow_multiple_reduction``), for the example's shape and a drawn production-sized one, equals the oracle of the
library's formula (:mod:`conformance.oracle.buffer_size`).

On the real library: held on the real V2 (docs/real-runs/, run 11b); its recording replays exactly.
"""

from __future__ import annotations

from typing import Any

import torch

from conformance.assertions import assert_bytes_equal, assert_tree, assert_value_equal, for_each_backend
from conformance.core.cases import BufferOptionsCase
from conformance.core.example import RankInputs, build_all_inputs, build_biases
from conformance.core.outcomes import NotChecked, Why
from conformance.oracle.buffer_size import expected_buffer_size
from conformance.oracle.reduction import (
    ExpectedSum,
    expanded_expert_scale,
    expected_combined_weights,
    expected_expanded_combine,
    expected_scaled_combine,
    scaled_weight,
)
from conformance.oracle.tree import v2_combine_groups
from conformance.properties import CheckContext, Property, register
from conformance.strategies import sized
from conformance.strategies.options import buffer_option_cases
from conformance.tasks.options import BufferOptionsResult, buffer_option_combine


def check(ctx: CheckContext, case: BufferOptionsCase, per_rank: list[dict[str, Any]]) -> None:
    """Every (allow_multiple_reduction, do_expand) run: combined_x through the tree those options select, combined
    weights (plain mode) as P5's, the backend's tree statement and the size hint consistent with them."""
    __tracebackhide__ = True
    example, shape = case.example, ctx.shape
    inputs = build_all_inputs(example)

    def one(rank: int, backend: str, runs: dict[tuple[bool, bool], BufferOptionsResult]) -> None:
        biases = build_biases(example, rank, case.num_bias)
        expected = {False: expected_scaled_combine(example, inputs, rank, biases, shape.ranks_per_node),
                    True: expected_expanded_combine(example, inputs, rank, biases, shape.ranks_per_node)}
        if not any(do_expand for _, do_expand in runs):
            ctx.not_checked(NotChecked.part(backend, Why.CAPABILITY, "expand-mode combines (capability expand)"))
        for (amr, do_expand), result in runs.items():  # one ExpectedSum per mode: its trees are cached
            check_run(ctx, case, rank, backend, amr, do_expand, result, expected[do_expand], inputs)

    for_each_backend(ctx, case, per_rank, one)


def check_run(ctx: CheckContext, case: BufferOptionsCase, rank: int, backend: str, amr: bool, do_expand: bool,
              result: BufferOptionsResult, expected: ExpectedSum, inputs: list[RankInputs]) -> None:
    """One run (see :func:`check`); ``expected``: the exact sum of its combine."""
    __tracebackhide__ = True
    example, shape = case.example, ctx.shape
    groups = v2_combine_groups(amr, do_expand, shape.nodes, shape.ranks_per_node)
    assert_tree(result.combined_x, expected, groups, name="combined_x", rank=rank, call=result.call,
                require_determined=case.mode == "exact")
    if result.combined_topk_weights is not None:
        own, idx = inputs[rank].topk_weights, inputs[rank].topk_idx
        if do_expand:  # slot k comes back from the row of expert idx[t, k], its 1-D weight times 33 + 2 e
            def value(dst: int, token: int, slot: int) -> float:
                return float(own[token, slot].to(torch.float32) * torch.tensor(
                    float(expanded_expert_scale(int(idx[token, slot]))), dtype=torch.float32))
        else:
            def value(dst: int, token: int, slot: int) -> float:
                return scaled_weight(own[token, slot], dst)
        weights = expected_combined_weights(example, inputs, rank, value)
        assert_bytes_equal(result.combined_topk_weights, weights, name="combined_topk_weights", rank=rank,
                           call=result.call + (" (1-D expand-mode weights)" if do_expand else ""),
                           labels=("token", "slot"))
    stated = shape.ranks_per_node if shape.nodes > 1 and amr else example.world_size
    if not do_expand and result.reduction_group is not None and result.reduction_group != stated:
        raise AssertionError(
            f"the backend says its combine on rank {rank} rounds groups of {result.reduction_group} rank(s) first, "
            f"expected {stated} (allow_multiple_reduction={amr} on {shape.nodes} node(s)): P5 and P9 would "
            f"predict the wrong tree [{result.call}]")
    if result.size_hints is None or result.num_bytes is None:
        ctx.not_checked(NotChecked.part(
            backend, Why.CAPABILITY, "get_buffer_size_hint against the buffer's num_bytes and the oracle"))
        return
    hints = result.size_hints
    if hints[("example", False, True, amr)] != result.num_bytes:
        raise AssertionError(
            f"get_buffer_size_hint(allow_multiple_reduction={amr}) = {hints[('example', False, True, amr)]} on rank "
            f"{rank}, expected the num_bytes {result.num_bytes} of the buffer built with the same settings "
            f"[{result.call}]")
    if amr and do_expand is False:  # once per rank: the hints do not depend on the run
        check_size_hints(case, hints, rank, backend, shape, ctx.contract(backend))


def check_size_hints(case: BufferOptionsCase, hints: dict[tuple[str, bool, bool, bool], int], rank: int, backend: str,
                     shape: Any, contract: Any) -> None:
    """Every ``get_buffer_size_hint`` option, for the example's shape and the case's production-sized one, equals
    the oracle of the library's formula (:func:`conformance.oracle.buffer_size.expected_buffer_size`) with the token
    alignment of the backend's DeepEP version (``contract``: its rule ``token_rdma_align``), and is never smaller
    without ``allow_multiple_reduction`` (unreduced rows need more room)."""
    __tracebackhide__ = True
    example = case.example
    shapes = {"example": (example.num_max_tokens_per_rank, example.hidden, example.num_topk),
              "sized": (case.size_tokens, case.size_hidden, case.size_topk)}
    for (name, fp8, hybrid, amr), got in hints.items():
        tokens, hidden, topk = shapes[name]
        call = (f"{backend} ElasticBuffer.get_buffer_size_hint(group, {tokens}, {hidden}, {topk}, "
                f"use_fp8_dispatch={fp8}, allow_hybrid_mode={hybrid}, allow_multiple_reduction={amr}) on rank {rank}")
        expected = expected_buffer_size(tokens, hidden, topk, use_fp8_dispatch=fp8, allow_hybrid_mode=hybrid,
                                        allow_multiple_reduction=amr, num_nodes=shape.nodes,
                                        ranks_per_node=shape.ranks_per_node,
                                        token_align=int(contract.rule("token_rdma_align", 1)))
        assert_value_equal("the size hint", got, expected, call=call,
                           why=f"the larger of the dispatch and combine layouts, 2 MiB aligned, on {shape.nodes} "
                               f"node(s) of {shape.ranks_per_node} ranks, DeepEP {contract.version}'s token layout "
                               f"(2.1.0: csrc/elastic/buffer.hpp:586-680; 2.5.0: csrc/buffers/ep.hpp:183-282)")
        if not amr and got < hints[(name, fp8, hybrid, True)]:
            raise AssertionError(
                f"get_buffer_size_hint is {got} without allow_multiple_reduction, {hints[(name, fp8, hybrid, True)]} "
                f"with it, expected at least as much (unreduced rows need more room) [{call}]")


PROPERTY = register(Property(
    id="P21-buffer-options",
    title="V2 buffer options: combine follows the reduction tree allow_multiple_reduction selects (per node / per "
          "rank rounding or one), prefer_overlap_with_compute changes no byte, get_buffer_size_hint (every option) "
          "= the library's formula and the buffer's size",
    strategy=sized(buffer_option_cases), task=buffer_option_combine, check=check, case_type=BufferOptionsCase,
    apis=("v2",), needs=("buffer_options", "combine"), shapes="small",
))
test_buffer_options = PROPERTY.test
