"""What Hypothesis draws for a property: an :class:`~conformance.core.example.Example`, or a richer case.

A case is plain frozen data that travels to the ranks and back into reports.  Every case type has the same
small protocol: ``to_json()``, ``from_json(text)`` (classmethod), ``world_size`` and ``validate()``; the
property registry names each property's case type so that ``conformance.repro`` can rebuild a case from a
report line.  Richer cases hold an example plus how the property calls the library with it
(:class:`ExampleCase` gives them the protocol).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, ClassVar

from conformance import versions
from conformance.core.api_surface import snapshot_path
from conformance.core.example import Example


@dataclass(frozen=True)
class ExampleCase:
    """Base of the cases that hold an ``example`` plus plain call parameters."""

    example: Example

    @property
    def world_size(self) -> int:
        """Number of ranks the case is written for."""
        return self.example.world_size

    def to_json(self) -> str:
        """One-line JSON (the example nested as an object)."""
        fields = dataclasses.asdict(self)
        fields["example"] = self.example.to_dict()
        return json.dumps(fields, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Any:
        """Inverse of :meth:`to_json`."""
        fields = json.loads(text)
        fields["example"] = Example.from_dict(fields["example"])
        return cls(**fields)

    def validate(self) -> None:
        """Raise ``ValueError`` unless the case is valid."""
        self.example.validate()


@dataclass(frozen=True)
class CombineCase(ExampleCase):
    """How P5 calls combine: ``num_bias`` bias tensors (0, 1 or 2), the comparison mode, and V1's configs.

    ``exact``: integer payloads and biases (``wide`` ones in P5's draws, see ``core.example.wide_integers``), every
    float32 sum exact in any order -> byte-exact against the library's reduction tree.
    ``bounded``: random payloads -> within the derived float32-accumulation bound (``oracle.bounds``).
    """

    MODES: ClassVar[tuple[str, ...]] = ("exact", "bounded")
    num_bias: int = 0
    mode: str = "exact"
    #: V1: dispatch and combine with explicit configs, the library's table entries built with this SM count (even,
    #: at least 4: the internode kernels need two channels); 0: the default configs (20 SMs)
    v1_num_sms: int = 0

    def validate(self) -> None:
        """Raise ``ValueError`` unless the case is valid."""
        super().validate()
        if self.num_bias not in (0, 1, 2):
            raise ValueError(f"num_bias={self.num_bias} must be 0, 1 or 2")
        if self.mode not in self.MODES:
            raise ValueError(f"mode={self.mode!r} must be one of {self.MODES}")
        if self.mode == "exact" and self.example.payload not in ("integers", "wide"):
            raise ValueError("mode 'exact' needs payload='integers' or 'wide' (exactly summable values)")
        if self.example.payload == "special":
            raise ValueError("combine sums payloads: NaN/Inf payloads have no meaningful sum to compare")
        if self.v1_num_sms and (self.v1_num_sms < 4 or self.v1_num_sms % 2 or self.v1_num_sms > 132):
            raise ValueError(f"v1_num_sms={self.v1_num_sms} must be 0 or an even count in 4..132")


@dataclass(frozen=True)
class BufferOptionsCase(CombineCase):
    """How P21 builds the V2 buffers and calls combine: the constructor's ``prefer_overlap_with_compute`` (every case
    runs both ``allow_multiple_reduction`` values, each with a plain and an expand-mode dispatch and combine), and
    P5's ``num_bias`` / ``mode``.  ``size_tokens`` / ``size_hidden`` / ``size_topk``: a second, production-sized
    shape ``get_buffer_size_hint`` is asked about (the example's own fits in the 2 MiB alignment)."""

    prefer_overlap_with_compute: bool = True
    size_tokens: int = 4096
    size_hidden: int = 7168
    size_topk: int = 8

    def validate(self) -> None:
        """Raise ``ValueError`` unless the case is valid."""
        super().validate()
        if self.size_tokens < 1 or self.size_hidden < 32 or self.size_hidden % 32 or not 0 <= self.size_topk <= 32:
            raise ValueError(f"the sizing shape needs tokens >= 1, hidden a positive multiple of 32 and top-k in "
                             f"0..32 (0: sized for 32): {self}")


@dataclass(frozen=True)
class QpCase(ExampleCase):
    """How P11 calls V2: the dispatch SM count (0 = automatic; combine then passes ``num_sms=0``), how many QPs
    above ``num_allocated_qps`` the over-asking dispatch requests, how many tokens above the pinned maximum
    the offending rank sends, and which rank offends (it also disagrees in the preflight).

    The explicit buffer: ``ElasticBuffer(num_bytes=hint + extra_bytes + num_cpu_bytes, num_cpu_bytes=...,
    num_allocated_qps=num_allocated_qps)`` (sizes in bytes, multiples of 2 MiB).  The bandwidths (GB/s) are
    passed to ``get_theoretical_num_sms``."""

    num_sms: int = 0
    over_qps: int = 1
    over_tokens: int = 1
    offender: int = 0
    num_allocated_qps: int = 1
    extra_bytes: int = 0
    num_cpu_bytes: int = 0
    rdma_gbs: float = 50.0
    nvlink_gbs: float = 450.0
    sm_read_gbs: float = 200.0
    sm_write_gbs: float = 50.0

    #: ``symmetric::kNumAlignmentBytes``: explicit buffer sizes are multiples of it (csrc/elastic/buffer.hpp:98).
    ALIGNMENT: ClassVar[int] = 2 * 1024 * 1024

    def validate(self) -> None:
        """Raise ``ValueError`` unless the case is valid."""
        super().validate()
        if self.num_sms < 0 or self.num_sms % 2:
            raise ValueError(f"num_sms={self.num_sms} must be 0 or a positive even count")
        if self.over_qps < 1 or self.over_tokens < 1 or not 0 <= self.offender < self.world_size:
            raise ValueError(f"over_qps/over_tokens must be >= 1 and offender a rank: {self}")
        if self.num_allocated_qps < 1:
            raise ValueError(f"num_allocated_qps={self.num_allocated_qps} must be an explicit count (>= 1)")
        if any(b < 0 or b % self.ALIGNMENT for b in (self.extra_bytes, self.num_cpu_bytes)):
            raise ValueError(f"extra_bytes / num_cpu_bytes must be non-negative multiples of 2 MiB: {self}")
        if min(self.rdma_gbs, self.nvlink_gbs, self.sm_read_gbs, self.sm_write_gbs) <= 0:
            raise ValueError(f"bandwidths must be positive (0 asks the hardware): {self}")


#: Statuses of the refusal-table rows the emulation reproduces: each has a recipe (``conformance/tasks/refusals``).
LIVE_STATUSES = ("emulated", "emulated-differently")
#: The recipe topologies P12 draws: recipes made on one node, as on the real library's intranode path.  The V1
#: internode (emulated nodes; the library takes that path with more than 8 ranks only), V2 hybrid and one-rank
#: recipes are the emulation's self-tests (tests/nocover/test_refusals.py).
P12_TOPOLOGIES = ("any", "single", "v1-intranode")
#: The API of a refusal-table row, by the class its ``call`` names (``EPBuffer``: DeepEP 2.5.0's V2).
_API_OF_CLASS = {"Buffer": "v1", "Config": "v1", "ElasticBuffer": "v2", "EPBuffer": "v2", "EPHandle": "v2",
                 "EventOverlap": "utils"}


def row_api(row: dict[str, Any]) -> str:
    """The API of refusal-table row ``row``, ``v1``, ``v2`` or ``utils``: the class its ``call`` names."""
    return _API_OF_CLASS[row["call"].split(".")[0]]


def p12_rows(version: str | None = None) -> dict[str, dict[str, Any]]:
    """The rows of a DeepEP version's refusal table (``conformance/versions/<version>/refusals.toml``; default: the
    version under test, ``versions.under_test()``) P12 draws, by id: the live rows whose recipe's ``topology`` is one
    of :data:`P12_TOPOLOGIES` and that name no ``self_test_only`` reason."""
    table = (versions.contract(version) if version else versions.under_test()).refusals
    return {rid: dict(row) for rid, row in table.rows.items()
            if row["status"] in LIVE_STATUSES and row.get("topology", "any") in P12_TOPOLOGIES
            and "self_test_only" not in row}


@dataclass(frozen=True)
class BadCallCase(ExampleCase):
    """P12: an example, and the refusal-table rows whose bad calls (and valid neighbours) are made with it."""

    rows: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, text: str) -> Any:
        """Inverse of :meth:`to_json`."""
        case = super().from_json(text)
        return dataclasses.replace(case, rows=tuple(case.rows))

    def validate(self) -> None:
        """Raise ``ValueError`` unless the example is valid and every row is one P12 draws."""
        super().validate()
        unknown = sorted(set(self.rows) - set(p12_rows()))
        if not self.rows or unknown:
            raise ValueError(f"rows must be refusal-table rows drawn by P12; unknown: {unknown or 'none given'}")


