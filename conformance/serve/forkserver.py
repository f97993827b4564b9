"""The fork server: the controller's short-lived helper interpreters, forked from one that imported torch once.

A controller (a pytest process or xdist worker) starts helper interpreters: the node agent of each CPU world it
starts (``python -m conformance.serve --local``) and the import probe of each plug-in and class backend it is
given (``python -m conformance.backends.plugins``).  Each fresh interpreter spends 1.3-2 s of CPU importing torch
before it does anything: a self-test session started about 100 node agents and 35 probes.  Instead, the first one a
controller needs starts this server (``python -m conformance.serve.forkserver``, one per controller process), which
imports torch and what those helpers and their ranks import first (:data:`PRELOAD`: never ``deep_ep``) and touches
no device; every helper is then a fork of it that runs its module as ``__main__`` with its arguments, environment,
working directory and output, as ``python -m MODULE ARGS`` would, and ends through the interpreter's normal exit.

What a fork does not give, the fresh interpreter still does: a GPU world's node agent (its ranks are *spawned*: see
``conformance.world.launcher.START_METHODS``), and every helper where ``$CONFORMANCE_FORK_SERVER=off``.

The server answers one request at a time over two pipes of its own (pickles): ``start`` (fork a helper: its pid),
``poll`` (its exit status, or ``None`` while it runs; the server reaps every child it has) and ``kill``; it never
blocks in a request.  It dies with the controller (PDEATHSIG, and when its request pipe closes), and its helpers
with it (theirs); a helper's own children are its business, as they were.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from typing import Any

#: What the server imports before it forks anything: torch, what a node agent, its elastic agents and its ranks
#: import first (torch's elastic launcher; the symbolic-shape module an autograd ``backward`` with explicit gradients
#: imports, about 0.4 s in each rank that first calls one), and what the probes import (not their module itself:
#: runpy runs a module as ``__main__`` from its source, and warns about one already imported).  ``module:function``:
#: the function is called once the module is imported (the versions' refusal tables, which ranks of the emulation
#: read: about 0.1 s of parsing each).
PRELOAD = ("torch", "torch.distributed", "torch.distributed.launcher.api", "torch.fx.experimental.symbolic_shapes",
           "conformance.serve", "conformance.backends.alias", "conformance.mutants", "conformance.core.spec",
           "conformance.versions:preload")
#: ``off``: every helper is a fresh interpreter (``subprocess.Popen``), as before the fork server.
ENV = "CONFORMANCE_FORK_SERVER"
#: How often a waiting caller asks the server about a helper.
POLL_S = 0.02
#: A server already started for this process, to adopt at the first use instead of starting one:
#: ``PID:SERVER_PID:REQUESTS_FD:REPLIES_FD`` (PID: the process it is for; any other ignores it).  The self-tests start
#: their runs forked from a warm interpreter and fork each one's server beside it, before the run imports anything
#: (``tests/helpers/zygote.py``); the server is this module's, as started here.
STARTED_ENV = "CONFORMANCE_FORK_SERVER_STARTED"


def enabled() -> bool:
    """Whether helpers are forked from the server: ``$CONFORMANCE_FORK_SERVER`` is not ``off``, and the caller is
    the main thread or the server runs already (the server dies with the thread that started it: PDEATHSIG)."""
    if os.environ.get(ENV, "").strip().lower() in ("off", "0", "no", "false"):
        return False
    return threading.current_thread() is threading.main_thread() or bool(_server and _server[0].alive())


class ForkServer:
    """The controller's side of its fork server: one request at a time (a lock), from any thread.  ``command`` and
    ``env``: another server speaking the same protocol (the self-tests' zygote, ``tests/helpers/zygote.py``), started
    with its two pipes' descriptors appended to ``command``; ``name``: what its errors call it."""

    def __init__(self, command: list[str] | None = None, env: dict[str, str] | None = None,
                 name: str = "the fork server") -> None:
        self.name = name
        started = _started() if command is None else None
        if started:
            self.proc: subprocess.Popen | _Process = _Started(started[0])
            self._requests, self._replies = started[1:]
        else:
            requests_r, self._requests = os.pipe()
            self._replies, replies_w = os.pipe()
            if env is None:  # what a node agent gets (libgomp reads it when torch loads)
                env = {**os.environ, "OMP_NUM_THREADS": "1"}
            self.proc = subprocess.Popen(
                [*(command or [sys.executable, "-m", "conformance.serve.forkserver"]), str(requests_r), str(replies_w)],
                stdin=subprocess.DEVNULL, pass_fds=(requests_r, replies_w), env=env)
            os.close(requests_r)
            os.close(replies_w)
        self._out = os.fdopen(self._requests, "wb")
        self._in = os.fdopen(self._replies, "rb")
        self._lock = threading.Lock()
        self.owner = os.getpid()

    def ask(self, *request: Any) -> Any:
        with self._lock:
            try:
                pickle.dump(request, self._out)
                self._out.flush()
                reply = pickle.load(self._in)
            except (EOFError, OSError, pickle.UnpicklingError) as e:
                raise RuntimeError(f"{self.name} (pid {self.proc.pid}) is gone (exit status {self.proc.poll()}): "
                                   f"{type(e).__name__}: {e}") from e
        if isinstance(reply, BaseException):
            raise reply
        return reply

    def alive(self) -> bool:
        return self.proc.poll() is None and self.owner == os.getpid()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._out.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _started() -> tuple[int, int, int] | None:
    """The server started for this process (:data:`STARTED_ENV`, taken once): its pid and this side's two pipes."""
    value = os.environ.pop(STARTED_ENV, "")
    fields = value.split(":")
    if len(fields) != 4 or not all(f.isdigit() for f in fields) or int(fields[0]) != os.getpid():
        return None
    return int(fields[1]), int(fields[2]), int(fields[3])


class _Process:
    """What the suite uses of ``subprocess.Popen`` (``pid``, ``args``, ``returncode``, ``poll``, ``wait``, ``kill``,
    ``terminate``, ``send_signal``) for a process that is not a ``Popen``: a subclass says how to ``poll`` it."""

    pid: int
    args: list[str] | str
    returncode: int | None = None

    def poll(self) -> int | None:
        raise NotImplementedError

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(POLL_S)
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class _Started(_Process):
    """A server started for this process (a child of it)."""

    def __init__(self, pid: int) -> None:
        self.pid, self.args = pid, f"fork server {pid}"

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                done, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.returncode = -signal.SIGKILL
            else:
                if done:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


_server: list[ForkServer] = []
_server_lock = threading.Lock()


def server() -> ForkServer:
    """This process's fork server, started at its first use (again if it died, or in a forked copy of a process)."""
    with _server_lock:
        if not _server or not _server[0].alive():
            _server[:] = [ForkServer()]
        return _server[0]


class Forked(_Process):
    """A helper forked by the server (``via``: another server of the same protocol, the self-tests' zygote)."""

    def __init__(self, module: str, args: list[str], *, env: dict[str, str] | None = None, cwd: str | None = None,
                 new_session: bool = False, stdout: str | None = None, stderr: str | None = None,
                 via: ForkServer | None = None) -> None:
        self.args = [sys.executable, "-m", module, *args]
        self._server = via or server()
        self.pid = self._server.ask("start", module, list(args), dict(os.environ if env is None else env),
                                    cwd or os.getcwd(), new_session, stdout, stderr)

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                self.returncode = self._server.ask("poll", self.pid)
            except RuntimeError:  # the server died: its helpers died with it (PDEATHSIG)
                self.returncode = -signal.SIGKILL
        return self.returncode


def run_module(module: str, args: list[str], *, timeout_s: float, env: dict[str, str] | None = None
               ) -> subprocess.CompletedProcess:
    """``subprocess.run([python, "-m", module, *args], capture_output=True, text=True, timeout=timeout_s)``, the
    interpreter forked from the server where it is enabled.  Raises ``subprocess.TimeoutExpired`` (the helper
    killed) like ``subprocess.run``."""
    if not enabled():
        return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                              timeout=timeout_s, env=env)
    import tempfile

    with tempfile.TemporaryDirectory(prefix="conformance-forked-") as folder:
        out, err = os.path.join(folder, "stdout"), os.path.join(folder, "stderr")
        child = Forked(module, args, env=env, stdout=out, stderr=err)
        try:
            code = child.wait(timeout_s)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
            raise
        with open(out, errors="replace") as o, open(err, errors="replace") as e:
            return subprocess.CompletedProcess(child.args, code, o.read(), e.read())


