"""Rank tasks of tests/test_refusals.py: run refusal recipes (conformance/tasks/bad_calls.py) on the emulation."""

from __future__ import annotations

from conformance.example import Example


def run_recipes(names: list[str], example_json: str, mutant: str | None = None) -> dict[str, tuple]:
    """Run every recipe in ``names`` (in order, on every rank) against ``conformance.emulation``, with mutant
    ``mutant`` active; return ``{name: (exception type name or None, message or None)}``."""
    import conformance.emulation as module
    from conformance.mutation import activate
    from conformance.tasks import bad_calls

    example = Example.from_json(example_json)
    results = {}
    with activate(mutant):
        for name in names:
            results[name] = bad_calls.run(name, bad_calls.make_env(module, example))
    return results
