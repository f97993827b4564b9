"""What a set-up cannot do on the real library (``conformance/core/setup_limits.py``) is one table, consulted by the
tasks that build buffers (P11, P12's bad calls and neighbours, P30, the recorder); and a hang in one backend's calls
is that backend's, found within the example timeout, costing one world restart (``harness/faults.py: HungBackend``).

On a CPU the set-up is simulated: a world started with ``rank_setup="shared"`` and a stand-in class that hangs the way
the real V2 did where two ranks share one GPU (``tests/helpers/class_backends.py``), once flagged as the real library's
own class (the table applies: the configuration is ``unsupported``, nothing hangs) and once as a fork (nothing applies:
its calls hang, and the harness must charge that to it alone).
"""

from __future__ import annotations

import dataclasses
import re
import time
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from conformance.core.example import Example, build_rank_inputs
from conformance.core.setup_limits import SETUP_LIMITS, SETUPS, setup_limit
from conformance.tasks import refusals
from conformance.tasks.setup import SetupLimited, guarded

#: Its module fixture (a started world) stays on one xdist worker.
pytestmark = pytest.mark.xdist_group("test_setup_limits")

LIMIT = "shared-gpu-v2-cpu-bytes"
CPU_BYTES = 2 << 20
#: The refusal-table calls the limit keeps from being made where ranks share a GPU (recipe names; ``.ok``: the
#: valid neighbour): computed below by making every V2 recipe against a stand-in library, compared with this and with
#: what the limit's ``covers`` says.
P12_LIMITED = {"v2_init_cpu_bytes_without_num_bytes.ok", "v2_init_cpu_handle_alignment",
               "v2_init_cpu_handle_alignment.ok", "v2_init_cpu_bytes_exceed", "v2_init_cpu_bytes_exceed.ok"}


def test_every_limit_names_known_set_ups_a_call_its_evidence_and_what_it_covers() -> None:
    for limit in SETUP_LIMITS:
        assert limit.setups and set(limit.setups) <= set(SETUPS), limit.id
        assert re.fullmatch(r"(Buffer|ElasticBuffer)\.\w+", limit.call), limit.call
        assert "docs/real-runs/" in limit.evidence and limit.covers and limit.checked_with, limit.id
    assert len({limit.id for limit in SETUP_LIMITS}) == len(SETUP_LIMITS)


def test_the_cpu_bytes_limit_applies_only_to_the_real_library_with_ranks_sharing_a_gpu() -> None:
    call, asked = "ElasticBuffer.__init__", {"num_bytes": 2 * CPU_BYTES, "num_cpu_bytes": CPU_BYTES}
    assert setup_limit("shared", True, call, asked).id == LIMIT
    assert setup_limit("shared", False, call, asked) is None  # the emulation (every CPU run) has no such limit
    for setup in ("isolated", "recorder"):
        assert setup_limit(setup, True, call, asked) is None  # checked with one GPU per rank
    assert setup_limit("shared", True, call, {**asked, "num_cpu_bytes": 0}) is None
    # without num_bytes the library refuses CPU bytes in Python first (the row's bad call is still made)
    assert setup_limit("shared", True, call, {"num_cpu_bytes": CPU_BYTES}) is None
    assert setup_limit("shared", True, "Buffer.__init__", asked) is None


class _Stop(Exception):
    """A stand-in library's constructor was reached (past the set-up limits)."""


class _Library:
    """A deep_ep-like module whose constructors are reached only past the set-up limits: they stop the recipe."""

    class ElasticBuffer:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise _Stop

    Buffer = ElasticBuffer


def _made_against_the_stand_in(setup: str, real: bool, monkeypatch) -> set[str]:
    """The V2 recipes (and neighbours) of the refusal table that a set-up limit keeps from being made."""
    monkeypatch.setenv("CONFORMANCE_RANK_SETUP", setup)
    example = Example(tokens_per_rank=(4, 4), hidden=256, num_topk=2, num_experts=4, num_max_tokens_per_rank=16)
    env = refusals.BadCallEnv(module=_Library, group=None, rank=0, world_size=2, example=example,
                              inputs=build_rank_inputs(example, 0), device=torch.device("cpu"), real=real)
    limited = set()
    for row_id, row in refusals.rows().items():
        if not row["call"].startswith("ElasticBuffer"):
            continue
        for name in (row_id, f"{row_id}.ok"):
            try:
                refusals.run(name, env)
            except SetupLimited as refused:
                assert refused.limit.id == LIMIT and "2026-12-04-1xH200" in str(refused)
                limited.add(name)
    return limited


def test_p12_makes_no_call_the_table_names_and_the_limit_says_which_rows(monkeypatch) -> None:
    assert _made_against_the_stand_in("shared", True, monkeypatch) == P12_LIMITED
    assert _made_against_the_stand_in("isolated", True, monkeypatch) == set()
    assert _made_against_the_stand_in("shared", False, monkeypatch) == set()
    (limit,) = SETUP_LIMITS
    (p12,) = [line for line in limit.covers if line.startswith("P12")]
    assert set(re.findall(r"v2_\w+", p12)) == {name.removesuffix(".ok") for name in P12_LIMITED}, p12


