"""CUDA-event semantics for the emulation: ``EventHandle`` and ``EventOverlap``.

On CPU every emulated kernel runs synchronously on the calling thread, so an event is "complete" as
soon as it is captured and waiting on it is a no-op.  On CUDA tensors a real ``torch.cuda.Event`` is
recorded on the current stream and waiting makes the current stream wait on it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


class EventHandle:
    """A captured point on the current stream (the emulation's stand-in for ``deep_ep._C.EventHandle``).

    Arguments:
        device: the device whose current stream is captured.  ``None`` captures the current CUDA stream
            only when CUDA is already initialised (it never initialises CUDA), otherwise the CPU "stream".
    """

    def __init__(self, device: torch.device | None = None) -> None:
        self._cuda_event = None
        use_cuda = (device is not None and torch.device(device).type == "cuda") or (
            device is None and torch.cuda.is_available() and torch.cuda.is_initialized()
        )
        if use_cuda:
            self._cuda_event = torch.cuda.Event()
            self._cuda_event.record(torch.cuda.current_stream())

    def current_stream_wait(self) -> None:
        """Make the current stream wait for this event (no-op on CPU: the work is already done)."""
        if self._cuda_event is not None:
            torch.cuda.current_stream().wait_event(self._cuda_event)

    def query(self) -> bool:
        """Whether the captured work has finished."""
        return True if self._cuda_event is None else bool(self._cuda_event.query())


class EventOverlap:
    """Wrapper of an ``EventHandle`` with the real library's overlap helpers.

    Arguments:
        event: the captured event (``None`` when the call was synchronous).
        extra_tensors: tensors kept alive until the event is waited on (like ``record_stream``).
    """

    def __init__(
        self, event: EventHandle | None = None, extra_tensors: tuple[torch.Tensor, ...] | None = None
    ) -> None:
        self.event = event
        self.extra_tensors = extra_tensors
        self._release_handle_by_call = False
        self.hook_after_wait: Callable | None = None

    def current_stream_wait(self, release_handle: bool = False) -> Any:
        """Make the current stream wait for the event, then run (once) the registered hook.

        Returns:
            the hook's return value, or ``None`` when no hook is registered.
        """
        assert self.event is not None
        self.event.current_stream_wait()
        result = None
        if self.hook_after_wait is not None:
            result = self.hook_after_wait()
            self.hook_after_wait = None
        if release_handle:
            self.event = None
        return result

    def wait(self) -> Any:
        """Alias of ``current_stream_wait()``."""
        return self.current_stream_wait()

    def register_hook_after_wait(self, hook_after_wait: Callable) -> None:
        """Register a callable run right after the next ``current_stream_wait()``."""
        assert self.hook_after_wait is None, "A hook is already registered on this `EventOverlap`"
        self.hook_after_wait = hook_after_wait

    def __call__(self, release_handle: bool = False) -> EventOverlap:
        """Configure ``release_handle`` for the next ``with`` block; returns ``self``."""
        self._release_handle_by_call = release_handle
        return self

    def __enter__(self) -> EventOverlap:
        return self

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> None:
        if self.event is not None:
            self.current_stream_wait(release_handle=self._release_handle_by_call)
        self._release_handle_by_call = False
