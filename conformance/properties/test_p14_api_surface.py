"""P14 API surface: each installed API's import probe and method signatures against the committed snapshot of the
DeepEP version under test (conformance/versions/<version>/api-surface.json: 2.1.0's and 2.5.0's recorded on the real
library).  Runs once per session (its strategy yields one case)."""

from __future__ import annotations

from typing import Any

from conformance.core.api_surface import changes_as_json, diff_surface, load_snapshot, snapshot_path
from conformance.core.cases import ApiSurfaceCase
from conformance.properties import CheckContext, Property, register
from conformance.strategies import sized
from conformance.strategies.calls import api_surface_cases
from conformance.tasks.surface import surfaces


def check(ctx: CheckContext, case: ApiSurfaceCase, per_rank: list[dict[str, Any]]) -> None:
    """Every rank sees the same surface; each module's surface (attached to the report) has no breaking
    change against the snapshot (renamed/removed arguments or methods fail; added optional ones are
    reported in the artifacts and pass)."""
    __tracebackhide__ = True
    snapshot = load_snapshot(snapshot_path(case.snapshot))
    for rank, surface in enumerate(per_rank[1:], start=1):
        if surface != per_rank[0]:
            raise AssertionError(f"rank {rank} sees a different API surface than rank 0 [import probe + signatures]")
    failures = []
    for module, surface in per_rank[0].items():
        changes = diff_surface(snapshot, surface)
        ctx.record_artifact(f"api-surface:{module}", {"surface": surface, "snapshot": case.snapshot,
                                                          "changes": changes_as_json(changes)})
        failures += [f"{module}: {c.where}: {c.kind} ({c.detail})" for c in changes if c.breaking]
    if failures:
        raise AssertionError(
            f"API surface differs from {case.snapshot} in {len(failures)} breaking way(s): " + "; ".join(failures[:8])
            + " [inspect.signature of Buffer/ElasticBuffer/EPHandle/EventOverlap, import probe]"
        )


PROPERTY = register(Property(
    id="P14-api-surface",
    title="import probe and method signatures against a snapshot of the real API",
    strategy=sized(api_surface_cases), task=surfaces, check=check, case_type=ApiSurfaceCase,
    needs=("api_surface",), runs_when_broken=True, shapes="free",
))
test_api_surface = PROPERTY.test
