"""A call that leaves the calling thread's current CUDA stream switched (DeepEP 2.1.0's stream_control_prologue
switches to the buffer's communication stream when ``allocate_on_comm_stream`` is set, and a refusal raised after it
returns without switching back) poisons every later call of that rank: on the real library, two ranks sharing one
H200 (docs/real-runs/2026-12-04-1xH200), P12's next dispatch and then every V2 property after it raised
``s_0.id() != s_1.id()``.  P12 reports such a row as that row's failure and makes the caller's stream current again
(``refusals.run``); any other task that leaves it switched retires the world (``rank._stream_left_switched``).
CPU machines have no CUDA streams: these tests stand fake ones in."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from conformance.core.views import Raised


@dataclass(frozen=True)
class FakeStream:
    stream_id: int


class FakeCuda:
    """torch.cuda's stream calls over fake streams (current starts on the default stream 0)."""

    def __init__(self) -> None:
        self.current = FakeStream(0)

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    def current_stream(self) -> FakeStream:
        return self.current

    def default_stream(self) -> FakeStream:
        return FakeStream(0)

    def set_stream(self, stream: FakeStream) -> None:
        self.current = stream


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
    import torch

    fake = FakeCuda()
    for name in ("is_available", "is_initialized", "current_stream", "default_stream", "set_stream"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    return fake


def test_a_recipe_that_leaves_the_stream_switched_is_reported_and_undone(fake_cuda: FakeCuda,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from conformance.tasks.refusals import registry

    def refused_after_switching(env: object) -> None:
        fake_cuda.set_stream(FakeStream(7))  # what setCurrentCUDAStream(comm_stream) does before the throw
        raise RuntimeError("Assertion exception (csrc/elastic/buffer.hpp:1254): ...")

    monkeypatch.setitem(registry.RECIPES, "planted_row", refused_after_switching)
    released = []
    env = type("Env", (), {"release": lambda self: released.append(True)})()
    kind, message, side_effect = registry.run("planted_row", env)
    assert kind == "RuntimeError" and "buffer.hpp:1254" in message
    assert side_effect is not None and "stream 7 instead of 0" in side_effect and "s_0.id() != s_1.id()" in side_effect
    assert fake_cuda.current == FakeStream(0) and released == [True]  # the caller's stream is current again


def test_a_recipe_that_leaves_the_stream_alone_has_no_side_effect(fake_cuda: FakeCuda,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from conformance.tasks.refusals import registry

    def refused(env: object) -> None:
        raise ValueError("bad")

    monkeypatch.setitem(registry.RECIPES, "planted_row", refused)
    env = type("Env", (), {"release": lambda self: None})()
    assert registry.run("planted_row", env) == ("ValueError", "bad", None)


def test_no_cuda_no_side_effect() -> None:
    from conformance.world.rank import current_cuda_stream, restore_cuda_stream

    assert current_cuda_stream() is None and restore_cuda_stream(None) is None


def test_p12_fails_the_row_whose_call_left_the_stream_switched() -> None:
    """The planted defect P12 must catch: a row refused with the table's message whose call left the stream switched
    (on the bad call, and on the valid neighbour)."""
    from conformance.core.cases import BadCallCase
    from conformance.properties.test_p12_bad_input import check
    from tests.helpers.meta import RecordingContext
    from tests.quality.test_p12_meta import case_of

    row = "v2_combine_num_sms_positive"
    case: BadCallCase = case_of(row)
    refused = Raised("RuntimeError", "Assertion exception (csrc/elastic/buffer.hpp:1198): num_sms > 0")
    leaked = "left the caller's current CUDA stream switched (stream 7 instead of 0)"

    for bad, neighbour in ((Raised(refused.type, refused.message, leaked), Raised(None, None)),
                           (refused, Raised(None, None, leaked))):
        per_rank = [{"rows": {row: {"emulated-v2": {"raised": bad, "neighbour": neighbour}}}, "after": {}}] * 2
        with pytest.raises(AssertionError, match="current CUDA stream switched") as failure:
            check(RecordingContext(), case, per_rank)
        assert row in str(failure.value) and "emulated-v2" in str(failure.value)
    clean = [{"rows": {row: {"emulated-v2": {"raised": refused, "neighbour": Raised(None, None)}}}, "after": {}}] * 2
    check(RecordingContext(), case, clean)


def test_a_task_that_leaves_the_stream_switched_retires_the_world(fake_cuda: FakeCuda) -> None:
    from conformance.world.rank import _stream_left_switched

    assert _stream_left_switched() is None
    fake_cuda.set_stream(FakeStream(3))
    said = _stream_left_switched()
    assert said is not None and "stream 3" in said and fake_cuda.current == FakeStream(0)
