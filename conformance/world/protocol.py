"""What the controller, the node agents and the ranks say to each other, and how they prove who they are.

Every world has a secret (32 random bytes, or a token remote nodes read from a file / ``$CONFORMANCE_WORLD_TOKEN``).
Nothing of it travels: a connection to the controller's control listener names its *role* in clear (``node`` or
``rank <generation>``) and then answers and delivers an HMAC challenge (``multiprocessing.connection``'s own) with a
key derived from the secret for that role.  A node agent therefore proves it holds the secret, and a rank proves
it belongs to the *current* world generation: a rank of a retired generation, or anything without the secret, is
refused at the handshake (both sides say so, naming the host).  The c10d rendezvous id is derived from the secret
and the generation too, and a node learns it only over the authenticated channel.

Messages after the handshake are pickled tuples (the peer is authenticated, as in ``multiprocessing``).
"""

from __future__ import annotations

import hashlib
import hmac
import io
import os
import pickle
import socket
import sys
from dataclasses import dataclass, field
from multiprocessing.connection import AuthenticationError, Client, Connection, answer_challenge, deliver_challenge
from typing import Any

#: Environment variable a node agent reads the world's token from (hex), when no ``--token-file`` is given.
TOKEN_ENV = "CONFORMANCE_WORLD_TOKEN"
#: Bytes of the per-rank "current call" slot at the start of the call file; the log offset of the running task
#: follows it (:data:`OFFSET_BYTES` ASCII digits), so that the node agent can return the task's part of the log.
CALL_SLOT_BYTES = 512
OFFSET_BYTES = 20


#: The key under which the controller publishes its control listener (``HOST:PORT``) in the rendezvous store.
CONTROL_KEY = "conformance/control"


def node_key(secret: bytes) -> bytes:
    """The key a node agent authenticates with."""
    return hmac.new(secret, b"conformance node", hashlib.sha256).digest()


def rank_key(secret: bytes, generation: int) -> bytes:
    """The key ranks of world generation ``generation`` authenticate with (a retired generation's is refused)."""
    return hmac.new(secret, f"conformance ranks of generation {generation}".encode(), hashlib.sha256).digest()


def run_id(secret: bytes, generation: int) -> str:
    """The c10d rendezvous id of a generation: unguessable without the secret, different per generation."""
    return "conformance-" + hmac.new(secret, f"run {generation}".encode(), hashlib.sha256).hexdigest()[:16]


def read_token(path: str | None) -> bytes:
    """The world's secret from ``path`` (hex text) or, without one, from ``$CONFORMANCE_WORLD_TOKEN``."""
    if path:
        with open(path) as f:
            text = f.read().strip()
    else:
        text = os.environ.get(TOKEN_ENV, "").strip()
    if not text:
        raise SystemExit(f"no world token: pass --token-file FILE or set {TOKEN_ENV} (the hex token the first "
                         "host's pytest wrote with --world-token-file)")
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise SystemExit(f"the world token must be hex text, got {len(text)} characters that are not") from None


def _tensor_from_bytes(data: bytes, dtype: Any, shape: tuple[int, ...]) -> Any:
    import torch

    if not data:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(shape)


class _Pickler(pickle.Pickler):
    """Pickles plain CPU tensors as their bytes, dtype and shape: torch's own reduction goes through
    ``torch.save`` (a zip archive per tensor), about 10x slower for the small tensors of an example's results."""

    def reducer_override(self, obj: Any) -> Any:
        torch = sys.modules.get("torch")
        if torch is not None and type(obj) is torch.Tensor and obj.device.type == "cpu" and not obj.requires_grad \
                and obj.dtype.itemsize and not obj.dtype.is_complex and obj.layout == torch.strided:
            # clone(contiguous_format), not contiguous(): a one-element slice (stride 3) counts as contiguous but
            # cannot be viewed as bytes; one copy, then a view
            flat = obj.detach().clone(memory_format=torch.contiguous_format).reshape(-1)
            return _tensor_from_bytes, (flat.view(torch.uint8).numpy().tobytes(), obj.dtype, tuple(obj.shape))
        return NotImplemented


