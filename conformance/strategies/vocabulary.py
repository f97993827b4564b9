"""Shapes the JIT compiles once: a bounded vocabulary of (hidden, top-k, experts, pinned maximum, alignment).

DeepEP V2 compiles its kernels on first use for every new set of template arguments (``csrc/kernels/elastic/
dispatch.hpp`` and ``combine.hpp``: ``num_hidden_bytes``, ``num_max_tokens_per_rank``, ``num_experts``, ``num_topk``,
``expert_alignment``, the SM count and ``num_qps``; the epilogues likewise), about 5 s each on an H200.  Drawn freely,
nearly every example is a new shape, and a run on the real library spends most of its time in NVCC.  On a backend
that compiles per shape (the real V2, or a plug-in / class backend over it), every example is therefore *snapped* to
one of a few shapes: its routing, payloads, token counts, masks, options and everything else stay as drawn (and
shrink as before; a drawn routing is refitted: each token keeps its routed ranks); only the template arguments are
taken from the vocabulary shape that matches its alignment (each shape has its own alignment, so the alignment
draws still pick among the four, and the aimed counts of the layout strategies keep their aim: every shape's pinned
maximum holds the tokens they aim at).

The shapes were chosen to reach the library's code paths (the JIT template arguments): top-1 to top-8, one to
eight local experts, alignments 1, 2, 16 and 128, hidden from 256 to the production 7168 with top-8 of 16 experts,
pinned maxima 64 and 256; hidden 128 is not among them (V2's combine JIT refuses it, a known limit: the refusal stays
P12's).  ``python -m conformance.strategies.vocabulary`` prints them.

Properties about call semantics on small examples (``Property.shapes == "small"``) use the first shape only; those
whose cases are a table of refusals or fixed sizes opt out (``"free"``).  The emulation draws freely unless
``--shapes jit`` asks for the vocabulary there too; the report and the header name the vocabulary a run used.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from conformance.core.cases import ExampleCase, QpCase, SequenceCase
from conformance.core.example import Example


@dataclass(frozen=True)
class Shape:
    """One set of JIT template arguments (experts per rank: the world size multiplies it)."""

    hidden: int
    num_topk: int
    experts_per_rank: int
    num_max_tokens_per_rank: int
    expert_alignment: int

    def describe(self) -> str:
        return (f"hidden {self.hidden}, top-{self.num_topk} of {self.experts_per_rank} experts per rank, "
                f"num_max_tokens_per_rank {self.num_max_tokens_per_rank}, alignment {self.expert_alignment}")


@dataclass(frozen=True)
class Vocabulary:
    """A named set of shapes; the first is the "small" shape."""

    name: str
    shapes: tuple[Shape, ...]
    #: P11's SM counts and explicit QP caps (template arguments too): the values drawn are mapped to these.
    num_sms: tuple[int, ...] = (0, 8)
    num_allocated_qps: tuple[int, ...] = (4, 129)

    def by_alignment(self, alignment: int) -> Shape:
        """The shape with this alignment (else the one with the nearest)."""
        return min(self.shapes, key=lambda s: (abs(s.expert_alignment - alignment), s.expert_alignment))

    def describe(self) -> str:
        return f"{self.name}: " + "; ".join(s.describe() for s in self.shapes)


JIT = Vocabulary("jit-4", (
    Shape(hidden=256, num_topk=2, experts_per_rank=2, num_max_tokens_per_rank=64, expert_alignment=1),
    Shape(hidden=512, num_topk=4, experts_per_rank=4, num_max_tokens_per_rank=64, expert_alignment=16),
    Shape(hidden=2048, num_topk=1, experts_per_rank=1, num_max_tokens_per_rank=256, expert_alignment=128),
    Shape(hidden=7168, num_topk=8, experts_per_rank=8, num_max_tokens_per_rank=256, expert_alignment=2),
))
VOCABULARIES = {"jit": JIT}
#: ``--shapes``: ``auto`` (the vocabulary where a backend compiles per shape), ``free``, ``jit``; ``jit:N`` is its shape
#: N alone (the JIT warm-up's runs).
MODES = ("auto", "free", "jit")


def named(name: str | None) -> Vocabulary | None:
    """The vocabulary ``--shapes`` names (``jit``, ``jit:2``), or ``None`` for free draws."""
    if not name:
        return None
    base, _, index = name.partition(":")
    vocabulary = VOCABULARIES.get(base)
    if vocabulary is None or not index:
        return vocabulary
    return dataclasses.replace(vocabulary, name=f"{vocabulary.name}:{index}", shapes=(vocabulary.shapes[int(index)],))

_active: list[Vocabulary | None] = [None]


def use(vocabulary: Vocabulary | None) -> None:
    """Draw with ``vocabulary`` in this process from now on (``None``: freely)."""
    _active[0] = vocabulary


def active() -> Vocabulary | None:
    """The vocabulary draws use now, if any."""
    return _active[0]


def snap_example(example: Example, shape: Shape) -> Example:
    """``example`` with ``shape``'s template arguments; tokens clamped to its pinned maximum, top-k to its experts; a
    drawn routing refitted to the shape (``Example.reshaped``: each token keeps its routed ranks, deterministically)."""
    num_experts = shape.experts_per_rank * example.world_size
    tokens = tuple(min(t, shape.num_max_tokens_per_rank) for t in example.tokens_per_rank)
    return example.reshaped(hidden=shape.hidden, num_topk=min(shape.num_topk, num_experts), num_experts=num_experts,
                            expert_alignment=shape.expert_alignment,
                            num_max_tokens_per_rank=shape.num_max_tokens_per_rank, tokens_per_rank=tokens)


def _nearest(value: int, choices: tuple[int, ...]) -> int:
    return min(choices, key=lambda c: (abs(c - value), c))


def snap(case: Any, vocabulary: Vocabulary, small: bool = False) -> Any:
    """``case`` (an :class:`Example` or a case holding one) on the vocabulary's shapes (``small``: the first only)."""
    def shape_for(example: Example) -> Shape:
        return vocabulary.shapes[0] if small else vocabulary.by_alignment(example.expert_alignment)

    if isinstance(case, Example):
        return snap_example(case, shape_for(case))
    if isinstance(case, QpCase):
        return dataclasses.replace(case, example=snap_example(case.example, shape_for(case.example)),
                                   num_sms=_nearest(case.num_sms, vocabulary.num_sms),
                                   num_allocated_qps=_nearest(case.num_allocated_qps, vocabulary.num_allocated_qps))
    if isinstance(case, ExampleCase):
        return dataclasses.replace(case, example=snap_example(case.example, shape_for(case.example)))
    if isinstance(case, SequenceCase):
        shaped = sequence_shape(case, vocabulary)
        steps = tuple(step if step.example is None else dataclasses.replace(
            step, example=snap_example(step.example, vocabulary.shapes[0])) for step in case.steps)
        return dataclasses.replace(shaped, steps=steps)
    return case


def sequence_shape(case: SequenceCase, vocabulary: Vocabulary) -> SequenceCase:
    """A call sequence's buffers on the vocabulary's small shape."""
    shape = vocabulary.shapes[0]
    return dataclasses.replace(case, hidden=shape.hidden, num_experts=shape.experts_per_rank * case.world_size,
                               num_topk=min(shape.num_topk, shape.experts_per_rank * case.world_size),
                               num_max_tokens_per_rank=shape.num_max_tokens_per_rank)


def valid(case: Any) -> bool:
    """Whether a snapped case is still a valid case of its type."""
    try:
        case.validate()
    except ValueError:
        return False
    return True


if __name__ == "__main__":
    for name, vocabulary in VOCABULARIES.items():
        print(f"--shapes {name}: {vocabulary.describe()}")
