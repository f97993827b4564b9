"""The zygote P25's children are forked from (conformance.tasks.lifecycle): a child's end is reported as a fresh
process's would be (its exit status, the signal that killed it, its output), a hung child is killed on request, and
no child outlives the zygote when the rank lets go of it."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from conformance.tasks.lifecycle import Zygote
from conformance.world.launcher import _running as _alive  # alive and not a zombie


class Hangs(dict):
    """Orders whose first read never returns (a child that hangs)."""

    def __getitem__(self, key: str) -> object:
        time.sleep(3600)
        return None


class SaysItsEnvironment(dict):
    """Orders whose first read raises with the child's ``CONFORMANCE_SELFTEST_MARK``."""

    def __getitem__(self, key: str) -> object:
        raise KeyError(os.environ.get("CONFORMANCE_SELFTEST_MARK"))


def test_a_childs_end_is_reported_as_a_fresh_processes_and_none_outlives_the_zygote(tmp_path: Path) -> None:
    zygote = Zygote()
    env = {**os.environ, "CONFORMANCE_SELFTEST_MARK": "seen"}
    try:
        # orders the child cannot follow: it raises (exit status 1, the traceback in its output)
        out = tmp_path / "raises.txt"
        out.touch()
        pid = zygote.start(env, {"spec": None}, str(out))
        assert zygote.wait(pid, 60.0) == 1
        assert "KeyError: 'case'" in out.read_text(), out.read_text()
        # the environment it was given (not the zygote's)
        pid = zygote.start(env, SaysItsEnvironment(), str(out))
        assert zygote.wait(pid, 60.0) == 1
        assert "KeyError: 'seen'" in out.read_text(), out.read_text()
        # a hung child: still running after the wait, killed on request (SIGKILL), the zygote unharmed
        hung = tmp_path / "hangs.txt"
        hung.touch()
        pid = zygote.start(env, Hangs(), str(hung))
        assert zygote.wait(pid, 1.0) is None
        assert zygote.kill(pid) == -signal.SIGKILL
        # a child killed by a signal: the negative signal number, as subprocess reports it
        pid = zygote.start(env, Hangs(), str(hung))
        os.kill(pid, signal.SIGSEGV)
        assert zygote.wait(pid, 30.0) == -signal.SIGSEGV
        # the rank lets go (its end of the requests closed, as when it exits) while a child hangs: both are gone
        pid = zygote.start(env, Hangs(), str(hung))
        assert _alive(pid)
    finally:
        zygote.proc.stdin.close()
        assert zygote.proc.wait(30) == 0
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid), f"child {pid} outlived its zygote"
