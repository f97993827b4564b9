"""A property that stops drawing (a known defect retired the world on enough examples) after one of its examples
failed still fails.  On the real library (run 33a, one H100): P23's first example crashed real-v1 outside any known
defect, then Hypothesis, replaying that failure, met the known defect twice; the stop took the failure's place and
pytest passed the test while the report's column said ``failed`` with no message.  Driven here without a world: a
stand-in session whose first example fails and whose later ones end in the stop."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import strategies as st

from conformance.core.example import Example
from conformance.harness.config import RunConfig
from conformance.harness.driver import _draw
from conformance.harness.faults import FaultBudget, KnownDefectStop
from conformance.harness.session import Recorder
from conformance.properties import Property
from conformance.world.launcher import WorldShape

EXAMPLE = Example(tokens_per_rank=(1, 1), hidden=256, num_topk=1, num_experts=2)


class StoppingSession:
    """``check`` fails the first case (charged to ``emulated-v1``), then raises the stop on every later one (unless
    ``fail_first`` is off: then every case ends in the stop)."""

    def __init__(self, fail_first: bool) -> None:
        self.config = RunConfig(WorldShape(1, 2), (), max_examples=5, seed=1)
        self.recorder, self.mutant, self.fail_first = Recorder(), None, fail_first

    def check(self, property_id: str, case: int) -> None:
        recorder = self.recorder
        recorder.examples += 1
        recorder.last_example = SimpleNamespace(case=case, to_json=lambda: str(case))
        recorder.tally.start(("emulated-v1",), [])
        if self.fail_first and recorder.examples == 1:
            recorder.tally.failed(("emulated-v1",), "emulated-v1: planted crash in Buffer.__init__")
            recorder.failing_example = recorder.last_example
            raise AssertionError("planted crash in Buffer.__init__")
        recorder.tally.known_defect(("emulated-v1",), "planted-defect")
        raise KnownDefectStop("planted-defect", recorder.examples - int(self.fail_first))

    def progress(self, property_id: str, examples: int) -> None:
        pass


PROP = Property(id="P99-stand-in", title="stand-in", strategy=lambda shape: st.integers(0, 100), task=None,
                check=None, shapes="free")


def test_a_failure_before_the_stop_fails_the_property_with_its_case() -> None:
    session = StoppingSession(fail_first=True)
    with pytest.raises(pytest.fail.Exception) as failed:
        _draw(session, PROP, None, session.recorder, FaultBudget(3))
    message = str(failed.value)
    assert "emulated-v1" in message and "planted crash" in message and "stopped drawing" in message, message
    assert session.recorder.stopped and session.recorder.last_example is session.recorder.failing_example
    assert session.recorder.tally.columns["emulated-v1"].failed == 1


def test_a_stop_without_a_failure_ends_the_property_as_counted() -> None:
    session = StoppingSession(fail_first=False)
    _draw(session, PROP, None, session.recorder, FaultBudget(3))
    assert session.recorder.stopped and session.recorder.tally.columns["emulated-v1"].verdict() == "known-defect"
