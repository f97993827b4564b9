"""Draws for P30 (call sequences): the model of what a sequence may call next, and the state machine.

:class:`SequenceModel` is the user's side of the library's rules, as plain bookkeeping: which buffers are live,
which dispatch handles belong to them, which async calls are still in flight (their results may not be read
before their event is waited on, DeepEP's contract for ``async_finish`` / ``async_with_compute_stream``), which
dispatches were combined, whether a destroyed buffer is around.  It never guesses a result: the oracle does that.

Two ways to draw sequences share it:

- :func:`sequence_machine` builds the Hypothesis ``RuleBasedStateMachine`` the pytest run uses: each rule draws
  one step the model allows and hands it to ``run_step`` (the harness executes it on the ranks and checks it at
  once), so a failure shrinks to the shortest sequence of steps that still fails;
- :func:`sequence_cases` draws a whole :class:`~conformance.core.cases.SequenceCase` (the kill matrix, which runs
  every property through one strategy).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from conformance.core.cases import SequenceCase, Step
from conformance.core.example import ROUTINGS, Example
from conformance.strategies import vocabulary

#: Buffer shapes a sequence is drawn with (hidden 128 is left out: V2's combine rejects it, a known limit P5 covers).
SEQUENCE_HIDDEN = (256, 512)
SEQUENCE_MAX_TOKENS = (16, 32)
SEQUENCE_PAYLOADS = ("integers", "random")
SEQUENCE_ALIGNMENTS = (1, 2, 16)
SEQUENCE_MASK_RATIOS = (0.0, 0.1, 0.5)
#: At most this many async calls in flight at once (a bound of the test, not of the library).
MAX_IN_FLIGHT = 3
#: Steps per drawn sequence (the state machine's ``stateful_step_count``; the pytest run may set fewer).
MAX_STEPS = 10

Draw = Callable[..., Any]


@dataclass
class SequenceModel:
    """What the sequence so far allows (see the module doc)."""

    case: SequenceCase
    live: bool = False
    generation: int = 0
    dispatches: dict[int, int] = field(default_factory=dict)  # dispatch step -> generation of its buffer
    combined: set[int] = field(default_factory=set)
    in_flight: set[int] = field(default_factory=set)  # async steps not waited on yet
    destroyed_generation: int | None = None

    def apply(self, step: Step) -> None:
        """Account for ``step`` (appended to the case)."""
        index = len(self.case.steps)
        self.case = self.case.then(step)
        if step.op == "create":
            self.live, self.generation = True, self.generation + 1
        elif step.op == "destroy":
            self.live, self.destroyed_generation = False, self.generation
        elif step.op == "wait":
            self.in_flight.discard(step.ref)
        elif step.op == "dispatch":
            self.dispatches[index] = self.generation
        elif step.op == "combine":
            self.combined.add(step.ref)
        if step.async_op and step.op in ("dispatch", "cached", "combine"):
            self.in_flight.add(index)

    # --------------------------------------------------------------------------- what may come next
    def handles(self) -> list[int]:
        """Dispatches whose handle belongs to the live buffer."""
        return [d for d, gen in self.dispatches.items() if self.live and gen == self.generation]

    def combinable(self) -> list[int]:
        """Dispatches not combined yet whose handle is live (in any order)."""
        return [d for d in self.handles() if d not in self.combined]

    def dead_handles(self) -> list[int]:
        """Dispatches of the buffer destroyed last."""
        return [d for d, gen in self.dispatches.items() if gen == self.destroyed_generation]

    def can_start_async(self) -> bool:
        return len(self.in_flight) < MAX_IN_FLIGHT

    def ops(self) -> list[str]:
        """The ops the model allows now."""
        out = []
        if self.live:
            out += ["dispatch", "grad"]
            if self.handles():
                out.append("cached")
            if self.combinable():
                out.append("combine")
            if not self.in_flight:
                out.append("destroy")
        elif not self.in_flight:
            out.append("create")
        if self.in_flight:
            out.append("wait")
        if self.destroyed_generation is not None:
            out.append("use_destroyed")
        return out


# ----------------------------------------------------------------------------------------------- step draws


def draw_example(draw: Draw, model: SequenceModel) -> Example:
    """A dispatch's example: the sequence's shape, fresh routing and payload; sometimes the token counts (and
    alignment) of an earlier dispatch ("a reused shape": same tensor shapes, other contents)."""
    case = model.case
    earlier = [s.example for s in case.steps if s.example is not None]
    if earlier and draw(st.booleans(), label="reuse_shape"):
        base = draw(st.sampled_from(earlier), label="shape_of")
        return replace(base, seed=draw(st.integers(0, 2**16), label="seed"),
                       routing=draw(st.sampled_from(ROUTINGS), label="routing"))
    tokens = draw(st.lists(st.integers(0, case.num_max_tokens_per_rank), min_size=case.world_size,
                           max_size=case.world_size), label="tokens_per_rank")
    example = Example(
        tokens_per_rank=tuple(tokens), hidden=case.hidden, num_topk=case.num_topk, num_experts=case.num_experts,
        expert_alignment=draw(st.sampled_from(SEQUENCE_ALIGNMENTS), label="expert_alignment")
        if vocabulary.active() is None else vocabulary.active().shapes[0].expert_alignment,
        routing=draw(st.sampled_from(ROUTINGS), label="routing"),
        mask_ratio=draw(st.sampled_from(SEQUENCE_MASK_RATIOS), label="mask_ratio"),
        payload=draw(st.sampled_from(SEQUENCE_PAYLOADS), label="payload"),
        seed=draw(st.integers(0, 2**16), label="seed"), num_max_tokens_per_rank=case.num_max_tokens_per_rank)
    example.validate()
    return example


def _async_flags(draw: Draw, model: SequenceModel, must_follow: int = -1) -> dict[str, Any]:
    """``async_op`` / ``after``: synchronous, async, or async after the event of a call in flight."""
    if must_follow >= 0:
        return {"async_op": True, "after": must_follow}
    if not model.can_start_async() or not draw(st.booleans(), label="async"):
        return {}
    if model.in_flight and draw(st.booleans(), label="chain"):
        return {"async_op": True, "after": draw(st.sampled_from(sorted(model.in_flight)), label="after")}
    return {"async_op": True}


def draw_step(draw: Draw, model: SequenceModel, op: str) -> Step:
    """A step of kind ``op`` that the model allows now."""
    if op in ("create", "destroy"):
        return Step(op)
    if op == "dispatch":
        return Step("dispatch", example=draw_example(draw, model), **_async_flags(draw, model))
    if op == "grad":
        return Step("grad", example=draw_example(draw, model))
    if op == "cached":
        return Step("cached", ref=draw(st.sampled_from(model.handles()), label="handle_of"),
                    **_async_flags(draw, model))
    if op == "combine":
        ref = draw(st.sampled_from(model.combinable()), label="combine_of")
        # The received rows of a dispatch in flight may only be read after its event: the combine is chained on it
        return Step("combine", ref=ref, **_async_flags(draw, model, ref if ref in model.in_flight else -1))
    if op == "wait":
        return Step("wait", ref=draw(st.sampled_from(sorted(model.in_flight)), label="wait_for"))
    if op == "use_destroyed":
        uses = ["dispatch", "destroy"] + (["combine"] if model.dead_handles() else [])
        return Step("use_destroyed", use=draw(st.sampled_from(uses), label="use"))
    raise ValueError(f"unknown op {op!r}")


def draw_shape(draw: Draw, world_size: int) -> SequenceCase:
    """The buffers' shape: hidden, top-k, experts, pinned maximum (the shape vocabulary's small shape when a run
    draws on one: ``conformance.strategies.vocabulary``)."""
    experts_per_rank = draw(st.integers(1, 4), label="experts_per_rank")
    num_experts = experts_per_rank * world_size
    case = SequenceCase(world_size=world_size, hidden=draw(st.sampled_from(SEQUENCE_HIDDEN), label="hidden"),
                        num_topk=draw(st.integers(1, min(4, num_experts)), label="num_topk"), num_experts=num_experts,
                        num_max_tokens_per_rank=draw(st.sampled_from(SEQUENCE_MAX_TOKENS), label="max_tokens"))
    chosen = vocabulary.active()
    return case if chosen is None else vocabulary.sequence_shape(case, chosen)


def finishing_steps(model: SequenceModel) -> list[Step]:
    """The waits that complete every call still in flight, newest first (the end of every sequence: nothing is left
    unread; out of issue order, as overlapped code often waits)."""
    return [Step("wait", ref=ref) for ref in sorted(model.in_flight, reverse=True)]


def explicit_sequences(world: Any) -> list[SequenceCase]:
    """Sequences every run checks before its draws (a random sequence reaches them rarely): the lifecycle (a
    dispatch, ``destroy()``, every use of the destroyed buffer: a second destroy, a dispatch, a combine through the
    dead handle; re-creation and a round trip on the new buffer); two async dispatches whose outputs have the same
    shapes (every token to expert 0: the same counts whatever the seed) but other payloads, in flight at once and
    waited on out of issue order, then their two combines, likewise."""
    size = world.size
    case = SequenceCase(world_size=size, hidden=SEQUENCE_HIDDEN[0], num_topk=1, num_experts=2 * size,
                        num_max_tokens_per_rank=SEQUENCE_MAX_TOKENS[0])
    first = Example(tokens_per_rank=(12,) * size, hidden=case.hidden, num_topk=1, num_experts=case.num_experts,
                    routing="one_expert", payload="random", seed=1,
                    num_max_tokens_per_rank=case.num_max_tokens_per_rank)
    model = SequenceModel(case)
    for step in (Step("create"), Step("dispatch", example=first, async_op=True),
                 Step("dispatch", example=replace(first, seed=2), async_op=True)):
        model.apply(step)
    for step in [*finishing_steps(model), Step("combine", ref=1, async_op=True), Step("combine", ref=2, async_op=True)]:
        model.apply(step)
    for step in finishing_steps(model):
        model.apply(step)
    model.case.validate()
    lifecycle = SequenceModel(case)
    for step in (Step("create"), Step("dispatch", example=first), Step("destroy"),
                 Step("use_destroyed", use="destroy"), Step("use_destroyed", use="dispatch"),
                 Step("use_destroyed", use="combine"), Step("create"), Step("dispatch", example=replace(first, seed=3)),
                 Step("combine", ref=7)):
        lifecycle.apply(step)
    lifecycle.case.validate()
    return [lifecycle.case, model.case]


@st.composite
def sequence_cases(draw: st.DrawFn, world_size: int, max_steps: int = MAX_STEPS) -> SequenceCase:
    """A whole sequence: create, up to ``max_steps`` steps the model allows, then the waits of what is in flight."""
    model = SequenceModel(draw_shape(draw, world_size))
    model.apply(Step("create"))
    for _ in range(draw(st.integers(1, max_steps), label="steps")):
        model.apply(draw_step(draw, model, draw(st.sampled_from(model.ops()), label="op")))
    for step in finishing_steps(model):
        model.apply(step)
    model.case.validate()
    return model.case


# ------------------------------------------------------------------------------------------ the state machine


def sequence_machine(world_size: int, run_step: Callable[[SequenceCase, int], None],
                     end: Callable[[SequenceCase, bool], None]) -> type[RuleBasedStateMachine]:
    """The state machine of the pytest run: every rule appends one step the model allows and calls
    ``run_step(case, index)`` (run it on the ranks and check it; raises on a violation).  ``end(case, failed)``
    runs at teardown (after the finishing waits, when nothing failed)."""

    class CallSequences(RuleBasedStateMachine):
        """DeepEP buffers V1 and V2 side by side, driven by a sequence of calls."""

        def __init__(self) -> None:
            super().__init__()
            self.model: SequenceModel | None = None
            self.failed = False

        def _do(self, step: Step) -> None:
            assert self.model is not None
            self.model.apply(step)
            try:
                run_step(self.model.case, len(self.model.case.steps) - 1)
            except BaseException:
                self.failed = True
                raise

        @initialize(data=st.data())
        def create(self, data: st.DataObject) -> None:
            self.model = SequenceModel(draw_shape(data.draw, world_size))
            self._do(Step("create"))

        def _allows(self, op: str) -> bool:
            return self.model is not None and op in self.model.ops()

        @precondition(lambda self: self._allows("dispatch"))
        @rule(data=st.data())
        def dispatch(self, data: st.DataObject) -> None:
            self._do(draw_step(data.draw, self.model, "dispatch"))

        @precondition(lambda self: self._allows("cached"))
        @rule(data=st.data())
        def cached_dispatch(self, data: st.DataObject) -> None:
            self._do(draw_step(data.draw, self.model, "cached"))

        @precondition(lambda self: self._allows("combine"))
        @rule(data=st.data())
        def combine(self, data: st.DataObject) -> None:
            self._do(draw_step(data.draw, self.model, "combine"))

        @precondition(lambda self: self._allows("wait"))
        @rule(data=st.data())
        def wait(self, data: st.DataObject) -> None:
            self._do(draw_step(data.draw, self.model, "wait"))

        @precondition(lambda self: self._allows("grad"))
        @rule(data=st.data())
        def gradient_round_trip(self, data: st.DataObject) -> None:
            self._do(draw_step(data.draw, self.model, "grad"))

        @precondition(lambda self: self._allows("destroy"))
        @rule()
        def destroy(self) -> None:
            self._do(Step("destroy"))

        @precondition(lambda self: self._allows("use_destroyed"))
        @rule(data=st.data())
        def use_destroyed(self, data: st.DataObject) -> None:
            self._do(draw_step(data.draw, self.model, "use_destroyed"))

        @precondition(lambda self: self._allows("create"))
        @rule()
        def recreate(self) -> None:
            self._do(Step("create"))

        def teardown(self) -> None:
            if self.model is None:
                return
            try:
                if not self.failed:
                    for step in finishing_steps(self.model):
                        self._do(step)
            finally:
                end(self.model.case, self.failed)

    return CallSequences
