"""The rank process: joins the process group, then runs tasks sent by the controller until told to stop.

Started by torch's elastic agent (the engine of ``torchrun``, driven by :mod:`conformance.serve`) with torchrun's
environment (``RANK``, ``LOCAL_RANK``, ``GROUP_RANK`` from the c10d rendezvous, ``MASTER_ADDR/PORT``...); it connects
back to the controller over an authenticated connection (:mod:`conformance.world.protocol`).  Tasks are
module-level functions the controller sends by reference (or names as
``"module:function"``); they are called with the arguments the controller sent, inside the initialised world,
and their return value goes back pickled.  Per-process
state that must outlive one task (communication buffers, which are expensive to build) lives in
:func:`cached`; :func:`on_shutdown` hooks run before the process group is destroyed (real DeepEP V2
buffers must be destroyed before the group, or it crashes).
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import faulthandler
import importlib
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from conformance.core.ids import CallId
from conformance.core.raisers import suite_frame
from conformance.world.protocol import (
    CALL_SLOT_BYTES,
    OFFSET_BYTES,
    LaunchSpec,
    call_file,
    connect,
    dumps,
    interface_of,
    loads,
    local_address,
    log_path,
)

#: Signal that makes every rank dump its Python stacks into its log.
STACK_DUMP_SIGNAL = signal.SIGUSR1

_cache: dict[Any, Any] = {}
_shutdown_hooks: list[Callable[[], None]] = []
_calls: list[str] = []
_call_fd: int | None = None


@dataclass(frozen=True)
class RankContext:
    """Where this process sits in the world."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node: int
    num_nodes: int
    device: str  # "cpu" or "cuda"

    @property
    def group(self) -> Any:  # torch.distributed.ProcessGroup
        """The process group the buffers are built on: the default group, or (rank set-up ``recorder``) the
        ``dist.new_group(list(range(world)))`` made at start-up."""
        import torch.distributed as dist

        return _ep_group if _ep_group is not None else dist.group.WORLD

    def torch_device(self) -> Any:  # torch.device
        """The device tensors of this rank live on."""
        import torch

        return torch.device("cuda", torch.cuda.current_device()) if self.device == "cuda" else torch.device("cpu")


_context: RankContext | None = None
_ep_group: Any = None
_store: Any = None
_control_group: Any = None


def control_group() -> Any:  # torch.distributed.ProcessGroup
    """A gloo group of every rank, made at start-up, for the suite's own synchronisation (:func:`step`): never the
    group the backends communicate on, so that a backend's half-finished collective cannot pair with the suite's."""
    if _control_group is None:
        raise RuntimeError("conformance.world.rank.control_group() called outside a rank process")
    return _control_group


def step(raised: bool, sticky: bool = False) -> tuple[list[int], bool]:
    """Every rank says whether its part of a backend's call raised (``sticky``: and left the device unusable); returns
    the ranks that raised and whether any of them is sticky.  One small all-gather on :func:`control_group`."""
    import torch
    import torch.distributed as dist

    group = control_group()
    mine = torch.tensor([2 if sticky else 1 if raised else 0], dtype=torch.int32)
    flags = [torch.zeros(1, dtype=torch.int32) for _ in range(dist.get_world_size(group))]
    dist.all_gather(flags, mine, group=group)
    values = [int(f.item()) for f in flags]
    return [r for r, v in enumerate(values) if v], any(v == 2 for v in values)


def store() -> Any:  # torch.distributed.TCPStore
    """The world's key-value store (the rendezvous ``TCPStore``): a side channel between the ranks that, unlike a
    collective, synchronises nothing (a task that checks a barrier's ordering writes and reads keys in it)."""
    if _store is None:
        raise RuntimeError("conformance.world.rank.store() called outside a rank process")
    return _store


def context() -> RankContext:
    """The context of the current rank (only valid inside a rank process)."""
    if _context is None:
        raise RuntimeError("conformance.world.rank.context() called outside a rank process")
    return _context


def cached(key: Any, factory: Callable[[], Any]) -> Any:
    """Return the per-process object stored under ``key``, building it with ``factory`` the first time."""
    if key not in _cache:
        _cache[key] = factory()
    return _cache[key]


def on_shutdown(hook: Callable[[], None]) -> None:
    """Run ``hook`` when the world shuts down cleanly, before the process group is destroyed."""
    _shutdown_hooks.append(hook)


def _write_call(text: str) -> None:
    if _call_fd is not None:
        os.pwrite(_call_fd, text.encode()[:CALL_SLOT_BYTES].ljust(CALL_SLOT_BYTES, b"\0"), 0)