def test_the_recorders_library_refuses_what_the_table_names(monkeypatch) -> None:
    made: list[dict[str, Any]] = []

    class ElasticBuffer:
        """A real-shaped constructor (positional ``num_bytes``)."""

        def __init__(self, group: Any, num_bytes: int | None = None, num_cpu_bytes: int = 0, **kwargs: Any) -> None:
            made.append({"num_bytes": num_bytes, "num_cpu_bytes": num_cpu_bytes})

        @staticmethod
        def hint() -> int:
            return 7

    library = SimpleNamespace(__name__="deep_ep", __doc__=None, ElasticBuffer=ElasticBuffer, Buffer=object)
    assert guarded(library, real=False, setup="shared") is library
    assert guarded(library, real=True, setup="recorder") is library
    shared = guarded(library, real=True, setup="shared")
    with pytest.raises(SetupLimited, match="never returns"):
        shared.ElasticBuffer(None, 2 * CPU_BYTES, num_cpu_bytes=CPU_BYTES)
    shared.ElasticBuffer(None, 2 * CPU_BYTES)
    assert made == [{"num_bytes": 2 * CPU_BYTES, "num_cpu_bytes": 0}]
    assert shared.ElasticBuffer.__name__ == "ElasticBuffer" and shared.ElasticBuffer.hint() == 7


# ------------------------------------------------------------------ the simulated set-up, on a world of two ranks
REAL_LIKE = "v2=tests.helpers.class_backends:SharedGpuHangingElasticBuffer"  # flagged as the real library's class
FORK = "v2=tests.helpers.class_backends:SharedGpuHangingFork"  # the same hang, not the real library's
TIMEOUT_S = 4.0


@pytest.fixture(scope="module")
def shared_session():
    """A 1 x 2 CPU world started as ranks sharing one GPU, over the emulated V2 and the two stand-ins."""
    from conformance.backends.alias import ENV
    from conformance.backends.plugins import probe_in_subprocess
    from conformance.core.spec import CLASS, BackendSpec, parse_backends
    from conformance.harness.config import RunConfig
    from conformance.harness.session import Session
    from conformance.world.launcher import WorldShape

    def stand_in(name: str, real: bool) -> BackendSpec:  # with its class's declaration, read as the controller does
        declared = probe_in_subprocess(name.partition("=")[2], "emulation", api="v2").get("capabilities")
        return BackendSpec(CLASS, "v2", name.partition("=")[2], deep_ep="emulation", library=real,
                           declared=None if declared is None else frozenset(declared))

    backends = (*parse_backends("emulated-v2", False), stand_in(REAL_LIKE, True), stand_in(FORK, False))
    config = RunConfig(WorldShape(1, 2), backends, "cpu", TIMEOUT_S, rank_setup="shared",
                       rank_env={ENV: "emulation"}, max_examples=1, seed=3, known_defects="none")
    session = Session(config)
    yield session
    session.close()


@pytest.mark.slow  # one planted hang (a 4 s example timeout and a world restart): scheduled first
def test_a_set_up_limit_is_unsupported_with_its_evidence_and_a_hang_is_its_backends_alone(shared_session) -> None:
    """P11 on an example with CPU bytes first: the stand-in flagged real is not asked for that buffer (unsupported,
    the limit's evidence); the fork hangs in ElasticBuffer.__init__, is charged the failure within one example
    timeout and one restart, and is left out after; emulated-v2 is checked on every example."""
    from conformance.core.cases import QpCase
    from conformance.harness.driver import run_property
    from conformance.harness.session import Recorder
    from conformance.properties import by_id
    from conformance.strategies.calls import qp_cases

    session = shared_session
    drawn = _first(qp_cases(2))
    with_cpu = dataclasses.replace(drawn, num_cpu_bytes=QpCase.ALIGNMENT)
    without = dataclasses.replace(drawn, num_cpu_bytes=0)
    p11 = dataclasses.replace(by_id("P11-qp-cap"), explicit=lambda shape: [with_cpu, without])
    session.recorder = Recorder()
    session.broken_backends()  # the construction preflight (no CPU bytes: nothing hangs), before the clock
    started = time.monotonic()
    with pytest.raises(pytest.fail.Exception) as failed:
        run_property(session, p11)
    took = time.monotonic() - started
    message = str(failed.value)
    assert f"{FORK}: the ranks hung in ElasticBuffer.__init__ on one example, past the {TIMEOUT_S:g} s" in message
    assert f"The other backends (emulated-v2, {REAL_LIKE}) were checked without it" in message, message
    recorder = session.recorder
    columns = recorder.tally.columns
    assert (columns[FORK].failed, columns[FORK].checked) == (1, 1), columns[FORK]
    assert any("hung in ElasticBuffer.__init__" in what for what in recorder.not_checked[FORK])
    examples = recorder.examples
    assert columns["emulated-v2"].held == examples and columns["emulated-v2"].failed == 0, columns
    assert columns[REAL_LIKE].failed == 0 and columns[REAL_LIKE].excluded >= 1, columns[REAL_LIKE]
    assert any(LIMIT in condition for condition in columns[REAL_LIKE].exclusions), columns[REAL_LIKE]
    assert "2026-12-04-1xH200" in recorder.unsupported[REAL_LIKE]["error"]
    assert recorder.cause["backend"] == FORK and recorder.cause["contained"] and recorder.last_example == with_cpu
    assert session.budget.property_restarts == 1
    # one example timeout and one world restart, plus the examples themselves (seconds on a CPU)
    assert took < TIMEOUT_S + 40, f"took {took:.0f} s"


