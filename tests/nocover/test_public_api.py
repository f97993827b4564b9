"""A class backend is judged through its public API only (issue 35): the seam of the library's internals refuses it,
its instance is seen through its public surface, its capabilities are declared or probed, and an exception is
sorted by who raised it (a backend, or the suite itself).  In-process checks; tests/quality/test_facades.py runs
the suite."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conformance.backends.internals import has_internals, internals
from conformance.backends.plugins import class_declaration, probe_in_subprocess
from conformance.backends.public import InternalReach, PublicClass, PublicInstance, public_names
from conformance.core.raisers import ApiViolation, NotSupported, SuiteError, suite_frame
from conformance.core.spec import CLASS_CAPABILITIES, BackendSpec, is_builtin_name
from conformance.core.views import Raised

ROOT = Path(__file__).resolve().parents[2]
CLASS_V1 = BackendSpec("class", "v1", target="tests.facades.faithful:ElasticBackedBuffer")
CLASS_V2 = BackendSpec("class", "v2", target="pkg.mod:Fork")


# ------------------------------------------------------------------------------------------------ the seam


def test_the_internals_seam_refuses_every_backend_but_the_built_in_ones() -> None:
    for name in ("emulated-v1", "emulated-v2", "real-v1", "real-v2"):
        assert has_internals(BackendSpec.parse(name)) and internals(BackendSpec.parse(name)).spec.name == name
    for spec in (CLASS_V1, CLASS_V2, BackendSpec("plugin", "v1", target="pkg.mod:factory")):
        assert not has_internals(spec)
        with pytest.raises(SuiteError, match="public API only"):
            internals(spec)


#: Where the suite reads a handle's entries or a buffer's runtime: the seam, and the places only built-in backends
#: reach (P12's refusal recipes of the library's own table, the planted defects standing in for library bugs).
READS_INTERNALS = re.compile(r"handle\[\d|len\(handle\)|\.runtime\b")
SEAM_ONLY = ("conformance/backends", "conformance/tasks")
BUILT_IN_ONLY = ("conformance/backends/internals.py", "conformance/tasks/refusals/")


def test_only_the_seam_reads_handles_and_runtimes() -> None:
    found = []
    for folder in SEAM_ONLY:
        for path in sorted((ROOT / folder).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if relative.startswith(BUILT_IN_ONLY):
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                code = line.split("#", 1)[0]
                if READS_INTERNALS.search(code) and '"""' not in code and "``" not in code:
                    found.append(f"{relative}:{number}: {line.strip()}")
    assert not found, "internals read outside conformance/backends/internals.py:\n" + "\n".join(found)


# ------------------------------------------------------------------------------------------ public surface


class _Forwarding:
    """A wrapper providing its calls on the instance (``__getattr__``), as many shims are written."""

    def __init__(self) -> None:
        self.inner = {"destroy": lambda: "destroyed", "dispatch": lambda: "dispatched"}

    def __getattr__(self, name: str):  # noqa: ANN204
        try:
            return self.__dict__["inner"][name]
        except KeyError:
            raise AttributeError(name) from None


def test_the_public_surface_probes_the_instance_and_refuses_internals() -> None:
    assert {"dispatch", "combine", "get_dispatch_layout", "destroy", "capture", "num_sms"} <= public_names("v1")
    assert {"dispatch", "combine", "get_buffer_size_hint", "num_scaleout_ranks"} <= public_names("v2")
    assert "runtime" not in public_names("v1") and "runtime" not in public_names("v2")
    buffer = PublicInstance(_Forwarding(), CLASS_V1)
    assert buffer.destroy() == "destroyed", "a method provided through __getattr__ counts"
    with pytest.raises(NotSupported, match=r"has no Buffer\.combine .*run-time probe"):
        buffer.combine  # noqa: B018 - a public call the instance does not have: unsupported, with the reason
    for name in ("runtime", "_inner", "last_launch"):
        with pytest.raises(InternalReach, match="not part of Buffer's public API") as raised:
            getattr(buffer, name)
        assert isinstance(raised.value, AttributeError) and suite_frame(raised.value) is not None
    assert getattr(buffer, "last_launch", "default") == "default", "an optional read falls back to its default"
    with pytest.raises(InternalReach):
        buffer.runtime = None


