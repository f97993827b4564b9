"""The end of a run (P25): a backend's processes exit cleanly after its teardown and ``destroy_process_group()``.

The suite's own rank processes never end the way a user's do (they destroy every buffer before the group and leave
with ``os._exit``), so each rank starts one short-lived child per backend: the children of one backend form a fresh
process group (the world's rendezvous store under a prefix of their own), build the backend as a user would (a
plug-in lazily, in its first call), dispatch and combine the example, end as the case's scenario says, destroy the
process group, print :data:`DESTROYED` and return from ``main``, so that the interpreter's exit collects what is
left (a wrapper's module-global buffer, say).  The rank waits for its children and returns each one's exit status,
the signal that killed it, the markers it reached and the tail of its output.

The children of a rank are forked from one fresh interpreter per rank, its *zygote* (``python -m
conformance.tasks.lifecycle --zygote``, started at the rank's first exit check, alive as long as the rank), which
imported torch and the suite's modules and touched no device: each child is the fresh process a user's run is (it
runs this module as ``__main__`` and ends through the interpreter's normal exit: module globals collected,
``atexit``), without the 1.5-2 s of CPU that importing torch costs every fresh interpreter (P25 started about 90 of
them in one self-test session).  The zygote forks, reports and kills children on the rank's requests
(:class:`Zygote`); it ends, killing any child still alive, when the rank closes its requests or dies.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from conformance.core.cases import ExitCase
from conformance.core.outcomes import NotChecked, Why
from conformance.core.views import DispatchOptions
from conformance.tasks.env import RankEnv, TaskSettings, rank_task
from conformance.world.rank import control_group

#: Printed by a child once its calls returned, and once the process group is destroyed (then it only exits).
CALLS_DONE = "conformance-exit-check: calls done"
DESTROYED = "conformance-exit-check: process group destroyed; exiting"
#: Seconds a child may take (start, calls, exit) before it is killed and reported hung.
CHILD_TIMEOUT_S = 150.0
#: The output kept per child.
TAIL_CHARS = 4000
_runs = [0]
#: What a child keeps alive until the interpreter exits (a user's module-global buffers).
_KEPT: list[Any] = []


#: The line a child prints before its end of the run (what it called), read back by :func:`exit_checks`.
ENDING = "conformance-exit-check: ending with "


def describe_end(spec: Any, scenario: str, backend: Any = None) -> str:
    """How the backend's run ended, in words (failure messages)."""
    if scenario == "garbage-collected":
        return (f"its buffers built with explicitly_destroy=False, kept in a module global and never destroyed "
                f"({spec.class_name}(group, ...) as a user who never destroys it builds it)")
    if spec.plugin:
        from conformance.backends.plugins import PluginBackend

        if backend is not None and type(backend).teardown is PluginBackend.teardown:
            return "no teardown (the wrapper offers its users none: PluginBackend.teardown is not overridden)"
        name = type(backend).__name__ if backend is not None else spec.name
        return f"the wrapper's own teardown ({name}.teardown())"
    return f"{spec.class_name}.destroy() of every buffer (built with explicitly_destroy=True)"


#: What torch's gloo leaves when a process group that ran collectives is still referenced at exit (after
#: ``destroy_process_group()``): ``std::terminate`` in the C++ teardown, about one exit in five on torch 2.13 with no
#: library involved (a two-line script shows it).  An exit that shows only this is run again.
TORCH_GLOO_EXIT_ABORT = "terminate called without an active exception"
#: How many times a backend's children are started when they die only of :data:`TORCH_GLOO_EXIT_ABORT`.
ATTEMPTS = 6


def torch_gloo_exit_abort(result: dict[str, Any]) -> bool:
    """Whether a child died at exit of torch's gloo teardown only (no library message in its output)."""
    tail = result["tail"]
    return (result["signal"] == "SIGABRT" and result["destroyed"] and TORCH_GLOO_EXIT_ABORT in tail
            and not any(word in tail for word in ("EPException", "CUDA", "deep_ep", "Assertion")))