# ------------------------------------------------------------------------------------------------ the server side
def _serve(requests_fd: int, replies_fd: int) -> tuple[str, list[str]]:
    """The server's loop: returns only in a helper just forked, with the module and arguments it is to run."""
    requests, replies = os.fdopen(requests_fd, "rb"), os.fdopen(replies_fd, "wb")
    from conformance.world.rank import die_with_parent

    die_with_parent()
    # A terminal's Ctrl-C reaches the controller's process group, this server too: it is the controller's to handle
    # (the server ends with it); a helper gets Python's own handler back, as a fresh interpreter has it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import importlib

    for name in PRELOAD:
        module, _, function = name.partition(":")
        imported = importlib.import_module(module)
        if function:
            getattr(imported, function)()
    assert "deep_ep" not in sys.modules, "the fork server imported deep_ep: every probe would see it imported"
    done: dict[int, int] = {}  # reaped helpers' exit statuses, kept until asked for
    live: set[int] = set()

    def reap() -> None:
        while live:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if not pid:
                return
            live.discard(pid)
            done[pid] = os.waitstatus_to_exitcode(status)

    while True:
        request = next_request(requests, live)
        reap()
        try:
            if request[0] == "start":
                _, module, args, env, cwd, new_session, stdout, stderr = request
                pid = os.fork()
                if pid == 0:
                    requests.close()
                    replies.close()
                    signal.signal(signal.SIGINT, signal.default_int_handler)
                    become(env, cwd, new_session, stdout, stderr)
                    return module, args
                live.add(pid)
                reply: Any = pid
            elif request[0] == "poll":
                reply = done.pop(request[1], None)
            elif request[0] == "kill":
                with contextlib.suppress(ProcessLookupError):
                    os.kill(request[1], signal.SIGKILL)
                reply = None
            else:
                reply = ValueError(f"the fork server does not know the request {request[0]!r}")
        except Exception as exc:  # answered, never fatal to the server
            reply = exc
        pickle.dump(reply, replies)
        replies.flush()


def next_request(requests: Any, live: set[int]) -> Any:
    """(a server: this one, the exit checks' zygote) Its client's next request; when the client closed its end or
    died, every child still alive is killed and the server exits: none outlives it."""
    try:
        return pickle.load(requests)
    except EOFError:
        for pid in live:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        os._exit(0)


def become(env: dict[str, str], cwd: str, new_session: bool, stdout: str | None, stderr: str | None) -> None:
    """In a process just forked (a helper here, a child of the exit checks' zygote): its session, working
    directory, standard streams (``stdout``/``stderr``: files, else inherited) and environment; it dies with its
    parent."""
    if new_session:
        os.setsid()
    os.chdir(cwd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    opened: dict[str, int] = {}  # one open file (one offset) where both streams go to the same one
    for fd, path in ((1, stdout), (2, stderr)):
        if path:
            if path not in opened:
                opened[path] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(opened[path], fd)
    for out in opened.values():
        os.close(out)
    os.environ.clear()
    os.environ.update(env)
    from conformance.world.rank import die_with_parent

    die_with_parent()  # with the server, which dies with the controller


def main() -> None:
    module, args = _serve(int(sys.argv[1]), int(sys.argv[2]))
    import runpy

    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
