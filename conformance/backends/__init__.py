"""Backends: one adapter per DeepEP API, given a deep_ep-like module (the real one or the emulation).

The same adapter code drives the real library on GPUs and :mod:`conformance.emulation` in CPU CI.
"""

from conformance.backends.spec import BackendSpec, parse_backends
from conformance.backends.views import DispatchOptions, DispatchView, Unsupported

__all__ = ["BackendSpec", "DispatchOptions", "DispatchView", "Unsupported", "parse_backends"]
