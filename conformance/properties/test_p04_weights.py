"""P4 ``recv_topk_weights``: the sender's weight at every slot with a local expert (all backends, pairwise);
at the -1 slots V1 writes 0 and V2 keeps the sender's weight, a documented divergence between the APIs."""

from __future__ import annotations

from typing import Any

from conformance.assertions import assert_same_tokens, describe_weight, for_each_backend, weight_bits
from conformance.canonical import api_of, token_rows
from conformance.core.example import Example, RankInputs, build_all_inputs
from conformance.core.views import DispatchView
from conformance.oracle import expected_received_tokens
from conformance.properties import CheckContext, Property, register
from conformance.strategies import sized
from conformance.strategies.layout import layout_examples
from conformance.tasks.dispatch import dispatch_views

#: Key under which the V1/V2 difference at -1 slots is reported.
DIVERGENCE_KEY = "P4-weights: recv_topk_weights at -1 slots (Buffer vs ElasticBuffer)"
DIVERGENCE_MESSAGE = (
    "recv_topk_weights differ between the APIs where recv_topk_idx == -1 (the expert is on another rank, or "
    "the slot was masked): deep_ep.Buffer (V1) writes 0.0 there, deep_ep.ElasticBuffer (V2) keeps the "
    "sender's weight. Where recv_topk_idx >= 0 both return the sender's weight. Integrators moving from V1 "
    "to V2 must mask the weights themselves (e.g. recv_topk_weights.masked_fill(recv_topk_idx < 0, 0)) before "
    "summing or normalising them per token; code that only reads slots with recv_topk_idx >= 0 is unaffected."
)


def check_view_weights(view: DispatchView, inputs: list[RankInputs], *, rank: int) -> int:
    """Check one view's weights slot by slot against the senders'; return how many -1 slots it has.

    idx >= 0: the sender's weight, bit for bit.  idx == -1: V1 must write 0.0 (its own behaviour), V2 must
    keep the sender's weight (its own behaviour); either API changing its behaviour is a failure.
    """
    __tracebackhide__ = True
    api = api_of(view)
    minus_one_slots = 0
    for (src_rank, src_token), row in sorted(token_rows(view).items()):
        sent = inputs[src_rank].topk_weights[src_token]
        for slot in range(view.topk_idx.shape[1]):
            idx = int(view.topk_idx[row, slot])
            got = view.topk_weights[row, slot]
            where = f"recv_topk_weights[rank {rank}, src ({src_rank}, {src_token}), slot {slot}]"
            if idx >= 0:
                if weight_bits(got) != weight_bits(sent[slot]):
                    raise AssertionError(
                        f"{where} = {describe_weight(got)}, expected the sender's weight {describe_weight(sent[slot])}"
                        f" (recv_topk_idx = {idx}, a local expert) [{view.call}]"
                    )
                continue
            minus_one_slots += 1
            if api == "v1" and float(got) != 0.0:
                raise AssertionError(
                    f"{where} = {describe_weight(got)}, expected 0.0 at a -1 slot: Buffer (V1) writes 0 where "
                    f"recv_topk_idx == -1 (recorded, DeepEP 2.1.0); V1 changed its own behaviour "
                    f"(sender's weight there: {describe_weight(sent[slot])}) [{view.call}]"
                )
            if api == "v2" and weight_bits(got) != weight_bits(sent[slot]):
                raise AssertionError(
                    f"{where} = {describe_weight(got)}, expected the sender's weight {describe_weight(sent[slot])} "
                    f"at a -1 slot: ElasticBuffer (V2) keeps it where recv_topk_idx == -1 (recorded, DeepEP 2.1.0); "
                    f"V2 changed its own behaviour [{view.call}]"
                )
    return minus_one_slots


def assert_pairwise(first: DispatchView, other: DispatchView, *, rank: int) -> None:
    """Two backends agree at every slot with a local expert, and at the -1 slots too when their API is the same."""
    __tracebackhide__ = True
    same_api = api_of(first) == api_of(other)
    first_rows = token_rows(first)
    for token, row in sorted(token_rows(other).items()):
        base = first_rows[token]
        for slot in range(other.topk_idx.shape[1]):
            if int(other.topk_idx[row, slot]) < 0 and not same_api:
                continue
            got, want = other.topk_weights[row, slot], first.topk_weights[base, slot]
            if weight_bits(got) != weight_bits(want):
                raise AssertionError(
                    f"recv_topk_weights[rank {rank}, src {token}, slot {slot}] = {describe_weight(got)}, "
                    f"{first.backend} gives {describe_weight(want)} [{other.call}]"
                )


def check(ctx: CheckContext, example: Example, per_rank: list[dict[str, Any]]) -> None:
    """Weights at local slots equal the sender's (every backend, pairwise); at -1 slots V1 writes 0 and V2
    keeps the sender's weight, reported as a divergence of the V1-V2 pair."""
    __tracebackhide__ = True
    inputs = build_all_inputs(example)

    def against_senders(rank: int, backend: str, view: DispatchView) -> tuple[DispatchView, int]:
        assert_same_tokens(view, expected_received_tokens(example, inputs, rank), rank=rank)
        return view, check_view_weights(view, inputs, rank=rank)

    def pairwise(rank: int, first: tuple[str, tuple[DispatchView, int]], other: tuple[str, tuple[DispatchView, int]]
                 ) -> None:
        (first_view, minus_one), (other_view, _) = first[1], other[1]
        assert_pairwise(first_view, other_view, rank=rank)
        if minus_one and api_of(first_view) != api_of(other_view):  # the pair of APIs being compared differs there
            ctx.record_divergence(DIVERGENCE_KEY, DIVERGENCE_MESSAGE)

    for_each_backend(ctx, example, per_rank, against_senders, pairwise)


PROPERTY = register(Property(
    id="P4-weights",
    title="weights equal where idx >= 0; at -1 slots V1 writes 0 and V2 keeps the sender's weight (a divergence)",
    strategy=sized(layout_examples), task=dispatch_views, check=check,
))
test_weights = PROPERTY.test
