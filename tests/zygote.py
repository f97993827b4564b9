"""The self-tests' inner runs (``python -m pytest ...`` of the suite, and other ``python -m`` tools) forked from a
warm interpreter instead of started cold: a self-test session starts about 60 of them, and each fresh interpreter
spends about 1.4 s of CPU importing torch and pytest before it does anything (issue 34: the self-tests' 8 minutes).

The zygote (``python tests/zygote.py``, one per self-test process, started at its first inner run and ended with
it) imports torch and pytest and nothing else: never the suite nor a pytest plug-in (pytest could not rewrite the
asserts of a plug-in imported before it, and says so), never a device.  Each run is a fork of it that becomes what
``python -m MODULE ARGS`` in a fresh interpreter is: its own session, working directory, environment, ``sys.path``
(the working directory, the run's ``PYTHONPATH``, then the interpreter's own), ``sys.argv`` and standard streams
(files, read back whole), ending through the interpreter's normal exit.  What a fork cannot give, a fresh
interpreter still does (:func:`run`): another interpreter, other ``PYTHON*`` start-up variables than the zygote's,
or a ``sitecustomize`` on the run's ``PYTHONPATH`` (``site`` imports it at start-up only).  One difference stays:
the runs share the zygote's string-hash seed.

The protocol is the suite's own fork server's (``conformance.serve.forkserver``: pickles over two pipes, one
request at a time, ``start`` / ``poll`` / ``kill``); the zygote kills its runs and exits when its client's end of
the pipe closes (the self-test process ended or died), and each run dies with the zygote (PDEATHSIG)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve()
#: ``off``: every inner run is a fresh interpreter.
ENV = "CONFORMANCE_SELFTEST_ZYGOTE"
#: How often a waiting caller asks about a run.
POLL_S = 0.05
#: Every process a run under test starts has this variable (its value: the run's tag, tests/runs.py) in its
#: ``/proc/PID/environ``, node agents and ranks too, which live in sessions of their own: a check finds them
#: wherever they are.  A fork shows the environment its interpreter started with, the zygote's: the zygote starts
#: with a placeholder there, which each run overwrites with its own tag (:func:`_show_tag`).
RUN_TAG = "CONFORMANCE_SELFTEST_RUN"
TAG_PLACEHOLDER = "-" * 48
#: What the zygote imports: torch, pytest, and what the suite's fork server imports first of torch (its PRELOAD).
PRELOAD = ("pytest", "torch", "torch.distributed", "torch.distributed.launcher.api",
           "torch.fx.experimental.symbolic_shapes")


class Zygote:
    """The self-test process's side: one request at a time (a lock), from any thread."""

    def __init__(self) -> None:
        requests_r, self._requests = os.pipe()
        self._replies, replies_w = os.pipe()
        self.env = dict(os.environ)
        env = {k: v for k, v in self.env.items() if k != "PYTHONPATH"}
        self.proc = subprocess.Popen([sys.executable, str(HERE), str(requests_r), str(replies_w)],
                                     stdin=subprocess.DEVNULL, pass_fds=(requests_r, replies_w),
                                     env={**env, RUN_TAG: TAG_PLACEHOLDER})
        os.close(requests_r)
        os.close(replies_w)
        self._out, self._in = os.fdopen(self._requests, "wb"), os.fdopen(self._replies, "rb")
        self._lock = threading.Lock()
        self.owner = os.getpid()

    def ask(self, *request: object) -> object:
        with self._lock:
            try:
                pickle.dump(request, self._out)
                self._out.flush()
                reply = pickle.load(self._in)
            except (EOFError, OSError, pickle.UnpicklingError) as e:
                raise RuntimeError(f"the self-tests' zygote (pid {self.proc.pid}) is gone: {e!r}") from e
        if isinstance(reply, BaseException):
            raise reply
        return reply

    def alive(self) -> bool:
        return self.proc.poll() is None and self.owner == os.getpid()

    def serves(self, env: dict[str, str]) -> bool:
        """Whether a fork of this zygote is what a fresh interpreter with ``env`` would be (see the module)."""
        def startup(e: dict[str, str]) -> dict[str, str]:  # read when the interpreter or torch's libraries load
            return {k: v for k, v in e.items()
                    if k.startswith(("PYTHON", "OMP_", "KMP_", "MKL_")) and k != "PYTHONPATH"}

        path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        customised = any((Path(p) / f"{name}.py").exists() for p in path for name in ("sitecustomize", "usercustomize"))
        return startup(env) == startup(self.env) and not customised


_zygote: list[Zygote] = []
_zygote_lock = threading.Lock()


def zygote() -> Zygote | None:
    """This process's zygote, started at its first use (again if it died), or ``None`` where it is turned off."""
    if os.environ.get(ENV, "").strip().lower() in ("off", "0", "no", "false"):
        return None
    with _zygote_lock:
        if not _zygote or not _zygote[0].alive():
            _zygote[:] = [Zygote()]
        return _zygote[0]


def run(module: str, args: list[str], *, cwd: Path, env: dict[str, str], timeout: float,
        python: str = sys.executable, fresh: bool = False) -> tuple[subprocess.CompletedProcess, int]:
    """``python -m module *args`` in a session of its own (its output captured, as text); raises
    ``subprocess.TimeoutExpired`` after killing its process group.  Returns the completed process and its pid (its
    process group's id).  Forked from the zygote where that is the same as a fresh interpreter, else (and with
    ``fresh``: a test of what the interpreter has imported) one."""
    cmd = [python, "-m", module, *args]
    server = zygote() if python == sys.executable and not fresh else None
    if server is None or not server.serves(env):
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err), proc.pid
    with tempfile.TemporaryDirectory(prefix="selftest-zygote-") as folder:
        out_path, err_path = os.path.join(folder, "stdout"), os.path.join(folder, "stderr")
        pid = server.ask("start", module, list(args), dict(env), str(cwd), out_path, err_path)
        assert isinstance(pid, int)
        deadline = time.monotonic() + timeout
        while (code := server.ask("poll", pid)) is None:
            if time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                while server.ask("poll", pid) is None:
                    time.sleep(POLL_S)
                raise subprocess.TimeoutExpired(cmd, timeout)
            time.sleep(POLL_S)
        assert isinstance(code, int)
        out, err = Path(out_path).read_text(errors="replace"), Path(err_path).read_text(errors="replace")
    return subprocess.CompletedProcess(cmd, code, out, err), pid


# --------------------------------------------------------------------------------------------------- the zygote
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
                _, module, args, env, cwd, stdout, stderr = request
                pid = os.fork()
                if pid == 0:
                    requests.close()
                    replies.close()
                    _become(env, cwd, stdout, stderr, base_path)
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


def _become(env: dict[str, str], cwd: str, stdout: str, stderr: str, base_path: list[str]) -> None:
    """In a run just forked: what ``python -m`` in a fresh interpreter started with ``env`` in ``cwd`` has."""
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
