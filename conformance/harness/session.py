"""The controller's view of a run: the world, the backends, and what the current test recorded."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from conformance.core.example import Example
from conformance.core.spec import CAPABILITIES
from conformance.core.views import Unsupported
from conformance.harness.config import RunConfig
from conformance.harness.faults import FaultBudget, cause_of
from conformance.properties import NotApplicable, Property, catalog
from conformance.tasks.env import TaskSettings
from conformance.world.errors import RankFailure
from conformance.world.launcher import World, WorldShape


@dataclass
class Recorder:
    """What one property test saw: example count, the last example, divergences, unsupported configs."""

    property_id: str | None = None
    examples: int = 0
    last_example: Any = None  # an Example or another case type (conformance.core.cases)
    divergences: dict[str, str] = field(default_factory=dict)
    unsupported: dict[str, dict[str, Any]] = field(default_factory=dict)
    artifacts: dict[str, Any] = field(default_factory=dict)  # JSON-able snapshots attached to the report
    rejected: dict[str, set[str]] = field(default_factory=dict)  # backend -> examples it rejected
    cause: dict[str, Any] | None = None  # why the property failed when a crash or hang stopped it
    not_applicable: str | None = None  # why the property could not be checked with the selected backends
    excluded: dict[str, str] = field(default_factory=dict)  # backend -> why the property does not apply to it
    not_checked: dict[str, list[str]] = field(default_factory=dict)  # backend -> parts of the check it cannot take
    failing: list[str] = field(default_factory=list)  # backends the last failing assertion was about
    seen: dict[str, Any] = field(default_factory=dict)  # backend -> the deep_ep it drove (construction preflight)
    distinct: set[str] = field(default_factory=set)  # the distinct cases checked
    started: float = field(default_factory=time.monotonic)

    def as_dict(self) -> dict[str, Any]:
        """JSON-able form, carried from xdist workers to the controller in ``user_properties``."""
        return {
            "id": self.property_id,
            "examples": self.examples,
            "last_example": self.last_example.to_json() if self.last_example else None,
            "divergences": self.divergences,
            "unsupported": self.unsupported,
            "artifacts": self.artifacts,
            "cause": self.cause,
            "not_applicable": self.not_applicable,
            "excluded": self.excluded,
            "not_checked": self.not_checked,
            "failing": self.failing,
            "seen": self.seen,
            "distinct_examples": len(self.distinct),
            "wall_s": round(time.monotonic() - self.started, 3),
        }


class Session:
    """One per pytest(-xdist) worker: owns the world and runs checks against it."""

    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.recorder = Recorder()
        self.mutant = config.mutant
        self.budget = FaultBudget(config.max_restarts)
        self._world: World | None = None
        self._broken: dict[str | None, dict[str, dict[str, Any]]] = {}  # mutant -> backend -> cause
        self.seen: dict[str, Any] = {}  # backend -> which deep_ep it drove on rank 0 (construction preflight)

    @contextlib.contextmanager
    def planted(self, mutant: str | None) -> Iterator[None]:
        """Run with ``mutant`` planted in the ranks (self-tests); the world is reused."""
        previous, self.mutant = self.mutant, mutant
        try:
            yield
        finally:
            self.mutant = previous

    @property
    def world(self) -> World:
        """The rank world, started on first use and restarted after a failure."""
        if self._world is None:
            self._world = World(
                self.config.shape, device=self.config.device, gpu_ids=self.config.gpu_ids, env=self.config.rank_env,
                rank_setup=self.config.rank_setup,
            )
        return self._world

    def close(self) -> None:
        """Shut the world down."""
        if self._world is not None:
            self._world.close()
            self._world = None

    @property
    def shape(self) -> WorldShape:
        """The world's shape (nodes x ranks per node)."""
        return self.config.shape

    def excluded(self, prop: Property) -> dict[str, str]:
        """The selected backends ``prop`` does not apply to, with the reason (another API, a missing capability)."""
        out: dict[str, str] = {}
        apis = " or ".join(f"{api} ({'ElasticBuffer' if api == 'v2' else 'Buffer'})" for api in prop.apis)
        for b in self.config.backends:
            if b.api not in prop.apis:
                out[b.name] = f"{prop.id} checks the {apis} contract and {b.name} follows {b.api} ({b.class_name})"
            elif b.lacks(prop.needs):
                missing = b.lacks(prop.needs)
                out[b.name] = (f"{b.name} does not declare the capabilit{'ies' if len(missing) > 1 else 'y'} "
                               + ", ".join(f"'{m}' ({CAPABILITIES[m]})" for m in missing) + f" that {prop.id} needs")
        return out

    def settings_for(self, prop: Property, include_broken: bool = False) -> TaskSettings:
        """The task settings of ``prop``: the selected backends of the APIs it exercises that declare the capabilities
        it needs, the planted mutant.  The others are recorded (``recorder.excluded``) with the reason.  Backends
        the construction preflight found broken are left out too (their failure is reported by the driver), unless
        ``include_broken``.

        Raises :class:`NotApplicable` when no selected backend is left."""
        excluded = self.excluded(prop)
        broken = () if include_broken else self._broken.get(self.mutant, {})
        specs = tuple(b for b in self.config.backends if b.name not in excluded and b.name not in broken)
        self.recorder.excluded = dict(excluded)
        if not specs:
            raise NotApplicable("; ".join(excluded.values()) or f"{prop.id}: --backends selected no backend")
        return TaskSettings(specs, self.mutant)

    def run(self, task: Callable[..., Any], case: Any, settings: TaskSettings | None = None) -> list[Any]:
        """Run the rank ``task`` on ``case`` with the per-example timeout; per-rank results."""
        settings = settings or TaskSettings(tuple(self.config.backends), self.mutant)
        return self.world.run(task, settings, case, timeout=self.config.example_timeout_s)

    def check(self, property_id: str, case: Any) -> None:
        """Run property ``property_id`` on one case: its task on the ranks, then its check here."""
        prop = catalog()[property_id]
        settings = self.settings_for(prop)
        self.recorder.property_id = property_id
        self.recorder.examples += 1
        self.recorder.last_example = case
        self.recorder.failing = []
        self.recorder.distinct.add(case.to_json())
        prop.check(self, case, self.world.run(prop.task, settings, case, timeout=self.config.example_timeout_s))

    def run_property(self, prop: Property) -> None:
        """The body of every property test: draw cases and check them (see :mod:`conformance.harness.driver`)."""
        from conformance.harness.driver import run_property

        run_property(self, prop)

    def broken_backends(self) -> dict[str, dict[str, Any]]:
        """Backends whose buffer construction crashes, hangs or raises (backend -> cause), found once per mutant
        by building one small buffer per backend on the ranks (see :mod:`conformance.harness.faults`)."""
        if self.mutant not in self._broken:
            from conformance.tasks.preflight import construct

            world_size = self.config.world_size
            example = Example(tokens_per_rank=(0,) * world_size, hidden=256, num_topk=1, num_experts=world_size,
                              num_max_tokens_per_rank=16)
            broken: dict[str, dict[str, Any]] = {}
            for backend in self.config.backends:
                try:
                    built = self.run(construct, example, TaskSettings((backend,), self.mutant))
                    self.seen[backend.name] = built[0]["deep_ep"]
                except RankFailure as failure:
                    self.budget.run_restarts += 1
                    broken[backend.name] = cause_of(failure, backend.name)
            self._broken[self.mutant] = broken
        return self._broken[self.mutant]

    # ------------------------------------------------------------------------------------- recording
    def record_unsupported(self, item: Unsupported, case: Any) -> None:
        """Remember that a backend rejected a configuration (reported as ``unsupported``).

        Called once per rank; ``count`` is the number of distinct cases rejected.
        """
        text = case.to_json()
        entry = self.recorder.unsupported.setdefault(
            item.backend, {"call": item.call, "error": item.error, "count": 0, "example": text}
        )
        seen = self.recorder.rejected.setdefault(item.backend, set())
        if text not in seen:
            seen.add(text)
            entry["count"] += 1

    def record_artifact(self, key: str, value: Any) -> None:
        """Attach a JSON-able artifact (e.g. an API-surface snapshot) to the property's report entry."""
        self.recorder.artifacts[key] = value

    def record_not_checked(self, backend: str, what: str) -> None:
        """Remember a part of the check that ``backend`` cannot take (it lacks the capability): listed under
        ``not_checked`` in the report, with the backend's verdict."""
        reasons = self.recorder.not_checked.setdefault(backend, [])
        if what not in reasons:
            reasons.append(what)

    def record_failing(self, backends: list[str]) -> None:
        """Remember which backend(s) the failing assertion was about (the report's per-backend verdicts)."""
        self.recorder.failing = list(backends)

    def record_divergence(self, key: str, message: str) -> None:
        """Remember a documented behavioural divergence (reported as ``divergence``, not a failure)."""
        self.recorder.divergences[key] = message
