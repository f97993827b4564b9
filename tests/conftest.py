"""Self-test helpers: run the suite itself as a subprocess and read its JSON report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_suite(args: list[str], report_dir: Path, timeout: float = 600, extra_path: tuple[str, ...] = ()
              ) -> tuple[subprocess.CompletedProcess, dict]:
    """Run ``pytest <args>`` on the suite in a fresh interpreter; return the process and its JSON report.
    ``extra_path``: more entries for ``PYTHONPATH`` (after the checkout)."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--report-dir={report_dir}", *args]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join((str(ROOT), *extra_path)))
    env.pop("CONFORMANCE_DEEP_EP", None)
    env.pop("GITHUB_STEP_SUMMARY", None)  # a self-test's inner run must not write into CI's job summary
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    report_path = report_dir / "conformance.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    return proc, report


@pytest.fixture
def suite(tmp_path: Path):
    """Callable running the suite with its reports in a temporary directory."""
    return lambda *args, **kw: run_suite(list(args), tmp_path / "reports", **kw)


@pytest.fixture(scope="session")
def emulated_session():
    """A session on a 1-node x 2-rank CPU world over the emulated V1 and V2 (shared by meta-tests)."""
    from conformance.core.spec import parse_backends
    from conformance.harness.config import RunConfig
    from conformance.harness.session import Session
    from conformance.world.launcher import WorldShape

    config = RunConfig(WorldShape(1, 2), tuple(parse_backends("emulated", False)), "cpu", 120.0)
    session = Session(config)
    yield session
    session.close()


@pytest.fixture(scope="session")
def two_node_session():
    """A session on a 2-node x 2-rank CPU world (internode paths) over the emulated V1 and V2."""
    from conformance.core.spec import parse_backends
    from conformance.harness.config import RunConfig
    from conformance.harness.session import Session
    from conformance.world.launcher import WorldShape

    session = Session(RunConfig(WorldShape(2, 2), tuple(parse_backends("emulated", False)), "cpu", 120.0))
    yield session
    session.close()