@dataclass(frozen=True)
class ApiSurfaceCase:
    """The trivial case of P14: which snapshot to compare against (a DeepEP version: its folder's
    ``api-surface.json``), for a world of ``world_size`` ranks."""

    world_size: int
    snapshot: str = versions.DEFAULT_VERSION

    def to_json(self) -> str:
        """One-line JSON."""
        return json.dumps({"world_size": self.world_size, "snapshot": self.snapshot}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> ApiSurfaceCase:
        """Inverse of :meth:`to_json`."""
        return cls(**json.loads(text))

    def validate(self) -> None:
        """Raise ``ValueError`` unless the snapshot exists and the world is not empty."""
        try:
            known = snapshot_path(self.snapshot).is_file()
        except versions.UnknownVersion:
            known = False
        if self.world_size < 1 or not known:
            raise ValueError(f"invalid API-surface case {self}")


def example_of(case: Any) -> Example | None:
    """The example a case is built on (the case itself when it is an :class:`Example`), or ``None``."""
    return case if isinstance(case, Example) else getattr(case, "example", None)


# ----------------------------------------------------------------------------------------------- call sequences

#: The calls a step of a call sequence (P30) makes, on every selected backend at once.
SEQUENCE_OPS = ("create", "dispatch", "cached", "combine", "wait", "grad", "destroy", "use_destroyed")
#: What ``use_destroyed`` calls on the destroyed buffer.
DESTROYED_USES = ("dispatch", "combine", "destroy")


@dataclass(frozen=True)
class Step:
    """One call of a sequence, made on every selected backend's live buffer (V1 and V2 side by side).

    Every step has an id: its position in the sequence.  ``ref`` names an earlier step: the dispatch whose handle
    a ``cached`` / ``combine`` uses, the async step a ``wait`` waits on.  ``after`` names an async step still in
    flight whose event is passed as ``previous_event`` (then the call is async and allocates on the communication
    stream, as both APIs require).  ``example`` gives a ``dispatch`` (or ``grad``) its routing and payload.
    """

    op: str
    ref: int = -1
    example: Example | None = None
    async_op: bool = False
    after: int = -1
    use: str = ""  # use_destroyed: one of DESTROYED_USES

    def to_dict(self) -> dict[str, Any]:
        """Only the fields that matter for this op (readable JSON)."""
        out: dict[str, Any] = {"op": self.op}
        if self.ref >= 0:
            out["ref"] = self.ref
        if self.example is not None:
            out["example"] = self.example.to_dict()
        if self.async_op:
            out["async_op"] = True
        if self.after >= 0:
            out["after"] = self.after
        if self.use:
            out["use"] = self.use
        return out

    @classmethod
    def from_dict(cls, fields: dict[str, Any]) -> Step:
        """Inverse of :meth:`to_dict`."""
        fields = dict(fields)
        if fields.get("example") is not None:
            fields["example"] = Example.from_dict(fields["example"])
        return cls(**fields)

    def describe(self, index: int) -> str:
        """The call as one readable line (both APIs; ``s<i>`` names step ``i``'s results)."""
        flags = ("async_finish/async_with_compute_stream=True" if self.async_op else "") + (
            f", previous_event=s{self.after}.event, allocate_on_comm_stream=True" if self.after >= 0 else "")
        flags = f", {flags.lstrip(', ')}" if flags else ""
        if self.op == "create":
            return f"s{index} = Buffer(group, ...) and ElasticBuffer(group, ...)  # (re-)create the live buffers"
        if self.op == "dispatch":
            ex = self.example
            assert ex is not None
            return (f"s{index} = dispatch(x, topk_idx, topk_weights{flags})  # tokens_per_rank="
                    f"{list(ex.tokens_per_rank)}, routing={ex.routing}, mask_ratio={ex.mask_ratio}, "
                    f"payload={ex.payload}, seed={ex.seed}, expert_alignment={ex.expert_alignment}")
        if self.op == "cached":
            return f"s{index} = dispatch(x2, handle=s{self.ref}.handle{flags})  # cached, another payload"
        if self.op == "combine":
            return f"s{index} = combine(s{self.ref}.recv_x, s{self.ref}.handle{flags})  # identity experts"
        if self.op == "wait":
            return f"s{self.ref}.event.current_stream_wait(); read s{self.ref}"
        if self.op == "grad":
            ex = self.example
            assert ex is not None
            return (f"s{index} = backward(combine(dispatch(x)))  # autograd round trip, tokens_per_rank="
                    f"{list(ex.tokens_per_rank)}, seed={ex.seed}")
        if self.op == "destroy":
            return "buffer.destroy()  # both buffers; their handles die with them"
        if self.op == "use_destroyed":
            what = {"dispatch": "dispatch(x, ...)", "combine": "combine(x, handle of the destroyed buffer)",
                    "destroy": "destroy() again"}[self.use]
            return f"destroyed_buffer.{what}  # must raise cleanly (or, V2 destroy, do nothing)"
        return f"{self.op}(?)"


@dataclass(frozen=True)
class SequenceCase:
    """P30: a call sequence on buffers of one shape (``hidden``, top-k, experts, pinned maximum), V1 and V2 side
    by side.  The first step creates the buffers."""

    world_size: int
    hidden: int
    num_topk: int
    num_experts: int
    num_max_tokens_per_rank: int
    steps: tuple[Step, ...] = ()

    def base_example(self) -> Example:
        """An example of the sequence's shape (no tokens): what buffers are built for."""
        return Example(tokens_per_rank=(0,) * self.world_size, hidden=self.hidden, num_topk=self.num_topk,
                       num_experts=self.num_experts, num_max_tokens_per_rank=self.num_max_tokens_per_rank)

    def then(self, step: Step) -> SequenceCase:
        """This sequence with ``step`` appended."""
        return dataclasses.replace(self, steps=self.steps + (step,))

    def calls(self) -> list[str]:
        """The sequence as readable calls, one per step (the report prints them)."""
        return [f"{i}. {step.describe(i)}" for i, step in enumerate(self.steps)]

    def to_json(self) -> str:
        """One-line JSON; ``calls`` (the readable listing) is ignored when read back."""
        fields = {name: getattr(self, name) for name in
                  ("world_size", "hidden", "num_topk", "num_experts", "num_max_tokens_per_rank")}
        fields["steps"] = [step.to_dict() for step in self.steps]
        fields["calls"] = self.calls()
        return json.dumps(fields, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> SequenceCase:
        """Inverse of :meth:`to_json`."""
        fields = json.loads(text)
        fields.pop("calls", None)
        fields["steps"] = tuple(Step.from_dict(s) for s in fields["steps"])
        return cls(**fields)

    def validate(self) -> None:
        """Raise ``ValueError`` unless every step is well formed for its place in the sequence."""
        self.base_example().validate()
        if not self.steps or self.steps[0].op != "create":
            raise ValueError("a call sequence starts with 'create'")
        for i, step in enumerate(self.steps):
            if step.op not in SEQUENCE_OPS:
                raise ValueError(f"step {i}: unknown op {step.op!r}")
            if not -1 <= step.ref < i or not -1 <= step.after < i:
                raise ValueError(f"step {i}: ref/after must name an earlier step")
            if step.example is not None:
                step.example.validate()
                if (step.example.hidden, step.example.num_topk, step.example.num_experts,
                        step.example.num_max_tokens_per_rank, step.example.world_size) != (
                        self.hidden, self.num_topk, self.num_experts, self.num_max_tokens_per_rank, self.world_size):
                    raise ValueError(f"step {i}: the example does not have the sequence's shape")
            if step.op == "use_destroyed" and step.use not in DESTROYED_USES:
                raise ValueError(f"step {i}: use must be one of {DESTROYED_USES}")


@dataclass(frozen=True)
class BackToBackCase(ExampleCase):
    """P28: rounds of a dispatch then a combine on one buffer per backend, issued back to back (no barrier between
    them).  The first round is ``example``; each later one is ``example`` with that round's ``later_tokens`` (clamped
    to the pinned maximum, so a case snapped to a smaller shape stays valid), payloads from ``seed + round``, the
    drawn routing refitted (``Example.reshaped``).  In round ``i`` rank ``late[i]`` (-1: none) sleeps ``delay_ms``
    before its dispatch, while the others are already in theirs."""

    DELAYS_MS: ClassVar[tuple[int, ...]] = (100, 20, 0)
    later_tokens: tuple[tuple[int, ...], ...] = ()
    late: tuple[int, ...] = (-1,)
    delay_ms: int = 0

    @classmethod
    def from_json(cls, text: str) -> Any:
        """Inverse of :meth:`to_json`."""
        case = super().from_json(text)
        return dataclasses.replace(case, later_tokens=tuple(tuple(t) for t in case.later_tokens),
                                   late=tuple(case.late))

    @property
    def num_rounds(self) -> int:
        return 1 + len(self.later_tokens)

    def rounds(self) -> list[Example]:
        """The example of every round, in order."""
        cap = self.example.num_max_tokens_per_rank
        out = [self.example]
        for i, tokens in enumerate(self.later_tokens, 1):
            shaped = self.example.reshaped(tokens_per_rank=tuple(min(t, cap) for t in tokens))
            out.append(dataclasses.replace(shaped, seed=(self.example.seed + i) % 2**32))
        return out

    def validate(self) -> None:
        """Raise ``ValueError`` unless every round is a valid example of the world and the late ranks are ranks."""
        super().validate()
        for tokens in self.later_tokens:
            if len(tokens) != self.world_size or min(tokens, default=0) < 0:
                raise ValueError(f"later_tokens has {tokens}: one count of 0 or more per rank of {self.world_size}")
        if len(self.late) != self.num_rounds or any(not -1 <= r < self.world_size for r in self.late):
            raise ValueError(f"late={self.late} must name one rank (or -1) for each of the {self.num_rounds} rounds")
        if self.delay_ms not in self.DELAYS_MS:
            raise ValueError(f"delay_ms={self.delay_ms} must be one of {self.DELAYS_MS}")
        for example in self.rounds()[1:]:
            example.validate()


@dataclass(frozen=True)
class GraphCase(ExampleCase):
    """P29: ``example``'s host-sync-free dispatch and combine captured once in a CUDA graph (on static inputs holding
    input set 0) and replayed once per entry of ``replays``, each an input set copied into the static inputs first.
    Set 0 is ``example``'s inputs; set ``i`` > 0 has the same shapes (the graph's) and payloads and routing from seed
    ``example.seed + i`` (the drawn routing pattern, not its drawn rows)."""

    MAX_SETS: ClassVar[int] = 3
    num_sets: int = 2
    replays: tuple[int, ...] = (1, 0)

    @classmethod
    def from_json(cls, text: str) -> Any:
        """Inverse of :meth:`to_json`."""
        case = super().from_json(text)
        return dataclasses.replace(case, replays=tuple(case.replays))

    def input_sets(self) -> list[Example]:
        """The example of every input set, set 0 first."""
        return [self.example] + [dataclasses.replace(self.example, seed=(self.example.seed + i) % 2**32,
                                                     topk_idx=None) for i in range(1, self.num_sets)]

    def validate(self) -> None:
        """Raise ``ValueError`` unless the sets are valid examples and every replay names one."""
        super().validate()
        if not 1 <= self.num_sets <= self.MAX_SETS:
            raise ValueError(f"num_sets={self.num_sets} must be 1..{self.MAX_SETS}")
        if not self.replays or any(not 0 <= i < self.num_sets for i in self.replays):
            raise ValueError(f"replays={self.replays} must name input sets 0..{self.num_sets - 1} (at least one)")
        for example in self.input_sets()[1:]:
            example.validate()


@dataclass(frozen=True)
class SoakCase(ExampleCase):
    """P31 (soak mode): an example dispatched and combined back ``repetitions`` times on the same buffers."""

    repetitions: int = 2

    def validate(self) -> None:
        """Raise ``ValueError`` unless the case is valid."""
        super().validate()
        if self.repetitions < 1:
            raise ValueError(f"repetitions={self.repetitions} must be at least 1")


@dataclass(frozen=True)
class ShrinkCase(ExampleCase):
    """P23 (V1 shrink mode): the ranks in ``masked`` have failed, the others mask them; an unmasked rank also
    masks ``toggled`` and unmasks it again before the calls; ``hook``: the calls use receive hooks."""

    masked: tuple[int, ...] = ()
    toggled: int | None = None
    hook: bool = False

    @classmethod
    def from_json(cls, text: str) -> Any:
        """Inverse of :meth:`to_json`."""
        case = super().from_json(text)
        return dataclasses.replace(case, masked=tuple(case.masked))

    def validate(self) -> None:
        """Raise ``ValueError`` unless the ranks are ranks of the world (``masked`` sorted, without repeats)."""
        super().validate()
        ranks = range(self.world_size)
        if list(self.masked) != sorted(set(self.masked)) or any(r not in ranks for r in self.masked):
            raise ValueError(f"masked={self.masked} must be distinct ranks of {self.world_size}, ascending")
        if self.toggled is not None and (self.toggled not in ranks or self.toggled in self.masked):
            raise ValueError(f"toggled={self.toggled} must be a rank that is not masked")


@dataclass(frozen=True)
class CleanCase(ExampleCase):
    """P24 (V1 ``clean_low_latency_buffer``): ``dirt_seed`` seeds the garbage written over the RDMA buffer first;
    ``hook``: the dispatch after the clean uses a receive hook."""

    dirt_seed: int = 0
    hook: bool = False


@dataclass(frozen=True)
class ExitCase(ExampleCase):
    """P25 (the end of a run): each backend's rank processes dispatch and combine the example on a fresh process
    group, end as ``scenario`` says, destroy the group and exit.

    ``teardown``: the backend's own end of a run (a plug-in's ``teardown()``: what the wrapper offers its users, if
    anything; the built-in adapters' ``destroy()`` of buffers built with ``explicitly_destroy=True``).
    ``garbage-collected`` (the built-in backends): a buffer built as a user who never destroys it builds it
    (``explicitly_destroy=False``), kept in a module global and left to the garbage collector at exit."""

    SCENARIOS: ClassVar[tuple[str, ...]] = ("teardown", "garbage-collected")
    scenario: str = "teardown"

    def validate(self) -> None:
        """Raise ``ValueError`` unless the scenario is known."""
        super().validate()
        if self.scenario not in self.SCENARIOS:
            raise ValueError(f"scenario={self.scenario!r} must be one of {self.SCENARIOS}")
