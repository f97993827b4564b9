"""Strategies for the combine-side properties (P5 combine, P6 round trip, P7 cached dispatch, P9 gradients).

Small hidden sizes keep every example cheap (combine is about sums, not about hidden); 128 stays in because
V2's combine rejects it (the known limit must be reported while V1 is still checked), but last and once among
five choices: Hypothesis favours and shrinks towards the first choices, so V2 spends most of its examples on
configurations it can run instead of on the known limit.

P5 and one extra rounding
-------------------------
A combine that rounds its float32 accumulator once more than the library's tree (a partial sum ``P`` of two or
more terms rounded to bf16 before at least one more term ``Q`` is added) returns ``bf16(bf16(P) + Q)`` instead
of ``bf16(P + Q)`` (per node on several nodes: the same at each level).  That changes a byte only if

1. the token's reduction has at least three terms (contributions plus biases; with two, ``P`` is everything, and
   rounding a single bf16 term changes nothing), and the extra rounding splits them;
2. ``P`` is not a bf16 value; and
3. the last rounding does not absorb ``bf16(P) - P``.

P5's cases are drawn for all three.  (1): a bias is drawn in four cases of five (a one-node world has two
ranks: without a bias a token has at most two terms), and two cases of three *spread* their tokens: top-k as
large as the experts allow (up to 8), no routing to one rank only, few masked slots, so that a token reaches
every rank of a small world (both ranks of one node, both nodes of two).  (2) and (3): exact mode draws ``wide``
payloads and biases (:func:`conformance.core.example.wide_integers`: odd multiples of ``2**0..2**5`` below
``2**13``); every float32 sum is then exact, so the tree predicts every byte, and a sum of two or more of
them has more than 8 significant bits most of the time; bounded mode's standard normals do the same with 8-bit
significands of spread exponents.  Each column draws its values on its own, so each column is a fresh trial of
(2) and (3): ``tests/quality/test_p05_meta.py`` measures, for every shape of extra rounding the tree admits on one and
two nodes, that at least 7% of columns show it; a token of ``hidden >= 128`` columns then hides it with
probability below ``0.93**128 < 1e-4``, and a case has several such tokens.
"""

from __future__ import annotations

from hypothesis import strategies as st

from conformance.core.cases import CombineCase
from conformance.core.example import ROUTINGS
from conformance.strategies import MAX_TOPK, examples

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


#: P5's bias counts: a bias in four cases of five (see the module doc).  None comes first: Hypothesis starts with
#: the simplest case, so a backend without ``combine_bias`` (a plug-in that declares no bias) is checked on at
#: least that one even with a small ``--max-examples``.
P5_NUM_BIAS = (0, 1, 2, 1, 2)
#: P5's routing draws: spread (tokens reach many ranks) in two cases of three, anything in the third.
P5_REACH = ("spread", "spread", "any")


def spread_examples(world_size: int, payloads: tuple[str, ...]) -> st.SearchStrategy:
    """Combine examples whose tokens reach many ranks: top-k as large as the experts allow (up to 8), routings
    that spread (no routing to one rank only), at most 10% of slots masked."""
    return examples(world_size, hidden_sizes=COMBINE_HIDDEN, payloads=payloads, max_tokens=COMBINE_MAX_TOKENS,
                    routings=tuple(r for r in ROUTINGS if r != "one_rank"), mask_ratios=(0.0, 0.1),
                    min_topk=MAX_TOPK)


@st.composite
def combine_cases(draw: st.DrawFn, world_size: int) -> CombineCase:
    """P5 cases: ``exact`` mode with wide integer payloads or ``bounded`` mode with random ones; 0, 1 or 2 biases
    (mostly some); tokens spread over many ranks in most cases; V1's default configs or the table's with another SM
    count.  The module doc says why an extra rounding in the combine shows."""
    mode = draw(st.sampled_from(("exact", "bounded")), label="mode")
    payload = "wide" if mode == "exact" else "random"
    reach = draw(st.sampled_from(P5_REACH), label="reach")
    drawn = spread_examples if reach == "spread" else combine_examples
    example = draw(drawn(world_size, (payload,)), label="example")
    case = CombineCase(example=example, num_bias=draw(st.sampled_from(P5_NUM_BIAS), label="num_bias"), mode=mode,
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