#: Set to 1: tensors travel by torch's own pickling (the benchmark's "before"; a fallback if the bytes path breaks).
PLAIN_PICKLE_ENV = "CONFORMANCE_PLAIN_PICKLE"


def dumps(message: Any) -> bytes:
    """Serialise a control message (tasks, their arguments and results)."""
    if os.environ.get(PLAIN_PICKLE_ENV) == "1":
        return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    out = io.BytesIO()
    try:
        _Pickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(message)
    except Exception as exc:  # a tensor the bytes path cannot take: torch's own pickling, which takes anything
        print(f"conformance protocol: plain pickling after {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return out.getvalue()


loads = pickle.loads


def send(conn: Connection, message: tuple) -> None:
    """Send one message."""
    conn.send_bytes(dumps(message))


def recv(conn: Connection) -> Any:
    """Receive one message."""
    return pickle.loads(conn.recv_bytes())


class Refused(ConnectionError):
    """The controller refused this connection (wrong secret, or a retired world generation)."""


def connect(address: tuple[str, int], role: str, key: bytes) -> Connection:
    """Connect to the control listener as ``role`` and authenticate with ``key``; raise :class:`Refused`."""
    conn = Client(address)
    try:
        conn.send_bytes(role.encode())
        answer_challenge(conn, key)
        deliver_challenge(conn, key)
    except (AuthenticationError, EOFError, ConnectionError) as exc:
        conn.close()
        raise Refused(f"the controller at {address[0]}:{address[1]} refused this {role.split()[0]} "
                      f"({socket.gethostname()}): the token does not match this world"
                      + (" generation (a node or rank of a retired world)" if role.startswith("rank") else
                         " (wrong --token-file / $CONFORMANCE_WORLD_TOKEN, or a node of another run)")
                      + f" [{type(exc).__name__}: {exc}]") from None
    return conn


def local_address(conn: Connection) -> str:
    """The address this host reached the other end of ``conn`` from (where the other hosts reach this one)."""
    with socket.socket(fileno=os.dup(conn.fileno())) as sock:
        return sock.getsockname()[0]


def interface_of(address: str) -> str | None:
    """The name of this host's network interface that has ``address`` (Linux), or None."""
    import fcntl
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(sock.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
            except OSError:
                continue
            if socket.inet_ntoa(raw[20:24]) == address:
                return name
    return None


def accept(conn: Connection, keys: dict[str, bytes]) -> str:
    """The controller's half of :func:`connect`: read the role, authenticate it; return the role.

    ``keys`` maps a role (``node``, ``rank 3``) to its key; an unknown role is refused like a wrong key."""
    role = conn.recv_bytes(256).decode(errors="replace")
    key = keys.get(role)
    if key is None:  # a rank of a retired generation, or a stranger: fail its challenge with a key it cannot hold
        key = os.urandom(32)
    deliver_challenge(conn, key)
    answer_challenge(conn, key)
    return role


@dataclass(frozen=True)
class LaunchSpec:
    """What a node agent needs to start its ranks under torch's elastic agent for one world generation."""

    generation: int
    nnodes: int
    nproc_per_node: int
    run_id: str
    rdzv_endpoint: str
    control: tuple[str, int]
    rank_key: bytes
    start_method: str
    start_timeout_s: float
    device: str
    rank_setup: str
    gpu_ids: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)


def log_path(log_dir: str, generation: int, rank: int) -> str:
    """Where rank ``rank`` of generation ``generation`` writes its log (on its own host)."""
    return os.path.join(log_dir, f"start{generation}-rank{rank}.log")


def call_file(log_path: str) -> str:
    """Where the rank writing ``log_path`` keeps the library call it is in, and its log offset at task start."""
    return log_path + ".call"
