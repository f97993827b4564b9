"""The controller side of the rank world.

One :class:`World` per pytest(-xdist) worker.  Its ranks are started by torch's elastic agent, the engine of
``torchrun`` (``torch.distributed.launcher.api.elastic_launch``), one agent per node: on this host the nodes of
one ``python -m conformance.serve --local --nodes K`` process (torch loaded once, a loop forked per node), which dies
with the controller; on other hosts the loop
``python -m conformance.serve --rdzv-endpoint HOST:PORT`` joins each world generation.  The controller hosts the
c10d rendezvous store (a multi-tenant ``TCPStore``) and an authenticated control listener
(:mod:`conformance.world.protocol`); the ranks get torchrun's environment (``GROUP_RANK`` from the rendezvous) and
connect back.  A task that raises, hangs or crashes on any rank is reported with every rank's traceback or stacks
(the node agent, local to its ranks, reads their logs and exit status and signals them); the world is then retired
(never reused after a failed collective) and started afresh on the next call.  No rank outlives it.
"""

from __future__ import annotations

import datetime
import os
import queue
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, Listener, wait
from typing import Any

from conformance.core.ids import CallId
from conformance.serve import forkserver
from conformance.world import protocol
from conformance.world.errors import RankCrashed, RankFailure, RankRaised, RankTimeout, WorldError

#: How long ranks that did not raise are given to finish after another rank raised.
GRACE_AFTER_ERROR_S = 5.0
#: How long a clean shutdown may take before ranks are killed.
SHUTDOWN_TIMEOUT_S = 15.0
#: How torch's elastic agent starts the ranks (``$CONFORMANCE_START_METHOD`` overrides): "fork" on CPU (the node
#: agent has torch loaded: a rank costs a fork), "spawn" on GPUs, torchrun's default: a rank forked from a process in
#: which torch's elastic agent touched CUDA cannot initialise CUDA ("Cannot re-initialize CUDA in forked
#: subprocess", seen on an H200).
START_METHODS = {"cpu": "fork", "cuda": "spawn"}


def start_method(device: str) -> str:
    """How the ranks of a world on ``device`` are started (see ``START_METHODS``)."""
    return os.environ.get("CONFORMANCE_START_METHOD") or START_METHODS.get(device, "spawn")


@dataclass(frozen=True)
class WorldShape:
    """nodes x ranks per node; ranks are numbered node-major like torchrun."""

    nodes: int = 1
    ranks_per_node: int = 2

    @property
    def size(self) -> int:
        """Total number of ranks."""
        return self.nodes * self.ranks_per_node

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.ranks_per_node < 1:
            raise WorldError(f"a world needs at least one node and one rank per node, got {self}")


@dataclass
class _Node:
    """A node agent of the current generation: a local ``conformance.serve --local`` process, or a remote one."""

    agent: int
    conn: Connection
    host: str
    address: str
    process: subprocess.Popen | forkserver.Forked | None = None

    @property
    def where(self) -> str:
        return f"host {self.host}" + (f" ({self.address})" if self.address not in ("127.0.0.1", self.host) else "")


@dataclass
class _Rank:
    rank: int
    conn: Connection
    pid: int
    node: _Node
    log_path: str
    env: dict[str, str] = field(default_factory=dict)
    gone: bool = False


