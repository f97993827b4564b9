"""Who raised: a backend (the library, the emulation, a class backend's or a plug-in's own code) or the suite itself.

A verdict is about a backend, so an exception met while driving one is sorted before it is counted:

- :class:`NotSupported`: the backend cleanly declines a configuration (reported ``unsupported`` with the reason);
- :class:`ApiViolation`: the suite read a backend's *public* result and found it breaks the API (a ``None`` where the
  API returns a list, a tuple of the wrong length): the backend's failure, although the suite's code raised it;
- :class:`SuiteError`, or any other exception whose raising frame is the suite's own code (:func:`suite_frame`): a
  **suite error**, reported as such, never a pass and never the backend's failure;
- anything else: raised by the backend (its failure, or the refusal a property expects).

The raising frame is the innermost frame of the traceback that is neither PyTorch's nor the standard library's (an
exception PyTorch raises belongs to whoever called PyTorch).  The suite's own code is the ``conformance`` package
but the library model (``conformance/emulation``), the planted defects standing in for library bugs
(``conformance/mutants``) and the plug-ins around integrators' code (``conformance/integrations``).
"""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path
from types import TracebackType

from conformance.core.outcomes import Why

#: The suite's package directory.
SUITE_ROOT = Path(__file__).resolve().parents[1]
#: Folders of the package whose code stands for a backend, not for the suite.
BACKEND_SIDE = ("emulation", "mutants", "integrations")


class NotSupported(Exception):  # noqa: N818 - an outcome, not an error
    """Raised by a backend for a configuration it cannot handle (e.g. a wrapper without ``expert_alignment``, a class
    backend whose instance lacks a call of the API): reported as ``unsupported`` for that backend and example, with
    this message as the reason.  ``why``: the kind of reason (a set-up limit's subclass says ``setup``)."""

    why = Why.DECLINED


class ApiViolation(AssertionError):
    """A backend's public result breaks the API it follows (found by the suite while reading it): that backend's
    failure.  The message names the value, what the API promises and the call."""


class SuiteError(RuntimeError):
    """The suite's own code failed where it drives or reads a backend (e.g. it reached past a class backend's public
    API): a suite error, never a pass and never the backend's failure."""


def _library_roots() -> tuple[str, ...]:
    roots = {sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib")}
    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch, "__file__", None):
        roots.add(os.path.dirname(torch.__file__))
    return tuple(os.path.realpath(r) + os.sep for r in roots if r)


def _is_library(filename: str, roots: tuple[str, ...]) -> bool:
    """PyTorch's or the standard library's code (not what is installed beside the standard library)."""
    if filename.startswith("<"):  # <frozen ...>, <string>
        return True
    real = os.path.realpath(filename)
    for root in roots:
        if real.startswith(root):
            rest = real[len(root):]
            return not rest.startswith(("site-packages", "dist-packages"))
    return False


def is_suite_file(filename: str) -> bool:
    """Whether ``filename`` is the suite's own code (see the module docstring)."""
    try:
        relative = Path(os.path.realpath(filename)).relative_to(SUITE_ROOT)
    except ValueError:
        return False
    return not relative.parts or relative.parts[0] not in BACKEND_SIDE


def raising_frame(tb: TracebackType | None) -> tuple[str, int, str] | None:
    """``(file, line, function)`` of the innermost frame of ``tb`` that is neither PyTorch's nor the standard
    library's, or ``None``."""
    frames: list[tuple[str, int, str]] = []
    while tb is not None:
        code = tb.tb_frame.f_code
        frames.append((code.co_filename, tb.tb_lineno, code.co_name))
        tb = tb.tb_next
    roots = _library_roots()
    return next((f for f in reversed(frames) if not _is_library(f[0], roots)), None)


#: How PyTorch reports a fault of earlier device work (``torch.AcceleratorError``; older releases: RuntimeError).
DEVICE_FAULT_MARKS = ("CUDA error:", "CUDA driver error", "device-side assert triggered")


def is_device_fault(exc: BaseException) -> bool:
    """Whether ``exc`` reports a fault of earlier device work (an illegal address, a device-side assert): CUDA
    reports it asynchronously, at whatever call synchronises next, so where it was raised says nothing of whose
    it is.  It belongs to the backend's operation it surfaced in (``tasks.env.settle``), never to the suite's line
    that synchronised (e.g. real-v1's known shrink-mode fault surfacing at a ``status.cpu()`` of
    ``backends/low_latency.py``: not a suite error)."""
    return type(exc).__name__ == "AcceleratorError" or any(mark in str(exc) for mark in DEVICE_FAULT_MARKS)


def suite_frame(exc: BaseException | None) -> str | None:
    """Where the suite's own code raised ``exc`` (``path:line in function``), or ``None`` when a backend raised it
    (or it is an outcome: :class:`NotSupported`, :class:`ApiViolation`)."""
    if exc is None or isinstance(exc, NotSupported | ApiViolation) or is_device_fault(exc):
        return None
    if getattr(exc, "conformance_raiser", None) == "callee":  # a traced library call's signature refused the
        return None  # arguments (backends.tracing): the callee's answer, raised before its first line
    frame = raising_frame(exc.__traceback__)
    if isinstance(exc, SuiteError) or (frame is not None and is_suite_file(frame[0])):
        if frame is None:
            return "the suite"
        try:
            where = str(Path(os.path.realpath(frame[0])).relative_to(SUITE_ROOT.parent))
        except ValueError:
            where = frame[0]
        return f"{where}:{frame[1]} in {frame[2]}"
    return None
