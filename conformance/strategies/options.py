"""Strategies for the V2 option properties: P20 (dispatch options), P21 (buffer options), P22
(``previous_event_before_epilogue``).

Every case ends in a V2 combine, so hidden sizes are multiples of 256 (V2's combine rejects 128, a known limit that
would leave these properties nothing to check); sizes stay small (hidden 256, at most 16 or 32 tokens per rank): the
properties are about options, and P20 makes seven calls per example, P21 and P22 check four combines each.  The
shared vocabulary's alignments (1, 2, 16, 128) with random counts give P20 expand layouts with and without padding
rows for ``do_zero_padding``.  P21 draws ``prefer_overlap_with_compute``, the biases, and exact (integer) or bounded
(random) payloads, like P5; every case runs both values of ``allow_multiple_reduction``, each with a plain and an
expand-mode dispatch and combine (so every multi-slot token tells the trees apart); and a production-sized shape
(up to 8192 tokens, hidden up to 8192, top-k 0-32) for ``get_buffer_size_hint``, a host-side formula.
"""

from __future__ import annotations

from hypothesis import strategies as st

from conformance.core.cases import BufferOptionsCase
from conformance.core.example import Example
from conformance.strategies import examples

#: The smallest hidden size V2's combine takes: the properties are about options, not sizes.
OPTION_HIDDEN = (256,)
#: Small pinned maxima, for the same reason (and every example ends in combines checked through the tree).
OPTION_MAX_TOKENS = (16, 32)


def v2_combine_examples(world_size: int, payloads: tuple[str, ...] = ("integers", "random"),
                        max_tokens: tuple[int, ...] = OPTION_MAX_TOKENS) -> st.SearchStrategy[Example]:
    """Cheap examples whose combine V2 accepts (hidden a multiple of 256)."""
    return examples(world_size, hidden_sizes=OPTION_HIDDEN, payloads=payloads, max_tokens=max_tokens)


def dispatch_option_examples(world_size: int) -> st.SearchStrategy[Example]:
    """P20: cheap examples (eight calls each)."""
    return v2_combine_examples(world_size)


@st.composite
def buffer_option_cases(draw: st.DrawFn, world_size: int) -> BufferOptionsCase:
    """P21: ``prefer_overlap_with_compute`` of the buffers (the task runs both ``allow_multiple_reduction`` values, a
    plain and an expand-mode combine each), 0-2 biases, ``exact`` mode with integer payloads or ``bounded`` mode with
    random ones."""
    mode = draw(st.sampled_from(BufferOptionsCase.MODES), label="mode")
    example = draw(v2_combine_examples(world_size, ("integers" if mode == "exact" else "random",)), label="example")
    case = BufferOptionsCase(
        example=example,
        num_bias=draw(st.integers(0, 2), label="num_bias"),
        mode=mode,
        prefer_overlap_with_compute=draw(st.booleans(), label="prefer_overlap_with_compute"),
        size_tokens=draw(st.integers(1, 8192), label="size_tokens"),
        size_hidden=32 * draw(st.integers(1, 256), label="size_hidden / 32"),
        size_topk=draw(st.integers(0, 32), label="size_topk"),
    )
    case.validate()
    return case


def epilogue_examples(world_size: int) -> st.SearchStrategy[Example]:
    """P22: cheap examples (the property is about ordering: any routing, both payload kinds)."""
    return v2_combine_examples(world_size)
