"""tests/helpers/zygote.py: an inner run forked from the warm interpreter is what ``python -m`` in a fresh one is."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers import zygote

#: A module that prints what a run sees of its start, writes to stderr and exits with a status of its own.
PROBE = """\
import json, os, sys
print(json.dumps({"path": sys.path[:3], "cwd": os.getcwd(), "argv": sys.argv[1:], "env": os.environ.get("ZYG"),
                  "own_session": os.getsid(0) == os.getpid(), "name": __name__, "bytecode": sys.dont_write_bytecode,
                  "torch": "torch" in sys.modules}))
print("to stderr", file=sys.stderr)
sys.exit(3)
"""
#: A module that reports the fork server it gets: the one forked beside it (a child of it), else one it starts.
SERVER_PROBE = """\
import json, os
from conformance.serve import forkserver
server = forkserver.server()
helper = forkserver.run_module("json.tool", ["--help"], timeout_s=60).returncode
print(json.dumps({"adopted": type(server.proc).__name__ == "_Started", "pid": server.proc.pid,
                  "parent": int(open(f"/proc/{server.proc.pid}/stat").read().rsplit(")", 1)[1].split()[1]),
                  "me": os.getpid(), "helper": helper}))
"""


def probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fork: bool) -> tuple[subprocess.CompletedProcess, dict]:
    (tmp_path / "mods").mkdir(exist_ok=True)
    (tmp_path / "mods" / "zyg_probe.py").write_text(PROBE)
    monkeypatch.setenv(zygote.ENV, "on" if fork else "off")
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "mods"), ZYG="seen")
    proc, _ = zygote.run("zyg_probe", ["a", "b c"], cwd=tmp_path, env=env, timeout=120)
    return proc, json.loads(proc.stdout)


def test_a_forked_run_sees_what_a_fresh_interpreter_sees(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    forked, seen = probe(tmp_path, monkeypatch, fork=True)
    fresh, expected = probe(tmp_path, monkeypatch, fork=False)
    assert (forked.returncode, forked.stderr) == (fresh.returncode, fresh.stderr) == (3, "to stderr\n")
    assert seen.pop("torch") is True and expected.pop("torch") is False  # forked: the one thing a fork saves
    assert seen == expected, (seen, expected)
    assert seen["path"][:2] == [str(tmp_path), str(tmp_path / "mods")] and seen["own_session"]


def test_a_forked_run_adopts_the_fork_server_forked_beside_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    (tmp_path / "zyg_server.py").write_text(SERVER_PROBE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join((str(tmp_path), str(Path(zygote.HERE).parents[2]))))
    seen = {}
    for mode in ("on", "off"):
        monkeypatch.setenv(zygote.ENV, mode)
        proc, _ = zygote.run("zyg_server", [], cwd=tmp_path, env=env, timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        seen[mode] = json.loads(proc.stdout.splitlines()[-1])
    assert seen["on"]["adopted"] and seen["on"]["parent"] == seen["on"]["me"] and seen["on"]["helper"] == 0
    assert not seen["off"]["adopted"] and seen["off"]["parent"] == seen["off"]["me"] and seen["off"]["helper"] == 0


def test_what_a_fork_cannot_give_runs_fresh(tmp_path: Path) -> None:
    server = zygote.zygote()
    assert server is not None
    assert server.serves(dict(os.environ))
    assert not server.serves({**os.environ, "PYTHONHASHSEED": "123"})  # read at start-up only
    (tmp_path / "sitecustomize.py").write_text("")
    assert not server.serves({**os.environ, "PYTHONPATH": str(tmp_path)})  # imported by site at start-up only


def test_a_run_past_its_timeout_is_killed_with_its_group(tmp_path: Path) -> None:
    (tmp_path / "zyg_sleeper.py").write_text(
        "import pathlib, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "pathlib.Path('child.pid').write_text(str(child.pid))\ntime.sleep(60)\n")
    began = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        zygote.run("zyg_sleeper", [], cwd=tmp_path, env=dict(os.environ), timeout=5)
    assert time.monotonic() - began < 20
    child = int((tmp_path / "child.pid").read_text())
    deadline = time.monotonic() + 5
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(child), f"the run's own child {child} outlived the run's timeout"


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
