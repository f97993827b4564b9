"""The DeepEP 2.5.0 emulation (``conformance.emulation.v2_5_0``, ``--deep-ep emulation:2.5.0``) against the facts of
the 2.5.0 source, and its contract (``conformance/versions/2.5.0/``).

(a) The refusal table is well formed (2.1.0's column rules), a row id both tables have carries the same recipe, every
    live row has a recipe, its messages cite their own source line, and (where the 2.5.0 sdist is at hand:
    ../shared/deepep-kit/deepinfer-ep-2.5.0-src.tar.gz, or DEEPEP_25_SRC naming the unpacked tree) every cited line
    holds the row's check.
(b) On gloo worlds every live row's recipe raises the row's exception on every rank, its neighbour passes.
(c) The behaviour the source states: the exports (no Buffer, ElasticBuffer, Config), do_handle_copy, defer_epilogue
    (dispatch and combine), the explicit SM count rounded up to even, the cached dispatch's rules, the handle keeping
    the caller's topk_idx and refusing it once modified, EventOverlap.wait, the SM model, uninitialised memory past a
    no-sync dispatch's valid rows, the cached dispatch's TypeError with the default SM count.
(d) The whole catalog on ``--deep-ep emulation:2.5.0``: every V2 property has a verdict on EPBuffer (passed,
    known-defect, or unsupported with the version's reason), every V1 property is unsupported with the removal reason.
"""

from __future__ import annotations

import collections
import importlib
import json
import os
import re
import tarfile
from pathlib import Path

import pytest

from conformance import versions
from conformance.world.launcher import World
from tests.nocover.test_refusals import (
    EXAMPLES,
    EXCEPTIONS,
    FIELDS,
    LIVE,
    MATCHES,
    RECIPE_FIELDS,
    SHAPES,
    STATUSES,
    world_of,
)

pytestmark = pytest.mark.xdist_group("test_emulation_2_5_0")

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = versions.contract("2.5.0")
TABLE = CONTRACT.refusals
ROWS = list(TABLE.rows.values())
LIVE_ROWS = [r for r in ROWS if r["status"] in LIVE]
OLD = versions.contract("2.1.0").refusals
SDIST = Path(os.environ.get("DEEPEP_25_SRC", ROOT.parent / "shared" / "deepep-kit" / "deepinfer-ep-2.5.0-src.tar.gz"))
TIMEOUT_S = 240


# ---------------------------------------------------------------------------------------- (a) the table
def test_the_table_is_well_formed() -> None:
    problems = []
    for r in ROWS:
        rid = r.get("id", "?")
        for name, kind in FIELDS.items():
            if not isinstance(r.get(name), kind):
                problems.append(f"{rid}: field {name} missing or not {kind.__name__}")
        if r["status"] not in STATUSES or r["message_match"] not in MATCHES or r["exception"] not in EXCEPTIONS:
            problems.append(f"{rid}: bad status / message_match / exception")
        if not re.fullmatch(r"[\w./-]+\.(hpp|cu|cuh|py|cpp):\d+", r["source"]):
            problems.append(f"{rid}: source {r['source']!r} is not file:line")
        if r["status"] != "emulated" and not r["status_note"]:
            problems.append(f"{rid}: status {r['status']} needs a status_note")
        live = r["status"] in LIVE
        if bool(r["emulated"]) != live:
            problems.append(f"{rid}: emulated must be {'set' if live else 'empty'} for status {r['status']}")
        unknown = set(r) - set(FIELDS) - (set(RECIPE_FIELDS) if live else set())
        problems += [f"{rid}: {name} is no column of a row of status {r['status']}" for name in sorted(unknown)]
        if not r["call"].startswith(("EPBuffer", "EventOverlap")):
            problems.append(f"{rid}: call {r['call']!r} is not a 2.5.0 class's")
    assert not problems, "\n".join(problems)


