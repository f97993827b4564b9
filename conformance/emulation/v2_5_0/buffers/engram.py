"""``deep_ep.buffers.engram`` of DeepEP 2.5.0: not emulated (``_stubs``)."""

from ._stubs import EngramBuffer

__all__ = ['EngramBuffer']
