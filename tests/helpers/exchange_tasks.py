"""Rank tasks of tests/nocover/test_exchange.py: ``_comm.exchange`` on every rank, its result compared
bit for bit there."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from conformance.emulation import _comm
from conformance.world.rank import context


def _inputs(rank: int, rows: int, hidden: int) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s fields, reproducible on every rank: bf16 with NaN/-0.0/Inf bit patterns, fp8, bool, int64,
    and a zero-width field."""
    g = torch.Generator().manual_seed(1000 + rank)
    bits = torch.randint(-(1 << 15), 1 << 15, (rows, hidden), dtype=torch.int32, generator=g).to(torch.int16)
    return {
        "x": bits.view(torch.bfloat16),
        "fp8": torch.randint(0, 256, (rows, 4), dtype=torch.uint8, generator=g).view(torch.float8_e4m3fn),
        "flag": torch.randint(0, 2, (rows, 3), generator=g).to(torch.bool),
        "token": torch.arange(rows, dtype=torch.int64) * 7 + rank,
        "nothing": torch.empty((rows, 0), dtype=torch.float32),
        "absent": None,
    }


def _whole(rank: int) -> dict[str, torch.Tensor]:
    return {"per_expert": torch.arange(5, dtype=torch.int32) + 10 * rank}


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return a.numel() == 0 or torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def exchange_matches(rows: list[int], hidden: int) -> dict[str, Any]:
    """Every rank exchanges its fields (``rows[rank]`` rows of width ``hidden``); what arrived from each rank equals
    what that rank sent, bit for bit; and how many collectives it took."""
    ctx = context()
    calls = []
    original = dist.all_gather

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return original(*args, **kwargs)

    dist.all_gather = counted
    try:
        got = _comm.exchange(ctx.group, torch.device("cpu"), rows[ctx.rank], None, "test",
                             lambda: _inputs(ctx.rank, rows[ctx.rank], hidden), extra=[ctx.rank, 5],
                             whole=_whole(ctx.rank))
    finally:
        dist.all_gather = original
    mismatches = []
    for s in range(ctx.world_size):
        sent = _inputs(s, rows[s], hidden)
        for name, tensor in sent.items():
            if tensor is None:
                if name in got.fields:
                    mismatches.append(f"{name} from {s}: arrived, though None")
            elif not _same(got.fields[name][s], tensor):
                mismatches.append(f"{name} from {s}")
        if not _same(got.whole["per_expert"][s], _whole(s)["per_expert"]):
            mismatches.append(f"per_expert from {s}")
    return {"mismatches": mismatches, "table": got.table, "collectives": len(calls), "names": got.names}


def exchange_refused(rows: list[int], refusing: int) -> str:
    """Rank ``refusing`` found an error in its arguments (its fields cannot even be built); what each rank raised."""
    ctx = context()

    def fields() -> dict[str, torch.Tensor]:
        if ctx.rank == refusing:
            raise AssertionError("the refusing rank's fields must not be built")
        return _inputs(ctx.rank, rows[ctx.rank], 16)

    try:
        _comm.exchange(ctx.group, torch.device("cpu"), rows[ctx.rank],
                       "bad argument" if ctx.rank == refusing else None, "test", fields)
    except Exception as exc:
        return type(exc).__name__
    return "nothing raised"
