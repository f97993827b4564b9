"""``deep_ep.utils.event`` of DeepEP 2.5.0: ``EventOverlap`` gained ``wait()`` (deep_ep/utils/event.py:62-64), and
``current_stream_wait()`` returns the registered hook's result (2.5.0's deferred epilogues hand their outputs back
that way, :meth:`EPBuffer.dispatch` with ``defer_epilogue=True``).  The event machinery (CUDA events, the CPU
deferred-work queue) is the 2.1.0 emulation's (``conformance.emulation.utils.event``)."""

from __future__ import annotations

from typing import Any

from ...utils.event import EventHandle
from ...utils.event import EventOverlap as _EventOverlap210

__all__ = ["EventHandle", "EventOverlap"]


class EventOverlap(_EventOverlap210):
    """Wrapper of an ``EventHandle`` with the real library's overlap helpers (DeepEP 2.5.0).

    Arguments:
        event: the captured event (``None`` when the call was synchronous).
        extra_tensors: tensors kept alive until the event is waited on (like ``record_stream``).
    """

    def wait(self) -> Any:
        """Wait on the current stream and return the registered epilogue's result (``current_stream_wait()``)."""
        return self.current_stream_wait()
