"""A module the fork server's self-test runs as ``python -m tests.helpers.fork_targets MODE ...`` would."""

from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import time


def _parsed_tables() -> list[str]:
    """The versions whose refusal table this process has parsed already (without parsing any)."""
    versions = sys.modules.get("conformance.versions")
    if versions is None:
        return []
    return [v for v in versions.known_versions() if "refusals" in versions.contract(v).__dict__]


if __name__ == "__main__":
    mode = sys.argv[1]
    atexit.register(lambda: print("atexit ran", flush=True))
    if mode == "report":
        print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "name": __name__, "sid": os.getsid(0),
                          "pid": os.getpid(), "marker": os.environ.get("FORK_TARGET_MARKER"),
                          "deep_ep": "deep_ep" in sys.modules, "torch": "torch" in sys.modules,
                          "tables": _parsed_tables()}), flush=True)
        print("to stderr", file=sys.stderr, flush=True)
        sys.exit(int(sys.argv[2]))
    if mode == "sleep":
        print(os.getpid(), flush=True)
        time.sleep(600)
    if mode == "signal":
        os.kill(os.getpid(), signal.SIGSEGV)