def test_a_row_both_versions_have_carries_one_recipe_and_every_live_row_has_one() -> None:
    from conformance.tasks import refusals

    problems = []
    for r in LIVE_ROWS:
        old = OLD.rows.get(r["id"])
        if old is not None and old["status"] in LIVE:
            differ = [k for k in RECIPE_FIELDS if old.get(k) != r.get(k)]
            if differ:
                problems.append(f"{r['id']}: recipe columns {differ} differ from 2.1.0's (a different recipe needs "
                                f"a new id)")
        for name in (r["id"], f"{r['id']}.ok"):
            if name not in refusals.RECIPES:
                problems.append(f"{r['id']}: no recipe {name!r}")
        if not refusals.applies(r["id"], EXAMPLES[world_of(r)], SHAPES[world_of(r)].nodes):
            problems.append(f"{r['id']}: its recipe does not apply to the {world_of(r)} self-test example")
        path, _, qualname = r["emulated"].partition(":")
        try:
            obj = importlib.import_module(path.removesuffix(".py").replace("/", "."))
            for part in qualname.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError) as exc:
            problems.append(f"{r['id']}: emulated {r['emulated']!r} does not exist ({exc})")
    assert not problems, "\n".join(problems)


def test_assertion_messages_cite_their_own_source_line() -> None:
    problems = []
    for r in ROWS:
        m = re.fullmatch(r"Assertion (?:exception|error) \((.+?):(\d+)\): (.*)", r["message"], re.S)
        if m is None:
            continue
        path, line, text = m.groups()
        src_path, src_line = r["source"].rsplit(":", 1)
        cited = os.path.normpath(path.replace("{build_root}/", ""))
        if line != src_line or not (os.path.normpath(src_path).endswith(cited)
                                    or cited.endswith(os.path.normpath(src_path))):
            problems.append(f"{r['id']}: message cites {path}:{line}, source is {r['source']}")
        if r["message"].startswith("Assertion exception") and text != r["expression"]:
            problems.append(f"{r['id']}: message text {text!r} != expression {r['expression']!r}")
    assert not problems, "\n".join(problems)


def _sdist_files() -> dict[str, list[str]]:
    if SDIST.is_dir():
        return {str(p.relative_to(SDIST)): p.read_text(errors="replace").splitlines()
                for p in SDIST.rglob("*") if p.suffix in (".py", ".hpp", ".cuh", ".cpp") and p.is_file()}
    if not SDIST.is_file():
        pytest.skip(f"no DeepEP 2.5.0 source at {SDIST} (set DEEPEP_25_SRC to the unpacked sdist)")
    files: dict[str, list[str]] = {}
    with tarfile.open(SDIST) as tar:
        for member in tar.getmembers():
            if member.isfile() and member.name.endswith((".py", ".hpp", ".cuh", ".cpp")):
                text = tar.extractfile(member).read().decode(errors="replace")  # type: ignore[union-attr]
                files[member.name.split("/", 1)[1]] = text.splitlines()
    return files


def test_cited_lines_hold_their_checks_in_the_2_5_0_source() -> None:
    files = _sdist_files()
    problems = []
    for r in ROWS:
        path, line = r["source"].rsplit(":", 1)
        lines = files.get(path)
        if lines is None or int(line) > len(lines):
            problems.append(f"{r['id']}: {r['source']} not in the sdist")
        elif r["snippet"] not in lines[int(line) - 1]:
            problems.append(f"{r['id']}: {r['source']} does not hold {r['snippet']!r}")
    assert not problems, "\n".join(problems)


def test_the_contract_names_what_2_5_0_changed() -> None:
    assert CONTRACT.class_name("v2") == "EPBuffer" and CONTRACT.class_name("v1") is None
    assert "removed the legacy Buffer" in CONTRACT.api_removed("v1")
    assert CONTRACT.capability_lost("epilogue_events") and not CONTRACT.capability_lost("expand")
    with pytest.raises(versions.NotInVersion, match="do_handle_copy"):
        CONTRACT.call_kwargs("v2", "dispatch", {"do_handle_copy": True})
    assert CONTRACT.call_kwargs("v2", "dispatch", {"do_handle_copy": False}) == {"do_handle_copy": False}
    assert CONTRACT.call_kwargs("v2", "dispatch", {"previous_event_before_epilogue": None}) == {}
    with pytest.raises(versions.NotInVersion, match="previous_event_before_epilogue"):
        CONTRACT.call_kwargs("v2", "combine", {"previous_event_before_epilogue": object()})
    assert CONTRACT.call_kwargs("v2", "__init__", {"num_cpu_bytes": 0, "hidden": 256}) == {"hidden": 256}
    assert CONTRACT.call_kwargs("v2", "barrier", {"use_comm_stream": False}) == {"wait_comm_stream": False}
    assert versions.contract("2.1.0").call_kwargs("v2", "dispatch", {"do_handle_copy": True}) == {
        "do_handle_copy": True}
    # an unknown version is driven by the contract whose classes it exports
    assert versions.contract_for("2.6.0", ["EPBuffer", "EPHandle"])[0].version == "2.5.0"
    assert versions.contract_for(None, ["Buffer", "ElasticBuffer"])[0].version == "2.1.0"


