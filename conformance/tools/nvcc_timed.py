#!/usr/bin/env python3
"""``EP_JIT_NVCC_COMPILER`` for DeepEP's JIT: runs the real ``nvcc`` with the same arguments and output, and appends
one JSON line per compile (start, end, the kernel's cache directory) to the file ``CONFORMANCE_JIT_LOG`` names.

DeepEP V2 compiles a kernel per new set of template arguments by calling ``nvcc`` as an external command
(``csrc/jit/compiler.hpp``: ``EP_JIT_NVCC_COMPILER`` overrides its path; the compiler's signature is the version
``nvcc --version`` prints, which this passes through, so the kernel cache is the same with or without it).  The
suite reads the log back to report how many kernels a run compiled and what share of its wall time went to them.
The real compiler: ``CONFORMANCE_REAL_NVCC``, else ``$CUDA_HOME/bin/nvcc``, else ``nvcc`` on the ``PATH`` (this
file excluded).

The log never changes a compile's outcome: its folder is made when missing, and a log that cannot be written is
reported on stderr and skipped (a tool exiting non-zero makes DeepEP's JIT say ``NVCC compilation failed`` for a
kernel nvcc had compiled).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time


def real_nvcc() -> str:
    me = os.path.realpath(__file__)
    for candidate in (os.environ.get("CONFORMANCE_REAL_NVCC"),
                      os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc"),
                      shutil.which("nvcc")):
        if candidate and os.path.isfile(candidate) and os.path.realpath(candidate) != me:
            return candidate
    sys.stderr.write("conformance nvcc_timed: no real nvcc found (set CONFORMANCE_REAL_NVCC)\n")
    raise SystemExit(127)


def instantiation(code_path: str) -> str:
    """The kernel a JIT source instantiates (``dispatch_impl<true, ...>``), read from the source file."""
    try:
        with open(code_path) as f:
            found = re.search(r"reinterpret_cast<void\*>\(&([^;]+?)\);", f.read())
    except OSError:
        return ""
    return found.group(1).strip() if found else ""


def main() -> int:
    args = sys.argv[1:]
    started = time.time()
    code = subprocess.call([real_nvcc(), *args])
    log = os.environ.get("CONFORMANCE_JIT_LOG")
    if log and "--version" not in args:
        entry = {"start": started, "end": time.time(), "exit": code, "pid": os.getppid(),
                 "kernel": instantiation(args[0] if args else ""),
                 "kind": "ptx" if "-ptx" in args else "cubin"}
        try:  # the log is the suite's; the compile's outcome is nvcc's, whatever becomes of the log
            os.makedirs(os.path.dirname(os.path.abspath(log)), exist_ok=True)
            with open(log, "a") as f:  # one short line per write: appends of concurrent compiles do not interleave
                f.write(json.dumps(entry) + "\n")
        except OSError as exc:
            sys.stderr.write(f"conformance nvcc_timed: compile not logged ({exc}); nvcc's exit status kept\n")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
