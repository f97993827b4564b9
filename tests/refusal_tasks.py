"""Rank tasks of tests/test_refusals.py: run refusal recipes (conformance/tasks/bad_calls.py) on the emulation."""

from __future__ import annotations

from conformance.core.example import Example


def run_recipes(names: list[str], example_json: str, mutant: str | None = None) -> dict[str, tuple]:
    """Run every recipe in ``names`` (in order, on every rank) against ``conformance.emulation``, with mutant
    ``mutant`` active; return ``{name: (exception type name or None, message or None)}``."""
    import conformance.emulation as module
    from conformance.mutants import activate
    from conformance.tasks import bad_calls

    example = Example.from_json(example_json)
    results = {}
    with activate(mutant), bad_calls.SharedBuffers() as shared:  # as P12 shares them
        for name in names:
            results[name] = bad_calls.run(name, bad_calls.make_env(module, example, shared))
    return results


def too_many_tokens_on_rank_0(example_json: str) -> dict:
    """V2 dispatch with one token too many on rank 0 only, then a valid dispatch on the same buffer."""
    import torch

    import conformance.emulation as module
    from conformance.tasks import bad_calls

    example = Example.from_json(example_json)
    env = bad_calls.make_env(module, example)
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
