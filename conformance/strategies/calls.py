"""Strategies for P10 (events), P11 (QP cap), P12 (bad calls, from the refusal table) and P14 (API surface).

Examples stay small (hidden 128/256, at most 16 or 64 tokens per rank): these properties are about call
semantics, not sizes.  Hidden 128 is kept so that the V2 combine limit is reached, but drawn last and in one case of
five (V2 rejects it in P10's combine: no property spends a quarter of its examples on a known limit; see
:mod:`conformance.strategies.combine`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import strategies as st

from conformance import versions
from conformance.backends.limits import known_limit
from conformance.core.cases import ApiSurfaceCase, BadCallCase, QpCase, p12_rows, row_api
from conformance.core.example import Example
from conformance.strategies import examples, vocabulary
from conformance.tasks import refusals

SMALL_HIDDEN = (256, 512, 256, 512, 128)  # 128 (V2 combine's known limit) in one draw of five
SMALL_MAX_TOKENS = (16, 64)
#: Explicit dispatch SM counts (0 = automatic); all even and within an H200's 132 SMs.
DISPATCH_NUM_SMS = (0, 4, 8, 16, 24, 32)
#: The bandwidths P11 passes to ``get_theoretical_num_sms`` (GB/s, whole numbers from 1 to 1000).
BANDWIDTHS = ("rdma_gbs", "nvlink_gbs", "sm_read_gbs", "sm_write_gbs")


def small_examples(world_size: int) -> st.SearchStrategy[Example]:
    """Cheap examples for a world of ``world_size`` ranks."""
    return examples(world_size, hidden_sizes=SMALL_HIDDEN, max_tokens=SMALL_MAX_TOKENS)


@st.composite
def qp_cases(draw: st.DrawFn, world_size: int) -> QpCase:
    """P11 cases: an example plus the SM count, QP excess, token excess and offending rank."""
    example = draw(small_examples(world_size), label="example")
    return QpCase(
        example=example,
        num_sms=draw(st.sampled_from(DISPATCH_NUM_SMS), label="num_sms"),
        over_qps=draw(st.integers(1, 64), label="over_qps"),
        over_tokens=draw(st.integers(1, 8), label="over_tokens"),
        offender=draw(st.integers(0, world_size - 1), label="offender"),
        num_allocated_qps=draw(st.integers(1, 129), label="num_allocated_qps"),
        extra_bytes=QpCase.ALIGNMENT * draw(st.integers(0, 2), label="extra_bytes / 2 MiB"),
        num_cpu_bytes=QpCase.ALIGNMENT * draw(st.integers(0, 1), label="num_cpu_bytes / 2 MiB"),
        **{name: float(draw(st.integers(1, 1000), label=name)) for name in BANDWIDTHS},
    )


#: At most this many refusal-table rows in one drawn P12 case (shrinking goes down to one).
MAX_ROWS_PER_CASE = 4
#: Rows per case of the sweep (one world round trip each).
SWEEP_ROWS_PER_CASE = 24


def row_applies(row_id: str, example: Example, world: Any) -> bool:
    """Whether the bad call of ``row_id`` can be made with ``example`` on this world: its recipe accepts both, and
    no known capability limit of the row's API refuses the example first (V2 combine at hidden 128)."""
    row = p12_rows()[row_id]
    api, operation = row_api(row), "combine" if ".combine" in row["call"] else "dispatch"
    if api in ("v1", "v2") and known_limit(api, operation, example, versions.under_test().version) is not None:
        return False
    return refusals.applies(row_id, example, world.nodes)


def p12_rows_for(world: Any) -> list[str]:
    """The P12 rows whose bad call can be made on a world of this shape (``refusals.applies``' topology)."""
    return [rid for rid in sorted(p12_rows()) if any(row_applies(rid, ex, world) for ex in sweep_examples(world.size))]


def sweep_examples(world_size: int) -> list[Example]:
    """The fixed examples the sweep makes the bad calls with (the first that a row's recipe accepts is used)."""
    tokens = tuple((6, 4, 5, 3)[r % 4] for r in range(world_size))
    base = Example(tokens, hidden=256, num_topk=2, num_experts=2 * world_size, num_max_tokens_per_rank=16, seed=3)
    return [base, dataclasses.replace(base, num_topk=min(4, base.num_experts), seed=4),
            dataclasses.replace(base, hidden=128)]


@st.composite
def sweep_shaped(draw: st.DrawFn, world_size: int) -> Example:
    """An example of one of the sweep's shapes (:func:`sweep_examples`), its tokens, routing, masks and payload
    drawn."""
    base = draw(st.sampled_from(sweep_examples(world_size)), label="sweep shape")
    drawn = draw(small_examples(world_size), label="example")
    return drawn.reshaped(hidden=base.hidden, num_topk=base.num_topk, num_experts=base.num_experts,
                          expert_alignment=base.expert_alignment, num_max_tokens_per_rank=base.num_max_tokens_per_rank,
                          tokens_per_rank=tuple(min(t, base.num_max_tokens_per_rank) for t in drawn.tokens_per_rank))


def bad_call_sweep(world: Any) -> list[BadCallCase]:
    """Every P12 row, once, in cases of up to :data:`SWEEP_ROWS_PER_CASE` rows (P12's explicit cases): each row's
    bad call and neighbour are made on every run, not only when drawn."""
    grouped: dict[Example, list[str]] = {}
    for rid in p12_rows_for(world):
        example = next((ex for ex in sweep_examples(world.size) if row_applies(rid, ex, world)), None)
        if example is not None:
            grouped.setdefault(example, []).append(rid)
    return [BadCallCase(example, tuple(rows[i:i + SWEEP_ROWS_PER_CASE]))
            for example, rows in grouped.items() for i in range(0, len(rows), SWEEP_ROWS_PER_CASE)]


@st.composite
def bad_call_cases(draw: st.DrawFn, world: Any, among: tuple[str, ...] | None = None) -> BadCallCase:
    """P12 cases: one to four refusal-table rows (``among`` these only, if given: a meta-test aimed at some rows),
    drawn first so that shrinking keeps them, then an example that every row's recipe accepts on this world."""
    names = [name for name in p12_rows_for(world) if among is None or name in among]
    rows = draw(st.lists(st.sampled_from(names), min_size=1, max_size=MAX_ROWS_PER_CASE, unique=True), label="rows")
    # On a shape vocabulary (--shapes jit): the sweep's few shapes only, with the other fields drawn (the sweep makes
    # every row's call with one of them: their kernels are the ones compiled anyway)
    examples = small_examples(world.size) if vocabulary.active() is None else sweep_shaped(world.size)
    example = draw(examples.filter(lambda ex: all(row_applies(rid, ex, world) for rid in rows)), label="example")
    case = BadCallCase(example=example, rows=tuple(rows))
    case.validate()
    return case


def api_surface_cases(world_size: int) -> st.SearchStrategy[ApiSurfaceCase]:
    """P14's single case (the property runs once per session), against the snapshot of the version under test."""
    return st.just(ApiSurfaceCase(world_size=world_size, snapshot=versions.under_test().version))
