"""GPU partitioning under xdist, and the GPU world (run on a GPU machine; skipped, with the reason, elsewhere)."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest

from conformance.harness.devices import gpu_slice, max_gpu_workers, shared_gpu_workers, visible_gpus
from conformance.harness.options import GPU_RANK_ENV, Machine, SetupError, build_run_config
from conformance.world.launcher import World, WorldShape
from tests.conftest import ROOT

needs_two_gpus = pytest.mark.skipif(len(visible_gpus()) < 2, reason="needs 2 GPUs (run on the accelerator machine)")


def test_worker_slices_are_disjoint_and_never_oversubscribe() -> None:
    gpus = [str(i) for i in range(8)]
    slices = [gpu_slice(gpus, worker, 2) for worker in range(4)]
    assert slices == [("0", "1"), ("2", "3"), ("4", "5"), ("6", "7")]
    assert gpu_slice(gpus, 4, 2) == ()  # a 5th worker would get nothing: World refuses it (test_world)
    assert gpu_slice(["3", "5", "7"], 0, 2) == ("3", "5")  # respects the parent's CUDA_VISIBLE_DEVICES


def test_max_workers_follow_visible_gpus(monkeypatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7")
    assert max_gpu_workers(2) == 4 and max_gpu_workers(4) == 2 and max_gpu_workers(8) == 1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert max_gpu_workers(2) == 1


def _shared(**values: object) -> object:
    return SimpleNamespace(rank_setup="shared", device="cuda", **values)


ONE_GPU = Machine(("3",), {"importable": True, "version": "2.1.0", "Buffer": True, "ElasticBuffer": True})


def test_shared_rank_setup_runs_every_xdist_worker_world_on_the_first_gpu(monkeypatch) -> None:
    """``--rank-setup shared -n K``: every worker's world of two ranks on the first visible GPU (here "3", as
    CUDA_VISIBLE_DEVICES=3 gives it), the header saying so; still one node only, and V2 still needs
    NCCL_MULTI_RANK_GPU_ENABLE=1.  Without ``shared`` one GPU per rank per worker is still required."""
    monkeypatch.setenv("NCCL_MULTI_RANK_GPU_ENABLE", "1")
    configs = [build_run_config(_shared(backends="real-v1,real-v2,emulated-v1,emulated-v2"), ONE_GPU,
                                worker=worker, workers=4) for worker in range(4)]
    assert [c.gpu_ids for c in configs] == [("3",)] * 4 and {c.device for c in configs} == {"cuda"}
    assert all(c.rank_setup == "shared" for c in configs)
    assert "--rank-setup shared with 4 xdist workers: 4 worlds of 2 ranks side by side on GPU 3" in configs[0].notes
    alone = build_run_config(_shared(backends="real-v1"), ONE_GPU)  # no -n: one world, no such note
    assert alone.gpu_ids == ("3",) and not any("xdist workers" in note for note in alone.notes)
    with pytest.raises(SetupError, match=r"--rank-setup shared: the ranks share one GPU of one host: use --nodes 1 "
                                         r"\(for several worlds side by side on that GPU, -n K"):
        build_run_config(_shared(backends="real-v1", nodes=2), ONE_GPU, workers=2)
    monkeypatch.delenv("NCCL_MULTI_RANK_GPU_ENABLE")
    with pytest.raises(SetupError, match="ElasticBuffer builds an NCCL communicator, which refuses two ranks on one "
                                         "GPU; select V1 backends only"):
        build_run_config(_shared(backends="real-v1,real-v2"), ONE_GPU, worker=1, workers=2)
    v1 = build_run_config(_shared(backends="real-v1,emulated-v1"), ONE_GPU, worker=1, workers=2)
    assert v1.gpu_ids == ("3",)
    with pytest.raises(SetupError, match=r"one GPU per rank is needed, 4 in all \(1 node\(s\) x 2 rank\(s\) x 2 "
                                         r"xdist workers\), but 1 is visible"):
        build_run_config(SimpleNamespace(device="cuda", backends="real-v1"), ONE_GPU, workers=2)


def test_auto_workers_with_a_shared_gpu_follow_the_cores(monkeypatch) -> None:
    """``-n auto --rank-setup shared``: min(4, cores // 4) worlds on the one GPU (16 cores: 4), at least one; without
    a visible GPU xdist's own default; the isolated set-ups as before (one worker per GPU slice)."""
    from conformance import plugin

    assert [shared_gpu_workers(cores) for cores in (1, 2, 4, 8, 12, 16, 64)] == [1, 1, 1, 2, 3, 4, 4]

    def auto(**given: object) -> int | None:
        option = SimpleNamespace(**{o.dest: None for o in plugin.OPTIONS}, conformance=False, allow_partial=False)
        for name, value in given.items():
            setattr(option, name, value)
        return plugin.pytest_xdist_auto_num_workers(SimpleNamespace(option=option, args=[]))

    monkeypatch.setattr("conformance.harness.devices.cpu_cores", lambda: 16)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert auto(rank_setup="shared") == 4 and auto(rank_setup="shared", device="cuda") == 4
    assert auto(rank_setup="shared", device="cpu") is None
    assert auto(nodes=1) is None  # one GPU, two ranks per world: no full slice
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    assert auto(nodes=1) == 2 and auto(rank_setup="shared") == 4
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert auto(rank_setup="shared") is None


@pytest.mark.slow  # runs the suite in a subprocess: scheduled first (tests/conftest.py)
def test_pytest_process_never_initialises_cuda() -> None:
    code = (
        "import sys, pytest, torch\n"
        "rc = pytest.main(['-q', '-p', 'no:cacheprovider', '--max-examples', '3', '--report-dir', sys.argv[1],\n"
        "                  'conformance/properties/test_p01_payloads.py'])\n"
        "assert not torch.cuda.is_initialized(), 'the pytest process initialised CUDA'\n"
        "sys.exit(int(rc))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, "/tmp/conformance-cuda-init-check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


@needs_two_gpus
def test_gpu_world_gives_each_rank_its_own_gpu_over_nccl() -> None:
    gpus = tuple(visible_gpus()[:2])
    with World(WorldShape(1, 2), device="cuda", gpu_ids=gpus, env=dict(GPU_RANK_ENV)) as world:
        ranks = world.run("tests.helpers.gpu_tasks:gpu_identity", timeout=120)
    assert [r["visible"] for r in ranks] == list(gpus)
    assert all(r["device_count"] == 1 and r["backend"] == "nccl" and r["nvls"] == "0" for r in ranks)
    assert len({r["uuid"] for r in ranks}) == 2, "two ranks share a GPU"


@needs_two_gpus
def test_xdist_auto_uses_one_worker_per_gpu_slice(tmp_path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "auto", "--nodes", "1", "--ranks-per-node", "2", "--max-examples", "3",
         "-p", "no:cacheprovider", f"--report-dir={tmp_path}", "conformance/properties/test_p01_payloads.py"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert f"created: {max_gpu_workers(2)}/{max_gpu_workers(2)} worker" in proc.stdout, proc.stdout[-2000:]


def test_recorder_rank_setup_builds_buffers_on_a_new_group_of_the_whole_world() -> None:
    with World(WorldShape(1, 2), rank_setup="recorder") as world:
        ranks = world.run("tests.helpers.gpu_tasks:ep_group", timeout=120)
    assert [(r["is_world"], r["size"]) for r in ranks] == [(False, 2), (False, 2)]
    with World(WorldShape(1, 2)) as world:
        assert [r["is_world"] for r in world.run("tests.helpers.gpu_tasks:ep_group", timeout=120)] == [True, True]


@needs_two_gpus
def test_recorder_rank_setup_shows_every_rank_the_node_gpus_and_selects_local_rank() -> None:
    gpus = tuple(visible_gpus()[:2])
    with World(WorldShape(1, 2), device="cuda", gpu_ids=gpus, env=dict(GPU_RANK_ENV), rank_setup="recorder") as world:
        ranks = world.run("tests.helpers.gpu_tasks:ep_group", timeout=120)
    assert [r["visible"] for r in ranks] == [",".join(gpus)] * 2
    assert [r["current"] for r in ranks] == [0, 1] and all(r["device_count"] == 2 for r in ranks)
    assert len({r["uuid"] for r in ranks}) == 2 and not any(r["is_world"] for r in ranks)
