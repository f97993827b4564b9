"""The import probe integrators use: which DeepEP APIs are installed, and where ``EventOverlap`` lives.

Never initialises CUDA: availability of a GPU is read through NVML (``PYTORCH_NVML_BASED_CUDA_CHECK``).
"""

from __future__ import annotations

import importlib
import os
from typing import Any


def probe_module(module_name: str) -> dict[str, Any]:
    """What ``module_name`` (``deep_ep`` or ``conformance.emulation``) offers; ``{"importable": False, ...}`` if not."""
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or a broken build raising something else
        return {"module": module_name, "importable": False, "error": f"{type(exc).__name__}: {exc}"}
    found: dict[str, Any] = {
        "module": module_name,
        "importable": True,
        "version": getattr(module, "__version__", None),
        "Buffer": hasattr(module, "Buffer"),
        "ElasticBuffer": hasattr(module, "ElasticBuffer"),
        "EPBuffer": hasattr(module, "EPBuffer"),
        "EventOverlap": None,
    }
    for where in (f"{module_name}.utils", f"{module_name}.utils.event"):
        try:
            if hasattr(importlib.import_module(where), "EventOverlap"):
                found["EventOverlap"] = where
                break
        except Exception:
            continue
    return found


def cuda_device_count() -> int:
    """GPUs visible to this process, read without creating a CUDA context."""
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    import torch

    try:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0




def probe_in_subprocess(module_name: str, timeout_s: float = 120.0) -> dict[str, Any]:
    """:func:`probe_module` run in a fresh interpreter: a library whose import crashes or hangs cannot take the
    caller (the pytest process) with it.  The result says so instead."""
    import json
    import subprocess
    import sys

    code = ("import json, sys; from conformance.core.probe import probe_module; "
            "print(json.dumps(probe_module(sys.argv[1])))")
    try:
        proc = subprocess.run([sys.executable, "-c", code, module_name], capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"module": module_name, "importable": False, "error": f"import did not finish in {timeout_s:.0f} s"}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode == 0 and lines:
        return json.loads(lines[-1])
    tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
    return {"module": module_name, "importable": False,
            "error": f"importing {module_name} killed the interpreter (exit {proc.returncode}): {tail}"}