def test_p12_does_not_make_the_calls_a_set_up_limit_names(shared_session) -> None:
    """The real-flagged stand-in's limited calls come back unsupported and P12 lists them as not checked with the
    evidence; its other calls and the emulated-v2 backend's are made and checked."""
    from conformance.core.cases import BadCallCase
    from conformance.core.outcomes import NotChecked, Span, Why
    from conformance.core.views import Raised
    from conformance.properties.test_p12_bad_input import check
    from conformance.tasks.bad_input import bad_call_results
    from conformance.tasks.env import TaskSettings
    from tests.helpers.meta import RecordingContext

    session = shared_session
    example = Example(tokens_per_rank=(3, 2), hidden=256, num_topk=2, num_experts=4, num_max_tokens_per_rank=16)
    rows = ("v2_init_cpu_bytes_without_num_bytes", "v2_init_cpu_bytes_exceed", "v2_init_num_bytes_alignment")
    case = BadCallCase(example, rows=rows)
    settings = TaskSettings(tuple(b for b in session.config.backends if b.name != FORK))
    per_rank = session.run(bad_call_results, case, settings)
    got = per_rank[0]["rows"]
    assert isinstance(got["v2_init_cpu_bytes_without_num_bytes"][REAL_LIKE]["raised"], Raised)  # the Python assert
    assert isinstance(got["v2_init_cpu_bytes_without_num_bytes"][REAL_LIKE]["neighbour"], NotChecked)
    assert all(isinstance(got["v2_init_cpu_bytes_exceed"][REAL_LIKE][part], NotChecked)
               for part in ("raised", "neighbour"))
    assert all(isinstance(value, Raised) for row in got.values() for value in row["emulated-v2"].values())

    not_checked: dict[str, list[str]] = {}

    class Context(RecordingContext):
        def not_checked(self, item: NotChecked, case: object = None) -> None:
            assert item.span is Span.PART and item.why is Why.SETUP, item
            not_checked.setdefault(item.backend, []).append(item.reason)

    check(Context(shape=session.shape), case, per_rank)  # holds: every made call is as the table says
    assert set(not_checked) == {REAL_LIKE}, not_checked
    text = "\n".join(not_checked[REAL_LIKE])
    assert "refusal row v2_init_cpu_bytes_exceed: the bad call was not made" in text, text
    assert "refusal row v2_init_cpu_bytes_without_num_bytes: the valid neighbour was not made" in text, text
    assert "2026-12-04-1xH200" in text and "v2_init_num_bytes_alignment" not in text


def _first(strategy: Any) -> Any:
    from conformance.harness.hypothesis_glue import NEW_DRAWS, drawing, found

    return found(strategy, lambda case: True, drawing(10, phases=NEW_DRAWS))


@pytest.mark.slow  # one planted hang: scheduled first
def test_a_hang_in_a_call_sequence_ends_that_sequence_and_the_next_run_without_the_backend(shared_session) -> None:
    """P30 (a state machine, one rank task per step): the fork hangs in its first dispatch; that sequence ends there
    (its state went with the world), the fork's column fails once, and the next sequences run on emulated-v2 alone."""
    from conformance.core.spec import CLASS, BackendSpec, parse_backends
    from conformance.harness.driver import run_property
    from conformance.harness.session import Recorder
    from conformance.properties import by_id

    session = shared_session
    fork = BackendSpec(CLASS, "v2", "tests.helpers.class_backends:DispatchHangingFork", deep_ep="emulation")
    config = session.config
    session.config = dataclasses.replace(config, backends=(*parse_backends("emulated-v2", False), fork))
    p30 = by_id("P30-call-sequences")
    p30 = dataclasses.replace(p30, explicit=lambda shape, explicit=p30.explicit: explicit(shape)[:1])
    session.recorder = Recorder()
    try:
        session.broken_backends()
        with pytest.raises(pytest.fail.Exception) as failed:
            run_property(session, p30)
    finally:
        session.config = config
    assert f"{fork.name}: the ranks hung in ElasticBuffer.dispatch" in str(failed.value), str(failed.value)
    columns = session.recorder.tally.columns
    assert (columns[fork.name].failed, columns[fork.name].checked) == (1, 1), columns[fork.name]
    emulated = columns["emulated-v2"]
    # the others are judged on the draws of a run without the fork (harness.driver: judge_the_others), so every one
    # of their sequences held, the one the fork hung in among them or not
    assert emulated.failed == 0 and emulated.held >= session.recorder.examples - 1 >= 2, (emulated, session.recorder)
