"""The JIT's compile log (``conformance.tools.nvcc_timed``, DeepEP's ``EP_JIT_NVCC_COMPILER`` in the suite's runs)
never changes a compile's outcome: runs 20c and 21 on one H200 failed real-v2 with ``NVCC compilation failed``
because the log's folder did not exist yet (found by the rank output the failure report now carries)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conformance.harness.jit import TOOL, read_log


def _fake_nvcc(tmp_path: Path, status: int) -> Path:
    nvcc = tmp_path / f"nvcc-{status}"
    nvcc.write_text(f"#!{sys.executable}\nimport sys\nsys.exit({status})\n")
    nvcc.chmod(0o755)
    return nvcc


def _compile(tmp_path: Path, log: Path, status: int = 0) -> subprocess.CompletedProcess:
    env = {**os.environ, "CONFORMANCE_REAL_NVCC": str(_fake_nvcc(tmp_path, status)), "CONFORMANCE_JIT_LOG": str(log)}
    return subprocess.run([sys.executable, str(TOOL), str(tmp_path / "kernel.cu"), "-cubin", "-o", "k.cubin"],
                          env=env, capture_output=True, text=True, timeout=60)


def test_the_log_folder_is_made_when_missing(tmp_path: Path) -> None:
    log = tmp_path / "report-not-made-yet" / "jit.log"
    done = _compile(tmp_path, log)
    assert done.returncode == 0, done.stderr
    [entry] = read_log(str(log))
    assert entry["exit"] == 0 and entry["kind"] == "cubin"


def test_a_log_that_cannot_be_written_keeps_nvccs_status(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for status in (0, 2):
        done = _compile(tmp_path, blocker / "jit.log", status)
        assert done.returncode == status, done.stderr
        assert "compile not logged" in done.stderr


def test_a_failed_compile_is_logged_with_its_status(tmp_path: Path) -> None:
    log = tmp_path / "jit.log"
    assert _compile(tmp_path, log, 3).returncode == 3
    assert json.loads(log.read_text().splitlines()[0])["exit"] == 3
