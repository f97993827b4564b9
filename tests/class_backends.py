"""Classes the self-tests run as class backends (``--backends v1=tests.class_backends:CountingBuffer``): DeepEP-shaped
buffers of "someone else's" (a fork, a vendor build), one faithful and one with a planted defect."""

from __future__ import annotations

from typing import Any

from deep_ep import Buffer, ElasticBuffer  # the deep_ep the ranks resolve (--deep-ep emulation here)


class CountingBuffer(Buffer):
    """``deep_ep.Buffer`` that counts its dispatches: a faithful fork."""

    dispatches = 0

    def dispatch(self, *args: Any, **kwargs: Any) -> Any:
        type(self).dispatches += 1
        return super().dispatch(*args, **kwargs)


class CountingElasticBuffer(ElasticBuffer):
    """``deep_ep.ElasticBuffer`` that counts its dispatches: a faithful fork."""

    dispatches = 0

    def dispatch(self, *args: Any, **kwargs: Any) -> Any:
        type(self).dispatches += 1
        return super().dispatch(*args, **kwargs)


class BitFlippingElasticBuffer(ElasticBuffer):
    """A fork whose dispatch flips the lowest bit of the first received element: P1 must fail it, and it alone."""

    def dispatch(self, *args: Any, **kwargs: Any) -> Any:
        recv_x, *rest = super().dispatch(*args, **kwargs)
        if kwargs.get("handle") is None and not isinstance(recv_x, tuple) and recv_x.numel():
            recv_x.view(-1).view(dtype=__import__("torch").int16)[0] ^= 1
        return (recv_x, *rest)


not_a_class = "a string"
