"""P31 soak: the same large dispatch and round trip, repeated N times on the same buffers (``--soak N``), must give
the first repetition's bytes every time, and the first must be the oracle's.

Rare silent corruption (a few rows out of thousands, in some runs only) is invisible to one healthy-looking
run: soak mode repeats chosen examples at production shapes on GPUs (4096 tokens per rank, hidden 7168, top-8 of
256 experts, DeepSeek-V3-like) and small ones on CPU (the self-test), compares every repetition bitwise with the
first (rows in source order) and the first with the oracle, and reports the figures per backend: repetitions,
rows compared, corrupted rows and their rate, time (the report's ``artifacts``).  Off unless ``--soak N`` is given
(then reported ``skipped``, with the reason).
"""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import strategies as st

from conformance.assertions import assert_view_matches_oracle, hex_row
from conformance.core.cases import SoakCase
from conformance.core.example import Example, build_all_inputs
from conformance.core.outcomes import NotChecked
from conformance.oracle.reduction import expected_round_trip_bf16, expected_rows_by_source
from conformance.properties import CheckContext, Property, register
from conformance.tasks.soak import SoakResult, soak_repeats

#: Repetitions of the kill matrix's and replays' soak cases (the pytest run takes ``--soak N``).
DEFAULT_REPETITIONS = 3


def soak_examples(world_size: int, large: bool) -> list[Example]:
    """The chosen examples: DeepSeek-V3-like on GPUs, the same routing at a small size on CPU."""
    experts = 256 if 256 % world_size == 0 else 8 * world_size
    if large:
        return [Example(tokens_per_rank=(4096,) * world_size, hidden=7168, num_topk=8, num_experts=experts,
                        routing="random", payload="integers", seed=1, num_max_tokens_per_rank=4096),
                Example(tokens_per_rank=(4096,) * world_size, hidden=7168, num_topk=8, num_experts=experts,
                        routing="skewed", payload="random", seed=2, num_max_tokens_per_rank=4096)]
    return [Example(tokens_per_rank=(48,) * world_size, hidden=256, num_topk=4, num_experts=4 * world_size,
                    routing="random", payload="integers", seed=1, num_max_tokens_per_rank=64)]


def configured(config: Any) -> list[SoakCase] | str:
    """``--soak N``: the chosen examples with N repetitions (large ones on GPUs); off otherwise."""
    if not getattr(config, "soak", 0):
        return "soak mode is off (run with --soak N to repeat large dispatches and round trips N times)"
    return [SoakCase(example, repetitions=config.soak)
            for example in soak_examples(config.world_size, large=config.device == "cuda")]


def soak_cases(world: Any) -> st.SearchStrategy[SoakCase]:
    """The kill matrix's and replays' cases: the small examples, a few repetitions."""
    return st.sampled_from([SoakCase(ex, DEFAULT_REPETITIONS) for ex in soak_examples(world.size, large=False)])


def check(ctx: CheckContext, case: SoakCase, per_rank: list[dict[str, SoakResult | NotChecked]]) -> None:
    """Per backend: the first repetition equals the oracle (receipts and round trip), every later one equals the
    first bit for bit; the figures go into the report whether it held or not."""
    __tracebackhide__ = True
    example = case.example
    inputs = build_all_inputs(example)
    payloads = [r.x for r in inputs]
    backends = list(per_rank[0]) if per_rank else []
    problems: list[str] = []
    for backend in backends:
        ctx.checking((backend,))
        figures = {"repetitions": case.repetitions, "rows_compared": 0, "corrupted_rows": 0, "wall_s": 0.0}
        first_problem = ""
        for rank, results in enumerate(per_rank):
            result = results[backend]
            if isinstance(result, NotChecked):
                ctx.not_checked(result, case)
                continue
            view = assert_view_matches_oracle(ctx, example, rank, result.first)
            assert view is not None
            order = torch.sort(view.src_rank * (int(view.src_token.max()) + 1 if view.src_token.numel() else 1)
                               + view.src_token, stable=True).indices
            expected_x = expected_rows_by_source(view.src_rank[order], view.src_token[order], payloads)
            expected_combined = expected_round_trip_bf16(example, inputs, rank)
            tokens = expected_combined.shape[0]
            figures["rows_compared"] += case.repetitions * (result.rows + tokens)
            figures["wall_s"] = max(figures["wall_s"], round(result.wall_s, 3))
            for name, diffs, expected in (("recv_x", result.dispatch_diffs, expected_x),
                                          ("combined_x", result.combine_diffs, expected_combined)):
                for repetition, rows in sorted(diffs.items()):
                    for row, got in rows:
                        bad = row < 0 or not torch.equal(got.view(torch.int16), expected[row].view(torch.int16))
                        figures["corrupted_rows"] += (result.rows if name == "recv_x" else tokens) if row < 0 else bad
                        if bad and not first_problem:
                            columns = [] if row < 0 else (got.view(torch.int16) != expected[row].view(torch.int16)
                                                          ).nonzero().flatten().tolist()[:4]
                            first_problem = (f"{name}[rank {rank}, repetition {repetition}, row {row} in source order] "
                                             + ("has another row count than the first repetition" if row < 0 else
                                                f"= {hex_row(got, columns)}, the first repetition and the oracle "
                                                f"have {hex_row(expected[row], columns)}") + f" [{result.call}]")
        compared = max(figures["rows_compared"], 1)
        figures["corrupted_rate"] = figures["corrupted_rows"] / compared
        ctx.record_artifact(f"soak {backend} {example.tokens_per_rank[0]}x{example.hidden} seed {example.seed}",
                            figures)
        if figures["corrupted_rows"]:
            problems.append(f"{backend}: {figures['corrupted_rows']} corrupted row(s) of {figures['rows_compared']} "
                            f"compared over {case.repetitions} repetitions (rate {figures['corrupted_rate']:.2e}); "
                            f"first: {first_problem}")
    ctx.checking(None)
    if problems:
        raise AssertionError("soak: repetitions differ from the first, which equals the oracle: " + "; ".join(problems))


PROPERTY = register(Property(
    id="P31-soak",
    title="soak mode (--soak N): N repetitions of large dispatches and round trips are bitwise identical to the first, "
          "which equals the oracle; reports the corrupted-row rate",
    strategy=soak_cases, task=soak_repeats, check=check, case_type=SoakCase, needs=("combine",),
    configured=configured, shapes="free",
))
test_soak = PROPERTY.test
