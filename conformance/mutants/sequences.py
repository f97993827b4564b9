"""Mutants only call sequences can find (P30): each needs two live handles, two calls in flight, or a destroyed
buffer next to a new one.  A single dispatch/combine, however drawn, never shows them; the kill matrix shows which
property killed each (P30 only, by design).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any

import torch

from conformance.emulation import EventHandle
from conformance.emulation.utils.event import defer, pending_work
from conformance.mutants.patching import seam
from conformance.mutants.registry import register

#: stale-handle-after-newer-dispatch: the handles of each buffer's fresh dispatches, oldest first (the buffer's state,
#: not one activation's: it outlives a task, as a call sequence's steps are tasks of their own).
_HANDLES: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()


@register("stale-handle-after-newer-dispatch", "harmful",
          "a buffer keeps the layout of its newest dispatch: a cached dispatch or combine through an older handle of "
          "the same buffer uses the newest one instead")
def stale_handle_after_newer_dispatch() -> Iterator[None]:
    def remember(position: int) -> Any:
        """The wrappers of one API's dispatch and combine (``position``: the handle's index among dispatch's outputs,
        V1 6-tuple 4, V2 5-tuple 3)."""
        def dispatch(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
            handle = kwargs.get("handle")
            mine = _HANDLES.setdefault(self, [])
            if handle is not None and any(h is handle for h in mine) and handle is not mine[-1]:
                kwargs["handle"] = mine[-1]
            result = original(self, *args, **kwargs)
            if handle is None:
                mine.append(result[position])
            return result

        def combine(original: Any, self: Any, x: Any, handle: Any = None, *args: Any, **kwargs: Any) -> Any:
            mine = _HANDLES.get(self, [])
            if handle is not None and any(h is handle for h in mine) and handle is not mine[-1]:
                handle = mine[-1]
            return original(self, x, handle, *args, **kwargs)

        return dispatch, combine

    v1_dispatch, v1_combine = remember(4)
    v2_dispatch, v2_combine = remember(3)
    with seam("Buffer.dispatch", v1_dispatch), seam("Buffer.combine", v1_combine), \
            seam("ElasticBuffer.dispatch", v2_dispatch), seam("ElasticBuffer.combine", v2_combine):
        yield


@register("event-misses-own-work-when-busy", "harmful",
          "an async call made while another is still in flight records its event before its own copy-out: waiting "
          "on it completes only the earlier call, and its result is read before it is written")
def event_misses_own_work_when_busy() -> Iterator[None]:
    def complete_later(original: Any, fills: list[tuple[torch.Tensor, torch.Tensor]]) -> EventHandle:
        if pending_work() == 0:
            return original(fills)
        event = EventHandle(torch.device("cpu"))  # covers the call already in flight, not this one
        defer(lambda: [dst.copy_(src) for dst, src in fills])
        return event

    with seam("async_complete_later", complete_later):
        yield


#: async-calls-share-receive-slot's slots, kept across activations (each rank task plants the mutant anew).
_RECEIVE_SLOTS: dict[tuple[Any, ...], torch.Tensor] = {}


@register("async-calls-share-receive-slot", "harmful",
          "two async calls in flight at once whose outputs have the same shape get the same receive tensor: the "
          "later copy-out overwrites the earlier call's result")
def async_calls_share_receive_slot() -> Iterator[None]:
    slots = _RECEIVE_SLOTS  # the library's state, not this activation's: it outlives a task (a sequence's step)

    def placeholder(original: Any, value: Any, fills: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
        if pending_work() == 0:
            slots.clear()  # nothing in flight: every slot is free again
        if not isinstance(value, torch.Tensor) or value.device.type != "cpu":
            return original(value, fills)
        key = (tuple(value.shape), value.dtype, len(fills))
        if key in slots:
            fills.append((slots[key], value))
            return slots[key]
        slots[key] = original(value, fills)
        return slots[key]

    with seam("async_placeholder", placeholder):
        yield


@register("destroyed-buffer-revived-by-new-buffer", "harmful",
          "destroy() releases the group's shared runtime and a buffer built next on the same group re-attaches every "
          "earlier buffer object to its runtime: a destroyed buffer works again after a re-create")
def destroyed_buffer_revived_by_new_buffer() -> Iterator[None]:
    built: list[weakref.ref] = []

    def init(original: Any, self: Any, group: Any, *args: Any, **kwargs: Any) -> None:
        original(self, group, *args, **kwargs)
        for ref in built:
            other = ref()
            if other is not None and other.group is group and other.runtime is None:
                other.runtime = self.runtime
        built.append(weakref.ref(self))

    with seam("Buffer.__init__", init), seam("ElasticBuffer.__init__", init):
        yield