def test_a_name_seen_before_raises_as_the_backend_raises_it() -> None:
    """After destroy() a wrapper that forgets its buffer raises AttributeError for its calls: that is the backend's
    answer (a refusal P30 judges), not a missing call."""
    inner = _Forwarding()
    buffer = PublicInstance(inner, CLASS_V1)
    buffer.dispatch  # noqa: B018
    del inner.inner["dispatch"]
    with pytest.raises(AttributeError) as raised:
        buffer.dispatch  # noqa: B018
    assert not isinstance(raised.value, NotSupported | SuiteError)


def test_the_public_class_builds_public_instances_and_probes_static_calls() -> None:
    class Fork:
        num_sms = 20

        def __init__(self, group: object) -> None:
            self.group = group

    cls = PublicClass(Fork, CLASS_V1)
    built = cls("group")
    assert isinstance(built, PublicInstance) and built.group == "group" and cls.num_sms == 20
    with pytest.raises(NotSupported, match=r"its class has no Buffer\.set_num_sms"):
        cls.set_num_sms  # noqa: B018


# ------------------------------------------------------------------------------------------- capabilities


def test_a_class_declares_its_capabilities_or_is_probed() -> None:
    assert "api_surface" not in CLASS_CAPABILITIES["v1"] and "low_latency" not in CLASS_CAPABILITIES["v1"]
    assert "lifecycle" in CLASS_CAPABILITIES["v1"] and "expand" in CLASS_CAPABILITIES["v2"]
    probed = BackendSpec("class", "v1", target="pkg.mod:Shim")
    assert probed.capabilities == CLASS_CAPABILITIES["v1"] - {"bad_input"}
    assert "declares 'bad_input'" in (probed.why_lacks("bad_input") or "")
    assert "not offered to class backends" in (probed.why_lacks("low_latency") or "")
    declared = BackendSpec("class", "v1", target="pkg.mod:Shim", declared=frozenset({"combine", "events"}))
    assert declared.capabilities == {"combine", "events"}
    assert "conformance_capabilities" in (declared.why_lacks("autograd") or "")
    assert is_builtin_name("emulated-v1") and not is_builtin_name("v1=pkg.mod:Shim")


def test_the_class_probe_reads_the_declaration_and_accepts_instance_methods() -> None:
    faithful = probe_in_subprocess("tests.facades.faithful:ElasticBackedBuffer", "emulation", api="v1")
    assert faithful["importable"], faithful
    assert "lifecycle" in faithful["capabilities"] and "worst_case" not in faithful["capabilities"]
    forwarding = probe_in_subprocess("tests.facades.faithful:ForwardingBufferOnGroup", "emulation", api="v1")
    assert forwarding["importable"] and forwarding["capabilities"] is None, forwarding


def test_a_declaration_is_checked() -> None:
    class Declares:
        conformance_capabilities = frozenset({"combine", "events"})

    assert class_declaration(Declares, "m:Declares", "v1") == ["combine", "events"]
    Declares.conformance_capabilities = {"combine", "low_latency"}
    with pytest.raises(TypeError, match="low_latency.*src_info"):
        class_declaration(Declares, "m:Declares", "v1")
    Declares.conformance_capabilities = {"combine", "telepathy"}
    with pytest.raises(TypeError, match="unknown capabilities .'telepathy'."):
        class_declaration(Declares, "m:Declares", "v1")
    Declares.conformance_capabilities = "combine"
    with pytest.raises(TypeError, match="a collection"):
        class_declaration(Declares, "m:Declares", "v1")
    Declares.conformance_capabilities = None
    assert class_declaration(Declares, "m:Declares", "v1") is None


# ---------------------------------------------------------------------------------------------- who raised


def _raise_in_the_suite() -> None:
    from conformance.backends.results import counts_list

    counts_list(None, "x")  # an ApiViolation: the backend's failure, although the suite raised it


