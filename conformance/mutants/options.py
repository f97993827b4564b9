"""Mutants of the V2 options (P20 dispatch options, P21 buffer options, P22 ``previous_event_before_epilogue``):
a handle that keeps the caller's ``topk_idx`` although a copy was asked for, padding left unzeroed, statistics
overwritten instead of added, a buffer whose combine ignores ``allow_multiple_reduction`` (either way), expand-mode
combined weights in the wrong slots, an epilogue
that does not wait for its event, a size hint that sizes the bf16 combine in FP8 or ignores ``allow_hybrid_mode``; and
one benign change: ``prefer_overlap_with_compute=False`` taking every SM (a
different, valid schedule, the same bytes).

Each sits where the real bug would: at a seam of the emulated ``ElasticBuffer`` (its dispatch, its combine, its SM
model, its sizing).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import Any

import torch

from conformance.emulation import EventHandle
from conformance.mutants.layout import garble_expand_padding
from conformance.mutants.patching import call_argument, rebinding, seam, through
from conformance.mutants.registry import register


@register("handle-not-copied", "harmful",
          "V2 dispatch with do_handle_copy=True keeps the caller's topk_idx in the handle instead of a copy: a later "
          "in-place change of the caller's tensor leaks into cached dispatches and combines (P20)")
def handle_not_copied() -> Iterator[None]:
    def dispatch(original: Any, self: Any, *args: Any, **kwargs: Any) -> tuple:
        out = original(self, *args, **kwargs)
        if call_argument(original, self, args, kwargs, "handle") is None:
            out[3].topk_idx = call_argument(original, self, args, kwargs, "topk_idx")
        return out

    with seam("ElasticBuffer.dispatch", dispatch):
        yield


@register("zero-padding-skipped", "harmful",
          "V2 expand-mode dispatch with do_zero_padding=True leaves the alignment padding rows uninitialised "
          "(garbage bytes, NaN/huge weights) (P20)")
def zero_padding_skipped() -> Iterator[None]:
    calls = itertools.count(1)

    def dispatch(original: Any, self: Any, *args: Any, **kwargs: Any) -> tuple:
        out = original(self, *args, **kwargs)
        if call_argument(original, self, args, kwargs, "do_zero_padding"):
            garble_expand_padding(out, next(calls))
        return out

    with seam("ElasticBuffer.dispatch", dispatch):
        yield


@register("v2-stats-not-accumulated", "harmful",
          "V2 dispatch writes this call's per-expert receipts into cumulative_local_expert_recv_stats instead of "
          "adding them (P20)")
def v2_stats_not_accumulated() -> Iterator[None]:
    def overwrite(self: Any, arguments: dict[str, Any]) -> None:
        stats = arguments["cumulative_local_expert_recv_stats"]
        if stats is not None and arguments["handle"] is None:
            stats.zero_()

    with rebinding("ElasticBuffer.dispatch", overwrite):
        yield


@contextlib.contextmanager
def _combine_as_if(allow_multiple_reduction: bool) -> Iterator[None]:
    """While active, the emulated combine's kernels reduce as if the buffer had been built with this flag (the flag
    the kernels are compiled with is wrong; the host-side size checks still read the buffer's own)."""
    with seam("v2_reduces_on_the_way", lambda original, self: allow_multiple_reduction):
        yield


@register("multiple-reduction-ignored", "harmful",
          "V2 combine ignores allow_multiple_reduction=True: every row travels unreduced and is rounded once (no "
          "per-node forwarder rounding on several nodes, no per-rank rounding of expanded rows) (P21; P5 on two "
          "nodes)")
def multiple_reduction_ignored() -> Iterator[None]:
    with _combine_as_if(False):
        yield


@register("single-reduction-ignored", "harmful",
          "V2 combine ignores allow_multiple_reduction=False: it still rounds per node (several nodes) and per rank "
          "(expanded rows) (P21)")
def single_reduction_ignored() -> Iterator[None]:
    with _combine_as_if(True):
        yield


class _NeverWaited(EventHandle):
    """An ``EventHandle`` whose wait does nothing (what an epilogue that skips ``stream_wait`` sees)."""

    def __init__(self) -> None:
        super().__init__(torch.device("cpu"))

    def current_stream_wait(self) -> None:
        return None

    def query(self) -> bool:
        return True