# ------------------------------------------------------------------------- (b) recipes on gloo worlds
@pytest.fixture(scope="module")
def results() -> dict[str, list[dict]]:
    out = {}
    for kind in sorted({world_of(r) for r in LIVE_ROWS}):
        names = [n for r in LIVE_ROWS if world_of(r) == kind for n in (r["id"], f"{r['id']}.ok")]
        if kind == "2x2":  # and on a hybrid buffer the neighbours of the rows of any topology (test below)
            names += [f"{r['id']}.ok" for r in ANY_TOPOLOGY_ROWS]
        with World(SHAPES[kind]) as world:
            out[kind] = world.run("tests.helpers.refusal_tasks:run_recipes", names, EXAMPLES[kind].to_json(), None,
                                  "2.5.0", timeout=TIMEOUT_S)
    return out


#: Rows of any topology: P12 makes their calls on whatever world it runs on, a two-node (hybrid) one too.
ANY_TOPOLOGY_ROWS = [r for r in LIVE_ROWS if r.get("topology", "any") == "any"]


def test_the_neighbours_of_rows_of_any_topology_pass_on_a_hybrid_buffer_too(results) -> None:
    """What ``--deep-ep emulation:2.5.0 --nodes 2`` showed: P12 failed emulated-v2 on the valid neighbour of
    ``v2_combine_num_sms_device`` (``num_sms=132``, which a hybrid combine also wants to divide the dispatch's
    channels: combine.hpp:50): a neighbour must be valid on every topology its row applies to."""
    problems = [f"{r['id']} rank {rank}: neighbour {r['id']}.ok raised {per_rank[r['id'] + '.ok']}"
                for r in ANY_TOPOLOGY_ROWS for rank, per_rank in enumerate(results["2x2"])
                if per_rank[f"{r['id']}.ok"] != (None, None)]
    assert ANY_TOPOLOGY_ROWS and not problems, f"{len(problems)} problem(s):\n" + "\n".join(problems)


def test_recipes_raise_the_2_5_0_exception_and_neighbours_pass_on_every_rank(results) -> None:
    problems = []
    for r in LIVE_ROWS:
        for rank, per_rank in enumerate(results[world_of(r)]):
            got_type, got_message = per_rank[r["id"]]
            if got_type != r["exception"] or not TABLE.matches(r["id"], got_message or ""):
                problems.append(f"{r['id']} rank {rank}: got {got_type}: {got_message!r}\n"
                                f"    expected {r['exception']}: {r['message']!r} ({r['message_match']})")
            if per_rank[f"{r['id']}.ok"] != (None, None):
                problems.append(f"{r['id']} rank {rank}: neighbour raised {per_rank[r['id'] + '.ok']}")
    assert not problems, f"{len(problems)} problem(s):\n" + "\n".join(problems)


# --------------------------------------------------------------------------- (c) behaviour from the source
@pytest.fixture(scope="module")
def facts() -> list[dict]:
    with World(SHAPES["1x2"]) as world:
        return world.run("tests.helpers.version_tasks:ep_2_5_0_facts", EXAMPLES["1x2"].to_json(), timeout=TIMEOUT_S)