def test_who_raised_is_read_from_the_raising_frame() -> None:
    from conformance.core.views import V1Layout

    try:
        V1Layout.fields(None)  # type: ignore[arg-type]  # the suite's own code raises (inside dataclasses)
    except TypeError as exc:
        suite = exc
    assert "conformance/core/views.py" in (suite_frame(suite) or "")
    with pytest.raises(TypeError):
        Raised.of(suite)  # never recorded as a refusal: raised again (a suite error upstream)
    try:
        raise AttributeError("destroyed")  # raised here, outside the suite's package: a backend's
    except AttributeError as exc:
        backend = exc
    assert suite_frame(backend) is None and Raised.of(backend) == Raised("AttributeError", "destroyed")
    with pytest.raises(ApiViolation) as violation:
        _raise_in_the_suite()
    assert suite_frame(violation.value) is None
    with pytest.raises(ApiViolation):
        Raised.of(violation.value)  # a failure, never recorded as a refusal
    with pytest.raises(NotSupported):
        Raised.of(NotSupported("no"))
    with pytest.raises(SuiteError):
        raise SuiteError("explicit")


def test_a_device_fault_that_surfaces_in_the_suites_code_is_never_a_suite_error() -> None:
    """Run 27a (one H100, the real 2.1.0): real-v1's known shrink-mode fault (an illegal address, sticky) surfaced at
    the suite's next synchronising call, ``status.cpu()`` in ``backends/low_latency.py``, and P23 reported a suite
    error where run 22b had reported the known defect.  A CUDA fault is asynchronous: it belongs to the backend's
    operation it surfaced in, whatever line reported it; any other exception raised there is still the suite's."""
    import torch

    from conformance.core.raisers import SUITE_ROOT, is_device_fault

    where = str(SUITE_ROOT / "backends" / "low_latency.py")
    fault_type = getattr(torch, "AcceleratorError", RuntimeError)
    for exc_type, text in ((fault_type, "CUDA error: an illegal memory access was encountered"),
                           (RuntimeError, "CUDA error: device-side assert triggered"),
                           (ValueError, "not a device fault")):
        try:
            exec(compile(f"raise exc_type({text!r})", where, "exec"), {"exc_type": exc_type})
        except Exception as exc:  # noqa: BLE001
            raised = exc
        device = exc_type is not ValueError
        assert is_device_fault(raised) is device, raised
        assert (suite_frame(raised) is None) is device, (raised, suite_frame(raised))
    assert "conformance/backends/low_latency.py:1" in (suite_frame(raised) or "")


def test_a_suite_error_on_the_ranks_is_named_and_never_a_backends_failure() -> None:
    from conformance.world.errors import RankRaised
    from conformance.world.launcher import World, WorldShape

    with World(WorldShape(1, 2)) as world, pytest.raises(RankRaised) as raised:
        world.run("tests.helpers.raiser_tasks:suite_raises_in_step", timeout=60)
    failure = raised.value
    assert failure.in_step and failure.backend == "emulated-v1" and sorted(failure.suite) == [0, 1], failure
    assert "conformance/core/views.py" in failure.suite[0] and str(failure).startswith("SUITE ERROR"), str(failure)


def test_a_check_that_raises_is_a_suite_error_of_the_column(emulated_session) -> None:
    """The controller's own check code raising (not an assertion) is the column's suite error, not its failure, and
    the property's status is ``suite-error``."""
    from conformance.harness.session import Recorder
    from conformance.properties import by_id
    from conformance.reporting.report import property_status
    from tests.helpers.meta import sample

    prop = by_id("P1-per-expert-payloads")

    def broken(ctx, case, per_rank):  # noqa: ANN001, ANN202
        ctx.checking(("emulated-v2",))
        return len(None)  # type: ignore[arg-type]  # a bug of the check

    original = prop.check
    object.__setattr__(prop, "check", broken)  # (a frozen dataclass)
    emulated_session.recorder = Recorder()
    try:
        with pytest.raises(SuiteError, match="SUITE ERROR while checking emulated-v2"):
            emulated_session.check(prop.id, sample(prop.strategy(emulated_session.shape), 1)[0])
    finally:
        object.__setattr__(prop, "check", original)
    recorded = emulated_session.recorder.as_dict()
    assert recorded["verdicts"]["emulated-v2"]["status"] == "suite-error", recorded["verdicts"]
    assert recorded["verdicts"]["emulated-v2"]["failed"] == 0
    assert property_status(True, False, recorded) == "suite-error"
