"""The oracle: what every rank must receive and what combine must return, computed the obvious way.

It reads only the inputs of all ranks (see :func:`conformance.core.example.build_all_inputs`) and the example
description.  It shares no code with the emulation or the backends, and it is written as plain loops on
purpose: it defines the contract, so it must be easy to read and hard to get wrong.
"""

from conformance.oracle.counts import (
    expected_aligned_counts,
    expected_layout,
    expected_psum_per_expert,
    expected_raw_counts,
    expected_recv_topk_idx,
    expected_tokens_per_source_rank,
)
from conformance.oracle.receipts import Receipts, expected_receipts, expected_received_tokens
from conformance.oracle.reduction import (
    ExpectedSum,
    expected_combined_weights,
    expected_dispatch_backward,
    expected_round_trip_bf16,
    expected_round_trip_sum,
    expected_rows_by_source,
    expected_scaled_combine,
    reach_counts,
    reached_ranks,
    scaled_expert_row,
    scaled_weight,
)

__all__ = [
    "ExpectedSum",
    "Receipts",
    "expected_combined_weights",
    "expected_dispatch_backward",
    "expected_round_trip_bf16",
    "expected_round_trip_sum",
    "expected_rows_by_source",
    "expected_scaled_combine",
    "reach_counts",
    "reached_ranks",
    "scaled_expert_row",
    "scaled_weight",
    "expected_aligned_counts",
    "expected_layout",
    "expected_psum_per_expert",
    "expected_raw_counts",
    "expected_recv_topk_idx",
    "expected_tokens_per_source_rank",
    "expected_receipts",
    "expected_received_tokens",
]
