"""Rank tasks for P12 (bad input): make one bad call, catch what it raises, then make the next valid call
on the same buffer.  Exceptions are caught here and returned as (type, message) per rank; letting one
escape would retire the world."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from conformance.backends.factory import get_adapter
from conformance.core.cases import DEFECT_APIS, BadInputCase
from conformance.core.example import Example, RankInputs, build_rank_inputs
from conformance.core.views import DispatchOptions, Raised
from conformance.tasks.env import RankEnv, rank_task


def odd_num_sms(example: Example) -> int:
    """The odd SM count ``Buffer.set_num_sms`` is called with (derived from the seed, always odd)."""
    return 2 * (example.seed % 60) + 1


def out_of_range_rank(example: Example) -> int:
    """The rank whose first token gets an expert id equal to ``num_experts`` (first rank with tokens)."""
    return next(r for r, t in enumerate(example.tokens_per_rank) if t > 0)


def _bad_inputs(defect: str, example: Example, inputs: RankInputs, rank: int, device: torch.device) -> RankInputs:
    x, idx, w = inputs.x, inputs.topk_idx, inputs.topk_weights
    if defect == "int32_topk_idx":
        idx = idx.to(torch.int32)
    elif defect == "bf16_weights":
        w = w.to(torch.bfloat16)
    elif defect == "expert_id_out_of_range" and rank == out_of_range_rank(example):
        idx = idx.clone()
        idx[0, 0] = example.num_experts
    elif defect == "too_many_tokens" and rank == 0:
        over = (example.num_max_tokens_per_rank + 1,) + example.tokens_per_rank[1:]
        return build_rank_inputs(dataclasses.replace(example, tokens_per_rank=over), rank).to(device)
    return RankInputs(x, idx, w)


def _v1_bad_call(adapter: Any, defect: str, example: Example, bad: RankInputs) -> None:
    buffer = adapter.buffer
    if defect == "odd_num_sms":
        type(buffer).set_num_sms(odd_num_sms(example))
        return
    num_experts = example.num_experts + (1 if defect == "experts_not_divisible" else 0)
    per_rank, per_rdma, per_expert, in_rank, _ = buffer.get_dispatch_layout(bad.topk_idx, num_experts)
    buffer.dispatch(bad.x, num_tokens_per_rank=per_rank, num_tokens_per_rdma_rank=per_rdma, is_token_in_rank=in_rank,
                    num_tokens_per_expert=per_expert, topk_idx=bad.topk_idx, topk_weights=bad.topk_weights,
                    expert_alignment=example.expert_alignment)


def _v2_bad_call(adapter: Any, defect: str, example: Example, bad: RankInputs) -> None:
    buffer = adapter.buffer(example)
    num_experts = example.num_experts + (1 if defect == "experts_not_divisible" else 0)
    kwargs: dict[str, Any] = {"topk_idx": bad.topk_idx, "topk_weights": bad.topk_weights, "num_experts": num_experts,
                              "num_max_tokens_per_rank": example.num_max_tokens_per_rank,
                              "expert_alignment": example.expert_alignment}
    if defect == "v2_previous_event_without_allocate":
        kwargs.update(previous_event=buffer.capture(), allocate_on_comm_stream=False)
    recv_x, _, recv_w, handle, _ = buffer.dispatch(bad.x, **kwargs)
    if defect == "v2_combine_hidden_128":
        buffer.combine(recv_x, handle, topk_weights=recv_w)
    elif defect == "v2_cached_dispatch_without_num_experts":
        buffer.dispatch(bad.x, handle=handle)  # no num_experts, num_sms=0: the recorded upstream TypeError


@rank_task
def bad_input_results(env: RankEnv) -> dict[str, dict[str, Any]]:
    """Per applicable backend: what the bad call raised here, and the view of the next valid dispatch."""
    case: BadInputCase = env.case
    example, inputs = case.example, env.inputs
    out: dict[str, dict[str, Any]] = {}
    for spec in env.specs(capability="bad_input"):
        if spec.api not in DEFECT_APIS[case.defect]:
            continue
        adapter = get_adapter(spec)
        bad = _bad_inputs(case.defect, example, inputs, env.rank, env.device)
        got: dict[str, Any] = {}
        num_sms_before = type(adapter.buffer).num_sms if spec.api == "v1" else None
        try:
            (_v1_bad_call if spec.api == "v1" else _v2_bad_call)(adapter, case.defect, example, bad)
            got["raised"] = Raised.of(None)
        except Exception as exc:  # the expected refusal; judged by the controller
            got["raised"] = Raised.of(exc)
        if spec.api == "v1":
            got["num_sms"] = (num_sms_before, type(adapter.buffer).num_sms)
            type(adapter.buffer).num_sms = num_sms_before  # never leak a changed default into other checks
        got["after"] = adapter.dispatch(inputs, example, DispatchOptions(), env.rank)[0]
        out[spec.name] = got
    return out
