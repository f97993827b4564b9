"""Rank tasks for P30 (call sequences): one step at a time on buffers that live across tasks.

A call sequence (:class:`~conformance.core.cases.SequenceCase`) keeps its own buffers, one ``Buffer`` and one
``ElasticBuffer`` per selected backend, built by its first step (``create``) and kept in this rank process
between tasks (:func:`conformance.world.rank.cached`) until the sequence ends or the next one starts: the
controller's state machine sends one step per task (:func:`sequence_step`), and a replay sends the whole
sequence at once (:func:`run_sequence`); both run the same code.  The buffers are built with the adapters'
production arguments but are the sequence's own: the adapters' buffers (other properties) are never touched.

Every step is made on every backend in turn, each backend's part ending on every rank together (as
``RankEnv.call``): a backend whose call raises is that backend's :class:`StepRaised` result (every rank knows it), its
later steps are not made (:class:`NotMade`), and the other backends' steps go on, so that their verdicts stand.
Async steps (``async_finish`` / ``async_with_compute_stream``)
stay in flight until a ``wait`` step waits on their event and reads them; ``after`` passes the event of a step
still in flight as ``previous_event`` (with ``allocate_on_comm_stream=True``, which both APIs require).  What a
step returns per backend: the rows it read (CPU copies), ``{"pending": ...}`` for an async call not waited yet,
a :class:`~conformance.core.views.Raised` for a call on a destroyed buffer, or ``None`` (create, destroy).
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import Any

import torch

from conformance.backends.contract import NotSupported, Raw
from conformance.backends.factory import get_adapter
from conformance.backends.legacy import NUM_NVL_BYTES, NUM_RDMA_BYTES
from conformance.backends.results import counts_list, returned, tensors
from conformance.core.cases import SequenceCase, Step
from conformance.core.example import Example, RankInputs, build_rank_inputs, second_payload, upstream_combined_grad
from conformance.core.outcomes import NotChecked
from conformance.core.raisers import suite_frame
from conformance.core.spec import BackendSpec
from conformance.core.views import Raised
from conformance.emulation.utils import event as emulated_event
from conformance.tasks.env import RankEnv, declined, limited, rank_task, settle
from conformance.tasks.setup import refuse_if_limited
from conformance.world.rank import backend_context, cached, on_shutdown


@dataclass
class InFlight:
    """A call of one backend whose results are read later: its outputs, its event, what it was."""

    kind: str  # "dispatch", "cached", "combine"
    outputs: dict[str, Any]
    event: Any = None  # the EventOverlap (None: synchronous, already complete)


@dataclass(frozen=True)
class StepRaised:
    """A backend's step raised on ``ranks`` (every rank returns this for it): that backend's failure at ``step``, or a
    suite error where the suite's own code raised (``suite``: where, on this rank).  ``traceback``: this rank's (None
    where it did not raise)."""

    backend: str
    step: int
    ranks: list[int]
    traceback: str | None
    suite: str | None = None


@dataclass(frozen=True)
class NotMade:
    """A backend's step that was not made: the backend failed at step ``failed_at`` of the sequence."""

    backend: str
    failed_at: int


@dataclass
class BackendState:
    """One backend's side of the running sequence."""

    spec: BackendSpec
    module: Any
    buffer: Any = None  # the live buffer, or None after destroy
    destroyed: Any = None  # the buffer destroyed last (for destroy-then-use)
    handles: dict[int, Any] = field(default_factory=dict)  # dispatch step -> handle (of the live buffer)
    dead_handles: dict[int, Any] = field(default_factory=dict)  # dispatch step -> handle of a destroyed buffer
    results: dict[int, InFlight] = field(default_factory=dict)  # step -> its outputs (dispatch, cached, combine)
    #: A step a known limit refused (``backends.limits``: V1 on a world size without a config): this and every
    #: later step of the sequence are that backend's NotChecked result.
    unsupported: NotChecked | None = None
    #: The step at which the backend raised: its later steps are not made.
    failed: StepRaised | None = None


