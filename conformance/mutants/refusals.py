"""Mutants of the refusals (the refusal table, conformance/versions/<version>/refusals.toml).

Two families, both harmful:

* a dropped refusal, one per kind of check (a dtype check, a shape/contiguity check, a size check, an
  argument-combination check, a buffer-state check): the emulation accepts the one offending call of that
  row, as a library that lost the check would (seam ``refusal_enforced``);
* a refusal that fires on a valid call: a size check off by one (or using the wrong constant), so that a
  legal call at the boundary is refused (the seams of the checks, sizes and constants).

Each mutant changes what the row's recipe or neighbour (conformance/tasks/refusals/) does; the self-test
(tests/nocover/test_refusals.py) shows it.  They are not wired into a property yet: P12 will draw the table's rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from conformance.mutants.patching import seam
from conformance.mutants.registry import register


def _dropped(row_id: str) -> Any:
    """The emulation skips the refusal of table row ``row_id`` while the block runs (tests/nocover/test_refusals.py
    checks that every row named here exists and that dropping it changes what its recipe does)."""
    return seam("refusal_enforced", lambda original, row: row != row_id and original(row))


#: mutant name -> the table row whose recipe (dropped refusals) or neighbour (false refusals) it changes.
TARGETS: dict[str, str] = {}


def _drop(name: str, row_id: str, what: str) -> None:
    TARGETS[name] = row_id

    @register(name, "harmful", f"{what} ({row_id} dropped)")
    def mutant() -> Iterator[None]:
        with _dropped(row_id):
            yield


_drop("refusal-dropped-dtype", "v1_dispatch_weights_dtype",
      "V1 dispatch accepts bfloat16 topk_weights instead of refusing them (dtype check)")
_drop("refusal-dropped-contiguity", "v1_layout_topk_contiguous",
      "V1 get_dispatch_layout accepts a non-contiguous topk_idx (shape/contiguity check)")
_drop("refusal-dropped-buffer-size", "v2_dispatch_buffer_size",
      "V2 dispatch accepts a per-call num_max_tokens_per_rank its buffer cannot hold (size check)")
_drop("refusal-dropped-argument-combination", "v1_dispatch_alloc_on_comm_stream",
      "V1 dispatch accepts allocate_on_comm_stream=True without previous_event / async_finish "
      "(argument-combination check)")
_drop("refusal-dropped-use-after-destroy", "v2_dispatch_after_destroy",
      "V2 dispatch works on a destroyed buffer (buffer-state check)")
_drop("refusal-dropped-ll-argument-combination", "v1_ll_dispatch_1511",
      "V1 low_latency_dispatch accepts async_finish=True with return_recv_hook=True (low-latency "
      "argument-combination check)")
_drop("refusal-dropped-event-type", "v2_dispatch_event_type",
      "V2 dispatch accepts an EventOverlap as previous_event / previous_event_before_epilogue (argument type check)")


TARGETS["refusal-full-batch-refused"] = "v2_dispatch_too_many_tokens"


@register("refusal-full-batch-refused", "harmful",
          "V2 dispatch refuses exactly num_max_tokens_per_rank tokens (num_tokens < max instead of <=: off by one)")
def full_batch_refused() -> Iterator[None]:
    def check(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
        args = list(args)
        args[6] -= 1  # num_max_tokens_per_rank
        return original(self, *args, **kwargs)

    with seam("v2_dispatch_checks", check):
        yield


TARGETS["refusal-nvl-bytes-overestimated"] = "v1_dispatch_nvl_bytes_data"


@register("refusal-nvl-bytes-overestimated", "harmful",
          "V1 dispatch counts FP8 scale bytes for bfloat16 payloads too, refusing a legal, exactly sized buffer")
def nvl_bytes_overestimated() -> Iterator[None]:
    def overestimated(original: Any, num_ranks: int, num_channels: int, config: Any, hidden: int, elem_size: int,
                      num_topk: int, num_scales: int) -> int:
        return original(num_ranks, num_channels, config, hidden, elem_size, num_topk, num_scales or hidden // 128)

    with seam("v1_dispatch_nvl_bytes", overestimated):
        yield


TARGETS["refusal-nvl-alignment-256"] = "v1_init_nvl_bytes_alignment"


@register("refusal-nvl-alignment-256", "harmful",
          "Buffer() requires num_nvl_bytes to be a multiple of 256 instead of 128, refusing legal sizes")
def nvl_alignment_256() -> Iterator[None]:
    with seam("v1_buffer_alignment_bytes", lambda original: 256):
        yield


TARGETS["refusal-ll-layout-overestimated"] = "v1_ll_combine_1643"


@register("refusal-ll-layout-overestimated", "harmful",
          "V1 low-latency layout adds the dispatch and combine receive buffers instead of sharing one, refusing a "
          "legal, exactly sized low-latency buffer")
def ll_layout_overestimated() -> Iterator[None]:
    def overestimated(original: Any, num_max_dispatch_tokens_per_rank: int, hidden: int, num_ranks: int,
                      num_experts: int) -> int:
        scale_bytes = hidden // 128 * 4
        messages = (16 + max(hidden * 2, hidden + scale_bytes), hidden * 2 + scale_bytes)  # dispatch, combine
        smaller_recv = num_experts * num_max_dispatch_tokens_per_rank * min(messages)  # max(...) + min(...) = sum
        return original(num_max_dispatch_tokens_per_rank, hidden, num_ranks, num_experts) + 2 * smaller_recv

    with seam("ll_layout_total_bytes", overestimated):
        yield