def _note_log_offset() -> None:
    """Note where this task's part of the log starts (the node agent returns the log from there on failure)."""
    global _task_log_start
    if _call_fd is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        _task_log_start = os.lseek(1, 0, os.SEEK_END)
        os.pwrite(_call_fd, str(_task_log_start).encode().rjust(OFFSET_BYTES), CALL_SLOT_BYTES)


#: Where this rank's log is, and where the current task's part of it starts (:func:`_note_log_offset`).
_log_path: str | None = None
_task_log_start: int | None = None
#: At most this many characters of what a rank printed during a task that raised go into its report.
PRINTED_CHARS = 2000


def _printed_during_task() -> str:
    """What this rank printed during the current task (its last :data:`PRINTED_CHARS` characters), for a task that
    raised: the library's own diagnostics, e.g. DeepEP's JIT prints ``NVCC compilation failed: <nvcc's output>``
    before its assertion says only ``"NVCC compilation failed"``."""
    if _log_path is None or _task_log_start is None:
        return ""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        with open(_log_path, "rb") as f:
            f.seek(_task_log_start)
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    text = text.strip()
    if not text:
        return ""
    cut = "[...]\n" if len(text) > PRINTED_CHARS else ""
    return f"\n--- what this rank printed during the task ---\n{cut}{text[-PRINTED_CHARS:]}\n"


_labels: list[str] = []
#: The backends whose calls the rank is inside (innermost last): :func:`backend_context`.
_backends: list[str] = []


class RaisedInStep(Exception):  # noqa: N818 - an outcome the controller reads, not an error of this module
    """A backend's call raised on some ranks and every rank knows it (:func:`step`): each rank ends its task with
    this, so the world is still in step and need not be retired (``conformance.tasks.env.RankEnv.call``).

    ``backend``: the backend whose call raised; ``operation``: what was called; ``ranks``: the ranks where it raised
    (the others raise this too, naming them); ``own``: this rank's traceback, or ``None`` where it did not raise;
    ``suite``: where the suite's own code raised it on this rank (a suite error, ``core.raisers.suite_frame``), or
    ``None`` (the backend raised it)."""

    def __init__(self, backend: str, operation: str, ranks: list[int], own: str | None,
                 suite: str | None = None) -> None:
        self.backend, self.operation, self.ranks, self.own, self.suite = backend, operation, ranks, own, suite
        where = f"raised on rank(s) {ranks}"
        super().__init__(f"{backend}: {operation} {where}" + ("" if own else " (not on this rank)"))


@contextlib.contextmanager
def backend_context(name: str, operation: str) -> Iterator[None]:
    """The calls inside the block are ``name``'s (a backend of the task): a crash or hang in a traced library call is
    charged to ``name`` even when another backend traced that class first (a plug-in over the emulation shares the
    emulated backends' classes), and outside any traced call the rank is reported in ``operation [name]``."""
    _backends.append(name)
    try:
        with current_call(str(CallId(name, operation))):
            yield
    finally:
        _backends.pop()


@contextlib.contextmanager
def call_context(label: str) -> Iterator[None]:
    """Name what the calls inside the block are for (e.g. ``refusal row v1_ll_combine_1660``): a crash or hang in one
    of them is then reported as ``Buffer.low_latency_combine (in refusal row v1_ll_combine_1660) [real-v1]``."""
    _labels.append(label)
    try:
        yield
    finally:
        _labels.pop()


def _with_context(name: str) -> str:
    if _backends and (call := CallId.parse(name)):  # a library call made for the backend the task is driving
        name = str(CallId(_backends[-1], call.operation))
    return f"{name} (in {', '.join(_labels)})" if _labels and name else name


@contextlib.contextmanager
def current_call(name: str) -> Iterator[None]:
    """Note that this rank is inside ``name`` (e.g. ``emulated-v2|ElasticBuffer.__init__``) while the block runs.

    The name is written to a small file beside the rank's log before the call starts, so that when the call
    kills the process (a segfault in the library) or hangs, the controller can say which call it was.
    Calls nest; on exit the enclosing call is written back.
    """
    _calls.append(_with_context(name))
    _write_call(_calls[-1])
    try:
        yield
    finally:
        _calls.pop()
        _write_call(_calls[-1] if _calls else "")


def child_exit_status(pid: int, wait_s: float = 2.0) -> int | None:
    """The exit code of child ``pid`` (negative: killed by that signal), or None while it runs after ``wait_s``
    (the node agent's ranks, the exit checks' children of a zygote)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return None
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)


def die_with_parent() -> None:
    """Be killed when the process that started this one dies (Linux PDEATHSIG; a no-op elsewhere)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _die_with_parent(parent_pid: int) -> None:
    """Never outlive the controller: PDEATHSIG where Linux offers it, and a watchdog thread everywhere."""
    die_with_parent()

    def watch() -> None:
        while True:
            if os.getppid() != parent_pid:
                os._exit(70)
            time.sleep(0.5)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def _redirect_output(log_path: str) -> None:
    global _log_path
    _log_path = log_path
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115


