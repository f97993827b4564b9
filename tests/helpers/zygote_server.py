"""The self-tests' zygote (see ``tests/helpers/zygote.py``, its client): run as ``python tests/helpers/zygote_server.py
REQUESTS REPLIES``; it imports torch and pytest (:data:`PRELOAD`), never the suite nor a pytest plug-in, and forks each
run it is asked for.  Nothing here imports the suite: the runs are forked from this module's state."""

from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import signal
import sys
from pathlib import Path

HERE = Path(__file__).resolve()
#: Every process a run under test starts has this variable (its value: the run's tag, tests/helpers/runs.py) in its
#: ``/proc/PID/environ``, node agents and ranks too, which live in sessions of their own: a check finds them
#: wherever they are.  A fork shows the environment its interpreter started with, the zygote's: the zygote starts
#: with a placeholder there, which each run overwrites with its own tag (:func:`_show_tag`).
RUN_TAG = "CONFORMANCE_SELFTEST_RUN"
TAG_PLACEHOLDER = "-" * 48
#: What the zygote imports: torch, pytest, and what the suite's fork server imports first of torch (its PRELOAD).
PRELOAD = ("pytest", "torch", "torch.distributed", "torch.distributed.launcher.api",
           "torch.fx.experimental.symbolic_shapes")


def _serve(requests_fd: int, replies_fd: int) -> tuple[str, list[str]]:
    """The zygote's loop: returns only in a run just forked, with its module and arguments."""
    requests, replies = os.fdopen(requests_fd, "rb"), os.fdopen(replies_fd, "wb")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the self-test process's to handle
    import importlib

    for name in PRELOAD:  # never the suite nor a pytest plug-in (see the module)
        importlib.import_module(name)
    base_path = list(sys.path)  # the interpreter's own
    done: dict[int, int] = {}
    live: set[int] = set()
    while True:
        try:
            request = pickle.load(requests)
        except EOFError:  # the self-test process ended or died: so do its runs
            for pid in live:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
            os._exit(0)
        while live:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if not pid:
                break
            live.discard(pid)
            done[pid] = os.waitstatus_to_exitcode(status)
        reply: object
        try:
            if request[0] == "start":
                _, module, args, env, cwd, new_session, stdout, stderr = request
                pid = os.fork()
                if pid == 0:
                    requests.close()
                    replies.close()
                    _become(env, cwd, new_session, stdout, stderr, base_path)
                    return module, args
                live.add(pid)
                reply = pid
            elif request[0] == "poll":
                reply = done.pop(request[1], None)
            else:
                reply = ValueError(f"the zygote does not know the request {request[0]!r}")
        except Exception as exc:  # answered, never fatal to the zygote
            reply = exc
        pickle.dump(reply, replies)
        replies.flush()


def _become(env: dict[str, str], cwd: str, new_session: bool, stdout: str, stderr: str, base_path: list[str]
            ) -> None:
    """In a run just forked: what ``python -m`` in a fresh interpreter started with ``env`` in ``cwd`` has."""
    if new_session:
        os.setsid()
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: dies with the zygote
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(cwd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for fd, path in ((1, stdout), (2, stderr)):
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, fd)
        os.close(out)
    os.environ.clear()
    os.environ.update(env)
    extra = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [os.getcwd(), *extra, *base_path]
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
    sys.path_importer_cache.clear()
    if env.get(RUN_TAG):
        _show_tag(env[RUN_TAG])
    _start_fork_server()


def _show_tag(tag: str) -> None:
    """Write ``RUN_TAG=tag`` over the zygote's placeholder in this process's start-up environment (the memory
    ``/proc/PID/environ`` reads, which every fork of this process copies)."""
    entry = f"{RUN_TAG}={TAG_PLACEHOLDER}".encode()
    shown = Path("/proc/self/environ").read_bytes()
    at = (b"\0" + shown).find(b"\0" + entry + b"\0")
    new = f"{RUN_TAG}={tag}".encode() + b"\0"
    if at < 0 or len(new) > len(entry) + 1:
        raise RuntimeError(f"the zygote cannot show the run's tag {tag!r} (placeholder not found or too short)")
    stat = Path("/proc/self/stat").read_text()
    env_start = int(stat[stat.rindex(")") + 2:].split()[47])  # field 50: env_start
    ctypes.memmove(env_start + at, new, len(new))


def _start_fork_server() -> None:
    """Fork the run's fork server (``conformance.serve.forkserver``) now, from this clean state, for the suite to
    adopt at its first use (``STARTED_ENV`` there) instead of starting one: it finds torch imported."""
    import torch

    requests_r, requests_w = os.pipe()
    replies_r, replies_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(requests_w)
        os.close(replies_r)
        os.environ["OMP_NUM_THREADS"] = "1"  # what the suite starts its server with
        torch.set_num_threads(1)
        import runpy

        sys.argv = ["conformance.serve.forkserver", str(requests_r), str(replies_w)]
        runpy.run_module("conformance.serve.forkserver", run_name="__main__", alter_sys=True)
        sys.exit(0)
    os.close(requests_r)
    os.close(replies_w)
    os.environ["CONFORMANCE_FORK_SERVER_STARTED"] = f"{os.getpid()}:{pid}:{requests_w}:{replies_r}"


def main() -> None:
    del sys.path[0]  # this file's folder: nothing is imported from there
    module, args = _serve(int(sys.argv[1]), int(sys.argv[2]))
    import runpy

    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
