"""The node agent: one per node (host), it starts that node's ranks with torch's elastic agent (``torchrun``'s engine).

``python -m conformance.serve`` connects to the controller (the pytest worker that owns the world), proves it holds
the world's token (:mod:`conformance.world.protocol`), receives a :class:`~conformance.world.protocol.LaunchSpec`
and calls ``torch.distributed.launcher.api.elastic_launch`` with the c10d rendezvous the controller hosts; the
ranks (:func:`conformance.world.rank.rank_entry`) then talk to the controller directly.  While they run, the node
agent answers the controller's questions about them, which only something on their host can answer: their exit
status, the library call they were in, the tail of their log (after a ``SIGUSR1`` stack dump on request).

Two forms:

Either way it is a loop: each world generation it joins the controller and runs that generation's elastic agent in
a forked child (torch is loaded once, so a restart after a failure costs a fork and a rendezvous); when the world is
retired (or the child is killed) it joins the next generation.  A wrong token ends it with one message.

* ``--local --control HOST:PORT``: started by the controller on its own host; dies with it (PDEATHSIG).
* remote (``--rdzv-endpoint HOST:PORT``): on another host; reads the control address from the rendezvous store.
"""

from __future__ import annotations

import os
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from conformance.world.protocol import CALL_SLOT_BYTES, OFFSET_BYTES, LaunchSpec, call_file, local_address, recv, send
from conformance.world.rank import STACK_DUMP_SIGNAL, child_exit_status, rank_entry

#: The elastic agent's monitor never acts in a world's lifetime: a rank that dies is the controller's to report
#: (with its exit status, read here) and the world is retired as a whole; the agent must not restart or reap.
MONITOR_INTERVAL_S = 10**6
#: How often a joining node polls the rendezvous store (torch waits 1 s; see :func:`_poll_rendezvous_faster`).
RENDEZVOUS_POLL_S = 0.05
_LOG_TAIL_CHARS = 6000
#: torch's switch that keeps node 0's agent from hosting a store for the workers (its "TCPStore sharing").
NO_AGENT_STORE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


def _poll_rendezvous_faster() -> None:
    """While other nodes join, torch's c10d rendezvous handler polls the store once a second (a fixed
    ``_delay(seconds=1)``) and serves the state it read for a second (``_BackendRendezvousStateHolder``'s
    ``cache_duration=1``): a world of several nodes took >= 1 s to meet however fast its nodes were.  In this node
    agent only (the ranks' environment is torchrun's all the same), poll and cache for ``RENDEZVOUS_POLL_S``
    instead.  A torch without these private hooks keeps its 1 s."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rdzv

    delay = getattr(rdzv, "_delay", None)
    if callable(delay):
        rdzv._delay = lambda seconds: delay(RENDEZVOUS_POLL_S if seconds == 1 else seconds)
    holder = getattr(rdzv, "_BackendRendezvousStateHolder", None)
    init = getattr(holder, "__init__", None)
    if holder is not None and not getattr(init, "_conformance", False):
        def fast_init(self: Any, *args: Any, **kwargs: Any) -> None:
            init(self, *args, **kwargs)
            if getattr(self, "_cache_duration", 0) == 1:
                self._cache_duration = RENDEZVOUS_POLL_S

        fast_init._conformance = True  # type: ignore[attr-defined]
        holder.__init__ = fast_init


def run_generation(conn: Connection, spec: LaunchSpec, agent: int, slot: int, host: str, log_dir: str) -> None:
    """Start this node's ranks for one generation and answer the controller until it lets go.

    ``slot``: which of this host's nodes this one is (its GPUs are ``spec.gpu_ids[slot * nproc:(slot + 1) * nproc]``).
    """
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    threading.Thread(target=_answer, args=(conn,), name="conformance-node-control", daemon=True).start()
    _poll_rendezvous_faster()
    # No store server in this process: its thread (libuv) calls getnameinfo on each connection, and a rank forked
    # while it holds glibc's resolver lock hangs in its own first connect.  The ranks use the rendezvous store.
    os.environ[NO_AGENT_STORE] = "1"
    config = LaunchConfig(
        min_nodes=spec.nnodes, max_nodes=spec.nnodes, nproc_per_node=spec.nproc_per_node, run_id=spec.run_id,
        rdzv_backend="c10d", rdzv_endpoint=spec.rdzv_endpoint,
        rdzv_configs={"is_host": False, "join_timeout": int(spec.start_timeout_s)},
        max_restarts=0, start_method=spec.start_method, monitor_interval=MONITOR_INTERVAL_S,
        local_addr=local_address(conn),  # MASTER_ADDR when this node is GROUP_RANK 0: what the others can reach
    )
    elastic_launch(config, rank_entry)(spec, agent, slot, host, log_dir)


def _answer(conn: Connection) -> None:
    """Answer the controller; when it closes the connection, end this node (its ranks die with it)."""
    while True:
        try:
            message = recv(conn)
        except (EOFError, OSError):
            os._exit(0)
        if message[0] == "inspect":
            try:
                send(conn, ("inspected", inspect(message[1])))
            except OSError:
                os._exit(0)
        elif message[0] == "end":
            os._exit(0)


def inspect(ranks: list[tuple[int, str, bool]]) -> list[dict[str, Any]]:
    """For each ``(pid, log path, dump stacks)`` of a rank of this node: its exit status, call and log tail."""
    dumped = False
    for pid, _, dump in ranks:
        if dump and _is_child(pid):
            try:
                os.kill(pid, STACK_DUMP_SIGNAL)
                dumped = True
            except ProcessLookupError:
                pass
    if dumped:
        time.sleep(1.0)
    # a stuck rank (its stacks asked for) is not waited for to exit: it hung (2 s each made every hang cost 4-5 s more)
    return [{"exit": child_exit_status(pid, 0.0 if dump else 2.0), **_call_and_log(path)} for pid, path, dump in ranks]


def _is_child(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1]) == os.getpid()
    except (OSError, ValueError, IndexError):
        return False


def _call_and_log(path: str) -> dict[str, str]:
    call, offset = "", 0
    try:
        with open(call_file(path), "rb") as f:
            slot = f.read(CALL_SLOT_BYTES + OFFSET_BYTES)
        call = slot[:CALL_SLOT_BYTES].rstrip(b"\0").decode(errors="replace")
        offset = int(slot[CALL_SLOT_BYTES:].strip() or 0)
    except (OSError, ValueError):
        pass
    try:
        with open(path, errors="replace") as log:
            log.seek(offset)
            text = log.read()
    except OSError as exc:
        return {"call": call, "log": f"(no log: {exc})"}
    return {"call": call, "log": text[-_LOG_TAIL_CHARS:] if text else "(log empty)"}