@dataclass
class World:
    """A persistent world of rank processes, started by torch's elastic agent with a c10d rendezvous.

    Args:
        shape: nodes x ranks per node.
        device: ``"cpu"`` (gloo) or ``"cuda"`` (NCCL, one GPU per rank).
        gpu_ids: physical GPU ids this world may use, one per rank (``device="cuda"`` only).
        rank_setup: ``"isolated"`` (each rank sees only its GPU; buffers on the default group) or ``"recorder"``
            (every rank sees its node's GPUs and selects ``LOCAL_RANK``; buffers on
            ``dist.new_group(list(range(world)))``), the set-up the real-library recordings were made with, or
            ``"shared"`` (every rank on the first GPU, time-sliced, over gloo: the legacy intranode path only).
        env: extra environment for the ranks (e.g. NCCL switches).
        start_timeout_s: how long start-up may take.
        log_dir: where rank logs of this host go (a temporary directory by default, removed on close).
        rdzv_endpoint: ``HOST:PORT`` the rendezvous store listens on (``127.0.0.1:0``: this host only, any port);
            remote nodes join with ``python -m conformance.serve --rdzv-endpoint HOST:PORT``.
        remote_nodes: how many of ``shape.nodes`` are served by other hosts (the rest are started here).
        token: the world's secret (random by default; remote nodes need it: see ``token_file``).
        token_file: where the token (hex) for remote nodes goes: read from it if it exists, else written to it.
        node_wait_s: how long a start waits for the remote nodes before failing with one message.
    """

    shape: WorldShape
    device: str = "cpu"
    gpu_ids: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    rank_setup: str = "isolated"
    start_timeout_s: float = 180.0
    log_dir: str | None = None
    rdzv_endpoint: str = "127.0.0.1:0"
    remote_nodes: int = 0
    token: bytes | None = None
    token_file: str | None = None
    node_wait_s: float = 300.0
    starts: int = 0
    #: Connections the control listener refused (``"host: reason"``), newest last.
    refused: list[str] = field(default_factory=list)
    _busy: bool = field(default=False, repr=False)
    _ranks: list[_Rank] = field(default_factory=list, repr=False)
    _nodes: list[_Node] = field(default_factory=list, repr=False)
    _store: Any = field(default=None, repr=False)
    _listener: Any = field(default=None, repr=False)
    _arrivals: Any = field(default=None, repr=False)
    _own_log_dir: bool = field(default=False, repr=False)
    #: This host's node-agent processes and how many nodes each serves.
    _local: list[tuple[subprocess.Popen | forkserver.Forked, int]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if self.rank_setup not in ("isolated", "recorder", "shared"):
            raise WorldError(f"rank_setup must be 'isolated', 'recorder' or 'shared', got {self.rank_setup!r}")
        if self.device not in ("cpu", "cuda"):
            raise WorldError(f"device must be 'cpu' or 'cuda', got {self.device!r}")
        # GPUs this host needs: its nodes' (a node on another host uses that host's first ones; see _gather_nodes)
        here = max(1, self.shape.nodes - self.remote_nodes) * self.shape.ranks_per_node
        if self.device == "cuda" and len(self.gpu_ids) < (1 if self.rank_setup == "shared" else here):
            raise WorldError(
                f"a CUDA world of {self.shape.size} ranks needs {here} GPUs on this host, "
                f"but this worker was given {len(self.gpu_ids)}: {list(self.gpu_ids)}"
            )
        if not 0 <= self.remote_nodes <= self.shape.nodes:
            raise WorldError(f"remote_nodes must be between 0 and {self.shape.nodes}, got {self.remote_nodes}")

    # ----------------------------------------------------------------------------------------- lifecycle
    @property
    def alive(self) -> bool:
        """Whether the world is started and every rank process is running (as far as the controller can tell)."""
        return bool(self._ranks) and not any(r.gone for r in self._ranks) and all(
            _running(r.pid) for r in self._ranks if r.node.process is not None)

    def pids(self) -> list[int]:
        """Process ids of the running ranks (on their own hosts)."""
        return [r.pid for r in self._ranks]

    def describe(self) -> dict[str, Any]:
        """Which launcher and rendezvous this world uses, and the hosts of its current nodes (GROUP_RANK order)."""
        host, port = self._store_address()
        by_group = {int(r.env.get("GROUP_RANK", -1)): r.node.host for r in self._ranks}
        return describe_engine(f"{host}:{port}", self.shape, self.remote_nodes, device=self.device, hosts=
                               [by_group[g] for g in sorted(by_group)] or None)

    def _store_address(self) -> tuple[str, int]:
        host, _, port = self.rdzv_endpoint.rpartition(":")
        return host, (self._store.port if self._store is not None else int(port))

    def start(self) -> None:
        """Start the node agents (here and/or elsewhere) and wait until every rank joined the process group."""
        if self._ranks or self._nodes:
            self.kill()
        self.prepare()
        self._open_store()  # while the node agents import torch
        self.starts += 1
        generation = self.starts
        host, port = self._store_address()
        spec = protocol.LaunchSpec(
            generation=generation, nnodes=self.shape.nodes, nproc_per_node=self.shape.ranks_per_node,
            run_id=protocol.run_id(self.token, generation), rdzv_endpoint=f"{host}:{port}",
            control=(host, self._listener.address[1]), rank_key=protocol.rank_key(self.token, generation),
            start_method=start_method(self.device), start_timeout_s=self.start_timeout_s, device=self.device,
            rank_setup=self.rank_setup, gpu_ids=tuple(self.gpu_ids), env=dict(self.env))
        self._keys = {"node": protocol.node_key(self.token), f"rank {generation}": spec.rank_key}
        try:
            self._gather_nodes(spec, [p for p, _ in self._local])
            self._gather_ranks(spec)
            self._collect("<start-up>", self.start_timeout_s, expect="ready")
        except RankFailure as failure:
            self.kill()
            raise WorldError(f"the world of {self.shape.size} ranks failed to start:\n{failure}") from None
        except BaseException:
            self.kill()
            raise

    def prepare(self) -> None:
        """Start this host's node agents without starting a world: they load torch (seconds) while the caller does
        other work, e.g. pytest collecting; :meth:`start` then only waits for what is not ready yet.  Idempotent;
        :meth:`close` ends them."""
        if self.log_dir is None:
            self.log_dir = tempfile.mkdtemp(prefix="conformance-world-")
            self._own_log_dir = True
        os.makedirs(self.log_dir, exist_ok=True)
        self._open_control()
        self._local = [(p, k) for p, k in self._local if p.poll() is None]
        missing = self.shape.nodes - self.remote_nodes - sum(k for _, k in self._local)
        if missing > 0:  # one process serves all of this host's nodes (torch loads once; a loop per node)
            host = self._store_address()[0]
            self._local.append((self._spawn_nodes(("127.0.0.1" if host in ("0.0.0.0", "") else host,
                                                   self._listener.address[1]), missing), missing))

    def _open_control(self) -> None:
        """The control listener (and the world's token): made once, kept across generations."""
        if self._listener is not None:
            return
        if self.token is None and self.token_file and os.path.exists(self.token_file):
            with open(self.token_file) as f:  # a token handed out beforehand (a Kubernetes Secret, a test)
                self.token = bytes.fromhex(f.read().strip()) or None
        if self.token is None:
            self.token = secrets.token_bytes(32)
        if self.token_file:
            with open(self.token_file, "w") as f:
                f.write(self.token.hex() + "\n")
        self._listener = Listener((self._store_address()[0], 0))
        self._keys: dict[str, bytes] = {"node": protocol.node_key(self.token)}
        self._arrivals = queue.Queue()
        threading.Thread(target=self._accept, args=(self._listener, self._arrivals), name="conformance-control",
                         daemon=True).start()

    def _open_store(self) -> None:
        """The c10d rendezvous store (remote nodes find the control listener's port in it): made once."""
        if self._store is not None:
            return
        import torch.distributed as dist

        host, port = self._store_address()
        self._store = dist.TCPStore(host, port, None, True, timeout=datetime.timedelta(seconds=30),
                                    wait_for_workers=False, multi_tenant=True)
        self._store.set(protocol.CONTROL_KEY, f"{host}:{self._listener.address[1]}")

    def _accept(self, listener: Listener, arrivals: queue.Queue) -> None:
        """Accept every connection at once (the handshake needs it), authenticate each in its own thread."""
        while True:
            try:
                conn = listener.accept()
            except OSError:  # the listener was closed
                return
            try:
                peer = listener.last_accepted[0] if listener.last_accepted else "?"
            except AttributeError:  # the listener was closed right after this accept (the world shuts down)
                conn.close()
                return
            threading.Thread(target=self._handshake, args=(conn, peer, arrivals), daemon=True).start()

    def _handshake(self, conn: Connection, peer: str, arrivals: queue.Queue) -> None:
        try:
            role = protocol.accept(conn, self._keys)
            hello = protocol.recv(conn)
        except Exception as exc:  # wrong secret, a retired generation's rank, or a stranger
            reason = ("the token does not match this world generation (a rank of a retired world, a node of "
                      "another run, or a wrong --token-file)")
            message = f"refused a connection from {peer}: {reason} [{type(exc).__name__}]"
            self.refused.append(message)
            print(f"conformance world: {message}", file=sys.stderr, flush=True)
            conn.close()
            return
        arrivals.put((role, conn, peer, hello))

    def _spawn_nodes(self, control: tuple[str, int], nodes: int) -> subprocess.Popen | forkserver.Forked:
        env = dict(os.environ, **{protocol.TOKEN_ENV: self.token.hex(), "OMP_NUM_THREADS": "1"})
        args = ["--local", "--nodes", str(nodes), "--control", f"{control[0]}:{control[1]}",
                "--log-dir", self.log_dir, "--host-name", socket.gethostname()]
        # its own session: a Ctrl-C in the terminal is the controller's to handle (it ends the generation); the node
        # agent dies with the controller all the same (PDEATHSIG).  On CPU it is forked from the controller's fork
        # server (torch loaded once per controller, not once per world); a GPU world's agent spawns its ranks from
        # a fresh interpreter (START_METHODS), so it is one too.
        if start_method(self.device) == "fork" and forkserver.enabled():
            return forkserver.Forked("conformance.serve", args, env=env, new_session=True)
        return subprocess.Popen([sys.executable, "-m", "conformance.serve", *args],
                                env=env, stdin=subprocess.DEVNULL, start_new_session=True)

    def _next_arrival(self, deadline: float, waiting_for: str) -> tuple:
        remaining = deadline - time.monotonic()
        try:
            return self._arrivals.get(timeout=max(0.0, remaining))
        except queue.Empty:
            raise WorldError(f"the world of {self.shape.size} ranks failed to start: timed out waiting for "
                             f"{waiting_for}" + (f"; refused: {self.refused[-3:]}" if self.refused else "")) from None

    def _gather_nodes(self, spec: protocol.LaunchSpec, local: list[subprocess.Popen | forkserver.Forked]) -> None:
        deadline = time.monotonic() + (self.node_wait_s if self.remote_nodes else self.start_timeout_s)
        by_pid = {p.pid: p for p in local}
        while len(self._nodes) < self.shape.nodes:
            have = len(self._nodes)
            role, conn, peer, hello = self._next_arrival(
                deadline, f"{self.shape.nodes - have} of {self.shape.nodes} node agent(s) "
                f"({self.remote_nodes} remote: run `python -m conformance.serve --rdzv-endpoint "
                f"{spec.rdzv_endpoint} --token-file FILE` on each other host)")
            if role != "node":
                protocol.send(conn, ("refused", f"a {role} arrived before the nodes"))
                conn.close()
                continue
            node = _Node(have, conn, hello[1]["host"], peer, by_pid.get(hello[1].get("root", hello[1]["pid"])))
            # GPU slot: this host's nodes split the worker's GPU ids; a node on another host uses the first slot
            slot = sum(n.process is not None for n in self._nodes) if node.process is not None else 0
            try:
                protocol.send(conn, ("launch", spec, node.agent, slot))
            except OSError:  # a node that joined early and went away since
                conn.close()
                continue
            self._nodes.append(node)

    def _gather_ranks(self, spec: protocol.LaunchSpec) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        arrived: dict[int, _Rank] = {}
        while len(arrived) < self.shape.size:
            role, conn, peer, hello = self._next_arrival(
                deadline, f"{self.shape.size - len(arrived)} rank(s) to join the c10d rendezvous "
                          f"{spec.run_id} (nodes: {[n.host for n in self._nodes]})")
            if role == "node":
                protocol.send(conn, ("refused", f"this world already has its {self.shape.nodes} node(s)"))
                conn.close()
                continue
            info = hello[1]
            arrived[info["rank"]] = _Rank(info["rank"], conn, info["pid"], self._nodes[info["agent"]],
                                          info["log"], info["env"])
        self._ranks = [arrived[r] for r in range(self.shape.size)]
        _check_node_major(self._ranks, self.shape)

    def close(self) -> None:
        """Shut the world down cleanly (bounded), killing whatever does not exit in time.

        A world interrupted in the middle of a task (Ctrl-C) is killed at once: its ranks would not read the
        shutdown message before the task ends.
        """
        if self._ranks and self.alive and not self._busy:
            for r in self._ranks:
                try:
                    r.conn.send_bytes(protocol.dumps(("shutdown",)))
                except OSError:
                    pass
            try:
                self._collect("<shutdown>", SHUTDOWN_TIMEOUT_S, expect="bye")
            except RankFailure:
                pass
        self.kill()
        for p, _ in self._local:
            p.kill()
        for p, _ in self._local:
            p.wait(10)
        self._local = []
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        self._store = None
        if self._own_log_dir and self.log_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)
            self.log_dir = None

    def kill(self) -> None:
        """Retire the world now (used after a failure: a failed collective is never reused): every node's agent of
        this generation is told to end, and its ranks die with it (the node's loop joins the next generation)."""
        for n in self._nodes:
            try:
                protocol.send(n.conn, ("end",))
            except OSError:
                pass
            n.conn.close()
        for r in self._ranks:
            r.conn.close()
        self._wait_local_ranks_gone([r.pid for r in self._ranks if r.node.process is not None])
        self._ranks = []
        self._nodes = []
        self._busy = False

    @staticmethod
    def _wait_local_ranks_gone(pids: list[int], timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if _running(p)]
            if pids:
                time.sleep(0.05)

    def __enter__(self) -> World:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------- tasks
    def run(self, target: Callable[..., Any] | str, *args: Any, timeout: float = 120.0, **kwargs: Any) -> list[Any]:
        """Run ``target`` (a module-level function, sent by reference, or ``"module:function"``) on every rank;
        return the per-rank results.

        Raises :class:`RankRaised`, :class:`RankTimeout` or :class:`RankCrashed` (each naming every
        rank's traceback or stacks); the world is retired and the next call starts a fresh one.
        """
        if not self.alive:
            self.start()
        message = protocol.dumps(("run", target, args, kwargs))
        target = target if isinstance(target, str) else f"{target.__module__}:{target.__qualname__}"
        self._busy = True
        try:
            for r in self._ranks:
                r.conn.send_bytes(message)
            results = self._collect(target, timeout, expect="ok")
        except RankRaised as failure:
            if not failure.in_step:  # a world left mid-task is never reused
                self.kill()
            self._busy = False
            raise
        except BaseException:  # a failed rank, or Ctrl-C: a world left mid-task is never reused
            self.kill()
            raise
        self._busy = False
        return results

    def _collect(self, target: str, timeout: float, expect: str) -> list[Any]:
        deadline = time.monotonic() + timeout
        results: dict[int, Any] = {}
        errors: dict[int, str] = {}
        in_step: dict[int, dict[str, Any]] = {}  # rank -> its RaisedInStep (a backend's call raised, all ranks know)
        error_calls: dict[int, str] = {}  # rank -> the backend call its world-retiring error was in, where known
        suite: dict[int, str] = {}  # rank -> where the suite's own code raised (a suite error, core.raisers)
        crashed: list[_Rank] = []
        pending = {r.conn: r for r in self._ranks}
        while pending:
            remaining = deadline - time.monotonic()
            if errors or crashed:
                remaining = min(remaining, GRACE_AFTER_ERROR_S)
            if remaining <= 0:
                break
            for conn in wait(list(pending), timeout=remaining):
                r = pending.pop(conn)
                try:
                    kind, value = protocol.loads(conn.recv_bytes())
                except (EOFError, OSError):
                    r.gone = True
                    crashed.append(r)
                    continue
                if kind == expect:
                    results[r.rank] = value
                elif kind == "raised":
                    in_step[r.rank] = value
                    errors[r.rank] = value["traceback"]
                    if value.get("suite"):
                        suite[r.rank] = value["suite"]
                elif isinstance(value, dict):  # a backend's sticky error (the call known) or a suite error
                    errors[r.rank] = value["traceback"]
                    if value.get("call"):
                        error_calls[r.rank] = value["call"]
                    if value.get("suite"):
                        suite[r.rank] = value["suite"]
                else:
                    errors[r.rank] = value
            if errors or crashed:
                deadline = min(deadline, time.monotonic() + GRACE_AFTER_ERROR_S)
        if not pending and not errors and not crashed:
            return [results[r] for r in range(self.shape.size)]
        if not pending and not crashed and len(in_step) == self.shape.size:  # every rank ended in the same step
            first = in_step[min(in_step)]
            raised_on = first["ranks"]
            per_rank = {rank: (errors[rank] if rank in raised_on else
                               f"did not raise; ended the task because rank(s) {raised_on} raised in "
                               f"{first['operation']} [{first['backend']}]") for rank in sorted(in_step)}
            raise RankRaised(target, per_rank, culprits=raised_on,
                             calls={rank: str(CallId(first["backend"], first["operation"])) for rank in raised_on},
                             backend=first["backend"], in_step=True, suite=suite)
        stuck = list(pending.values())
        seen = self._inspect(crashed, stuck)
        calls = {rank: info["call"] for rank, info in seen.items() if info.get("call")} | error_calls
        signals: dict[int, str] = {}
        per_crashed: dict[int, str] = {}
        for r in crashed:
            info = seen[r.rank]
            code = info.get("exit")
            if isinstance(code, int) and code < 0:
                signals[r.rank] = _signal_name(-code)
            status = info.get("agent_gone") or f"process exited with code {code}" + (
                f" ({signals[r.rank]})" if r.rank in signals else "")
            per_crashed[r.rank] = f"rank {r.rank} on {r.node.where}: {status}\n{info.get('log', '')}"
        per_stuck = {r.rank: "still running; its stacks:\n" + seen[r.rank].get("log", "") for r in stuck}
        if crashed:
            raise RankCrashed(target, {**per_crashed, **errors, **per_stuck}, culprits=[r.rank for r in crashed],
                              calls=calls, signals=signals, hosts={r.rank: r.node.host for r in self._ranks})
        if errors:
            raise RankRaised(target, {**errors, **per_stuck}, culprits=list(errors), calls=calls, suite=suite)
        raise RankTimeout(target, per_stuck, calls=calls)

    def _inspect(self, crashed: list[_Rank], stuck: list[_Rank]) -> dict[int, dict[str, Any]]:
        """Ask each node agent about its crashed ranks (exit status, call, log) and stuck ones (stack dump first)."""
        asked: dict[int, list[tuple[_Rank, bool]]] = {}
        for r in crashed:
            asked.setdefault(r.node.agent, []).append((r, False))
        for r in stuck:
            asked.setdefault(r.node.agent, []).append((r, True))
        for r in self._ranks:  # the call file of every other rank too (it may be mid-call when a peer died)
            if r not in crashed and r not in stuck:
                asked.setdefault(r.node.agent, []).append((r, False))
        seen: dict[int, dict[str, Any]] = {}
        for agent, ranks in asked.items():
            node = self._nodes[agent]
            try:
                protocol.send(node.conn, ("inspect", [(r.pid, r.log_path, dump) for r, dump in ranks]))
                if not node.conn.poll(15.0):
                    raise TimeoutError("no answer in 15 s")
                _, answers = protocol.recv(node.conn)
            except (EOFError, OSError, TimeoutError) as exc:
                gone = f"its node agent on {node.where} is gone ({type(exc).__name__}): the node died"
                answers = [{"agent_gone": gone, "log": "(its log is on that host)"} for _ in ranks]
            for (r, _), answer in zip(ranks, answers, strict=True):
                seen[r.rank] = answer
        return seen