@register("expand-combined-weights-slot-shifted", "harmful",
          "V2 expand-mode combine with 1-D topk_weights returns each slot's weight in the next slot's column (the "
          "weight of the expanded row of slot k lands in column k + 1; the earlier V2 contract's layout) (P21)")
def expand_combined_weights_slot_shifted() -> Iterator[None]:
    def combine(original: Any, self: Any, *args: Any, **kwargs: Any) -> tuple:
        combined_x, combined_w, event = original(self, *args, **kwargs)
        handle = call_argument(original, self, args, kwargs, "handle")
        if combined_w is not None and handle.do_expand and combined_w.shape[1] > 1:
            combined_w = torch.roll(combined_w, shifts=1, dims=1)
        return combined_x, combined_w, event

    with seam("ElasticBuffer.combine", combine):
        yield


@register("epilogue-event-ignored", "harmful",
          "V2 dispatch and combine do not wait for previous_event_before_epilogue (the argument checks still see "
          "it) (P22)")
def epilogue_event_ignored() -> Iterator[None]:
    def drop(self: Any, arguments: dict[str, Any]) -> None:
        if isinstance(arguments["previous_event_before_epilogue"], EventHandle):
            arguments["previous_event_before_epilogue"] = _NeverWaited()

    with rebinding("ElasticBuffer.dispatch", drop), rebinding("ElasticBuffer.combine", drop):
        yield


@register("overlap-off-uses-every-sm", "benign",
          "V2 buffers with prefer_overlap_with_compute=False take every SM of the device for their automatic SM "
          "count instead of at least 64 (a different, valid schedule; handle.num_sms changes, no byte does). Allowed: "
          "the SM count is the library's choice")
def overlap_off_uses_every_sm() -> Iterator[None]:
    def every_sm(original: Any, self: Any, *args: Any, **kwargs: Any) -> int:
        result = original(self, *args, **kwargs)
        return result if self.prefer_overlap_with_compute else through("device_num_sms")

    with seam("ElasticBuffer.get_theoretical_num_sms", every_sm):
        yield


@register("fp8-hint-sizes-combine-in-fp8", "harmful",
          "with use_fp8_dispatch the V2 buffer size takes one byte per element for the combine layout too (combine "
          "stays bf16): get_buffer_size_hint and ElasticBuffer(use_fp8_dispatch=True) too small for a combine "
          "(P18, P21)")
def fp8_hint_sizes_combine_in_fp8() -> Iterator[None]:
    sizing_fp8: list[bool] = []  # non-empty while an FP8 buffer size is computed

    def halved(token_bytes: Any, hidden: int, num_topk: int, with_mbarrier: bool, row_id: str) -> int:
        if sizing_fp8 and row_id == "v2_init_hidden_tma":  # the sizing formula only
            hidden //= 2
        return token_bytes(hidden, num_topk, with_mbarrier, row_id)

    def hint(original: Any, num_max_tokens_per_rank: int, hidden: int, num_topk: int, use_fp8_dispatch: bool,
             *args: Any) -> int:
        if not use_fp8_dispatch:
            return original(num_max_tokens_per_rank, hidden, num_topk, use_fp8_dispatch, *args)
        sizing_fp8.append(True)
        try:
            return original(num_max_tokens_per_rank, hidden, num_topk, use_fp8_dispatch, *args)
        finally:
            sizing_fp8.pop()

    with seam("v2_buffer_size_hint", hint), seam("v2_combine_token_bytes", halved):
        yield


@register("hint-ignores-allow-hybrid-mode", "harmful",
          "ElasticBuffer.get_buffer_size_hint(allow_hybrid_mode=False) sizes for hybrid mode (the constructor is "
          "right): on several nodes the direct-mode hint is wrong (P21)", min_nodes=2)
def hint_ignores_allow_hybrid_mode() -> Iterator[None]:
    def hybrid(original: Any, group: Any, num_max_tokens_per_rank: int, hidden: int, num_topk: int = 0,
               use_fp8_dispatch: bool = False, allow_hybrid_mode: bool = True,
               allow_multiple_reduction: bool = True) -> int:
        return original(group, num_max_tokens_per_rank, hidden, num_topk, use_fp8_dispatch, True,
                        allow_multiple_reduction)

    with seam("ElasticBuffer.get_buffer_size_hint", hybrid):
        yield
