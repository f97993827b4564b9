"""A world that dies outside a property's examples (while idle, or in the suite's own library-call drain) is said in
the property's report entry and the report's headline: never a silent restart (tests/nocover/test_multihost.py kills a
node agent at a random moment; this is the moment between examples, made deterministic with a stand-in world)."""

from __future__ import annotations

from types import SimpleNamespace

from conformance.core.spec import parse_backends
from conformance.harness.config import RunConfig
from conformance.harness.session import Session
from conformance.reporting.report import entry_from_report, headline
from conformance.world.errors import RankCrashed
from conformance.world.launcher import WorldShape


class _DeadWorld:
    alive = True  # a remote node's death is seen only when a task is sent

    def run(self, *args, **kwargs):
        raise RankCrashed("conformance.tasks.drain:drain", {1: "its node agent on host nsB is gone: the node died"},
                          hosts={0: "nsA", 1: "nsB"})

    def kill(self) -> None:
        pass

    def close(self) -> None:
        pass


def _session() -> Session:
    session = Session(RunConfig(WorldShape(1, 2), tuple(parse_backends("emulated", False)), "cpu", 120.0))
    session._world = _DeadWorld()
    session.recorder.property_id = "P5-combine"
    return session


def test_a_world_lost_in_the_drain_is_said_in_the_entry_and_the_headline() -> None:
    session = _session()
    session.collect_api_calls()
    recorded = session.recorder.as_dict()
    assert "after the property's examples" in recorded["world_lost"], recorded["world_lost"]
    assert "host nsB" in recorded["world_lost"], recorded["world_lost"]
    assert session.budget.run_restarts == 1  # a restart the run pays for like any other
    report = SimpleNamespace(user_properties=[("conformance", recorded)], failed=False, skipped=False,
                             nodeid="conformance/properties/test_p05_combine.py::test_p05")
    entry = entry_from_report(report, session.config)
    assert entry.status == "passed" and entry.message == recorded["world_lost"]
    assert any("P5-combine: the world was lost" in line for line in headline([entry]))


def test_a_world_lost_before_the_first_example_is_said_too() -> None:
    session = _session()
    session.collect_api_calls(keep=False)
    assert "before the property's first example" in session.recorder.world_lost
