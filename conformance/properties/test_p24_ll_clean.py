"""P24 ``clean_low_latency_buffer`` (V1): after garbage bytes over the whole RDMA buffer
(``get_local_buffer_tensor(torch.uint8, use_rdma_buffer=True)``), a clean zeroes exactly the two signalling buffers
of the layout (``4 * num_experts`` bytes at 0 and at ``align_up(4 * num_experts, 128)``, ``csrc/legacy/config.hpp``
``LowLatencyLayout``) and changes no other byte; the low-latency dispatch after it is the oracle's (no stale count
leaks into it); a second clean between staging rows with ``get_next_low_latency_combine_buffer`` and a zero-copy
combine again zeroes only signalling bytes, and the zero-copy combine still sends the staged rows (the clean
keeps the send buffer and the double-buffer index): it equals the oracle and the plain combine byte for byte
(DeepEP 2.1.0 ``csrc/legacy/buffer.hpp:1431-1455``, ``internode_ll.cu:71-99``).  After each clean, the second
signalling buffer read through a view of its own (``get_local_buffer_tensor(torch.int32, size, offset,
use_rdma_buffer=True)``: ``offset`` in bytes, ``size`` in elements, legacy.py:201-220) holds the same bytes as the
whole buffer's view there.

On the real library: held on the real V1 (docs/real-runs/, run 11a).
"""

from __future__ import annotations

from typing import Any

import torch

from conformance.assertions import assert_bytes_equal, assert_within_tolerance, for_each_backend
from conformance.backends.low_latency import PREFIX_BYTES
from conformance.checks.low_latency import check_dispatch
from conformance.core.cases import CleanCase
from conformance.core.example import build_all_inputs
from conformance.oracle.bounds import ll_combine_bound
from conformance.oracle.quantize import signal_regions, weighted_identity_combine
from conformance.properties import CheckContext, Property, register
from conformance.strategies import sized
from conformance.strategies.low_latency import clean_cases
from conformance.tasks.low_latency import clean_runs


def check_clean(clean: dict[str, Any], regions: list[tuple[int, int]], rank: int, when: str) -> None:
    """What one clean did: every byte it changed lies in ``regions`` and is now 0, every byte of them is 0."""
    __tracebackhide__ = True
    call = f"{clean['call']} {when} on rank {rank}"
    union: list[tuple[int, int]] = []  # the regions merged (adjacent when 4 * num_experts is a multiple of 128)
    for begin, end in sorted(regions):
        if union and begin <= union[-1][1]:
            union[-1] = (union[-1][0], max(union[-1][1], end))
        else:
            union.append((begin, end))
    outside = [r for r in clean["changed"] if not any(b <= r[0] and r[1] <= e for b, e in union)]
    if outside or clean["changed_nonzero"]:
        raise AssertionError(f"the RDMA bytes changed by the clean are {clean['changed']} ({clean['changed_nonzero']} "
                             f"of them not zero now), expected only bytes of the signalling buffers {regions}, set to "
                             f"0 [{call}]")
    if regions[-1][1] > PREFIX_BYTES:
        raise AssertionError(f"the signalling buffers {regions} lie past the {PREFIX_BYTES} bytes the task returns "
                             f"[{call}]")
    for begin, end in regions:
        values = clean["prefix"][begin:end]
        if bool((values != 0).any()):
            at = begin + int(torch.nonzero(values != 0)[0])
            raise AssertionError(f"RDMA byte {at} is {int(clean['prefix'][at])} after the clean, expected 0 (it lies "
                                 f"in the signalling buffer [{begin}, {end})) [{call}]")
    begin, end = regions[1]
    if clean["words_at"] != begin:
        raise AssertionError(f"the task read the second signalling buffer at byte {clean['words_at']}, expected "
                             f"{begin} (the layout's) [{call}]")
    assert_bytes_equal(clean["words"], clean["prefix"][begin:end].view(torch.int32), rank=rank, labels=("expert",),
                       name=f"get_local_buffer_tensor(torch.int32, torch.Size([{(end - begin) // 4}]), offset={begin}, "
                            "use_rdma_buffer=True)", call=call,
                       against=f"bytes [{begin}, {end}) of get_local_buffer_tensor(torch.uint8, use_rdma_buffer=True)")


def check(ctx: CheckContext, case: CleanCase, per_rank: list[dict[str, Any]]) -> None:
    """Per rank and backend: both cleans, the dispatch after the first, the zero-copy combine after the second."""
    __tracebackhide__ = True
    example = case.example
    inputs = build_all_inputs(example)
    regions = signal_regions(example.num_experts)

    def one(rank: int, backend: str, result: dict[str, Any]) -> None:
        first, second = result["cleans"]
        check_clean(first, regions, rank, "on an RDMA buffer full of garbage")
        check_dispatch(result["dispatch"], example, inputs, rank)
        check_clean(second, regions, rank, "after a dispatch and get_next_low_latency_combine_buffer(handle).copy_")
        exact, magnitude = weighted_identity_combine(inputs, rank)
        call = result["combine_call"]
        assert_within_tolerance("combined_x", result["zero_copy"], exact,
                                ll_combine_bound(exact, magnitude, example.num_topk), call=call, rank=rank)
        assert_bytes_equal(result["zero_copy"], result["plain"], name="combined_x", rank=rank, call=call,
                           against="the plain combine of the same rows")

    for_each_backend(ctx, case, per_rank, one)


PROPERTY = register(Property(
    id="P24-ll-clean",
    title="V1 clean_low_latency_buffer zeroes exactly the two signalling buffers (no other byte), the dispatch "
          "after it on a garbage buffer is the oracle's, a zero-copy combine staged before it still sends its rows",
    strategy=sized(clean_cases), task=clean_runs, check=check, case_type=CleanCase, apis=("v1",),
    needs=("low_latency", "ll_buffer"),
))
test_ll_clean = PROPERTY.test
