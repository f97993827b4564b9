"""The adapters follow the production call conventions (checked against the emulation through a spy)."""

from __future__ import annotations

import pytest

from conformance.core.probe import probe_module
from conformance.core.spec import BackendSpec, parse_backends
from conformance.world.launcher import World, WorldShape

#: Its module-scoped fixtures are built once: under xdist (the self-tests run with -n) its tests share a worker.
pytestmark = pytest.mark.xdist_group("test_adapters")


@pytest.fixture(scope="module")
def world():
    with World(WorldShape(1, 2)) as w:
        yield w


def _calls(log: list, name: str) -> list[dict]:
    return [kwargs for call, kwargs in log if call == name]


def test_v2_buffer_is_pinned_with_automatic_qps_and_explicit_destroy(world) -> None:
    result = world.run("tests.helpers.adapter_tasks:v2_conventions", timeout=120)[0]
    inits = _calls(result["log"], "ElasticBuffer")
    first = inits[0]
    assert first["num_max_tokens_per_rank"] == 128 and first["hidden"] == 256 and first["num_topk"] == 2
    assert first["num_allocated_qps"] == 0, "production code lets DeepEP pick the QP cap"
    assert result["num_allocated_qps"] == 129, "num_allocated_qps=0 must give the automatic (hybrid) cap"
    assert first["explicitly_destroy"] is True
    # one buffer per pinned key: the repeated dispatch built nothing; 4 new hidden sizes built 4 more
    assert [i["hidden"] for i in inits] == [256, 512, 1024, 2048, 4096]
    destroys = _calls(result["log"], "ElasticBuffer.destroy")
    assert len(destroys) == len(inits), "every buffer is destroyed (LRU eviction, then destroy())"


def test_v2_dispatch_combine_and_cached_dispatch_conventions(world) -> None:
    result = world.run("tests.helpers.adapter_tasks:v2_conventions", timeout=120)[0]
    dispatches = _calls(result["log"], "ElasticBuffer.dispatch")
    first = dispatches[0]
    assert first["do_expand"] is False
    assert first["num_experts"] == 4 and first["num_max_tokens_per_rank"] == 128
    assert first["topk_idx"] == "Tensor" and first["topk_weights"] == "Tensor"
    (combine, *_) = _calls(result["log"], "ElasticBuffer.combine")
    assert combine["num_sms"] == 0, "combine reuses the dispatch handle's SM count"
    cached = dispatches[1]
    assert cached["handle"] == "EPHandle" and cached.get("topk_idx") is None
    assert cached["num_experts"] == 4, "cached dispatch passes num_experts (avoids the upstream TypeError)"
    assert result["cached_same_bytes"]


def test_v1_buffer_arguments(world) -> None:
    (init,) = _calls(world.run("tests.helpers.adapter_tasks:v1_buffer_arguments", timeout=120)[0], "Buffer")
    assert init["explicitly_destroy"] is True and init["num_rdma_bytes"] == 0 and init["num_nvl_bytes"] > 0


def test_buffers_are_destroyed_before_the_process_group() -> None:
    with World(WorldShape(1, 2)) as w:
        logs = w.run("tests.helpers.adapter_tasks:destroy_happens_before_the_process_group", timeout=120)
        w.kill()  # the task already tore the process group down
    for log in logs:
        destroys = [kwargs for call, kwargs in log if call.endswith(".destroy")]
        assert len(destroys) == 2 and all(d["process_group_alive"] for d in destroys)


def test_import_probe_reports_what_is_installed(tmp_path, monkeypatch) -> None:
    emulated = probe_module("conformance.emulation")
    assert emulated["importable"] and emulated["Buffer"] and emulated["ElasticBuffer"]
    assert emulated["EventOverlap"] == "conformance.emulation.utils.event"  # as deep_ep 2.1.0 (docs/real-runs)
    missing = probe_module("deep_ep_not_installed_anywhere")
    assert missing["importable"] is False and "ModuleNotFoundError" in missing["error"]
    # A V2.5-style layout: EPBuffer, EventOverlap only in .utils.event
    pkg = tmp_path / "fake_deep_ep"
    (pkg / "utils").mkdir(parents=True)
    (pkg / "__init__.py").write_text("class EPBuffer: ...\nclass ElasticBuffer: ...\n")
    (pkg / "utils" / "__init__.py").write_text("")
    (pkg / "utils" / "event.py").write_text("class EventOverlap: ...\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    fake = probe_module("fake_deep_ep")
    assert (fake["Buffer"], fake["ElasticBuffer"], fake["EPBuffer"]) == (False, True, True)
    assert fake["EventOverlap"] == "fake_deep_ep.utils.event"


def test_backend_selection_is_strict() -> None:
    assert [b.name for b in parse_backends("auto", real_available=False)] == ["emulated-v1", "emulated-v2"]
    assert [b.name for b in parse_backends("auto", real_available=True)] == ["real-v1", "real-v2"]
    assert parse_backends("emulated-v2", False) == [BackendSpec("emulated", "v2")]
    # (A real backend where deep_ep does not import is a set-up error: tests/nocover/test_fault_matrix.py.)
    with pytest.raises(ValueError, match="unknown backend 'v3'"):
        parse_backends("v3", False)
    with pytest.raises(ValueError, match="twice"):
        parse_backends("emulated-v1,emulated-v1", False)


def test_v2_previous_event_comes_from_capture_with_comm_stream_allocation(world) -> None:
    log = world.run("tests.helpers.adapter_tasks:v2_previous_event_convention", timeout=120)[0]
    (dispatch,) = _calls(log, "ElasticBuffer.dispatch")
    assert dispatch["previous_event"] == "EventHandle", "previous_event is a captured EventHandle"
    assert dispatch["allocate_on_comm_stream"] is True, "V2 refuses previous_event without it"
    assert dispatch["async_with_compute_stream"] is True


def test_v2_options_reach_the_library(world) -> None:
    log = world.run("tests.helpers.adapter_tasks:v2_option_conventions", timeout=120)[0]
    first, second = _calls(log, "ElasticBuffer")
    assert (first["allow_multiple_reduction"], first["prefer_overlap_with_compute"]) == (False, False)
    assert (second["allow_multiple_reduction"], second["prefer_overlap_with_compute"]) == (True, True), \
        "buffer options are part of the buffer's key"
    with_options, expand = _calls(log, "ElasticBuffer.dispatch")
    assert with_options["do_handle_copy"] is False and with_options["cumulative_local_expert_recv_stats"] == "Tensor"
    assert with_options["previous_event_before_epilogue"] == "EventHandle"
    assert with_options["allocate_on_comm_stream"] is False, "the epilogue event needs no comm-stream allocation"
    assert (expand["do_expand"], expand["do_zero_padding"], expand["do_cpu_sync"]) == (True, True, False)
    (combine,) = _calls(log, "ElasticBuffer.combine")
    assert combine["previous_event_before_epilogue"] == "EventHandle"
