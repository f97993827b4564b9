"""P15 low-latency dispatch: per local expert, the rows of every source rank sit in the block its
``layout_range`` names, ``recv_count`` counts them, ``src_info`` names the oracle's tokens, and each row is the
oracle's: bf16 bytes unchanged; with ``use_fp8`` the per-128-channel E4M3 cast (bytes and ``round_scale`` scales
exact; without ``round_scale`` scales exact and each byte the oracle's or its E4M3 neighbour, a bound derived
from a one-ulp float32 ``448 / amax``), ``use_ue8m0`` scales packed four exponents per int32, column-major; one
dispatch is made with ``async_finish=True`` and read after ``event.current_stream_wait()``.

On the real library: held on the real V1 (one H200, two ranks sharing it: docs/real-runs/, run 10b); its recording
replays exactly.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import torch

from conformance.assertions import for_each_backend
from conformance.core.example import Example, build_all_inputs
from conformance.oracle.quantize import expert_rows, quantize, ue8m0
from conformance.properties import CheckContext, Property, register
from conformance.strategies import sized
from conformance.strategies.low_latency import ll_examples
from conformance.tasks.low_latency import low_latency_runs


def _fail(what: str, got: Any, expected: Any, call: str) -> AssertionError:
    return AssertionError(f"{what} is {got}, expected {expected} [{call}]")


def check_dispatch(run: dict[str, Any], example: Example, inputs: list, rank: int,
                   masked: Collection[int] = ()) -> None:
    """One low-latency dispatch of one rank against the oracle (see the module docstring); the sources in
    ``masked`` (shrink mode: ranks this rank masked) send nothing."""
    __tracebackhide__ = True
    use_fp8, round_scale, use_ue8m0, _ = run["options"]
    call = run["call"]
    expected = expert_rows(example, inputs, rank, masked)
    num_local, rows_per_expert = example.experts_per_rank, example.world_size * example.num_max_tokens_per_rank
    dtype = "torch.float8_e4m3fn" if use_fp8 else "torch.bfloat16"
    if tuple(run["x"].shape) != (num_local, rows_per_expert, example.hidden) or run["x_dtype"] != dtype:
        raise _fail("recv_x shape/dtype", (tuple(run["x"].shape), run["x_dtype"]),
                    ((num_local, rows_per_expert, example.hidden), dtype), call)
    num_scales = example.hidden // 128
    if use_fp8:
        packs = num_scales // 4 if use_ue8m0 else num_scales
        want = ((num_local, rows_per_expert, packs), "torch.int32" if use_ue8m0 else "torch.float32",
                (rows_per_expert * packs, 1, rows_per_expert))
        got = (tuple(run["scales"].shape), run["scales_dtype"], run["scales_stride"])
        if got != want:
            raise _fail("recv_x scales (shape, dtype, stride: column-major)", got, want, call)
    for e in range(num_local):
        count = int(run["recv_count"][e])
        total = sum(len(v) for v in expected[e].values())
        if count != total:
            raise _fail(f"recv_count[{e}] on rank {rank}", count, f"{total} (oracle: slots naming expert "
                        f"{rank * num_local + e})", call)
        blocks = []
        for s, tokens in expected[e].items():
            packed = int(run["layout_range"][e, s])
            begin, n = packed >> 32, packed & 0xFFFFFFFF
            if n != len(tokens):
                raise _fail(f"layout_range[{e}, {s}] count on rank {rank}", n, len(tokens), call)
            blocks.append((begin, n))
            got_tokens = sorted(int(v) for v in run["src_info"][e, begin:begin + n])
            if got_tokens != tokens:
                raise _fail(f"src_info of expert {e} from rank {s} on rank {rank}", got_tokens, tokens, call)
            if not n:
                continue
            source = inputs[s].x[torch.tensor(got_tokens)]
            order = torch.argsort(run["src_info"][e, begin:begin + n].to(torch.int64), stable=True)
            rows = run["x"][e, begin:begin + n][order]
            if not use_fp8:
                if not torch.equal(rows.view(torch.int16), source.view(torch.int16)):
                    raise _fail(f"bf16 bytes of expert {e} from rank {s} on rank {rank}", "different bytes",
                                "the source rows byte for byte", call)
                continue
            codes, scale_inv = quantize(source, round_scale)
            got_codes = rows  # the E4M3 bytes (travelled as uint8)
            scales = run["scales"][e, begin:begin + n][order]
            if use_ue8m0:
                got_bytes = torch.stack([(scales >> (8 * j)) & 0xFF for j in range(4)], dim=-1).reshape(n, -1)
                want_bytes = ue8m0(scale_inv)
                if not torch.equal(got_bytes.to(torch.int64), want_bytes):
                    bad = torch.nonzero(got_bytes.to(torch.int64) != want_bytes)[0].tolist()
                    raise _fail(f"UE8M0 scale byte {bad} of expert {e} from rank {s} on rank {rank}",
                                int(got_bytes[tuple(bad)]), int(want_bytes[tuple(bad)]), call)
            elif not torch.equal(scales.view(torch.int32), scale_inv.view(torch.int32)):
                bad = torch.nonzero(scales.view(torch.int32) != scale_inv.view(torch.int32))[0].tolist()
                raise _fail(f"scale {bad} of expert {e} from rank {s} on rank {rank}", float(scales[tuple(bad)]),
                            f"{float(scale_inv[tuple(bad)])} (amax / 448 of those 128 channels)", call)
            exact = torch.equal(got_codes, codes)
            if not exact:
                near = _neighbours(got_codes, codes)
                if round_scale or not bool(near.all()):
                    bad = torch.nonzero(~near if not round_scale else got_codes != codes)[0].tolist()
                    raise _fail(f"E4M3 byte {bad} of expert {e} from rank {s} on rank {rank}"
                                f" (round_scale={round_scale})", hex(int(got_codes[tuple(bad)])),
                                hex(int(codes[tuple(bad)])) + ("" if round_scale else " or its E4M3 neighbour"), call)
        blocks.sort()
        offset = 0
        for begin, n in blocks:
            if n and begin != offset:
                raise _fail(f"source blocks of expert {e} on rank {rank}", blocks,
                            f"blocks tiling [0, {count}) without gaps or overlaps", call)
            offset += n


def _neighbours(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """Whether each E4M3 code equals ``want`` or is adjacent to it on the same sign (magnitude code +-1)."""
    g, w = got.to(torch.int16), want.to(torch.int16)
    same_sign = (g & 0x80) == (w & 0x80)
    return (g == w) | (same_sign & ((g & 0x7F) - (w & 0x7F)).abs().le(1))


def check(ctx: CheckContext, example: Example, per_rank: list[dict[str, Any]]) -> None:
    """Every dispatch of every rank and backend against the oracle; backends pairwise by the same oracle."""
    __tracebackhide__ = True
    inputs = build_all_inputs(example)

    def one(rank: int, backend: str, result: dict[str, Any]) -> None:
        for run in result["dispatches"]:
            check_dispatch(run, example, inputs, rank)

    for_each_backend(ctx, example, per_rank, one)


PROPERTY = register(Property(
    id="P15-ll-dispatch",
    title="low-latency dispatch: per local expert, layout_range blocks, recv_count and src_info are the oracle's; "
          "rows are the source bytes (bf16) or the oracle's per-128-channel E4M3 cast with its scales (use_fp8, "
          "round_scale, use_ue8m0 packed column-major; async_finish read after the event wait)",
    strategy=sized(ll_examples), task=low_latency_runs, check=check, apis=("v1",), needs=("low_latency",),
))
test_ll_dispatch = PROPERTY.test
