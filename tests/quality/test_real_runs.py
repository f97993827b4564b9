"""The evidence of the real-library runs (``docs/real-runs/``) and what the suite concluded from it.

A failure of the real DeepEP is kept (its report under ``docs/real-runs/<date>-<machine>/``) and explained by an
entry of ``conformance/versions/<version>/known-defects.toml``; this checks that each kept failure is matched by its
entry, and by no other, and that the reports kept as real runs say ``real: true``."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from conformance.harness.known_defects import load

ROOT = Path(__file__).resolve().parents[2]
RUNS = ROOT / "docs" / "real-runs"
KNOWN = load(ROOT / "conformance" / "versions" / "2.1.0" / "known-defects.toml")
#: (report kept from a real run, property, the backend its failure is charged to, the entry that explains it)
KEPT_FAILURES = [
    ("2026-12-02-1xH200/11a-v1-p12-p23-p24/conformance.json", "P12-bad-input", "real-v1",
     "v1-ll-combine-zero-experts-sigfpe"),
    # run 13 (torchrun's engine): the same crash, reported failed because crashes were not yet matched to entries
    ("2026-12-02-1xH200/13-v1-real-torchrun-engine/conformance.json", "P12-bad-input", "real-v1",
     "v1-ll-combine-zero-experts-sigfpe"),
]


def _report(relative: str) -> dict:
    path = RUNS / relative
    # a large report may be kept gzipped (run 28d: the device call's working tree has a 64 MiB limit)
    return json.loads(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_text())


def _property(report: dict, property_id: str) -> dict:
    return next(p for p in report["properties"] if p["id"] == property_id)


@pytest.mark.parametrize(("relative", "property_id", "backend", "entry_id"), KEPT_FAILURES)
def test_a_kept_real_failure_is_its_known_defect(relative: str, property_id: str, backend: str,
                                                 entry_id: str) -> None:
    prop = _property(_report(relative), property_id)
    assert prop["status"] == "failed", prop["status"]  # kept as it was reported then, before the entry existed
    case = SimpleNamespace(to_json=lambda: json.dumps(prop["counterexample"]))
    entry = KNOWN.match(property_id, (backend,), case, prop["message"])
    assert entry is not None and entry.id == entry_id, (entry, prop["message"][:300])
    # the same failure charged to the emulation is not excused by it
    assert KNOWN.match(property_id, (backend.replace("real", "emulated"),), case, prop["message"]) is None


KEPT_REPORTS = sorted(str(p.relative_to(RUNS)) for pattern in ("conformance.json", "conformance.json.gz")
                      for p in RUNS.glob(f"2026-12-0[2456]-*/*/{pattern}"))


@pytest.mark.parametrize("relative", KEPT_REPORTS)
def test_reports_kept_from_real_runs_name_their_backends(relative: str) -> None:
    backends = _report(relative)["environment"]["backends"]
    real = {b["name"]: b["real"] for b in backends} if isinstance(backends, list) else \
        {name: b["real"] for name, b in backends.items()}
    assert real, relative
    for name, is_real in real.items():
        if name.startswith(("real-", "emulated-")):
            assert is_real == name.startswith("real-"), (relative, name, is_real)
        else:  # a wrapper's backend is real where it drove the real deep_ep (the Megatron runs)
            assert is_real == (_report(relative)["environment"].get("deep_ep_mode", "real") == "real"), (relative, name)


def test_the_fresh_nccl_group_crash_was_reported_as_its_known_defect_on_the_real_library() -> None:
    """Run 20c: P27 on the real V2 met the crash of run 19a and reported it as the entry made from it (not failed)."""
    report = _report("2026-12-05-1xH200/20c-graphs/conformance.json")
    p27 = _property(report, "P27-fresh-groups")
    assert p27["status"] == "known-defect", p27["status"]
    entries = report["known_defects"]["entries"]
    (entry,) = [e for e in entries if e["id"] == "v2-buffer-on-uninitialised-nccl-group-sigsegv"]
    assert entry["status"] == "known-defect", entry
    assert {b["name"]: b["real"] for b in report["environment"]["backends"]}["real-v2"] is True


RUN_21_22 = "2026-12-05-1xH200"


def test_cuda_graphs_held_on_the_real_library_after_the_stream_fix() -> None:
    """Runs 21b and 22a (after 2530c8c): P29's replays equal the eager calls on both real APIs, and a buffer built
    inside a capture is refused on every rank, the stream set back (issue 27's last run)."""
    for run, examples in (("21b-rest-warm", 25), ("22a-megatron-late", 10)):
        p29 = _property(_report(f"{RUN_21_22}/{run}/conformance.json"), "P29-cuda-graphs")
        for backend in ("real-v1", "real-v2"):
            verdict = p29["verdicts"][backend]
            assert verdict["status"] == "passed" and verdict["held"] == examples, (run, backend, verdict)
        if run == "21b-rest-warm":
            refused = p29["artifacts"]["built inside a capture"]
            for backend, where in (("real-v1", "shared_memory.hpp:74"), ("real-v2", "buffer.hpp:133")):
                (message,) = refused[backend]["refused"]
                assert "cudaErrorStreamCaptureUnsupported" in message and where in message, message
                assert "the suite set the previous stream back" in message



RUN_24A = "2026-12-06-1xH100/24a-catalog21/conformance.json"


def test_the_uninitialised_topk_idx_tail_is_a_verdict_on_the_real_library() -> None:
    """Run 24a (issue 36, one H100, the kit's 2.1.0): P26 found the ``recv_topk_idx`` rows past the valid count of a
    ``do_cpu_sync=False`` dispatch uninitialised on the real V2 on every example, and the matrix says so as the known
    defect (no longer a plain ``passed`` with an artifact).  The report also shows the fault this run found in the
    suite: the emulated-v2 cell beside it reads ``not-checked`` with no reason (the real backend's known defect ended
    each example's check before the emulated backend's turn), fixed since (docs/real-runs/README.md, run 24a)."""
    report = _report(RUN_24A)
    assert {b["name"]: b["real"] for b in report["environment"]["backends"]}["real-v2"] is True
    p26 = _property(report, "P26-worst-case-whole")
    verdict = p26["verdicts"]["real-v2"]
    assert verdict["status"] == "known-defect" and verdict["checked"] == 25, verdict
    assert verdict["defects"] == {"v2-recv-topk-idx-uninitialised-past-valid-rows": 25}, verdict
    assert p26["verdicts"]["emulated-v2"]["status"] == "not-checked"  # kept as it was reported then
    assert "not -1" in p26["known_defects"]["v2-recv-topk-idx-uninitialised-past-valid-rows"]["message"]


def test_the_cold_catalog_reached_p26_in_one_call_and_says_where_its_time_went() -> None:
    """Run 24a: the whole catalog cold in one device call, stopped by the call's limit after P26 (P27-P31 not run):
    the report is partial and says so; P12 took the largest share (its bad calls compile kernels of their own)."""
    report = _report(RUN_24A)
    assert report["complete"] is False
    ran = {p["id"]: p for p in report["properties"] if p["status"] != "not-run"}
    assert "P26-worst-case-whole" in ran and "P27-fresh-groups" not in ran
    slowest = max(ran.values(), key=lambda p: p["wall_s"])
    assert slowest["id"] == "P12-bad-input", slowest["id"]

def test_a_sticky_fault_is_charged_to_its_backend_alone() -> None:
    """Run 21a: real-v1's shrink-mode fault (a sticky CUDA error) was charged to emulated-v1 too, and P23 failed;
    run 22b, after b0a1fe4: the same fault is the known defect, on real-v1 alone."""
    before = _property(_report(f"{RUN_21_22}/21a-catalog-cold/conformance.json"), "P23-ll-shrink")
    assert before["status"] == "failed" and before["verdicts"]["emulated-v1"]["failed"], before["verdicts"]
    after = _property(_report(f"{RUN_21_22}/22b-rerun/conformance.json"), "P23-ll-shrink")
    assert after["status"] == "known-defect", after["status"]
    assert after["verdicts"]["real-v1"]["defects"] == {"v1-shrink-clean-needs-ibgda": 2}, after["verdicts"]
    assert not any(v["failed"] for v in after["verdicts"].values())


#: Failures kept from real runs that were the suite's own, each with what shows it and the commit that fixed it.
SUITE_FAILURES = [
    ("21a-catalog-cold", "P12-bad-input", "expected a message matching", "38ca5c0"),
    ("21b-rest-warm", "P26-worst-case-whole", "NVCC compilation failed", "cb0b6e3"),
    ("22a-megatron-late", "P28-back-to-back", "nvcc_timed.py", "cb0b6e3"),
    ("22b-rerun", "P12-bad-input", "nvcc_timed.py", "cb0b6e3"),
]


@pytest.mark.parametrize(("run", "property_id", "shown_by", "fixed_in"), SUITE_FAILURES)
def test_a_kept_failure_of_the_suite_is_named_with_its_fix(run: str, property_id: str, shown_by: str,
                                                          fixed_in: str) -> None:
    prop = _property(_report(f"{RUN_21_22}/{run}/conformance.json"), property_id)
    assert prop["status"] == "failed" and shown_by in prop["message"], (prop["status"], prop["message"][:300])
    assert KNOWN.match(property_id, ("real-v2",), SimpleNamespace(to_json=lambda: "{}"), prop["message"]) is None
    assert fixed_in in (RUNS / "README.md").read_text(), f"docs/real-runs/README.md names the fix {fixed_in}"


RUN_26 = "2026-12-06-1xH100/26-catalog25/conformance.json"
#: The defects of 2.1.0 that issue 36's probe found still there on 2.5.0, each with the property that finds it.
PERSISTING = {"v2-recv-topk-idx-uninitialised-past-valid-rows": "P26-worst-case-whole",
              "v2-buffer-on-uninitialised-nccl-group-sigsegv": "P27-fresh-groups",
              "v2-cached-dispatch-without-num-experts": "P12-bad-input"}


def test_the_real_2_5_0_catalog_gives_every_v2_property_a_verdict_on_epbuffer() -> None:
    """Run 26 (issue 36, one H100, the kit's real 2.5.0, cold, 10 examples, gated against run 24a): complete; real-v2
    is ``EPBuffer`` of the real 2.5.0, real-v1 unsupported (V1 removed); every property of the V2 contract has a
    verdict on real-v2 (none not-run or not-checked); two of the persisting defects found on real-v2 itself.  P12
    failed real-v2 on the suite's own comparison (a path through a relative include, fixed in ffd8b9d)."""
    report = _report(RUN_26)
    assert report["complete"] is True and report["environment"]["deep_ep"] == "2.5.0"
    backends = {b["name"]: b for b in report["environment"]["backends"]}
    assert backends["real-v2"]["real"] is True and backends["real-v2"]["api"] == "EPBuffer"
    assert backends["real-v2"]["deep_ep_seen"] == {**backends["real-v2"]["deep_ep_seen"], "kind": "real",
                                                   "version": "2.5.0"}
    statuses = {}
    for prop in report["properties"]:
        verdict = prop["verdicts"].get("real-v2", {})
        statuses[prop["id"]] = verdict.get("status")
        assert verdict.get("status") not in (None, "not-run", "not-checked"), (prop["id"], verdict)
        v1 = prop["verdicts"].get("real-v1", {})
        assert v1.get("status") in ("unsupported", "skipped"), (prop["id"], v1)
    assert statuses["P31-soak"] == "skipped"  # the soak runs only when asked (--soak)
    for defect, property_id in PERSISTING.items():
        if property_id == "P12-bad-input":
            continue  # the rerun below
        assert _property(report, property_id)["verdicts"]["real-v2"]["defects"].get(defect, 0) >= 1, defect
    p12 = _property(report, "P12-bad-input")
    assert p12["verdicts"]["real-v2"]["status"] == "failed" and "buffers/../kernels/ep/dispatch.hpp:57" in \
        p12["message"]
    assert "ffd8b9d" in (RUNS / "README.md").read_text()


RUN_27A = "2026-12-06-1xH100/27a-catalog21-cold/conformance.json"


def test_the_cold_catalog_is_complete_in_one_call_with_p12_warmed_up() -> None:
    """Run 27a (issue 37, one H100, the real 2.1.0, cold): every property ran in one call (the benchmark's wall
    under 600 s), P12 no longer the run's largest share (157 s in 24a) since its sweep is compiled in the warm-up;
    the warm-up ran the 10 vocabulary runs and P12's 4 parts side by side.  Its P23 cell is the suite error fixed
    after it (a device fault surfacing in the suite's ``status.cpu()``)."""
    report = _report(RUN_27A)
    assert report["complete"] is True and all(p["status"] != "not-run" for p in report["properties"])
    assert {b["name"]: b["real"] for b in report["environment"]["backends"]}["real-v1"] is True
    bench = json.loads((RUNS / "2026-12-06-1xH100/27a-catalog21-cold/benchmark.json").read_text())
    assert bench["figures"]["catalog"]["complete"] is True and bench["figures"]["catalog"]["wall"]["median"] < 600
    assert len(report["jit"]["warm_up"]["jobs"]) == 14
    p12 = _property(report, "P12-bad-input")
    assert p12["status"] == "known-defect" and p12["wall_s"] < 100, p12["wall_s"]
    p23 = _property(report, "P23-ll-shrink")
    assert p23["status"] == "suite-error" and "illegal memory access" in p23["message"]
    from conformance.core.raisers import is_device_fault

    assert is_device_fault(RuntimeError(p23["cause"]["detail"]))  # now the backend's, not the suite's


def test_the_warm_catalog_did_not_fit_three_minutes() -> None:
    """Run 27b: on 27a's kernel cache the warm-up was skipped and little compiled, yet 22 of 31 properties took the
    200 s the part had: the warm target of issue 37 is not met (kept as measured)."""
    report = _report("2026-12-06-1xH100/27b-warm21/conformance.json")
    assert report["complete"] is False and report["jit"]["warm_up"].get("skipped")
    assert sum(p["status"] != "not-run" for p in report["properties"]) == 22


RUN_28 = "2026-12-06-1xH100"


def test_p12_on_the_real_2_5_0_reaches_the_cached_dispatch_defect() -> None:
    """Run 28e (issue 36, one H100, the kit's real 2.5.0, after ffd8b9d and the warm-up for the selected properties
    only): P12 alone has a real verdict on ``EPBuffer``: the refusals held and the one persisting defect the catalog
    run 26 did not reach on real-v2 is met there, ``TypeError`` NoneType % int of a dispatch without num_experts
    and with the default num_sms; the 2.5.0 emulation beside it the same.  Run 28a (the same part under 150 s, cold)
    was stopped after P12's warm-up, before P12."""
    report = _report(f"{RUN_28}/28e-p12-25/conformance.json")
    assert report["environment"]["deep_ep"] == "2.5.0" and report["complete"] is False
    assert "a subset was selected" in report["incomplete_reason"]
    backends = {b["name"]: b for b in report["environment"]["backends"]}
    assert backends["real-v2"]["real"] is True and backends["real-v2"]["api"] == "EPBuffer"
    p12 = _property(report, "P12-bad-input")
    assert p12["status"] == "known-defect", p12["status"]
    for backend in ("real-v2", "emulated-v2"):
        verdict = p12["verdicts"][backend]
        assert verdict["status"] == "known-defect" and (verdict["held"], verdict["checked"]) == (13, 14), verdict
        assert verdict["defects"] == {"v2-cached-dispatch-without-num-experts": 1} and not verdict["failed"], verdict
    message = p12["known_defects"]["v2-cached-dispatch-without-num-experts"]["message"]
    assert "unsupported operand type(s) for %: 'NoneType' and 'int'" in message and "real-v2" in message
    stopped = (RUNS / RUN_28 / "28a-p12-25-cold" / "log.txt").read_text()
    assert "JIT warm-up 4/4 done" in stopped and "31 of 31 properties did not run" in stopped


def test_the_bump_document_takes_p12_from_the_real_2_5_0_rerun() -> None:
    """docs/bumps/2.1.0-to-2.5.0.md regenerated with ``--rerun`` run 28e: P12 on real-v2 is no longer a lost finding
    (the suite's fault of run 26) but the defect still there."""
    text = (ROOT / "docs" / "bumps" / "2.1.0-to-2.5.0.md").read_text()
    assert f"Rerun: P12-bad-input from `docs/real-runs/{RUN_28}/28e-p12-25/conformance.json`" in text
    assert "`P12-bad-input:real-v2`" not in text
    assert "| P12-bad-input | real-v2 | known-defect | known-defect | still there: " \
        "v2-cached-dispatch-without-num-experts |" in text


def test_megatron_through_the_bump_stops_using_deep_ep_and_the_gate_says_so() -> None:
    """Runs 28b and 28c (issue 36): the seed PR's Megatron on the real 2.1.0 drives DeepEP on both paths (P1 and P5
    held, 3 examples); on the real 2.5.0 its fused_a2a finds neither ``Buffer`` nor ``ElasticBuffer`` and silently
    stops using DeepEP (``HAVE_DEEP_EP`` False, ``fused_dispatch`` None); the run gated against 28b fails the gate
    with one wrapper finding per path, before any property ran."""
    before = _report(f"{RUN_28}/28b-megatron21/conformance.json")
    after = _report(f"{RUN_28}/28c-megatron25/conformance.json")
    assert before["environment"]["deep_ep"] == "2.1.0" and after["environment"]["deep_ep"] == "2.5.0"
    for name in ("megatron-fused-a2a-v1", "megatron-fused-a2a-v2"):
        was = {b["name"]: b for b in before["environment"]["backends"]}[name]
        now = {b["name"]: b for b in after["environment"]["backends"]}[name]
        assert was["real"] is True and was["wrapper"]["drives_deep_ep"] is True
        assert now["real"] is True and now["wrapper"]["drives_deep_ep"] is False
        assert now["wrapper"]["checked"] == {"HAVE_DEEP_EP": False, "HAVE_DEEP_EP_V2": False,
                                             "fused_dispatch is None": True}
        for property_id in ("P1-per-expert-payloads", "P5-combine"):
            assert _property(before, property_id)["verdicts"][name]["status"] == "passed"
    fails = {f["id"] for f in after["gate"]["findings"] if f["fails"]}
    assert {"wrapper:megatron-fused-a2a-v1", "wrapper:megatron-fused-a2a-v2"} <= fails
    assert all(p["status"] == "not-run" for p in after["properties"])  # stopped by its 100 s limit in P1
    bump = (RUNS / RUN_28 / "28c-megatron25" / "bump.md").read_text()
    assert "the wrapper stopped using DeepEP" in bump and "falls back silently" in bump


def test_megatron_beside_both_raw_apis_over_the_whole_catalog_on_the_real_2_1_0() -> None:
    """Run 28d (issue 37's last bullet, one H100, the real 2.1.0, 10 examples): complete in one call; both wrapper
    paths and both raw APIs real; every property the wrapper declares held on both paths and equals the raw API of
    its contract; P4 and P9 differ only between the V1 and V2 contracts (the documented divergences); nothing
    failed; the known defects met on the raw APIs only."""
    report = _report(f"{RUN_28}/28d-megatron-catalog21/conformance.json.gz")
    assert report["complete"] is True and report["environment"]["deep_ep"] == "2.1.0"
    backends = {b["name"]: b for b in report["environment"]["backends"]}
    assert set(backends) == {"megatron-fused-a2a-v1", "megatron-fused-a2a-v2", "real-v1", "real-v2"}
    assert all(b["real"] is True for b in backends.values())
    assert backends["megatron-fused-a2a-v1"]["wrapper"]["drives_deep_ep"] is True
    assert backends["megatron-fused-a2a-v2"]["wrapper"]["drives_deep_ep"] is True
    statuses = {p["id"]: p["status"] for p in report["properties"]}
    assert "failed" not in statuses.values() and "suite-error" not in statuses.values(), statuses
    wrappers = ("megatron-fused-a2a-v1", "megatron-fused-a2a-v2")
    for property_id in ("P1-per-expert-payloads", "P2-counts", "P3-recv-topk-idx", "P4-weights", "P5-combine",
                        "P6-round-trip", "P7-cached-dispatch", "P9-gradients", "P10-events", "P13-determinism",
                        "P25-clean-exit", "P28-back-to-back"):
        verdicts = _property(report, property_id)["verdicts"]
        for name in wrappers:
            assert verdicts[name]["status"] == "passed" and verdicts[name]["held"] >= 1, (property_id, name)
    for property_id in ("P4-weights", "P9-gradients"):
        verdicts = _property(report, property_id)["verdicts"]
        assert verdicts["megatron-fused-a2a-v1 vs megatron-fused-a2a-v2"]["status"] == "divergence"
        assert verdicts["real-v1 vs real-v2"]["status"] == "divergence"
        assert verdicts["real-v2 vs megatron-fused-a2a-v2"]["status"] == "passed"
    p12 = _property(report, "P12-bad-input")["verdicts"]
    assert p12["real-v2"]["defects"] == {"v2-cached-dispatch-without-num-experts": 1}
    assert _property(report, "P26-worst-case-whole")["verdicts"]["real-v2"]["defects"] == {
        "v2-recv-topk-idx-uninitialised-past-valid-rows": 10}
    for prop in report["properties"]:
        for name in wrappers:
            assert not prop["verdicts"].get(name, {}).get("defects"), (prop["id"], name)


def test_the_real_2_5_0_sections_of_run_29_are_the_recording_replayed() -> None:
    """Run 29 (issue 36, one H100, the kit's real 2.5.0, cold, five worlds side by side): every V2 section recorded
    on both ranks, none failed, in 44 s; what is merged into ``fixtures/deepep-real-2.5.0-2026-12-06`` came from the
    files the log names (their SHA-256), and the API surface is run 25's."""
    folder = RUNS / RUN_28 / "29-record25"
    log = (folder / "log.txt").read_text()
    assert "NVIDIA H100" in (folder / "gpu.txt").read_text() and "deep_ep 2.5.0" in log
    assert "record_groups: 44 s" in log and log.count("record.py exit 0 at") == 5
    sections = {"v2_contract", "v2_dispatch_options", "v2_single_reduction", "v2_fp8_dispatch", "integrator_calls",
                "cuda_graphs", "capture_build"}
    logs = (folder / "record-logs.txt").read_text()
    fixture = ROOT / "fixtures" / "deepep-real-2.5.0-2026-12-06"
    for rank in (0, 1):
        rec = torch.load(fixture / f"rank{rank}.pt", weights_only=True)
        assert set(rec["sections"]) == sections, set(rec["sections"])
        assert all(rec["sections"][sid]["status"] == "ok" for sid in sections)
        origin = rec["meta"]["recorder"]["sections_run29"]["sources"]
        assert origin["g0"]["meta_unit"]["deep_ep"] == "2.5.0" and rec["meta"]["deep_ep"] == "2.5.0"
        assert all(s["status"] == "ok" for o in origin.values() for s in o["units"].values())
        for group, source in rec["meta"]["compact"]["sections_run29"].items():
            assert f"--- rank{rank}.pt: {source['bytes']} bytes, sha256 {source['sha256']}" in logs, group
    surface = json.loads((folder / "api-surface.json").read_text())
    assert surface == json.loads((RUNS / "api-surface-real-2.5.0.json").read_text())["surface"]


def test_p25_children_forked_from_a_zygote_exit_cleanly_on_the_real_library() -> None:
    """Run 30 (issue 34, one H100, the kit's real 2.1.0): with P25's children forked from a zygote per rank (a
    process that imported torch and touched no device), each child initialises CUDA, builds, dispatches, combines,
    destroys and exits: P25 held on both real backends, as with fresh interpreters before (runs 24a, 27a)."""
    report = _report(f"{RUN_28}/30-p25-zygote/conformance.json")
    backends = {b["name"]: b for b in report["environment"]["backends"]}
    assert {name: b["real"] for name, b in backends.items()} == {"real-v1": True, "real-v2": True}
    assert report["environment"]["deep_ep"] == "2.1.0"
    p25 = _property(report, "P25-clean-exit")
    assert p25["status"] == "passed", p25["status"]
    for backend in ("real-v1", "real-v2"):
        verdict = p25["verdicts"][backend]
        assert verdict["status"] == "passed" and (verdict["held"], verdict["checked"]) == (2, 2), verdict
    assert "NVIDIA H100" in (RUNS / RUN_28 / "30-p25-zygote" / "gpu.txt").read_text()


RUN_31 = "2026-12-06-1xH100-parallel"


def _catalog_figure(run: str) -> dict:
    return json.loads((RUNS / RUN_31 / run / "benchmark.json").read_text())["figures"]["catalog"]


def test_the_warm_catalog_with_four_worlds_on_one_gpu_is_complete_within_three_minutes() -> None:
    """Run 31c (issue 37, one H100, the kit's real 2.1.0, four xdist workers each with its own world of two ranks on
    the one GPU, ``--rank-setup shared -n 4``, on the kernel cache run 31b left): the whole catalog on the four backends
    at 25 examples, real, complete, within 180 s as ``python -m benchmarks --only catalog`` measured it (one
    invocation); no property failed; the same verdicts as the cold run beside it."""
    report = _report(f"{RUN_31}/31c-catalog-warm/conformance.json.gz")
    real = {b["name"]: b["real"] for b in report["environment"]["backends"]}
    assert real == {"real-v1": True, "real-v2": True, "emulated-v1": False, "emulated-v2": False}, real
    assert report["environment"]["deep_ep"] == "2.1.0"
    assert "--rank-setup shared with 4 xdist workers: 4 worlds of 2 ranks side by side on GPU 0" in \
        report["environment"]["notes"]
    assert report["complete"] is True and all(p["status"] != "not-run" for p in report["properties"])
    statuses = {p["id"]: p["status"] for p in report["properties"]}
    assert "failed" not in statuses.values() and "suite-error" not in statuses.values(), statuses
    assert statuses["P31-soak"] == "skipped"  # soak mode off, as in every catalog run
    figure = _catalog_figure("31c-catalog-warm")
    assert figure["complete"] is True and figure["exit_status"] == 0 and figure["xdist_workers"] == 4
    assert figure["jit_cache"] == "warm (kept)" and figure["warm_up_s"] == 0.0
    assert figure["wall"]["median"] <= 180, figure["wall"]
    assert report["jit"]["warm_up"].get("skipped")  # the cache held 31b's warm-up
    assert figure["property_wall_sum_s"] > 2 * figure["wall"]["median"]  # the worlds ran side by side
    kept = json.loads((ROOT / "docs" / "benchmarks" / "2026-12-06-1xH100-catalog-warm-4workers-2.1.0.json").read_text())
    assert kept["figures"]["catalog"] == figure
    cold = _report(f"{RUN_31}/31b-catalog-cold/conformance.json.gz")
    assert {p["id"]: p["status"] for p in cold["properties"]} == statuses
    assert "NVIDIA H100" in (RUNS / RUN_31 / "31c-catalog-warm" / "gpu.txt").read_text()


def test_the_cold_catalog_with_four_worlds_makes_one_warm_up() -> None:
    """Run 31b (the same call, cold kernel cache): complete within one call's 600 s; the JIT warm-up was made once,
    by one worker, for all four (14 runs side by side), the kernels compiled there."""
    report = _report(f"{RUN_31}/31b-catalog-cold/conformance.json.gz")
    assert report["complete"] is True
    assert {b["name"]: b["real"] for b in report["environment"]["backends"]}["real-v2"] is True
    warm_up = report["jit"]["warm_up"]
    assert len(warm_up["jobs"]) == 14 and warm_up["side_by_side"] == 14 and warm_up["made_by"].startswith("gw")
    figure = _catalog_figure("31b-catalog-cold")
    assert figure["complete"] is True and figure["jit_cache"] == "cold (emptied first)" and figure["xdist_workers"] == 4
    assert figure["wall"]["median"] < 600 and figure["jit"]["kernels"] == 106, figure


def test_two_worlds_on_one_gpu_drive_every_path_of_the_real_library() -> None:
    """Run 31a (the smoke run before 31b/31c, ``-n 2``): V1's intranode IPC and V2's NCCL communicator (P1), the
    low-latency NVSHMEM buffer (P15), P12's crashing rows and P23's sticky fault (world restarts) in two worlds
    sharing the GPU: P1 and P15 held, P12 and P23 their known defects, nothing failed."""
    report = _report(f"{RUN_31}/31a-smoke/conformance.json.gz")
    assert {b["name"]: b["real"] for b in report["environment"]["backends"]}["real-v1"] is True
    assert "--rank-setup shared with 2 xdist workers: 2 worlds of 2 ranks side by side on GPU 0" in \
        report["environment"]["notes"]
    statuses = {p["id"]: p["status"] for p in report["properties"] if p["status"] != "not-run"}
    assert statuses == {"P1-per-expert-payloads": "passed", "P12-bad-input": "known-defect",
                        "P15-ll-dispatch": "passed", "P23-ll-shrink": "known-defect"}, statuses
    assert _property(report, "P15-ll-dispatch")["verdicts"]["real-v1"]["held"] == 3
    assert report["jit"]["warm_up"]["made_by"] in ("gw0", "gw1")


def test_both_versions_cold_in_one_call_did_not_complete_and_say_what_ran() -> None:
    """Run 32 (one H100, one call: the 2.1.0 catalog cold, then the 2.5.0 catalog cold, four worlds on the GPU each):
    both partial, kept as such: 2.1.0 stopped by its limit with only P29 not run, 2.5.0 by the call's time left with
    11 properties not run; both real, no property failed; no baseline was written from the partial 2.1.0 run."""
    old = _report(f"{RUN_31}/32a-cold21/conformance.json.gz")
    new = _report(f"{RUN_31}/32b-cold25/conformance.json.gz")
    for report, version in ((old, "2.1.0"), (new, "2.5.0")):
        assert report["environment"]["deep_ep"] == version
        assert {b["name"]: b["real"] for b in report["environment"]["backends"]}["real-v2"] is True
        assert report["complete"] is False and report["incomplete_reason"].startswith("the run was interrupted")
        assert "failed" not in {p["status"] for p in report["properties"]}
    assert old["not_run"] == ["P29-cuda-graphs"]
    assert len(new["not_run"]) == 11 and "P12-bad-input" in new["not_run"]
    assert "not written, this run is partial" in (RUNS / RUN_31 / "32a-cold21" / "log.txt").read_text()
    assert "NVIDIA H100" in (RUNS / RUN_31 / "32b-cold25" / "gpu.txt").read_text()