def _init_process_group(timeout_s: float) -> RankContext:
    import torch
    import torch.distributed as dist

    env = os.environ
    global _ep_group, _store
    device = env["CONFORMANCE_DEVICE"]
    setup = env.get("CONFORMANCE_RANK_SETUP", "isolated")
    recorder = setup == "recorder"
    rank, world_size = int(env["RANK"]), int(env["WORLD_SIZE"])
    gpu = int(env["LOCAL_RANK"]) if recorder else 0  # isolated: each rank sees its own GPU; shared: the same one
    # NCCL refuses two ranks on one GPU: ranks sharing a GPU talk over gloo (CUDA tensors, host-staged collectives).
    backend = "nccl" if device == "cuda" and setup != "shared" else "gloo"
    torch.set_num_threads(1)
    if device == "cuda":
        torch.cuda.set_device(gpu)
    # The workers' store is the controller's rendezvous store (under this generation's run id), not the one
    # torchrun's agent of node 0 would host (its "TCPStore sharing", switched off in conformance.serve): that
    # store's server thread resolves peer names while the agent forks ranks, and a rank forked at that moment
    # inherits glibc's resolver lock held and hangs in its first connect (seen: 1 start in 10 of a 1x3 world).
    host, _, port = env["CONFORMANCE_STORE"].rpartition(":")
    store = dist.PrefixStore(env["TORCHELASTIC_RUN_ID"] + "/ranks", dist.TCPStore(
        host, int(port), world_size, is_master=False, timeout=datetime.timedelta(seconds=timeout_s)))
    dist.init_process_group(
        backend=backend,
        store=store,
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
        device_id=torch.device("cuda", gpu) if backend == "nccl" else None,
    )
    if recorder:
        _ep_group = dist.new_group(list(range(world_size)))
    global _control_group
    _control_group = dist.new_group(list(range(world_size)), backend="gloo")
    _store = store
    return RankContext(
        rank=rank,
        world_size=world_size,
        local_rank=int(env["LOCAL_RANK"]),
        local_world_size=int(env["LOCAL_WORLD_SIZE"]),
        node=int(env["GROUP_RANK"]),
        num_nodes=world_size // int(env["LOCAL_WORLD_SIZE"]),
        device=device,
    )


def _resolve(target: str) -> Callable[..., Any]:
    module_name, _, attr = target.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _send(conn: Connection, message: tuple) -> None:
    conn.send_bytes(dumps(message))


def _shutdown() -> None:
    import torch.distributed as dist

    for hook in reversed(_shutdown_hooks):
        try:
            hook()
        except Exception:  # a failing hook must not keep the others from running
            traceback.print_exc()
    _cache.clear()
    if dist.is_initialized():
        dist.destroy_process_group()