class SequenceState:
    """The running sequence on this rank: its case so far and every backend's buffers, handles and results."""

    def __init__(self) -> None:
        self.backends: dict[str, BackendState] = {}

    def reset(self, device: torch.device) -> None:
        """Complete outstanding work and destroy the sequence's buffers (start or end of a sequence)."""
        finish_all(device)
        for state in self.backends.values():
            if state.buffer is not None and state.unsupported is None:  # (V1's destroy refuses where dispatch did)
                if state.failed is None:
                    state.buffer.destroy()
                    continue
                try:  # a backend that failed in the sequence: its verdict is given, its clean-up is best effort
                    state.buffer.destroy()
                except Exception:  # noqa: BLE001, S110
                    pass
        self.backends.clear()


def finish_all(device: torch.device) -> None:
    """Complete every outstanding piece of work."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    else:
        emulated_event.synchronize()


def _state() -> SequenceState:
    def build() -> SequenceState:
        state = SequenceState()
        on_shutdown(lambda: state.reset(torch.device("cpu")))
        return state

    return cached(("sequence-state",), build)


# ------------------------------------------------------------------------------------------------- the calls


def _build(state: BackendState, case: SequenceCase, num_nodes: int, group: Any) -> Any:
    """The sequence's buffer (a set-up limit that names it refuses it first: ``tasks.setup``)."""
    if state.spec.api == "v1":
        arguments: dict[str, Any] = {"num_nvl_bytes": NUM_NVL_BYTES,
                                     "num_rdma_bytes": NUM_RDMA_BYTES if num_nodes > 1 else 0,
                                     "explicitly_destroy": True}
        refuse_if_limited(state.spec.real, "Buffer.__init__", arguments)
        return state.module.Buffer(group, **arguments)
    adapter = get_adapter(state.spec)
    arguments = {"num_max_tokens_per_rank": case.num_max_tokens_per_rank, "hidden": case.hidden,
                 "num_topk": case.num_topk, "deterministic": False, "num_allocated_qps": 0, "explicitly_destroy": True}
    refuse_if_limited(state.spec.real, f"{adapter.class_name}.__init__", arguments)
    return adapter.new_buffer(group, **arguments)  # the version's V2 class (ElasticBuffer, EPBuffer)


def _previous(state: BackendState, after: int) -> Any:
    """The ``previous_event`` argument naming step ``after``'s event (V1: the EventOverlap; V2: its EventHandle)."""
    if after < 0:
        return None
    event = state.results[after].event
    return event if state.spec.api == "v1" else event.event


def _dispatch(state: BackendState, buffer: Any, inputs: RankInputs, example: Example, step: Step) -> InFlight:
    previous = _previous(state, step.after)
    flags = {"previous_event": previous, "allocate_on_comm_stream": previous is not None}
    if state.spec.api == "v1":
        per_rank, per_rdma, per_expert, in_rank, _ = returned(
            "Buffer.get_dispatch_layout", buffer.get_dispatch_layout(inputs.topk_idx, example.num_experts), 5)
        recv_x, recv_idx, recv_w, counts, handle, event = returned("Buffer.dispatch", buffer.dispatch(
            inputs.x, num_tokens_per_rank=per_rank, num_tokens_per_rdma_rank=per_rdma, is_token_in_rank=in_rank,
            num_tokens_per_expert=per_expert, topk_idx=inputs.topk_idx, topk_weights=inputs.topk_weights,
            expert_alignment=example.expert_alignment, async_finish=step.async_op, **flags), 6)
    else:
        recv_x, recv_idx, recv_w, handle, event = returned("ElasticBuffer.dispatch", buffer.dispatch(
            inputs.x, topk_idx=inputs.topk_idx, topk_weights=inputs.topk_weights, num_experts=example.num_experts,
            num_max_tokens_per_rank=example.num_max_tokens_per_rank, expert_alignment=example.expert_alignment,
            async_with_compute_stream=step.async_op, **flags), 5)
        counts = handle.num_recv_tokens_per_expert_list
    call = f"{state.spec.class_name}.dispatch (step {step.op})"
    return InFlight("dispatch", {"x": recv_x, "topk_idx": recv_idx, "topk_weights": recv_w,
                                 "counts": counts_list(counts, call), "handle": handle},
                    event if step.async_op else None)