def test_the_module_exports_2_5_0s_api() -> None:
    import conformance.emulation.v2_5_0 as deep_ep

    for name in ("EPBuffer", "EPHandle", "EventOverlap", "EventHandle", "topk_idx_t", "get_num_allocation_alignment",
                 "get_num_rdma_alignment", "get_num_tma_alignment", "EngramBuffer", "PPBuffer", "BucketBuffer",
                 "BufferAllocator", "comm"):
        assert hasattr(deep_ep, name), name
    for gone in ("Buffer", "ElasticBuffer", "Config"):
        assert not hasattr(deep_ep, gone), gone
    assert deep_ep.__version__.startswith("2.5.0") and deep_ep.get_num_rdma_alignment() == 64
    assert hasattr(deep_ep.EventOverlap, "wait") and not hasattr(deep_ep.utils, "EventOverlap")
    with pytest.raises(NotImplementedError, match="EngramBuffer is not emulated"):
        deep_ep.EngramBuffer(None, 0, 0, False, 0, 0)
    import inspect

    dispatch = inspect.signature(deep_ep.EPBuffer.dispatch).parameters
    assert dispatch["do_handle_copy"].default is False and "defer_epilogue" in dispatch
    assert "previous_event_before_epilogue" not in dispatch
    init = inspect.signature(deep_ep.EPBuffer.__init__).parameters
    assert "num_cpu_bytes" not in init and "lb_allocation_plan_or_num_bytes" in init and init["sl_idx"].default is None


def test_the_api_snapshot_is_the_surface_recorded_on_the_real_2_5_0() -> None:
    """``conformance/versions/2.5.0/api-surface.json`` is generated from the surface probed on the real 2.5.0
    (docs/real-runs/api-surface-real-2.5.0.json): every public method there is compared, with its recorded signature,
    or listed ``not_covered``; the emulation's surface differs from it in nothing (P14 on the emulation is clean);
    V1 is gone on both (the recording's cases: ``AttributeError: module 'deep_ep' has no attribute 'Buffer'``)."""
    from conformance.core.api_surface import diff_surface, recorded_snapshot, recorded_surface_path, surface_of

    recorded = json.loads(recorded_surface_path("2.5.0").read_text())
    snapshot = CONTRACT.api_surface()
    assert snapshot == recorded_snapshot(CONTRACT, recorded), "regenerate it: python -m conformance.core.api_surface " \
                                                             "--write --version 2.5.0"
    assert snapshot["confirmed"] is True and "api-surface-real-2.5.0.json" in snapshot["source"]
    for cls, methods in recorded["surface"]["classes"].items():
        compared, not_covered = snapshot["classes"][cls], set(snapshot["not_covered"].get(cls, []))
        assert set(methods) == set(compared) | not_covered and not set(compared) & not_covered, cls
        for name, entry in compared.items():
            assert entry == methods[name], f"{cls}.{name}"
    assert diff_surface(snapshot, surface_of(CONTRACT.emulation)) == []
    import conformance.emulation.v2_5_0 as deep_ep

    with pytest.raises(AttributeError, match=r"^module 'deep_ep' has no attribute 'Buffer'$"):
        deep_ep.Buffer  # noqa: B018 - the lookup is the call under test


def test_defer_epilogue_hands_the_outputs_out_at_the_wait(facts) -> None:
    for got in facts:
        assert got["deferred_type"] == "EventOverlap" and got["deferred_equal"], got
        assert got["deferred_combine_type"] == "EventOverlap" and got["deferred_combine_equal"], got


def test_an_explicit_sm_count_is_rounded_up_to_even(facts) -> None:
    for got in facts:
        assert got["handle_num_sms_for_3"] == 4 and got["combine_num_sms_for_5"] == 6, got


def test_the_handle_keeps_the_callers_topk_idx_and_refuses_it_once_modified(facts) -> None:
    for got in facts:
        assert got["handle_topk_is_input"] and got["modified"] == ("AssertionError", TABLE.message(
            "v2_handle_topk_idx_modified")), got
        assert got["handle_copy"] == ("AssertionError", TABLE.message("v2_dispatch_handle_copy")), got


def test_cached_dispatch_rules(facts) -> None:
    for got in facts:
        assert got["cached_with_topk"][0] == "AssertionError", got
        assert got["cached_cpu_sync"] == ("AssertionError", "Cannot do CPU sync with cached handle"), got
        assert got["cached_default_sms"] == ("TypeError", "unsupported operand type(s) for %: 'NoneType' and 'int'")


