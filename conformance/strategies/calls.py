"""Strategies for P10 (events), P11 (QP cap), P12 (bad input) and P14 (API surface).

Examples stay small (hidden 128/256, at most 16 or 64 tokens per rank): these properties are about call
semantics, not sizes.  Hidden 128 is kept so that the V2 combine limit is reached.
"""

from __future__ import annotations

import dataclasses

from hypothesis import strategies as st

from conformance.core.cases import BAD_INPUT_DEFECTS, ApiSurfaceCase, BadInputCase, QpCase, needs_tokens
from conformance.core.example import Example
from conformance.strategies import examples

SMALL_HIDDEN = (128, 256)
SMALL_MAX_TOKENS = (16, 64)
#: Explicit dispatch SM counts (0 = automatic); all even and within an H200's 132 SMs.
DISPATCH_NUM_SMS = (0, 4, 8, 16, 24, 32)


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
    )


@st.composite
def bad_input_cases(draw: st.DrawFn, world_size: int, defects: tuple[str, ...] = BAD_INPUT_DEFECTS) -> BadInputCase:
    """P12 cases: the defect kind is drawn first so that shrinking keeps it and shrinks the example."""
    defect = draw(st.sampled_from(defects), label="defect")
    example = draw(small_examples(world_size), label="example")
    if defect == "v2_combine_hidden_128":
        example = dataclasses.replace(example, hidden=128)
    if needs_tokens(defect) and sum(example.tokens_per_rank) == 0:
        example = dataclasses.replace(example, tokens_per_rank=(1,) + example.tokens_per_rank[1:])
    case = BadInputCase(example=example, defect=defect)
    case.validate()
    return case


def api_surface_cases(world_size: int) -> st.SearchStrategy[ApiSurfaceCase]:
    """P14's single case (the property runs once per session)."""
    return st.just(ApiSurfaceCase(world_size=world_size))
