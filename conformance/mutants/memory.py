"""Mutants of what worst-case outputs hold past their valid rows (P26): the last valid row of a V2 dispatch without
a CPU sync left unwritten (a device count off by one), and one benign change: the memory the library never writes
reading as zeros (what the caching allocator may well hand out): no property may depend on what uninitialised rows
hold.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from conformance.emulation import seams as emulation_seams
from conformance.mutants.patching import call_argument, seam
from conformance.mutants.registry import register


@register("uninitialised-zeroed", "benign",
          "the memory the library allocates and never writes (the rows past a worst-case output's valid ones) reads "
          "as zeros instead of 0x7F bytes: what a fresh block of the caching allocator may hold. Allowed: the "
          "contract says nothing of those rows (P19 asserts nothing there; P26's recv_topk_idx tail is not -1 either "
          "way: its known defect)")
def uninitialised_zeroed() -> Iterator[None]:
    def zeros(original: Any, shape: tuple[int, ...], dtype: torch.dtype, device: Any) -> torch.Tensor:
        return torch.zeros(shape, dtype=dtype, device=device)

    with seam("uninitialised", zeros):
        yield


@register("v2-worst-case-last-row-unwritten", "harmful",
          "V2 dispatch with do_cpu_sync=False leaves its last valid received row unwritten (the device-side count "
          "one short): that row's payload and weights are the uninitialised memory's bytes (P26)")
def last_row_unwritten() -> Iterator[None]:
    def dispatch(original: Any, self: Any, *args: Any, **kwargs: Any) -> tuple:
        out = original(self, *args, **kwargs)
        if call_argument(original, self, args, kwargs, "do_cpu_sync") is False and \
                not call_argument(original, self, args, kwargs, "do_expand"):
            handle = out[3]
            valid = int(handle.psum_num_recv_tokens_per_scaleup_rank[-1])
            if valid:
                unwritten = emulation_seams.current("uninitialised")
                for tensor in (out[0], out[2]):
                    if isinstance(tensor, torch.Tensor):
                        tensor[valid - 1] = unwritten(tuple(tensor[valid - 1].shape), tensor.dtype, tensor.device)
        return out

    with seam("ElasticBuffer.dispatch", dispatch):
        yield


@register("v2-worst-case-topk-idx-filled", "benign",
          "V2 dispatch with do_cpu_sync=False writes -1 into the rows of recv_topk_idx past the valid count, as "
          "DeepEP's own fix does (PR #739): the known defect v2-recv-topk-idx-uninitialised-past-valid-rows is fixed "
          "(P26 holds there, and reports the entry fixed)")
def topk_idx_filled() -> Iterator[None]:
    def dispatch(original: Any, self: Any, *args: Any, **kwargs: Any) -> tuple:
        out = original(self, *args, **kwargs)
        if call_argument(original, self, args, kwargs, "do_cpu_sync") is False and out[1] is not None:
            valid = int(out[3].psum_num_recv_tokens_per_scaleup_rank[-1])
            out[1][valid:] = -1
        return out

    with seam("ElasticBuffer.dispatch", dispatch):
        yield