class Zygote:
    """The rank's side of its zygote (see the module docstring): requests and replies pickled over its stdin and
    stdout, one at a time."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "conformance.tasks.lifecycle", ZYGOTE_FLAG],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=dict(os.environ))

    def ask(self, *request: Any) -> Any:
        try:
            pickle.dump(request, self.proc.stdin)
            self.proc.stdin.flush()
            return pickle.load(self.proc.stdout)
        except (EOFError, OSError, pickle.UnpicklingError) as e:
            raise RuntimeError(f"the exit checks' zygote process (pid {self.proc.pid}) is gone (exit status "
                               f"{self.proc.poll()}): {type(e).__name__}: {e}") from e

    def start(self, env: dict[str, str], orders: dict[str, Any], output: str) -> int:
        """Fork a child with ``env`` that writes its output to the file ``output`` and runs ``orders``: its pid."""
        return self.ask("start", env, orders, output)

    def wait(self, pid: int, timeout_s: float) -> int | None:
        """The child's exit status (negative: the signal that killed it), or None if it still runs after
        ``timeout_s``."""
        return self.ask("wait", pid, timeout_s)

    def kill(self, pid: int) -> int:
        """Kill the child; its exit status."""
        return self.ask("kill", pid)


#: The flag that makes ``python -m conformance.tasks.lifecycle`` a zygote.
ZYGOTE_FLAG = "--zygote"
_zygote: list[Zygote] = []


def zygote() -> Zygote:
    """This rank's zygote, started at its first use (one that died is started again)."""
    if not _zygote or _zygote[0].proc.poll() is not None:
        _zygote[:] = [Zygote()]
    return _zygote[0]


def _start(env: RankEnv, spec: Any, case: ExitCase, attempt: int) -> tuple[int, str]:
    child_env = dict(os.environ)
    # a fresh group per backend, task and attempt, in the world's rendezvous store (rank.py's _init_process_group)
    child_env["TORCHELASTIC_RUN_ID"] = f"{os.environ['TORCHELASTIC_RUN_ID']}/exit/{_runs[0]}/{spec.name}/{attempt}"
    fd, output = tempfile.mkstemp(prefix="conformance-exit-check-")  # a file, not a pipe: never blocks a child
    os.close(fd)
    orders = {"spec": spec, "case": case, "mutant": env.settings.mutant, "timeout_s": CHILD_TIMEOUT_S}
    return zygote().start(child_env, orders, output), output


def kind_of(spec: Any) -> str | None:
    """``plugin`` (a wrapper), ``class`` (a class backend not the library's own), else ``None`` (the library)."""
    return "plugin" if spec.plugin else "class" if spec.substitute and not spec.library else None


def _result(env: RankEnv, name: str, case: ExitCase, pid: int, output: str, deadline: float) -> dict[str, Any]:
    code = zygote().wait(pid, max(1.0, deadline - time.monotonic()))
    hung = code is None
    if hung:
        code = zygote().kill(pid)
    with open(output, "rb") as f:
        text = f.read().decode(errors="replace")
    os.unlink(output)
    return {
        "exit": code,
        "signal": signal.Signals(-code).name if code is not None and code < 0 and -code in
        signal.Signals._value2member_map_ else None,
        "hung": hung,
        "calls_done": CALLS_DONE in text,
        "destroyed": DESTROYED in text,
        "tail": text[-TAIL_CHARS:],
        "end": next((line[len(ENDING):] for line in text.splitlines() if line.startswith(ENDING)),
                    describe_end(env.spec(name), case.scenario)),
        "kind": kind_of(env.spec(name)),
        "attempts": 1,
    }


