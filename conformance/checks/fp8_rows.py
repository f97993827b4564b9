"""The rows of an FP8 dispatch against the oracle (P18, P19): each received token's E4M3 bytes and its own scale row.

Shared by several properties: a property module imports the checks it shares from here, never another
property module (moved from ``conformance/properties/test_p18_fp8_payloads.py``)."""

from __future__ import annotations

from typing import Any

import torch

from conformance.core.example import Example


def check_rows(run: dict[str, Any], example: Example, rank: int, expected: list[tuple[int, int]],
               payloads: list[tuple[torch.Tensor, torch.Tensor]], call: str) -> None:
    """The valid rows of one FP8 dispatch: the oracle's tokens, each with its own bytes and scale row."""
    __tracebackhide__ = True
    n = run["num_valid"]
    got = sorted(zip(run["src_rank"][:n].tolist(), run["src_token"][:n].tolist(), strict=True))
    if got != expected:
        raise AssertionError(f"received (source rank, token) on rank {rank} are {got}, expected {expected} (the "
                             f"oracle) [{call}]")
    for row, (s, t) in enumerate(zip(run["src_rank"][:n].tolist(), run["src_token"][:n].tolist(), strict=True)):
        x, scales = payloads[s]
        if not torch.equal(run["x"][row].view(torch.uint8), x[t].view(torch.uint8)):
            raise AssertionError(f"E4M3 bytes of row {row} (rank {s} token {t}) on rank {rank} differ from the "
                                 f"source token's [{call}]")
        if not torch.equal(run["scales"][row].view(torch.int32), scales[t].view(torch.int32)):
            raise AssertionError(f"scales of row {row} (rank {s} token {t}) on rank {rank} are "
                                 f"{run['scales'][row].tolist()}, expected {scales[t].tolist()} (that token's scale "
                                 f"row) [{call}]")


def call_of(backend: str, variant: str, example: Example, rank: int) -> str:
    cls = "Buffer" if backend.endswith("v1") else "ElasticBuffer"
    extra = {"plain": "", "col_major": ", use_tma_aligned_col_major_sf=True", "no_cpu_sync": ", do_cpu_sync=False",
             "fp8_buffer": ") on ElasticBuffer(..., use_fp8_dispatch=True",
             "num_worst_tokens": f", num_worst_tokens={example.world_size * example.num_max_tokens_per_rank}"}
    return (f"{backend}: {cls}.dispatch((x[{example.tokens_per_rank[rank]},{example.hidden}] float8_e4m3fn, "
            f"scales float32){extra.get(variant, variant)}) on rank {rank}")
