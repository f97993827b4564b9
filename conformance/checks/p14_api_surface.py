"""P14 API surface: each installed API's import probe and method signatures against the committed snapshot
of the real DeepEP 2.1.0 (conformance/data/api-surface).  Runs once per session (its strategy yields one case)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from conformance.api_surface import SNAPSHOT, changes_as_json, diff_surface, load_snapshot
from conformance.checks.registry import register


@dataclass(frozen=True)
class ApiSurfaceCase:
    """The trivial case of P14: which snapshot to compare against, for a world of ``world_size`` ranks."""

    world_size: int
    snapshot: str = SNAPSHOT.name

    def to_json(self) -> str:
        """One-line JSON."""
        return json.dumps({"world_size": self.world_size, "snapshot": self.snapshot}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> ApiSurfaceCase:
        """Inverse of :meth:`to_json`."""
        return cls(**json.loads(text))

    def validate(self) -> None:
        """Raise ``ValueError`` unless the snapshot exists and the world is not empty."""
        if self.world_size < 1 or not (SNAPSHOT.parent / self.snapshot).is_file():
            raise ValueError(f"invalid API-surface case {self}")


@register("P14-api-surface", case=ApiSurfaceCase)
def check_api_surface(session, case: ApiSurfaceCase) -> None:  # noqa: ANN001 - conformance.session.Session
    """Every rank sees the same surface; each module's surface (attached to the report) has no breaking
    change against the snapshot (renamed/removed arguments or methods fail; added optional ones are
    reported in the artifacts and pass)."""
    __tracebackhide__ = True
    snapshot = load_snapshot(SNAPSHOT.parent / case.snapshot)
    per_rank = session.run("conformance.api_surface:surface_task")
    for rank, surfaces in enumerate(per_rank[1:], start=1):
        if surfaces != per_rank[0]:
            raise AssertionError(f"rank {rank} sees a different API surface than rank 0 [import probe + signatures]")
    failures = []
    for module, surface in per_rank[0].items():
        changes = diff_surface(snapshot, surface)
        session.record_artifact(f"api-surface:{module}", {"surface": surface, "snapshot": case.snapshot,
                                                          "changes": changes_as_json(changes)})
        failures += [f"{module}: {c.where}: {c.kind} ({c.detail})" for c in changes if c.breaking]
    if failures:
        raise AssertionError(
            f"API surface differs from {case.snapshot} in {len(failures)} breaking way(s): " + "; ".join(failures[:8])
            + " [inspect.signature of Buffer/ElasticBuffer/EPHandle/EventOverlap, import probe]"
        )
