"""API coverage: every method and keyword of the recorded DeepEP 2.1.0 surface is exercised by a property, as
measured from the calls the properties make, or excluded with a reason in conformance/data/api-surface/coverage.toml.

The catalog runs on the emulation (CPU) on a 1-node and a 2-node world at once (some calls happen only on one of
them: V1 internode forwarding on two nodes, V1 ``num_worst_tokens`` on one), as two pytest runs of the suite, with a
small budget and a fixed seed (the measurement is deterministic for a given checkout): the session's whole-catalog
runs (``catalog_runs`` in tests/conftest.py), which other self-tests read too.  Their reports carry each
property's calls (``api_calls``); ``conformance.core.api_coverage`` judges the union against the snapshot and the
exclusions.  The meta-tests below show the judgement fails on an item the surface gains, on a keyword the
properties stop giving, on a stale, unknown or malformed exclusion, and that the tracing rule is the documented one.
"""

from __future__ import annotations

import copy
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from conformance.backends import tracing
from conformance.core.api_coverage import (
    EXCLUSIONS,
    Exclusion,
    calls_as_json,
    judge,
    load_exclusions,
    per_property_calls,
    report_section,
    table,
)
from conformance.core.api_surface import load_snapshot

pytestmark = pytest.mark.slow  # a whole run of the suite or more: scheduled first (tests/conftest.py)


@pytest.fixture(scope="module")
def reports(catalog_runs: dict[int, Any]) -> list[dict[str, Any]]:
    """The reports of the catalog on a 1-node and a 2-node world of the emulation (run side by side, once per
    session: ``catalog_runs``)."""
    for nodes, run in catalog_runs.items():
        assert run.proc.returncode == 0 and run.report.get("complete"), (
            f"the catalog did not pass completely on {nodes} node(s), so its coverage is not measured:\n"
            + run.proc.stdout[-3000:] + run.proc.stderr[-2000:])
    return [run.report for run in catalog_runs.values()]


