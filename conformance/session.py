"""The controller's view of a run: the world, the backends, and what the current test recorded."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from conformance.backends.views import DispatchOptions, DispatchView, Unsupported
from conformance.config import RunConfig
from conformance.example import Example
from conformance.harness.faults import FaultBudget, cause_of
from conformance.tasks.settings import TaskSettings
from conformance.world import RankFailure, World


@dataclass
class Recorder:
    """What one property test saw: example count, the last example, divergences, unsupported configs."""

    property_id: str | None = None
    examples: int = 0
    last_example: Any = None  # an Example or another case type (see conformance.checks.registry)
    divergences: dict[str, str] = field(default_factory=dict)
    unsupported: dict[str, dict[str, Any]] = field(default_factory=dict)
    artifacts: dict[str, Any] = field(default_factory=dict)  # JSON-able snapshots attached to the report
    rejected: dict[str, set[str]] = field(default_factory=dict)  # backend -> examples it rejected
    cause: dict[str, Any] | None = None  # why the property failed when a crash or hang stopped it
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
                self.config.shape, device=self.config.device, gpu_ids=self.config.gpu_ids, env=self.config.rank_env
            )
        return self._world

    def close(self) -> None:
        """Shut the world down."""
        if self._world is not None:
            self._world.close()
            self._world = None

    @property
    def settings(self) -> TaskSettings:
        """Task settings for the ranks."""
        return TaskSettings(tuple(b.name for b in self.config.backends), self.mutant)

    def run(self, target: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Run a rank task with the per-example timeout; per-rank results."""
        return self.world.run(target, self.settings, *args, timeout=self.config.example_timeout_s, **kwargs)

    def check(self, property_id: str, example: Any) -> None:
        """Run the registered check of ``property_id`` on ``example`` (the body of every property test)."""
        from conformance.checks import CHECKS

        self.recorder.property_id = property_id
        self.recorder.examples += 1
        self.recorder.last_example = example
        CHECKS[property_id](self, example)

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
                settings = TaskSettings((backend.name,), self.mutant)
                target = f"{construct.__module__}:{construct.__name__}"
                try:
                    self.world.run(target, settings, example, timeout=self.config.example_timeout_s)
                except RankFailure as failure:
                    self.budget.run_restarts += 1
                    broken[backend.name] = cause_of(failure, backend.name)
            self._broken[self.mutant] = broken
        return self._broken[self.mutant]

    # ------------------------------------------------------------------------------ shared task calls
    def dispatch_views(
        self, example: Example, options: DispatchOptions = DispatchOptions()
    ) -> list[dict[str, DispatchView | Unsupported]]:
        """Every rank's dispatch views, one per backend."""
        return self.run("conformance.tasks.dispatch:dispatch_views", example, options)

    def record_unsupported(self, item: Unsupported, example: Example) -> None:
        """Remember that a backend rejected a configuration (reported as ``unsupported``).

        Called once per rank; ``count`` is the number of distinct examples rejected.
        """
        entry = self.recorder.unsupported.setdefault(
            item.backend, {"call": item.call, "error": item.error, "count": 0, "example": example.to_json()}
        )
        seen = self.recorder.rejected.setdefault(item.backend, set())
        if example.to_json() not in seen:
            seen.add(example.to_json())
            entry["count"] += 1

    def record_artifact(self, key: str, value: Any) -> None:
        """Attach a JSON-able artifact (e.g. an API-surface snapshot) to the property's report entry."""
        self.recorder.artifacts[key] = value

    def record_divergence(self, key: str, message: str) -> None:
        """Remember a documented behavioural divergence (reported as ``divergence``, not a failure)."""
        self.recorder.divergences[key] = message