def describe_engine(rdzv_endpoint: str, shape: WorldShape, remote_nodes: int = 0,
                    hosts: list[str] | None = None, device: str = "cpu") -> dict[str, Any]:
    """The report's account of the engine: launcher, rendezvous, where the nodes run."""
    from conformance.core.probe import torch_version

    local = shape.nodes - remote_nodes
    return {
        "launcher": f"torch.distributed elastic agent (torchrun) {torch_version()}, "
                    f"start method {start_method(device)}",
        "rendezvous": f"c10d at {rdzv_endpoint}" + (" (port 0: a free port per world)" if
                                                    rdzv_endpoint.endswith(":0") else ""),
        "hosts": hosts or ([f"{socket.gethostname()} ({local} node(s), one conformance.serve process)"]
                           + ([f"{remote_nodes} remote node(s) via python -m conformance.serve"] if remote_nodes
                              else [])),
    }


def _check_node_major(ranks: list[_Rank], shape: WorldShape) -> None:
    """torchrun numbers ranks node-major (``RANK = GROUP_RANK * LOCAL_WORLD_SIZE + LOCAL_RANK``); the suite splits
    nodes that way, so a world numbered otherwise is refused at start-up."""
    for r in ranks:
        node, local = int(r.env["GROUP_RANK"]), int(r.env["LOCAL_RANK"])
        if r.rank != node * shape.ranks_per_node + local or int(r.env["WORLD_SIZE"]) != shape.size:
            raise WorldError(f"rank {r.rank} came up as GROUP_RANK {node}, LOCAL_RANK {local}, WORLD_SIZE "
                             f"{r.env['WORLD_SIZE']}: not torchrun's node-major numbering of {shape}")


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"