@pytest.fixture(scope="module")
def measured(reports: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Property id -> its recorded calls, over both worlds."""
    return per_property_calls(reports)


def test_every_method_and_keyword_is_exercised_or_excluded(measured: dict[str, dict[str, Any]]) -> None:
    coverage = judge(load_snapshot(), measured, load_exclusions())
    print("\n".join(table(coverage)))  # -s shows the whole table
    if not coverage.ok:
        pytest.fail(coverage.message(), pytrace=False)


def test_the_report_section_is_the_judgement_of_its_own_calls(reports: list[dict[str, Any]]) -> None:
    for report in reports:
        section = report["api_coverage"]
        assert section == report_section(per_property_calls([report])), "api_coverage disagrees with api_calls"
        assert sum(section["summary"][k] for k in ("exercised", "excluded", "missing")) == section["summary"]["items"]


def test_the_measurement_sees_what_the_properties_call(measured: dict[str, dict[str, Any]]) -> None:
    """Spot checks of the measurement itself: P15's FP8 options, a call the library makes itself on two nodes, and
    the construction preflight left out of every property."""
    ll = measured["P15-ll-dispatch"]["Buffer.low_latency_dispatch"]
    assert ll["returned"] and {"use_fp8", "round_scale", "use_ue8m0", "return_recv_hook"} <= set(ll["given"]), ll
    assert "Buffer.low_latency_dispatch" not in measured["P1-per-expert-payloads"]  # each property its own calls
    forwarded = measured["P1-per-expert-payloads"]["Buffer.internode_dispatch"]
    assert forwarded["called_from"] == ["Buffer.dispatch"], forwarded
    assert "Buffer.__init__" not in measured["P1-per-expert-payloads"], "the preflight's construction was counted"


# ------------------------------------------------------------------------------------------ it can fail
def test_an_item_the_surface_gains_is_reported_missing(measured: dict[str, dict[str, Any]]) -> None:
    snapshot = copy.deepcopy(load_snapshot())
    snapshot["classes"]["Buffer"]["dispatch"]["params"].append(
        {"name": "num_pad_tokens", "kind": "POSITIONAL_OR_KEYWORD", "default": "0"})
    snapshot["classes"]["ElasticBuffer"]["reset"] = {"static": False, "params": []}
    coverage = judge(snapshot, measured, load_exclusions())
    assert {"Buffer.dispatch(num_pad_tokens)", "ElasticBuffer.reset"} <= set(coverage.missing)
    message = coverage.message()
    assert "missing: Buffer.dispatch(num_pad_tokens) is neither exercised by a property nor excluded" in message
    assert "exercise it in a property" in message and str(EXCLUSIONS) in message


def test_a_keyword_the_properties_stop_giving_is_reported_missing(measured: dict[str, dict[str, Any]]) -> None:
    assert "Buffer.dispatch(num_worst_tokens)" not in judge(load_snapshot(), measured, load_exclusions()).missing
    dropped = copy.deepcopy(measured)
    for calls in dropped.values():
        if "Buffer.dispatch" in calls:
            given = calls["Buffer.dispatch"]["given"]
            calls["Buffer.dispatch"]["given"] = [p for p in given if p != "num_worst_tokens"]
    coverage = judge(load_snapshot(), dropped, load_exclusions())
    assert "Buffer.dispatch(num_worst_tokens)" in coverage.missing


def test_a_keyword_given_only_in_calls_that_raised_is_not_exercised() -> None:
    calls = calls_as_json([("emulated-v1", "Buffer.dispatch", frozenset({"x", "num_worst_tokens"}), False, None),
                           ("emulated-v1", "Buffer.dispatch", frozenset({"x"}), True, None)])
    coverage = judge(load_snapshot(), {"P12-bad-input": calls}, {})
    assert "Buffer.dispatch(num_worst_tokens)" in coverage.missing
    assert "Buffer.dispatch(x)" not in coverage.missing and "Buffer.dispatch" not in coverage.missing
    assert "only in calls that raised, in P12-bad-input" in coverage.message()


def test_stale_and_unknown_exclusions_are_reported(measured: dict[str, dict[str, Any]]) -> None:
    exclusions = dict(load_exclusions())
    exclusions["Buffer.dispatch(num_worst_tokens)"] = Exclusion("Buffer.dispatch(num_worst_tokens)", "hardware-only",
                                                                "planted: it is exercised")
    exclusions["Buffer.dispatch(num_wrost_tokens)"] = Exclusion("Buffer.dispatch(num_wrost_tokens)", "hardware-only",
                                                                "planted: a typo")
    coverage = judge(load_snapshot(), measured, exclusions)
    assert coverage.stale == ["Buffer.dispatch(num_worst_tokens)"]
    assert coverage.unknown == ["Buffer.dispatch(num_wrost_tokens)"]
    message = coverage.message()
    assert "stale exclusion: Buffer.dispatch(num_worst_tokens) is exercised by" in message
    assert "remove its entry" in message
    assert "unknown exclusion: Buffer.dispatch(num_wrost_tokens)" in message


def test_excluding_a_method_excludes_its_keywords() -> None:
    exclusions = {"Buffer.get_local_buffer_tensor": Exclusion("Buffer.get_local_buffer_tensor", "not-emulated", "r")}
    coverage = judge(load_snapshot(), {}, exclusions)
    rows = {r.item.name: r for r in coverage.rows}
    assert rows["Buffer.get_local_buffer_tensor(use_rdma_buffer)"].status == "excluded"
    assert rows["Buffer.get_local_buffer_tensor(use_rdma_buffer)"].excluded_with_method
    assert "Buffer.dispatch(x)" in coverage.missing  # nothing measured: everything else is missing


@pytest.mark.parametrize(("text", "error"), [
    ('[[exclude]]\nitem = "Buffer.destroy"\ncategory = "later"\nreason = "r"\n', "is not one of"),
    ('[[exclude]]\nitem = "Buffer.destroy"\ncategory = "hardware-only"\nreason = " "\n', "the reason is empty"),
    ('[[exclude]]\nitem = "Buffer.destroy"\ncategory = "hardware-only"\n', "needs exactly the keys"),
    ('[[exclude]]\nitem = "Buffer.destroy"\ncategory = "hardware-only"\nreason = "r"\n' * 2, "excluded twice"),
])
def test_a_malformed_exclusion_is_refused(tmp_path: Path, text: str, error: str) -> None:
    path = tmp_path / "coverage.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=error):
        load_exclusions(path)


def test_the_exclusions_file_loads_and_names_only_the_surface() -> None:
    exclusions = load_exclusions()
    assert exclusions and all(e.reason.strip() for e in exclusions.values())
    assert judge(load_snapshot(), {}, exclusions).unknown == []


# ------------------------------------------------------------------------------------------ the tracing rule
class _Lib:
    """A stand-in library class (traced under the name ``Buffer``)."""

    def __init__(self, group: Any, flag: bool = False, count: int = 0, opt: Any = None, mode: Any = None) -> None:
        self.group = group

    def outer(self, x: Any, scale: int = 1) -> Any:
        return self.inner(x, scale=scale)

    def inner(self, x: Any, scale: int = 1) -> Any:
        return x

    @staticmethod
    def hint(n: int, fp8: bool = False) -> int:
        if fp8:
            raise ValueError("refused")
        return n


def test_tracing_records_given_parameters_by_the_documented_rule() -> None:
    tracing.trace_classes(types.SimpleNamespace(Buffer=_Lib), "fake")
    tracing.drain()
    _Lib(None, False, 0, None)  # every optional spelled out at its default: only the required one is given
    _Lib(None, True, count=2, opt=torch.zeros(2), mode=True)  # mode=True: non-default (default None)
    _Lib(None, mode=False)  # False for a default of None (like do_cpu_sync=False): given
    buffer = _Lib(None)
    buffer.outer(torch.ones(1), scale=1)
    assert _Lib.hint(3) == 3
    with pytest.raises(ValueError):
        _Lib.hint(3, fp8=True)
    calls = tracing.drain()
    assert tracing.drain() == []  # drained
    init = {c[2] for c in calls if c[1] == "Buffer.__init__"}
    assert init == {frozenset({"group"}), frozenset({"group", "flag", "count", "opt", "mode"}),
                    frozenset({"group", "mode"})}
    assert ("fake-v1", "Buffer.inner", frozenset({"x"}), True, "Buffer.outer") in calls  # made by the library itself
    assert ("fake-v1", "Buffer.outer", frozenset({"x"}), True, None) in calls
    assert ("fake-v1", "Buffer.hint", frozenset({"n", "fp8"}), False, None) in calls  # raised
    judged = calls_as_json(calls)["Buffer.hint"]
    assert judged["given"] == ["n"] and judged["given_when_raised"] == ["fp8", "n"]
