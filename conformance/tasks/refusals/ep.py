"""Stateful refusal recipes of rows only DeepEP 2.5.0's table has (``EPBuffer``, ``EPHandle``): a handle whose
``topk_idx`` the caller modified in place, ``print_memory_usage`` on a destroyed buffer."""

from __future__ import annotations

from conformance.tasks.refusals.env import BadCallEnv
from conformance.tasks.refusals.registry import recipe


@recipe("v2_handle_topk_idx_modified")
def _(env: BadCallEnv, bad: bool) -> None:
    """A cached dispatch through a handle whose ``topk_idx`` (the caller's tensor: 2.5.0 keeps no copy) was modified
    in place after the dispatch, with the same values (``add_(0)`` bumps its version counter only); neighbour: the
    same cached dispatch with the tensor left alone."""
    done = env.valid_v2_dispatch(topk_idx=env.inputs.topk_idx.clone())
    if bad:
        done.kwargs["topk_idx"].add_(0)
    done.buffer.dispatch(env.inputs.x, handle=done.handle, num_experts=done.handle.num_experts)


@recipe("v2_print_memory_usage_destroyed")
def _(env: BadCallEnv, bad: bool) -> None:
    """``print_memory_usage()`` on a destroyed buffer (``explicitly_destroy=True``, ``destroy()`` called); neighbour:
    on the live buffer."""
    buffer = env.v2_buffer()
    if bad:
        buffer.destroy()
    buffer.print_memory_usage()
