"""``deep_ep.buffers.bucket`` of DeepEP 2.5.0: not emulated (``_stubs``)."""

from ._stubs import BucketBuffer, BucketSession

__all__ = ['BucketBuffer', 'BucketSession']