@rank_task
def exit_checks(env: RankEnv) -> dict[str, Any]:
    """Per backend: one child process on every rank, all backends at once (see the module docstring).  A backend
    whose children died only of torch's gloo exit abort (:data:`TORCH_GLOO_EXIT_ABORT`, on any rank) is started
    again, every rank agreeing, up to :data:`ATTEMPTS` times; its result says how many attempts it took."""
    case: ExitCase = env.case
    _runs[0] += 1
    out: dict[str, Any] = {}
    pending = []
    for spec in env.specs():
        if case.scenario == "garbage-collected" and spec.plugin:
            out[spec.name] = NotChecked.example(spec.name, Why.API, f"{spec.name} end of run", (
                "a plug-in builds and keeps its buffers itself: only its own teardown (scenario 'teardown') "
                "applies"))
            continue
        pending.append(spec)
    for attempt in range(1, ATTEMPTS + 1):
        children = {spec.name: _start(env, spec, case, attempt) for spec in pending}
        deadline = time.monotonic() + CHILD_TIMEOUT_S
        for name, (pid, output) in children.items():
            result = _result(env, name, case, pid, output, deadline)
            result["attempts"] = attempt
            out[name] = result
        again = [spec.name for spec in pending if torch_gloo_exit_abort(out[spec.name])]
        flags = [None] * env.world_size
        import torch.distributed as dist

        dist.all_gather_object(flags, again, group=control_group())
        retry = {name for names in flags for name in names or ()}
        pending = [spec for spec in pending if spec.name in retry]
        if not pending or attempt == ATTEMPTS:
            break
    return out


def _zygote_main() -> dict[str, Any]:
    """The zygote's loop (see :class:`Zygote`): returns only in a child just forked, with its orders."""
    # requests and replies on descriptors of their own: what an import prints goes to the rank's log, not the rank
    requests, replies = os.fdopen(os.dup(0), "rb"), os.fdopen(os.dup(1), "wb")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    import torch  # noqa: F401  (what every child imports: once, here; no device touched)
    import torch.distributed  # noqa: F401

    import conformance.backends.alias  # noqa: F401
    import conformance.backends.factory  # noqa: F401
    import conformance.mutants  # noqa: F401
    from conformance.serve.forkserver import become, next_request
    from conformance.world.rank import child_exit_status, die_with_parent

    die_with_parent()
    live: set[int] = set()

    def reply(value: Any) -> None:
        pickle.dump(value, replies)
        replies.flush()

    while True:
        request = next_request(requests, live)  # the rank closed its end or died: no child outlives the zygote
        if request[0] == "start":
            _, env, orders, output = request
            pid = os.fork()
            if pid == 0:  # the child: its own output, the rank's environment, no requests
                requests.close()
                replies.close()
                become(env, os.getcwd(), False, output, output)
                return orders
            live.add(pid)
            reply(pid)
        elif request[0] == "wait":
            _, pid, timeout_s = request
            code = child_exit_status(pid, timeout_s)
            if code is not None:
                live.discard(pid)
            reply(code)
        elif request[0] == "kill":
            pid = request[1]
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            live.discard(pid)
            reply(os.waitstatus_to_exitcode(status))


def _child_main(orders: dict[str, Any]) -> None:
    """One backend's life in a fresh process (forked from the rank's zygote)."""
    spec, case = orders["spec"], orders["case"]
    import torch.distributed as dist

    from conformance.backends.alias import apply_from_environment
    from conformance.backends.factory import get_adapter
    from conformance.mutants import activate
    from conformance.world import rank as rank_process

    rank_process._context = rank_process._init_process_group(orders["timeout_s"])
    apply_from_environment()
    planted = activate(orders["mutant"])
    planted.__enter__()  # planted until the process is gone (its exit is what is checked)
    _KEPT.append(planted)  # (a context manager collected would undo it)
    env = RankEnv(TaskSettings((spec,), orders["mutant"]), case, rank_process.context())
    example = case.example
    adapter = get_adapter(spec)
    if case.scenario == "garbage-collected":
        adapter.explicitly_destroy = False
    view, raw = adapter.dispatch(env.inputs, example, DispatchOptions(), env.rank)
    adapter.combine(raw, raw.recv_x)
    del view, raw
    print(CALLS_DONE, flush=True)
    print(ENDING + describe_end(spec, case.scenario, adapter), flush=True)
    if case.scenario == "garbage-collected":
        _KEPT.append(adapter)  # a user's module global: collected when the interpreter exits
    elif spec.plugin:
        adapter.teardown()
    else:
        adapter.destroy()
    dist.destroy_process_group()
    print(DESTROYED, flush=True)


if __name__ == "__main__":
    _child_main(_zygote_main() if sys.argv[1:] == [ZYGOTE_FLAG] else pickle.load(sys.stdin.buffer))