def _cached(state: BackendState, buffer: Any, handle: Any, x: torch.Tensor, step: Step) -> InFlight:
    previous = _previous(state, step.after)
    flags = {"previous_event": previous, "allocate_on_comm_stream": previous is not None}
    if state.spec.api == "v1":
        recv_x, _, _, _, _, event = returned("Buffer.dispatch(x, handle=handle)", buffer.dispatch(
            x, handle=handle, async_finish=step.async_op, **flags), 6)
    else:  # production convention: num_experts passed (P12 covers the known defect without it)
        recv_x, _, _, _, event = returned("ElasticBuffer.dispatch(x, handle=handle)", buffer.dispatch(
            x, handle=handle, num_experts=handle.num_experts, async_with_compute_stream=step.async_op, **flags), 5)
    return InFlight("cached", {"x": recv_x}, event if step.async_op else None)


def _combine(state: BackendState, buffer: Any, handle: Any, x: torch.Tensor, step: Step,
             topk_weights: torch.Tensor | None = None) -> InFlight:
    previous = _previous(state, step.after)
    flags = {"previous_event": previous, "allocate_on_comm_stream": previous is not None}
    if state.spec.api == "v1":
        combined, combined_w, event = returned("Buffer.combine", buffer.combine(
            x, handle, topk_weights=topk_weights, async_finish=step.async_op, **flags), 3)
    else:
        combined, combined_w, event = returned("ElasticBuffer.combine", buffer.combine(
            x, handle, topk_weights=topk_weights, num_sms=0, async_with_compute_stream=step.async_op, **flags), 3)
    return InFlight("combine", {"x": combined, "topk_weights": combined_w}, event if step.async_op else None)


def _read(flight: InFlight) -> dict[str, Any]:
    """The outputs of a completed call, as CPU copies (what the controller checks)."""
    out: dict[str, Any] = {"kind": flight.kind}
    for name, value in flight.outputs.items():
        if isinstance(value, torch.Tensor):
            out[name] = value.cpu().clone()
        elif name == "counts":
            out[name] = [int(c) for c in value]
        elif name == "x" or (name in ("topk_idx", "topk_weights") and flight.kind == "dispatch"):
            tensors(f"{flight.kind} (its {name})", **{name: value})  # the API returns a tensor there
    return out


