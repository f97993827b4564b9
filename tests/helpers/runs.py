"""Running the suite as a user does, for the self-tests: pytest in a process of its own (a process group, every
process it starts tagged), with a check that nothing it started outlives it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers import zygote
from tests.helpers.zygote import RUN_TAG

ROOT = Path(__file__).resolve().parents[2]


def run_pytest(args: list[str], cwd: Path = ROOT, env: dict[str, str] | None = None, timeout: float = 600,
               python: str = sys.executable, fresh: bool = False) -> tuple[subprocess.CompletedProcess, float]:
    """Run pytest in its own process group (forked from a warm interpreter where that is the same as a fresh one:
    tests/helpers/zygote.py; ``fresh``: always a fresh one); fail if any process it started outlives it.  With
    ``python`` another interpreter (a venv's, with the suite installed) runs it, without the checkout on its path."""
    base = {**os.environ, "PYTHONPATH": str(ROOT)}
    if python != sys.executable:
        # a clean venv's torch was installed --no-compile (tests/helpers/installs.py): its first process writes the
        # bytecode the others then read (about 2 s of CPU per process that imports torch, where the environment has
        # PYTHONDONTWRITEBYTECODE set)
        for name in ("PYTHONPATH", "CONFORMANCE_DEEP_EP", "VIRTUAL_ENV", "PYTHONDONTWRITEBYTECODE"):
            base.pop(name, None)
    env = tagged({**base, **(env or {})})
    started = time.monotonic()
    proc, pid = zygote.run("pytest", args, cwd=cwd, env=env, timeout=timeout, python=python, fresh=fresh)
    took = time.monotonic() - started
    assert_group_gone(pid, env[RUN_TAG])
    return proc, took


def report_of(report_dir: Path, name: str = "conformance.json") -> dict:
    """A run's report."""
    return json.loads((report_dir / name).read_text())


def tagged(env: dict[str, str]) -> dict[str, str]:
    """``env`` with a fresh run tag (see :func:`assert_group_gone`)."""
    return {**env, RUN_TAG: f"{os.getpid()}-{time.monotonic_ns()}"}


def _tagged_pids(tag: str) -> list[str]:
    needle = f"{RUN_TAG}={tag}".encode()
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    pids.append(pid)
        except OSError:
            continue
    return pids


def assert_group_gone(pgid: int, tag: str, grace_s: float = 5.0) -> None:
    """No process of the run is alive: of process group ``pgid`` (pytest, its xdist workers) or carrying its tag
    (node agents and ranks, in their own session)."""
    deadline = time.monotonic() + grace_s
    while True:
        out = subprocess.run(["ps", "-eo", "pid=,pgid=,stat=,args="], capture_output=True, text=True).stdout
        rows = [line.split(None, 3) for line in out.splitlines() if line.strip()]
        mine = set(_tagged_pids(tag))
        left = [" ".join(row) for row in rows if (row[1] == str(pgid) or row[0] in mine) and not row[2].startswith("Z")]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not left, "processes of the run outlived it:\n" + "\n".join(left)
