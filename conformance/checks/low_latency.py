"""A low-latency dispatch against the oracle (P15, P23, P24).

Shared by several properties: a property module imports the checks it shares from here, never another
property module (moved from ``conformance/properties/test_p15_ll_dispatch.py``)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import torch

from conformance.core.example import Example
from conformance.oracle.quantize import expert_rows, quantize, ue8m0


def _fail(what: str, got: Any, expected: Any, call: str) -> AssertionError:
    return AssertionError(f"{what} is {got}, expected {expected} [{call}]")


def _neighbours(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """Whether each E4M3 code equals ``want`` or is adjacent to it on the same sign (magnitude code +-1)."""
    g, w = got.to(torch.int16), want.to(torch.int16)
    same_sign = (g & 0x80) == (w & 0x80)
    return (g == w) | (same_sign & ((g & 0x7F) - (w & 0x7F)).abs().le(1))


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
