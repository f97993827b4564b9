"""The controller side of the rank world.

One :class:`World` per pytest(-xdist) worker.  It starts ``nodes x ranks_per_node`` spawned processes with
torchrun's environment, lets them rendezvous through a ``TCPStore`` that the controller hosts on port 0
(no port probing), and talks to each over an authenticated ``multiprocessing`` pipe.  A task that raises,
hangs or crashes on any rank is reported with every rank's traceback or stacks; the world is then retired
(never reused after a failed collective) and started afresh on the next call.  No rank outlives it.
"""

from __future__ import annotations

import datetime
import multiprocessing
import os
import pickle
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from conformance.world.errors import RankCrashed, RankFailure, RankRaised, RankTimeout, WorldError
from conformance.world.rank import CALL_SLOT_BYTES, STACK_DUMP_SIGNAL, call_file, rank_main

#: How long ranks that did not raise are given to finish after another rank raised.
GRACE_AFTER_ERROR_S = 5.0
#: How long a clean shutdown may take before ranks are killed.
SHUTDOWN_TIMEOUT_S = 15.0
_LOG_TAIL_CHARS = 6000


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
class _Rank:
    rank: int
    process: multiprocessing.process.BaseProcess
    conn: Connection
    log_path: str
    log_offset: int = 0


