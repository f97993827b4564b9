"""``python -m conformance.serve``: run this host's node of the conformance world (see :mod:`conformance.serve`).

On a remote host::

    python -m conformance.serve --rdzv-endpoint FIRST_HOST:PORT --token-file /shared/world.token

(``FIRST_HOST:PORT`` and the token file are what pytest on the first host was given: ``--rdzv-endpoint`` and
``--world-token-file``; the token may come from ``$CONFORMANCE_WORLD_TOKEN`` instead.)
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
import sys
import tempfile
import time

from conformance.serve import run_generation
from conformance.world.protocol import CONTROL_KEY, Refused, connect, node_key, read_token, recv, send
from conformance.world.rank import die_with_parent


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m conformance.serve", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rdzv-endpoint", type=_address,
                   help="the first host's rendezvous store (pytest's --rdzv-endpoint)")
    p.add_argument("--control", type=_address, help="the controller's control listener (default: read from the store)")
    p.add_argument("--token-file", help="file holding the world's hex token (default: $CONFORMANCE_WORLD_TOKEN)")
    p.add_argument("--host-name", default=socket.gethostname(), help="how failures name this host")
    p.add_argument("--log-dir", help="where this host's rank logs go (default: a temporary directory)")
    p.add_argument("--join-timeout", type=float, default=600.0,
                   help="how long to wait for the controller, per generation (seconds)")
    p.add_argument("--generations", type=int, default=0, help="stop after this many world generations (0: never)")
    p.add_argument("--nodes", type=int, default=1, help="how many nodes of the world this host serves (one loop each, "
                   "forked from one process that loads torch once)")
    p.add_argument("--local", action="store_true", help="started by the controller on its own host: dies with it, "
                   "ends when it is gone (not for use by hand)")
    return p


def _control_address(args: argparse.Namespace) -> tuple[str, int]:
    if args.control:
        return args.control
    if not args.rdzv_endpoint:
        raise SystemExit("conformance.serve: give --rdzv-endpoint HOST:PORT (the first host's) or --control")
    import datetime

    import torch.distributed as dist

    host, port = args.rdzv_endpoint
    store = dist.TCPStore(host, port, None, False, timeout=datetime.timedelta(seconds=args.join_timeout),
                          wait_for_workers=False)
    _, _, control_port = store.get(CONTROL_KEY).decode().rpartition(":")
    return host, int(control_port)


def _join(args: argparse.Namespace, key: bytes, served: int) -> tuple | None:
    """Connect and say hello; return ``(conn, spec, agent, gpu slot)``, or None when the controller sent this node away
    or went away."""
    deadline = time.monotonic() + args.join_timeout
    while True:
        try:
            conn = connect(_control_address(args), "node", key)
            break
        except Refused as exc:
            raise SystemExit(f"conformance.serve on {args.host_name}: {exc}") from None
        except OSError as exc:
            if args.local or time.monotonic() > deadline:
                raise SystemExit(f"conformance.serve on {args.host_name}: no controller reachable ({exc})") from None
            time.sleep(1.0)
    try:
        send(conn, ("node", {"host": args.host_name, "pid": os.getpid(), "root": _root_pid, "served": served}))
        reply = recv(conn)
    except (EOFError, OSError):  # the controller closed its world (a run ended) before launching this node
        conn.close()
        return None
    if reply[0] != "launch":
        print(f"conformance.serve on {args.host_name}: the controller refused this node: {reply[1]}", flush=True)
        conn.close()
        return None
    spec = reply[1]
    if args.rdzv_endpoint and not args.control:  # the controller may listen on 0.0.0.0: reach it as this node did
        host = args.rdzv_endpoint[0]
        spec = dataclasses.replace(spec, rdzv_endpoint=f"{host}:{spec.rdzv_endpoint.rpartition(':')[2]}",
                                   control=(host, spec.control[1]))
    return conn, spec, reply[2], reply[3]


_root_pid = os.getpid()


def main(argv: list[str] | None = None) -> int:
    global _root_pid
    args = _parser().parse_args(argv)
    if args.local:
        die_with_parent()
    if args.nodes < 1:
        raise SystemExit(f"conformance.serve: --nodes must be at least 1, got {args.nodes}")
    key = node_key(read_token(args.token_file))
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="conformance-node-")
    import torch  # noqa: F401  (once, here: each node loop and each generation's agent is forked with it loaded)

    _root_pid = os.getpid()
    if args.nodes == 1:
        return _serve_loop(args, key, log_dir)
    loops: dict[int, int] = {}  # pid -> loop number: one forked loop per node this host serves, kept running
    while True:
        for number in set(range(args.nodes)) - set(loops.values()):
            child = os.fork()
            if child == 0:
                die_with_parent()
                code = 1
                try:
                    code = _serve_loop(args, key, log_dir)
                finally:
                    os._exit(code)
            loops[child] = number
        pid, status = os.wait()
        loops.pop(pid, None)
        code = os.waitstatus_to_exitcode(status)
        if code != 0 or args.generations:  # a loop that was refused, or that served its generations: stop them all
            for other in loops:
                os.kill(other, 9)
            return code


def _serve_loop(args: argparse.Namespace, key: bytes, log_dir: str) -> int:
    """One node: join each world generation, run its elastic agent in a forked child, wait for it to end."""
    served = 0
    while not args.generations or served < args.generations:
        joined = _join(args, key, served)
        if joined is None:
            time.sleep(2.0)
            continue
        conn, spec, agent, slot = joined
        served += 1
        child = os.fork()
        if child == 0:
            die_with_parent()
            try:
                run_generation(conn, spec, agent, slot, args.host_name, log_dir)
            finally:
                os._exit(0)
        conn.close()
        _, status = os.waitpid(child, 0)
        print(f"conformance.serve on {args.host_name}: world generation {spec.generation} ended "
              f"(agent exit {os.waitstatus_to_exitcode(status)})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