def rank_entry(spec: LaunchSpec, agent: int, slot: int, host: str, log_dir: str) -> None:
    """Entry point of a rank process: the function torch's elastic agent runs (``elastic_launch``).

    ``agent`` is the controller's number for the node agent that started this rank, ``slot`` which of its host's
    nodes that is (it picks the GPUs), ``host`` that node's name."""
    global _context, _call_fd
    env = os.environ
    rank, node = int(env["RANK"]), int(env["GROUP_RANK"])  # GROUP_RANK: the node's place in the rendezvous
    path = log_path(log_dir, spec.generation, rank)
    _redirect_output(path)
    env.update(spec.env)
    env.update({"CONFORMANCE_DEVICE": spec.device, "CONFORMANCE_RANK_SETUP": spec.rank_setup,
                "CONFORMANCE_STORE": spec.rdzv_endpoint,
                "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    if spec.device == "cuda":
        # "isolated": each rank sees only its own GPU; "recorder": every rank sees the node's GPUs and picks
        # LOCAL_RANK (the set-up fixtures/deepep-real was recorded with); "shared": all on the first one.
        local, per_node = int(env["LOCAL_RANK"]), spec.nproc_per_node
        node_gpus = spec.gpu_ids[slot * per_node:(slot + 1) * per_node]
        env["CUDA_VISIBLE_DEVICES"] = {"recorder": ",".join(node_gpus), "shared": spec.gpu_ids[0]}.get(
            spec.rank_setup, node_gpus[local] if local < len(node_gpus) else "")
    _die_with_parent(os.getppid())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the controller's to handle; it kills the ranks
    _call_fd = os.open(call_file(path), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    faulthandler.enable(file=sys.stderr, all_threads=True)
    faulthandler.register(STACK_DUMP_SIGNAL, file=sys.stderr, all_threads=True)
    conn = connect(spec.control, f"rank {spec.generation}", spec.rank_key)
    # gloo binds to the address the host name resolves to, often 127.0.x.1 (/etc/hosts): on several hosts, use the
    # interface this rank reaches the controller through instead (an explicit GLOO_SOCKET_IFNAME wins)
    if "GLOO_SOCKET_IFNAME" not in env and (interface := interface_of(local_address(conn))):
        env["GLOO_SOCKET_IFNAME"] = interface
    _send(conn, ("hello", {"rank": rank, "node": node, "agent": agent, "pid": os.getpid(), "host": host,
                           "log": path, "env": {k: env.get(k, "") for k in _TORCHRUN_KEYS}}))
    try:
        _context = _init_process_group(spec.start_timeout_s)
        from conformance.backends.alias import apply_from_environment

        deep_ep = apply_from_environment()  # opt-in: ``import deep_ep`` resolves as --deep-ep says (alias.ENV)
    except BaseException:
        _send(conn, ("error", traceback.format_exc()))
        raise
    _send(conn, ("ready", {"pid": os.getpid(), "rank": _context.rank, "deep_ep": deep_ep}))
    _serve(conn)


#: The torchrun variables a rank reports in its hello (the controller checks the numbering is node-major).
_TORCHRUN_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                  "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT")


#: Set to a folder: every rank profiles its tasks (cProfile) and writes ``rank<N>-<pid>.prof`` there when its world
#: shuts down cleanly (benchmarks/README.md shows how to read them).
PROFILE_ENV = "CONFORMANCE_PROFILE_DIR"


def current_cuda_stream() -> Any:
    """The calling thread's current CUDA stream, or ``None`` where CUDA is not in use in this process."""
    import torch

    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return None
    return torch.cuda.current_stream()


def restore_cuda_stream(expected: Any) -> Any:
    """If a call left the current CUDA stream other than ``expected`` (a library call that switched it and raised
    before switching back), make ``expected`` current again and return the stream that was left; else ``None``."""
    current = current_cuda_stream()
    if expected is None or current is None or current == expected:
        return None
    import torch

    torch.cuda.set_stream(expected)
    return current


def _stream_left_switched() -> str | None:
    """Whether the last task left this rank's current CUDA stream other than the default stream: say so (the
    default stream is current again)."""
    if current_cuda_stream() is None:
        return None
    import torch

    left = restore_cuda_stream(torch.cuda.default_stream())
    return None if left is None else \
        f"left the rank's current CUDA stream switched (stream {left.stream_id}, not the default stream)"


def _serve(conn: Connection) -> None:
    profiler = None
    if os.environ.get(PROFILE_ENV):
        import cProfile

        profiler = cProfile.Profile()
    while True:
        try:
            message = loads(conn.recv_bytes())
        except (EOFError, OSError):  # controller went away
            os._exit(71)
        if message[0] == "shutdown":
            if profiler is not None:
                os.makedirs(os.environ[PROFILE_ENV], exist_ok=True)
                name = f"rank{os.environ.get('RANK')}-{os.getpid()}.prof"
                profiler.dump_stats(os.path.join(os.environ[PROFILE_ENV], name))
            _shutdown()
            _send(conn, ("bye", None))
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)  # the elastic agent is not waited for: the node agent ends it
        _, target, args, kwargs = message
        _note_log_offset()
        try:
            task = _resolve(target) if isinstance(target, str) else target
            with current_call(target if isinstance(target, str) else f"{task.__module__}:{task.__qualname__}"):
                if profiler is not None:
                    profiler.enable()
                try:
                    result = task(*args, **kwargs)
                finally:
                    if profiler is not None:
                        profiler.disable()
            reply: tuple = ("ok", result)
        except RaisedInStep as exc:  # every rank ends the task this way: the world stays usable
            own = exc.own and exc.own + _printed_during_task()
            reply = ("raised", {"backend": exc.backend, "operation": exc.operation, "ranks": exc.ranks,
                                "traceback": own or traceback.format_exc(), "suite": exc.suite})
        except BaseException as exc:  # reported to the controller, which retires this world
            call = getattr(exc, "conformance_call", None)  # a backend's sticky error (tasks.env.in_step)
            suite = suite_frame(exc)  # the suite's own code raised it: a suite error
            told = traceback.format_exc() + _printed_during_task()
            reply = ("error", told if call is None and suite is None else {"traceback": told, "call": call,
                                                                            "suite": suite})
        switched = _stream_left_switched()
        if switched is not None and reply[0] != "error":  # a poisoned rank: the controller retires this world
            reply = ("error", f"the task {target if isinstance(target, str) else task.__qualname__} {switched}; "
                              "the world is retired rather than reused\n")
        sys.stdout.flush()
        sys.stderr.flush()
        _send(conn, reply)
