"""Strategies for the combine-side properties (P5 combine, P6 round trip, P7 cached dispatch, P9 gradients).

Small hidden sizes keep every example cheap (combine is about sums, not about hidden); 128 stays in because
V2's combine rejects it (the known limit must be reported while V1 is still checked), but last and once among
five choices: Hypothesis favours and shrinks towards the first choices, so V2 spends most of its examples on
configurations it can run instead of on the known limit.
"""

from __future__ import annotations

from hypothesis import strategies as st

from conformance.core.cases import CombineCase
from conformance.strategies import examples

#: Hidden sizes for combine-side properties: two sizes both APIs combine (each listed twice, so that they are
#: drawn four times as often) and, last, 128 (the V2 combine limit).
COMBINE_HIDDEN = (256, 512, 256, 512, 128)
#: Pinned maxima: small, so that examples stay cheap and empty/full ranks are likely.
COMBINE_MAX_TOKENS = (16, 64)
#: P5's V1 configs: the default ones (0), or the library's table entries built with one of these SM counts (the
#: default 20 among them, spelled out; 4 is the fewest the internode kernels take, 132 an H200's SMs).
V1_CONFIG_SMS = (0, 4, 8, 20, 24, 48, 132)


def combine_examples(world_size: int, payloads: tuple[str, ...]) -> st.SearchStrategy:
    """Examples with small hidden sizes and token counts, drawing the given payload kinds."""
    return examples(world_size, hidden_sizes=COMBINE_HIDDEN, payloads=payloads, max_tokens=COMBINE_MAX_TOKENS)


@st.composite
def combine_cases(draw: st.DrawFn, world_size: int) -> CombineCase:
    """P5 cases: ``exact`` mode with integer payloads or ``bounded`` mode with random ones; 0, 1 or 2 biases; V1's
    default configs or the table's with another SM count."""
    mode = draw(st.sampled_from(("exact", "bounded")), label="mode")
    payload = "integers" if mode == "exact" else "random"
    example = draw(combine_examples(world_size, (payload,)), label="example")
    case = CombineCase(example=example, num_bias=draw(st.integers(0, 2), label="num_bias"), mode=mode,
                       v1_num_sms=draw(st.sampled_from(V1_CONFIG_SMS), label="v1_num_sms"))
    case.validate()
    return case


def round_trip_examples(world_size: int) -> st.SearchStrategy:
    """P6: every payload kind (integers exact, random and special values bounded / value-compared)."""
    return combine_examples(world_size, ("integers", "random", "special"))


def cached_dispatch_examples(world_size: int) -> st.SearchStrategy:
    """P7: every payload kind (cached dispatch moves bytes: NaN payloads and -0.0 must survive)."""
    return combine_examples(world_size, ("integers", "random", "special"))


def gradient_examples(world_size: int) -> st.SearchStrategy:
    """P9: integer payloads give integer upstream gradients (exact); random ones give normal gradients."""
    return combine_examples(world_size, ("integers", "random"))
