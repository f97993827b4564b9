"""CUDA-event semantics for the emulation: ``EventHandle`` and ``EventOverlap``.

On CUDA tensors a real ``torch.cuda.Event`` is recorded on the current stream and waiting makes the
current stream wait on it.

On CPU there are no streams, so the emulation models them with a small *deferred-work* queue (see
DIVERGENCES.md, "Events on CPU"): work that would run on another stream (a compute kernel started
elsewhere, or the copy-out of an async dispatch/combine on the communication stream) is queued with
:func:`defer` instead of running at once.  A captured ``EventHandle`` remembers the work queued so far;
``current_stream_wait()`` completes it.  Reading a tensor before waiting shows its stale contents, as on a
GPU.  :func:`synchronize` completes everything (``torch.cuda.synchronize`` stand-in).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch

from ..seams import seam


class _Work:
    """One queued piece of CPU work (runs at most once)."""

    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn = fn
        self.done = False


_pending: list[_Work] = []


def defer(work: Callable[[], None]) -> None:
    """Queue CPU ``work`` on the emulated side stream; it runs when an event capturing it is waited on."""
    _pending.append(_Work(work))


def _flush(items: list[_Work]) -> None:
    for item in items:
        if not item.done:
            item.done = True
            item.fn()
    _pending[:] = [w for w in _pending if not w.done]


def synchronize() -> None:
    """Complete every queued piece of CPU work (the ``torch.cuda.synchronize()`` stand-in)."""
    _flush(list(_pending))


def pending_work() -> int:
    """How many queued pieces of CPU work have not run yet."""
    return sum(not w.done for w in _pending)


class EventHandle:
    """A captured point on the current stream (the emulation's stand-in for ``deep_ep._C.EventHandle``).

    Arguments:
        device: the device whose current stream is captured.  ``None`` captures the current CUDA stream
            only when CUDA is already initialised (it never initialises CUDA), otherwise the CPU "stream".
    """

    def __init__(self, device: torch.device | None = None) -> None:
        self._cuda_event = None
        self._captured: list[_Work] = []
        use_cuda = (device is not None and torch.device(device).type == "cuda") or (
            device is None and torch.cuda.is_available() and torch.cuda.is_initialized()
        )
        if use_cuda:
            self._cuda_event = torch.cuda.Event()
            self._cuda_event.record(torch.cuda.current_stream())
        else:
            self._captured = list(_pending)

    def current_stream_wait(self) -> None:
        """Make the current stream wait for this event (on CPU: complete the work queued before capture)."""
        if self._cuda_event is not None:
            torch.cuda.current_stream().wait_event(self._cuda_event)
        else:
            _flush(self._captured)

    def query(self) -> bool:
        """Whether the captured work has finished."""
        if self._cuda_event is None:
            return all(w.done for w in self._captured)
        return bool(self._cuda_event.query())


@seam("async_placeholder")
def _placeholder(value: Any, fills: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
    """A not-yet-written stand-in for a CPU output (bytes 0xA5), registering the copy that completes it."""
    if isinstance(value, tuple):
        return tuple(_placeholder(v, fills) for v in value)
    if not isinstance(value, torch.Tensor) or value.device.type != "cpu":
        return value
    stale = torch.empty(value.shape, dtype=value.dtype)
    if stale.numel():
        stale.view(-1).view(torch.uint8).fill_(0xA5)
    fills.append((stale, value))
    return stale


@seam("async_complete_later")
def _complete_later(fills: list[tuple[torch.Tensor, torch.Tensor]]) -> EventHandle:
    """Queue the copy-out of an async call, then capture the event that covers it."""
    defer(lambda: [dst.copy_(src) for dst, src in fills])
    return EventHandle(torch.device("cpu"))


def async_outputs(flag: str, num_outputs: int) -> Callable:
    """Decorator of dispatch/combine: when argument ``flag`` is true and outputs are on CPU, the first
    ``num_outputs`` results are returned unwritten and completed by deferred work that the returned
    ``EventOverlap``'s event covers (the CPU model of a kernel still running on the communication stream)."""

    def decorate(fn: Callable) -> Callable:
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            result = fn(*args, **kwargs)
            bound = signature.bind(*args, **kwargs)
            if not bound.arguments.get(flag, signature.parameters[flag].default):
                return result
            fills: list[tuple[torch.Tensor, torch.Tensor]] = []
            outputs = [_placeholder(v, fills) for v in result[:num_outputs]] + list(result[num_outputs:])
            if fills:
                outputs[-1].event = _complete_later(fills)
            return tuple(outputs)

        return wrapper

    return decorate


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
