"""Strategies for P10 (events), P11 (QP cap), P12 (bad input) and P14 (API surface).

Examples stay small (hidden 128/256, at most 16 or 64 tokens per rank): these properties are about call
semantics, not sizes.  Hidden 128 is kept so that the V2 combine limit is reached.
"""

from __future__ import annotations

import dataclasses

from hypothesis import strategies as st

from conformance.checks.p11_qp_cap import QpCase
from conformance.checks.p12_bad_input import BAD_INPUT_DEFECTS, BadInputCase, needs_tokens
from conformance.checks.p14_api_surface import ApiSurfaceCase
from conformance.example import Example
from conformance.strategies import examples

SMALL_HIDDEN = (128, 256)
SMALL_MAX_TOKENS = (16, 64)
#: Explicit dispatch SM counts (0 = automatic); all even and within an H200's 132 SMs.
DISPATCH_NUM_SMS = (0, 4, 8, 16, 24, 32)


def _world_size() -> int:
    from conformance import config

    return config.active().world_size


def small_examples(world_size: int) -> st.SearchStrategy[Example]:
    """Cheap examples for a world of ``world_size`` ranks."""
    return examples(world_size, hidden_sizes=SMALL_HIDDEN, max_tokens=SMALL_MAX_TOKENS)


def event_examples() -> st.SearchStrategy[Example]:
    """P10 examples for the active world."""
    return st.deferred(lambda: small_examples(_world_size()))


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


def active_qp_cases() -> st.SearchStrategy[QpCase]:
    """P11 cases for the active world."""
    return st.deferred(lambda: qp_cases(_world_size()))


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


def active_bad_input_cases() -> st.SearchStrategy[BadInputCase]:
    """P12 cases for the active world."""
    return st.deferred(lambda: bad_input_cases(_world_size()))


def api_surface_cases() -> st.SearchStrategy[ApiSurfaceCase]:
    """P14's single case (the property runs once per session)."""
    return st.deferred(lambda: st.just(ApiSurfaceCase(world_size=_world_size())))
