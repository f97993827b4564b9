"""Rank tasks of tests/nocover/test_emulation_2_5_0.py: DeepEP 2.5.0's behaviour on its emulation, as plain data."""

from __future__ import annotations

from typing import Any


def _raised(fn: Any) -> tuple[str | None, str | None]:
    try:
        fn()
    except Exception as exc:  # the refusal under test
        return type(exc).__name__, str(exc)
    return None, None


def ep_2_5_0_facts(example_json: str) -> dict[str, Any]:
    """One EPBuffer's answers to the calls whose 2.5.0 behaviour the source states (every rank makes them)."""
    import torch

    import conformance.emulation.v2_5_0 as deep_ep
    from conformance.core.example import Example, build_rank_inputs
    from conformance.versions import POISON_BYTE
    from conformance.world.rank import context

    example = Example.from_json(example_json)
    ctx = context()
    inputs = build_rank_inputs(example, ctx.rank)
    buffer = deep_ep.EPBuffer(ctx.group, num_max_tokens_per_rank=example.num_max_tokens_per_rank,
                              hidden=example.hidden, num_topk=example.num_topk, explicitly_destroy=True)
    args = {"topk_weights": inputs.topk_weights, "num_experts": example.num_experts}
    got: dict[str, Any] = {}
    topk_idx = inputs.topk_idx.clone()
    recv_x, recv_idx, recv_w, handle, _ = buffer.dispatch(inputs.x, topk_idx=topk_idx, **args)
    got["handle_num_sms"] = handle.num_sms
    got["theoretical_num_sms"] = buffer.get_theoretical_num_sms(example.num_experts, example.num_topk)
    got["handle_topk_is_input"] = handle.topk_idx is topk_idx
    combined, combined_w, _ = buffer.combine(recv_x, handle, topk_weights=recv_w)

    event = buffer.dispatch(inputs.x, topk_idx=topk_idx, async_with_compute_stream=True, defer_epilogue=True, **args)
    got["deferred_type"] = type(event).__name__
    out = event.current_stream_wait()
    got["deferred_equal"] = (len(out) == 4 and torch.equal(out[0], recv_x) and torch.equal(out[1], recv_idx)
                             and torch.equal(out[2], recv_w) and type(out[3]).__name__ == "EPHandle")
    event = buffer.combine(recv_x, handle, topk_weights=recv_w, async_with_compute_stream=True, defer_epilogue=True)
    got["deferred_combine_type"] = type(event).__name__
    out = event.wait()
    got["deferred_combine_equal"] = len(out) == 2 and torch.equal(out[0], combined) and torch.equal(out[1],
                                                                                                  combined_w)

    odd = buffer.dispatch(inputs.x, topk_idx=topk_idx, num_sms=3, **args)[3]
    got["handle_num_sms_for_3"] = odd.num_sms
    buffer.combine(recv_x, handle, topk_weights=recv_w, num_sms=5)
    got["combine_num_sms_for_5"] = buffer.last_launch["num_sms"]

    got["handle_copy"] = _raised(lambda: buffer.dispatch(inputs.x, topk_idx=topk_idx, do_handle_copy=True, **args))
    got["cached_with_topk"] = _raised(lambda: buffer.dispatch(inputs.x, topk_idx=topk_idx, handle=handle,
                                                              num_experts=example.num_experts))
    got["cached_cpu_sync"] = _raised(lambda: buffer.dispatch(inputs.x, handle=handle, do_cpu_sync=True,
                                                             num_experts=example.num_experts))
    got["cached_default_sms"] = _raised(lambda: buffer.dispatch(inputs.x, handle=handle))

    _, tail_idx, _, worst, _ = buffer.dispatch(inputs.x, topk_idx=topk_idx, do_cpu_sync=False, **args)
    valid = int(worst.psum_num_recv_tokens_per_scaleup_rank[-1])
    tail = tail_idx[valid:]
    got["tail_rows"] = int(tail.shape[0])
    got["tail_poison"] = bool((tail.contiguous().view(torch.uint8) == POISON_BYTE).all())

    topk_idx.add_(0)  # same values, a new version of the tensor the handle holds
    got["modified"] = _raised(lambda: buffer.dispatch(inputs.x, handle=handle, num_experts=example.num_experts))
    buffer.destroy()
    return got
