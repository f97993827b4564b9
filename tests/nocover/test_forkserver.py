"""The fork server (conformance/serve/forkserver.py): a helper forked from it is what ``python -m MODULE ARGS`` would
be (arguments, environment, working directory, output, session, exit status, the interpreter's normal exit), a hung
one is killed, and none outlives the server or the controller."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conformance.serve import forkserver
from conformance.versions import known_versions
from conformance.world.launcher import _running as _alive  # alive and not a zombie
from tests.helpers.runs import ROOT


def _started(out: Path, pid: int) -> None:
    """Wait until the helper ``pid`` printed its pid to ``out`` (it runs its module: its set-up is done)."""
    deadline = time.monotonic() + 60
    while not (out.exists() and out.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert int(out.read_text()) == pid


def test_a_forked_helper_is_what_python_dash_m_would_be(tmp_path: Path) -> None:
    env = {**os.environ, "FORK_TARGET_MARKER": "given", "PYTHONPATH": str(ROOT)}
    forked = forkserver.run_module("tests.helpers.fork_targets", ["report", "3"], timeout_s=60, env=env)
    fresh = subprocess.run([sys.executable, "-m", "tests.helpers.fork_targets", "report", "3"], capture_output=True,
                           text=True, timeout=60, env=env)
    assert forked.returncode == fresh.returncode == 3, (forked, fresh)
    seen, expected = json.loads(forked.stdout.splitlines()[0]), json.loads(fresh.stdout.splitlines()[0])
    for key in ("argv", "cwd", "name", "marker", "deep_ep"):
        assert seen[key] == expected[key], (key, seen, expected)
    assert seen["torch"] and not seen["deep_ep"], "the server preloads torch, never deep_ep"
    assert seen["tables"] == list(known_versions()) and expected["tables"] == [], "the refusal tables: parsed there"
    assert forked.stdout.splitlines()[-1] == fresh.stdout.splitlines()[-1] == "atexit ran", forked.stdout
    assert forked.stderr.strip() == fresh.stderr.strip() == "to stderr"


def test_a_helper_in_its_own_session_and_a_signal_is_its_exit_status(tmp_path: Path) -> None:
    child = forkserver.Forked("tests.helpers.fork_targets", ["signal"], env={**os.environ, "PYTHONPATH": str(ROOT)},
                              new_session=True)
    assert child.wait(60) == -signal.SIGSEGV
    child = forkserver.Forked("tests.helpers.fork_targets", ["sleep"], env={**os.environ, "PYTHONPATH": str(ROOT)},
                              new_session=True, stdout=str(tmp_path / "out"))
    _started(tmp_path / "out", child.pid)
    assert os.getsid(child.pid) == child.pid, "new_session: the helper leads a session of its own"
    assert child.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(0.2)
    child.kill()
    assert child.wait(10) == -signal.SIGKILL and not _alive(child.pid)


def test_a_hung_helper_is_killed_at_its_timeout() -> None:
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        forkserver.run_module("tests.helpers.fork_targets", ["sleep"], timeout_s=1.0,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert time.monotonic() - started < 10


def test_no_helper_outlives_its_server(tmp_path: Path) -> None:
    server = forkserver.ForkServer()
    out = tmp_path / "out"
    pid = server.ask("start", "tests.helpers.fork_targets", ["sleep"], {**os.environ, "PYTHONPATH": str(ROOT)},
                     str(tmp_path), True, str(out), None)
    _started(out, pid)
    assert _alive(pid)
    server.close()  # the controller's end closed: the server kills its helpers and exits
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid) and server.proc.poll() is not None


def test_a_killed_server_takes_its_helpers_with_it(tmp_path: Path) -> None:
    server = forkserver.ForkServer()
    pid = server.ask("start", "tests.helpers.fork_targets", ["sleep"], {**os.environ, "PYTHONPATH": str(ROOT)},
                     str(tmp_path), True, str(tmp_path / "out"), None)
    _started(tmp_path / "out", pid)
    os.kill(server.proc.pid, signal.SIGKILL)  # as when the controller dies (the server's PDEATHSIG)
    server.proc.wait()
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid), "a helper outlived its fork server"


def test_off_means_a_fresh_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(forkserver.ENV, "off")
    assert not forkserver.enabled()
    done = forkserver.run_module("tests.helpers.fork_targets", ["report", "0"], timeout_s=60,
                                 env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0 and not json.loads(done.stdout.splitlines()[0])["torch"]


def test_ctrl_c_is_the_controllers_and_a_helper_has_pythons_handler(tmp_path: Path) -> None:
    """A terminal's Ctrl-C reaches the controller's process group: the server ignores it (it ends with the
    controller, without a traceback in the user's terminal); a helper has Python's handler, as ``python -m`` has."""
    server = forkserver.ForkServer()
    try:
        pid = server.ask("start", "tests.helpers.fork_targets", ["sleep"], {**os.environ, "PYTHONPATH": str(ROOT)},
                         str(tmp_path), True, str(tmp_path / "out"), None)
        _started(tmp_path / "out", pid)
        os.kill(server.proc.pid, signal.SIGINT)
        time.sleep(0.5)
        assert server.proc.poll() is None and _alive(pid), "the fork server died of a SIGINT"
        os.kill(pid, signal.SIGINT)  # the helper: KeyboardInterrupt, exit status 1 (a fresh interpreter's too)
        deadline = time.monotonic() + 10
        while server.ask("poll", pid) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid)
    finally:
        server.close()


def test_a_server_started_for_this_process_is_adopted_once_and_only_by_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """``STARTED_ENV`` (the self-tests' zygote forks each run's server beside it): taken once, and only by the
    process it names; any other starts its own."""
    monkeypatch.setenv(forkserver.STARTED_ENV, f"{os.getpid() + 1}:99:3:4")  # another process's (a child's copy)
    assert forkserver._started() is None and forkserver.STARTED_ENV not in os.environ
    monkeypatch.setenv(forkserver.STARTED_ENV, f"{os.getpid()}:99:3:4")
    assert forkserver._started() == (99, 3, 4) and forkserver.STARTED_ENV not in os.environ
