"""The self-tests' inner runs (``python -m pytest ...`` of the suite, and other ``python -m`` tools) forked from a
warm interpreter instead of started cold: a self-test session starts about 60 of them, and each fresh interpreter
spends about 1.4 s of CPU importing torch and pytest before it does anything (issue 34: the self-tests' 8 minutes).

The zygote (``python tests/helpers/zygote_server.py``, one per self-test process, started at its first inner run and
ended with it) imports torch and pytest and nothing else: never the suite nor a pytest plug-in (pytest could not rewrite
the asserts of a plug-in imported before it, and says so), never a device.  Each run is a fork of it that becomes what
``python -m MODULE ARGS`` in a fresh interpreter is: its own session, working directory, environment, ``sys.path``
(the working directory, the run's ``PYTHONPATH``, then the interpreter's own), ``sys.argv`` and standard streams
(files, read back whole), ending through the interpreter's normal exit.  What a fork cannot give, a fresh
interpreter still does (:func:`run`): another interpreter, other ``PYTHON*`` start-up variables than the zygote's,
or a ``sitecustomize`` on the run's ``PYTHONPATH`` (``site`` imports it at start-up only).  One difference stays:
the runs share the zygote's string-hash seed.  This module is the self-test process's side; the zygote's is
``tests/helpers/zygote_server.py``.

The protocol is the suite's own fork server's (``conformance.serve.forkserver``, whose client this one is and whose
``Forked`` a run is: pickles over two pipes, one request at a time, ``start`` / ``poll``); the zygote's loop is its
own (it must not import the suite); the zygote kills its runs and exits when its client's end of the pipe closes
(the self-test process ended or died), and each run dies with the zygote (PDEATHSIG)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from conformance.serve.forkserver import Forked, ForkServer
from tests.helpers.zygote_server import HERE, RUN_TAG, TAG_PLACEHOLDER

#: ``off``: every inner run is a fresh interpreter.
ENV = "CONFORMANCE_SELFTEST_ZYGOTE"


class Zygote(ForkServer):
    """The self-test process's side: the suite's fork server client, speaking to the zygote's loop."""

    def __init__(self) -> None:
        self.env = dict(os.environ)
        env = {k: v for k, v in self.env.items() if k != "PYTHONPATH"}
        super().__init__([sys.executable, str(HERE)], env={**env, RUN_TAG: TAG_PLACEHOLDER},
                         name="the self-tests' zygote")

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
        child = Forked(module, args, env=env, cwd=str(cwd), new_session=True, stdout=out_path, stderr=err_path,
                       via=server)
        try:
            code = child.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            raise subprocess.TimeoutExpired(cmd, timeout) from None
        out, err = Path(out_path).read_text(errors="replace"), Path(err_path).read_text(errors="replace")
    return subprocess.CompletedProcess(cmd, code, out, err), child.pid