@dataclass
class World:
    """A persistent world of rank processes.

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
        log_dir: where rank logs go (a temporary directory by default, removed on close).
    """

    shape: WorldShape
    device: str = "cpu"
    gpu_ids: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    rank_setup: str = "isolated"
    start_timeout_s: float = 180.0
    log_dir: str | None = None
    starts: int = 0
    _busy: bool = field(default=False, repr=False)
    _ranks: list[_Rank] = field(default_factory=list, repr=False)
    _store: Any = field(default=None, repr=False)
    _own_log_dir: bool = field(default=False, repr=False)

    def __post_init__(self) -> None:
        if self.rank_setup not in ("isolated", "recorder", "shared"):
            raise WorldError(f"rank_setup must be 'isolated', 'recorder' or 'shared', got {self.rank_setup!r}")
        if self.device not in ("cpu", "cuda"):
            raise WorldError(f"device must be 'cpu' or 'cuda', got {self.device!r}")
        if self.device == "cuda" and len(self.gpu_ids) < (1 if self.rank_setup == "shared" else self.shape.size):
            raise WorldError(
                f"a CUDA world of {self.shape.size} ranks needs {self.shape.size} GPUs, "
                f"but this worker was given {len(self.gpu_ids)}: {list(self.gpu_ids)}"
            )

    # ----------------------------------------------------------------------------------------- lifecycle
    @property
    def alive(self) -> bool:
        """Whether the world is started and every rank process is running."""
        return bool(self._ranks) and all(r.process.is_alive() for r in self._ranks)

    def pids(self) -> list[int]:
        """Process ids of the running ranks."""
        return [r.process.pid for r in self._ranks if r.process.pid is not None]

    def start(self) -> None:
        """Start the rank processes and wait until every rank joined the process group."""
        import torch.distributed as dist

        if self._ranks:
            self.kill()
        if self.log_dir is None:
            self.log_dir = tempfile.mkdtemp(prefix="conformance-world-")
            self._own_log_dir = True
        os.makedirs(self.log_dir, exist_ok=True)
        self._store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=datetime.timedelta(seconds=30),
                                    wait_for_workers=False)
        port = self._store.port
        self.starts += 1
        ctx = multiprocessing.get_context("spawn")
        for rank in range(self.shape.size):
            parent_conn, child_conn = ctx.Pipe(duplex=True)
            log_path = os.path.join(self.log_dir, f"start{self.starts}-rank{rank}.log")
            process = ctx.Process(
                target=rank_main,
                args=(child_conn, self._rank_env(rank, port), log_path, os.getpid(), self.start_timeout_s),
                name=f"conformance-rank{rank}",
                daemon=True,
            )
            process.start()
            child_conn.close()
            self._ranks.append(_Rank(rank, process, parent_conn, log_path))
        try:
            self._collect("<start-up>", self.start_timeout_s, expect="ready")
        except RankFailure as failure:
            raise WorldError(f"the world of {self.shape.size} ranks failed to start:\n{failure}") from None

    def _rank_env(self, rank: int, port: int) -> dict[str, str]:
        node, local_rank = divmod(rank, self.shape.ranks_per_node)
        env = {
            "RANK": str(rank),
            "LOCAL_RANK": str(local_rank),
            "WORLD_SIZE": str(self.shape.size),
            "LOCAL_WORLD_SIZE": str(self.shape.ranks_per_node),
            "GROUP_RANK": str(node),
            "NODE_RANK": str(node),
            "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": str(self.shape.size),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "TORCHELASTIC_RUN_ID": f"conformance-{os.getpid()}-{self.starts}",
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
            "CONFORMANCE_DEVICE": self.device,
            "CONFORMANCE_RANK_SETUP": self.rank_setup,
        }
        if self.device == "cuda":
            # "isolated": each rank sees only its own GPU; "recorder": every rank sees the node's GPUs and picks
            # LOCAL_RANK (the set-up fixtures/deepep-real was recorded with).
            node = rank // self.shape.ranks_per_node
            node_gpus = self.gpu_ids[node * self.shape.ranks_per_node:(node + 1) * self.shape.ranks_per_node]
            env["CUDA_VISIBLE_DEVICES"] = {"recorder": ",".join(node_gpus), "shared": self.gpu_ids[0]}.get(
                self.rank_setup, self.gpu_ids[rank] if rank < len(self.gpu_ids) else "")
        env.update(self.env)
        return env

    def close(self) -> None:
        """Shut the world down cleanly (bounded), killing whatever does not exit in time.

        A world interrupted in the middle of a task (Ctrl-C) is killed at once: its ranks would not read the
        shutdown message before the task ends.
        """
        if self._ranks and self.alive and not self._busy:
            for r in self._ranks:
                try:
                    r.conn.send_bytes(pickle.dumps(("shutdown",)))
                except OSError:
                    pass
            deadline = time.monotonic() + SHUTDOWN_TIMEOUT_S
            for r in self._ranks:
                r.process.join(max(0.0, deadline - time.monotonic()))
        self.kill()
        if self._own_log_dir and self.log_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)
            self.log_dir = None

    def kill(self) -> None:
        """Kill every rank process now (used after a failure: a failed collective is never reused)."""
        for r in self._ranks:
            if r.process.is_alive():
                r.process.kill()
        for r in self._ranks:
            r.process.join(5.0)
            r.conn.close()
        self._ranks = []
        self._store = None
        self._busy = False

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
        message = pickle.dumps(("run", target, args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
        target = target if isinstance(target, str) else f"{target.__module__}:{target.__qualname__}"
        self._busy = True
        for r in self._ranks:
            r.log_offset = os.path.getsize(r.log_path) if os.path.exists(r.log_path) else 0
            r.conn.send_bytes(message)
        try:
            results = self._collect(target, timeout, expect="ok")
        except BaseException:  # a failed rank, or Ctrl-C: a world left mid-task is never reused
            self.kill()
            raise
        self._busy = False
        return results

    def _collect(self, target: str, timeout: float, expect: str) -> list[Any]:
        deadline = time.monotonic() + timeout
        results: dict[int, Any] = {}
        errors: dict[int, str] = {}
        crashed: dict[int, str] = {}
        signals: dict[int, str] = {}
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
                    kind, value = pickle.loads(conn.recv_bytes())
                except (EOFError, OSError):
                    r.process.join(2.0)
                    code = r.process.exitcode
                    if code is not None and code < 0:
                        signals[r.rank] = _signal_name(-code)
                    crashed[r.rank] = f"process exited with code {code}" + (
                        f" ({signals[r.rank]})" if r.rank in signals else "") + f"\n{self._log_tail(r)}"
                    continue
                if kind == expect:
                    results[r.rank] = value
                else:
                    errors[r.rank] = value
            if errors or crashed:
                deadline = min(deadline, time.monotonic() + GRACE_AFTER_ERROR_S)
        if not pending and not errors and not crashed:
            return [results[r] for r in range(self.shape.size)]
        stuck = self._dump_stacks(list(pending.values()))
        calls = {r.rank: call for r in self._ranks if (call := self._current_call(r))}
        if crashed:
            raise RankCrashed(target, {**crashed, **errors, **stuck}, culprits=list(crashed), calls=calls,
                              signals=signals)
        if errors:
            raise RankRaised(target, {**errors, **stuck}, culprits=list(errors), calls=calls)
        raise RankTimeout(target, stuck, calls=calls)

    def _current_call(self, r: _Rank) -> str:
        """The call rank ``r`` is in (or died in), from its call file; empty if it is in none."""
        try:
            with open(call_file(r.log_path), "rb") as f:
                return f.read(CALL_SLOT_BYTES).rstrip(b"\0").decode(errors="replace")
        except OSError:
            return ""

    def _dump_stacks(self, ranks: list[_Rank]) -> dict[int, str]:
        for r in ranks:
            if r.process.is_alive() and r.process.pid:
                try:
                    os.kill(r.process.pid, STACK_DUMP_SIGNAL)
                except ProcessLookupError:
                    pass
        if ranks:
            time.sleep(1.0)
        return {r.rank: "still running; its stacks:\n" + self._log_tail(r) for r in ranks}

    def _log_tail(self, r: _Rank) -> str:
        try:
            with open(r.log_path, errors="replace") as log:
                log.seek(r.log_offset)
                text = log.read()
        except OSError as exc:
            return f"(no log: {exc})"
        return text[-_LOG_TAIL_CHARS:] if text else "(log empty)"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"

