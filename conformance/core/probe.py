"""The import probe integrators use: which DeepEP APIs are installed, and where ``EventOverlap`` lives.

Never initialises CUDA: availability of a GPU is read through NVML (``PYTORCH_NVML_BASED_CUDA_CHECK``).
"""

from __future__ import annotations

import importlib
import os
import sys
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


#: Present on a Linux host with an NVIDIA driver (or AMD's, for ROCm builds of torch): without any, no GPU.
GPU_DRIVER_PATHS = ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/kfd")


def torch_version() -> str:
    """``torch.__version__`` (``2.13.0+cpu``), from the installed distribution when torch is not loaded here (an
    xdist controller: importing it costs seconds)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return str(torch.__version__)
    import importlib.metadata

    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        import torch

        return str(torch.__version__)


def cuda_device_count() -> int:
    """GPUs visible to this process, read without creating a CUDA context.  On a Linux host without a GPU driver
    it is 0 without importing torch (seconds, in the pytest process that only starts the workers)."""
    if sys.platform.startswith("linux") and not any(os.path.exists(p) for p in GPU_DRIVER_PATHS):
        return 0
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