class _Shim:
    """What the autograd wrappers (``backends.autograd``) call, over the sequence's own buffer."""

    def __init__(self, state: BackendState) -> None:
        self.state, self.step = state, Step("grad")

    def dispatch(self, inputs: RankInputs, example: Example, options: Any, rank: int) -> tuple[None, Raw]:
        flight = _dispatch(self.state, self.state.buffer, inputs, example, self.step)
        out = flight.outputs
        return None, Raw(out["x"], out["topk_weights"], handle=out["handle"])

    def combine(self, raw: Raw, x: torch.Tensor, topk_weights: torch.Tensor | None = None,
                bias: Any = None, async_finish: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        out = _combine(self.state, self.state.buffer, raw.handle, x, self.step, topk_weights).outputs
        return out["x"], out["topk_weights"]

    def cached_dispatch(self, raw: Raw, x: torch.Tensor) -> torch.Tensor:
        return _cached(self.state, self.state.buffer, raw.handle, x, self.step).outputs["x"]


def _grad(state: BackendState, example: Example, rank: int, device: torch.device) -> dict[str, Any]:
    """Autograd round trip: ``combined = combine(dispatch(x))`` (identity experts), ``combined.backward(g)``."""
    from conformance.backends.autograd import FusedCombine, FusedDispatch

    inputs = build_rank_inputs(example, rank).to(device)
    x = inputs.x.clone().requires_grad_(True)
    weights = inputs.topk_weights.clone().requires_grad_(True)
    shim, keep = _Shim(state), {}
    recv_x, _ = FusedDispatch.apply(x, weights, shim, inputs.topk_idx, example, rank, keep)
    combined = FusedCombine.apply(recv_x, shim, keep["raw"])
    combined.backward(upstream_combined_grad(example, rank).to(device))
    return {"kind": "grad", "combined": combined.detach().cpu().clone(), "grad_x": x.grad.cpu().clone()}


def _use_destroyed(state: BackendState, case: SequenceCase, step: Step, rank: int, device: torch.device,
                   num_nodes: int) -> Raised:
    """Call the destroyed buffer; what it raised (``Raised.of(None)``: it returned)."""
    buffer = state.destroyed
    probe = next((s.example for s in reversed(case.steps) if s.example is not None), None) or case.base_example()
    inputs = build_rank_inputs(probe, rank).to(device)
    try:
        if step.use == "destroy":
            buffer.destroy()
        elif step.use == "combine":
            ref, handle = max(state.dead_handles.items(), key=lambda item: item[0])
            rows = state.results[ref].outputs["x"] if ref in state.results else None
            buffer.combine(rows, handle) if state.spec.api == "v1" else buffer.combine(rows, handle, num_sms=0)
        elif state.spec.api == "v1":  # a call the API allows (the layout a live buffer would have given)
            per_rank, per_rdma, per_expert, in_rank = v1_layout(inputs.topk_idx, probe.num_experts,
                                                                 probe.world_size, num_nodes)
            buffer.dispatch(inputs.x, num_tokens_per_rank=per_rank, num_tokens_per_rdma_rank=per_rdma,
                            is_token_in_rank=in_rank, num_tokens_per_expert=per_expert, topk_idx=inputs.topk_idx,
                            topk_weights=inputs.topk_weights)
        else:
            buffer.dispatch(inputs.x, topk_idx=inputs.topk_idx, topk_weights=inputs.topk_weights,
                            num_experts=probe.num_experts)
    except Exception as exc:  # the expected refusal; the controller judges type and message
        return Raised.of(exc)
    return Raised.of(None)


def v1_layout(topk_idx: torch.Tensor, num_experts: int, num_ranks: int, num_nodes: int
              ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """``get_dispatch_layout``'s ``(num_tokens_per_rank, num_tokens_per_rdma_rank, num_tokens_per_expert,
    is_token_in_rank)`` as V1 documents them, computed here (for a call on a destroyed buffer, which has no layout
    call left): the call the API allows."""
    per_rank_experts = max(1, num_experts // num_ranks)
    owner = torch.where(topk_idx >= 0, topk_idx // per_rank_experts, torch.full_like(topk_idx, -1))
    in_rank = (owner.unsqueeze(-1) == torch.arange(num_ranks, device=topk_idx.device)).any(dim=1)
    ids = topk_idx[topk_idx >= 0]
    per_expert = torch.bincount(ids, minlength=num_experts).to(torch.int32)
    per_rdma = None
    if num_nodes > 1:
        per_rdma = in_rank.reshape(in_rank.shape[0], num_nodes, num_ranks // num_nodes).any(dim=2).sum(dim=0).to(
            torch.int32)
    return in_rank.sum(dim=0).to(torch.int32), per_rdma, per_expert, in_rank


def apply_step(env: RankEnv, state: BackendState, case: SequenceCase, index: int) -> Any:
    """Make step ``index`` of ``case`` on one backend; what the controller checks for it (see module doc)."""
    step, rank, device = case.steps[index], env.rank, env.device
    if step.op == "create":
        state.buffer = _build(state, case, env.ctx.num_nodes, env.group)
        return None
    if step.op == "destroy":
        finish_all(device)  # nothing may be in flight when a buffer goes away (the model waits first)
        state.buffer.destroy()
        state.destroyed, state.buffer = state.buffer, None
        state.dead_handles, state.handles = state.handles, {}
        return None
    if step.op == "use_destroyed":
        return {"api": state.spec.api, "raised": _use_destroyed(state, case, step, rank, device, env.ctx.num_nodes)}
    if step.op == "grad":
        assert step.example is not None
        return _grad(state, step.example, rank, device)
    if step.op == "wait":
        flight = state.results[step.ref]
        flight.event.current_stream_wait()
        flight.event = None
        return _read(flight)
    if step.op == "dispatch":
        assert step.example is not None
        flight = _dispatch(state, state.buffer, build_rank_inputs(step.example, rank).to(device), step.example, step)
        state.handles[index] = flight.outputs["handle"]
    elif step.op == "cached":
        example = case.steps[step.ref].example
        assert example is not None
        flight = _cached(state, state.buffer, state.handles[step.ref], second_payload(example, rank).to(device), step)
    else:  # combine: identity experts, the dispatch's received rows go back unchanged
        flight = _combine(state, state.buffer, state.handles[step.ref], state.results[step.ref].outputs["x"], step)
    state.results[index] = flight
    return {"pending": flight.kind} if flight.event is not None else _read(flight)


def _run_step(env: RankEnv, sequence: SequenceState, case: SequenceCase, index: int) -> dict[str, Any]:
    if index == 0:
        sequence.reset(env.device)
        for spec in env.specs():
            sequence.backends[spec.name] = BackendState(spec, get_adapter(spec).module)
    return {name: _step_in_step(env, state, case, index) for name, state in sequence.backends.items()}


def _step_in_step(env: RankEnv, state: BackendState, case: SequenceCase, index: int) -> Any:
    """One backend's part of step ``index``, ended on every rank together: its result, or its :class:`StepRaised`
    (every rank knows it; the later steps are :class:`NotMade`), so that the other backends' steps go on."""
    name = state.spec.name
    if state.failed is not None:
        return NotMade(name, state.failed.step)
    operation = f"step {index} {case.steps[index].op}"
    error: BaseException | None = None
    result: Any = None
    with backend_context(name, operation):
        try:
            result = _step_or_unsupported(env, state, case, index)
        except Exception as exc:  # judged by the controller (the backend's failure, or a suite error)
            error = exc
        ranks, error = settle(env.device, name, operation, error)
    if not ranks:
        return result
    own = None if error is None else "".join(traceback.format_exception(error))
    state.failed = StepRaised(name, index, ranks, own, suite_frame(error))
    return state.failed


def _step_or_unsupported(env: RankEnv, state: BackendState, case: SequenceCase, index: int) -> Any:
    """:func:`apply_step`, or the backend's NotChecked result from the step a known limit refused on."""
    if state.unsupported is not None:
        return state.unsupported
    try:
        return apply_step(env, state, case, index)
    except NotSupported as exc:  # a set-up limit (tasks.setup): the rest of the sequence is not made either
        state.unsupported = NotChecked.example(state.spec.name, exc.why, f"{state.spec.name} step {index}", str(exc),
                                               getattr(exc, "condition", ""))
        return state.unsupported
    except Exception as exc:
        if suite_frame(exc) is not None:  # the suite's own error is never a known limit
            raise
        state.unsupported = declined(state.spec, case.steps[index].op, exc)
        if state.unsupported is not None:
            return state.unsupported
        step = case.steps[index]
        examples = [step.example, case.steps[step.ref].example if step.ref >= 0 else None]
        example = next((e for e in examples if e is not None), case.base_example())  # the step's, its dispatch's
        state.unsupported = limited(state.spec, ("dispatch", "combine", "destroy"), example, exc)
        if state.unsupported is None:
            raise
        return state.unsupported


@rank_task
def sequence_step(env: RankEnv) -> dict[str, Any]:
    """Step ``index`` of the sequence ``case`` (``env.case`` is ``(case, index)``); step 0 starts a new sequence
    (completes and destroys what the previous one left).  Per backend: what the step returns."""
    case, index = env.case
    return _run_step(env, _state(), case, index)


@rank_task
def sequence_end(env: RankEnv) -> None:
    """End the running sequence: complete outstanding work, destroy its buffers."""
    _state().reset(env.device)


@rank_task
def run_sequence(env: RankEnv) -> list[dict[str, Any]]:
    """The whole sequence ``env.case`` at once (replays, the kill matrix): per step, per backend, its result."""
    case: SequenceCase = env.case
    sequence = _state()
    try:
        return [_run_step(env, sequence, case, index) for index in range(len(case.steps))]
    finally:
        sequence.reset(env.device)
