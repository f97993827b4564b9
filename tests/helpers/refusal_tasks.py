"""Rank tasks of tests/nocover/test_refusals.py: run refusal recipes (conformance/tasks/refusals/) on the emulation."""

from __future__ import annotations

from conformance.core.example import Example


def run_recipes(names: list[str], example_json: str, mutant: str | None = None,
                version: str | None = None) -> dict[str, tuple]:
    """Run every recipe in ``names`` (in order, on every rank) against the emulation of DeepEP ``version`` (``None``:
    ``conformance.emulation``, 2.1.0's), with mutant ``mutant`` active; return ``{name: (exception type name or None,
    message or None)}``."""
    import importlib

    from conformance.backends.alias import emulation_module
    from conformance.mutants import activate
    from conformance.tasks import refusals

    module = importlib.import_module(emulation_module(version))

    example = Example.from_json(example_json)
    results = {}
    with activate(mutant), refusals.SharedBuffers() as shared:  # as P12 shares them
        for name in names:
            results[name] = refusals.run(name, refusals.make_env(module, example, shared))[:2]
    return results


def too_many_tokens_on_rank_0(example_json: str) -> dict:
    """V2 dispatch with one token too many on rank 0 only, then a valid dispatch on the same buffer."""
    import torch

    import conformance.emulation as module
    from conformance.tasks import refusals

    example = Example.from_json(example_json)
    env = refusals.make_env(module, example)
    buffer = env.v2_buffer()
    n = example.num_max_tokens_per_rank + (1 if env.rank == 0 else 0)
    x = torch.zeros(n, example.hidden, dtype=torch.bfloat16)
    idx = torch.full((n, example.num_topk), -1, dtype=torch.int64)
    try:
        buffer.dispatch(x, topk_idx=idx, topk_weights=torch.zeros(n, example.num_topk),
                        num_experts=example.num_experts)
        raised = (None, None)
    except Exception as exc:  # the refusal under test
        raised = (type(exc).__name__, str(exc))
    after = env.valid_v2_dispatch(buffer)
    rows = int(after.recv_x.shape[0])
    env.release()
    return {"raised": raised, "after_rows": rows}


def ll_rank_local_on_rank_0(example_json: str, call: str) -> dict:
    """A low-latency ``dispatch`` (topk_idx one row longer than x) or ``combine`` (top-k padded past
    num_max_dispatch_tokens_per_rank) refused on rank 0 only, then a valid dispatch and combine on the same buffer."""
    import torch

    import conformance.emulation as module
    from conformance.tasks import refusals

    example = Example.from_json(example_json)
    env = refusals.make_env(module, example)
    done = env.valid_ll_dispatch(use_fp8=False)
    buffer, t_max = done.buffer, done.kwargs["num_max_dispatch_tokens_per_rank"]
    idx, w = env.inputs.topk_idx, env.inputs.topk_weights
    pad = (1 if call == "dispatch" else t_max + 1 - idx.shape[0]) if env.rank == 0 else 0
    idx = torch.cat([idx, idx.new_full((pad, idx.shape[1]), -1)])
    w = torch.cat([w, w.new_zeros((pad, w.shape[1]))])
    try:
        if call == "dispatch":
            buffer.low_latency_dispatch(done.kwargs["x"], idx, t_max, example.num_experts)
        else:
            buffer.low_latency_combine(done.recv_x, idx, w, done.handle)
        raised = (None, None)
    except Exception as exc:  # the refusal under test
        raised = (type(exc).__name__, str(exc))
    after = env.valid_ll_dispatch(buffer, use_fp8=False)
    combined = buffer.low_latency_combine(after.recv_x, env.inputs.topk_idx, env.inputs.topk_weights, after.handle)[0]
    env.release()
    return {"raised": raised, "after_rows": int(after.out[1].sum()), "combined_rows": int(combined.shape[0])}


def ll_two_mistakes(example_json: str) -> dict[str, tuple]:
    """Low-latency calls with two mistakes each, on every rank: what each raised (the library's first check wins)."""
    import torch

    import conformance.emulation as module
    from conformance.tasks import refusals

    example = Example.from_json(example_json)
    env = refusals.make_env(module, example)
    done = env.valid_ll_dispatch(use_fp8=False)
    buffer, t_max = done.buffer, done.kwargs["num_max_dispatch_tokens_per_rank"]
    idx, w = env.inputs.topk_idx, env.inputs.topk_weights
    pad = t_max + 1 - idx.shape[0]
    long_idx = torch.cat([idx, idx.new_full((pad, idx.shape[1]), -1)])
    long_w = torch.cat([w, w.new_zeros(pad, w.shape[1])])
    calls = {
        # :1481 (x and topk_idx rows differ) before :1482 (int32 topk_idx)
        "dispatch_1481_1482": lambda: buffer.low_latency_dispatch(done.kwargs["x"], long_idx.int(), t_max,
                                                                  example.num_experts),
        # :1623 (more rows than num_max_dispatch_tokens_per_rank) before :1624 (bfloat16 weights)
        "combine_1623_1624": lambda: buffer.low_latency_combine(done.recv_x, long_idx, long_w.bfloat16(), done.handle),
        # internode_ll.cu:1182 (zero-copy with LogFMT) before SWITCH_HIDDEN (:1236)
        "combine_1182_1236": lambda: buffer.low_latency_combine(done.recv_x[:, :, :1024].contiguous(), idx, w,
                                                                done.handle, zero_copy=True, use_logfmt=True),
    }
    results = {}
    for name, call in calls.items():
        try:
            call()
            results[name] = (None, None)
        except Exception as exc:  # the refusal under test
            results[name] = (type(exc).__name__, str(exc))
    env.release()
    return results