def test_rows_past_a_no_sync_dispatchs_valid_count_are_uninitialised(facts) -> None:
    for got in facts:
        assert got["tail_rows"] > 0 and got["tail_poison"], got


def test_the_sm_model_is_2_5_0s(facts) -> None:
    """2 ranks on one node (the example's experts and top-k), the CPU stand-ins of an H200 (132 SMs, NVLink 430.3125
    GB/s): the 2.5.0 model (margin 1.3, a multiple of 4, the combine's traffic, default 180 / 45 GB/s) against the
    oracle, which 2.1.0's constants would not give."""
    from conformance.emulation._sizing import H200_NVLINK_GBS
    from conformance.oracle.schedule import expected_num_sms

    rules, example = CONTRACT.rules, EXAMPLES["1x2"]
    experts, topk = example.num_experts, example.num_topk
    expected = expected_num_sms(experts, topk, num_nodes=1, ranks_per_node=2, allow_hybrid_mode=True,
                                prefer_overlap_with_compute=True, rdma_gbs=50, nvlink_gbs=H200_NVLINK_GBS,
                                sm_read_gbs=rules["sm_read_gbs"], sm_write_gbs=rules["sm_write_gbs"], device_sms=132,
                                margin=rules["sm_margin"], multiple=rules["sm_align"],
                                combine_terms=rules["sm_combine_terms"], cap_even=rules["sm_cap_even"])
    old = versions.contract("2.1.0").rules
    assert expected != expected_num_sms(experts, topk, num_nodes=1, ranks_per_node=2, allow_hybrid_mode=True,
                                        prefer_overlap_with_compute=True, rdma_gbs=50, nvlink_gbs=H200_NVLINK_GBS,
                                        sm_read_gbs=old["sm_read_gbs"], sm_write_gbs=old["sm_write_gbs"],
                                        device_sms=132)
    for got in facts:
        assert got["theoretical_num_sms"] == expected == got["handle_num_sms"], got


# --------------------------------------------------------------------------------- (d) the whole catalog
@pytest.mark.slow
def test_the_catalog_on_2_5_0_gives_every_property_a_verdict(suite) -> None:
    # two xdist workers, as the main job runs: each worker builds its set-up from the controller's resolved one, the
    # emulation's version included (before the fix, the workers drove the 2.1.0 emulation under a 2.5.0 header)
    proc, report = suite("--deep-ep", "emulation:2.5.0", "--nodes", "1", "--max-examples", "3", "-n", "2",
                         "--conformance-seed", "0", timeout=900)
    assert report, proc.stdout[-3000:] + proc.stderr[-3000:]
    backends = {b["name"]: b for b in report["environment"]["backends"]}
    assert backends["emulated-v2"]["api"] == "EPBuffer" and backends["emulated-v2"]["deep_ep_version"] == "2.5.0"
    assert backends["emulated-v2"]["deep_ep_seen"]["version"] == "2.5.0+emulation"
    assert "removed the legacy Buffer" in backends["emulated-v1"]["removed"]
    notes = [n for n in report["environment"]["notes"] if n.startswith("emulated-v1: unsupported")]
    assert len(notes) == 1, report["environment"]["notes"]
    from conformance.properties import catalog

    seen = collections.Counter()
    for prop in report["properties"]:
        declared = catalog()[prop["id"]]
        v1, v2 = prop["verdicts"].get("emulated-v1", {}), prop["verdicts"].get("emulated-v2", {})
        if prop["status"] == "skipped":  # soak mode is off
            continue
        if "v1" in declared.apis:
            assert v1.get("status") == "unsupported" and "removed the legacy Buffer" in v1.get("reason", ""), prop
        if "v2" in declared.apis:
            assert v2.get("status") in ("passed", "known-defect", "unsupported"), (prop["id"], v2)
            if v2["status"] == "unsupported":
                assert v2.get("reason"), (prop["id"], v2)
            seen[v2["status"]] += 1
    assert seen["passed"] >= 15 and seen["known-defect"] >= 2, seen
    by_id = {p["id"]: p for p in report["properties"]}
    assert "DeepEP 2.5.0 removed previous_event_before_epilogue" in by_id["P22-epilogue-events"]["verdicts"][
        "emulated-v2"]["reason"]
    assert by_id["P26-worst-case-whole"]["verdicts"]["emulated-v2"]["status"] == "known-defect"
    p20 = by_id["P20-dispatch-options"]["verdicts"]["emulated-v2"]  # checked, but for do_handle_copy=True
    assert p20["status"] == "passed" and any("DeepEP 2.5.0 changed do_handle_copy" in part
                                             for part in p20.get("not_checked", [])), p20
    assert by_id["P12-bad-input"]["verdicts"]["emulated-v2"]["status"] == "known-defect"
    assert report["environment"]["known_defects"].endswith("versions/2.5.0/known-defects.toml")
    assert json.dumps(report).count("Traceback") == 0 or proc.returncode in (0, 1)


