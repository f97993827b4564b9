"""``deep_ep.buffers.pp`` of DeepEP 2.5.0: not emulated (``_stubs``)."""

from ._stubs import PPBuffer

__all__ = ['PPBuffer']