def test_emulation_2_1_0_is_plain_emulation() -> None:
    """``--deep-ep emulation:2.1.0`` is what plain ``emulation`` was and is: the 2.1.0 emulation, its contract."""
    from types import SimpleNamespace

    from conformance.harness.options import Machine, build_run_config

    machine = Machine((), {"importable": False, "error": "none here"})
    plain = build_run_config(SimpleNamespace(deep_ep="emulation"), machine)
    explicit = build_run_config(SimpleNamespace(deep_ep="emulation:2.1.0"), machine)
    assert plain.emulation_version == explicit.emulation_version == "2.1.0"
    assert [(b.name, b.version, b.class_name) for b in plain.backends] == [
        (b.name, b.version, b.class_name) for b in explicit.backends] == [
        ("emulated-v1", "2.1.0", "Buffer"), ("emulated-v2", "2.1.0", "ElasticBuffer")]
    newer = build_run_config(SimpleNamespace(deep_ep="emulation:2.5.0"), machine)
    assert newer.rank_env["CONFORMANCE_DEEP_EP"] == "emulation:2.5.0" and newer.library_version == "2.5.0"
    assert [(b.name, b.class_name, b.removed is not None) for b in newer.backends] == [
        ("emulated-v1", "Buffer", True), ("emulated-v2", "EPBuffer", False)]
    assert "--deep-ep emulation:2.5.0" in newer.cli_args()
    # a real deep_ep 2.5.0 selects the 2.5.0 emulation for the emulated backends beside it
    real = build_run_config(SimpleNamespace(backends="real-v2,emulated-v2"),
                            Machine(("0", "1"), {"importable": True, "version": "2.5.0", "EPBuffer": True}))
    assert [(b.name, b.version) for b in real.backends] == [("real-v2", "2.5.0"), ("emulated-v2", "2.5.0")]


def test_the_alias_gives_third_party_code_2_5_0s_module_tree() -> None:
    """``use_emulation("2.5.0")`` (what ``--deep-ep emulation:2.5.0`` does in the ranks): ``import deep_ep`` and its
    submodules are the 2.5.0 emulation's, 2.1.0's classes do not import, and mixing versions in one process is
    refused."""
    import subprocess
    import sys

    code = (
        "from conformance.backends import alias\n"
        "info = alias.use('emulation:2.5.0')\n"
        "import deep_ep, deep_ep.utils.event, deep_ep.comm\n"
        "from deep_ep import EPBuffer, EPHandle, EventOverlap\n"
        "assert deep_ep.utils.event.EventOverlap is EventOverlap and hasattr(EventOverlap, 'wait')\n"
        "assert not hasattr(deep_ep, 'Buffer') and not hasattr(deep_ep, 'ElasticBuffer')\n"
        "try:\n    from deep_ep import ElasticBuffer\nexcept ImportError:\n    pass\nelse:\n    raise SystemExit(3)\n"
        "try:\n    alias.use_emulation()\nexcept RuntimeError as exc:\n    assert 'DeepEP 2.5.0' in str(exc)\n"
        "else:\n    raise SystemExit(4)\n"
        "print(info['kind'], info['version'])\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0 and proc.stdout.split() == ["emulation", "2.5.0+emulation"], proc.stderr[-2000:]
    from conformance.backends.alias import parse

    assert parse("emulation") == ("emulation", None) and parse("emulation:2.5.0") == ("emulation", "2.5.0")
    for bad in ("emulation:9.9.9", "real:2.5.0", "bogus"):
        with pytest.raises(ValueError):
            parse(bad)
