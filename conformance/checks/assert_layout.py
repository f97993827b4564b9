"""Assert helpers for the layout properties (P2 counts, P3 ``recv_topk_idx``, P4 weights, P8 expand, P13
determinism).  Messages name the value, what it should be, and the call that produced it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch

from conformance.backends.spec import BackendSpec
from conformance.backends.views import DispatchView
from conformance.checks.assertions import MAX_LISTED, bytes_equal, tensor_bytes

Token = tuple[int, int]  # (source rank, source token)


def api_of(view: DispatchView) -> str:
    """``v1`` or ``v2``: the API a view's backend drives."""
    return BackendSpec.parse(view.backend).api


def as_ints(value: Any) -> list[int]:
    """A tensor, list or tuple of integers as a plain list."""
    return [int(v) for v in (value.tolist() if isinstance(value, torch.Tensor) else value)]


def assert_ints_equal(name: str, got: Any, expected: Any, *, call: str, why: str = "the oracle") -> None:
    """Fail unless the integer sequences ``got`` and ``expected`` are equal; name the first difference."""
    __tracebackhide__ = True
    got_list, exp_list = as_ints(got), as_ints(expected)
    if got_list == exp_list:
        return
    if len(got_list) != len(exp_list):
        detail = f"length {len(got_list)}, expected {len(exp_list)}"
    else:
        first = next(i for i, (g, e) in enumerate(zip(got_list, exp_list, strict=True)) if g != e)
        detail = f"{name}[{first}] = {got_list[first]}, expected {exp_list[first]}"
    raise AssertionError(f"{name} = {got_list}, expected {exp_list} ({why}); {detail} [{call}]")


def token_rows(view: DispatchView) -> dict[Token, int]:
    """Map each received (source rank, source token) to its row in the view (last row if repeated)."""
    return {tok: row for row, tok in enumerate(zip(view.src_rank.tolist(), view.src_token.tolist(), strict=True))}


def assert_same_tokens(
    view: DispatchView, expected: Sequence[Token], *, rank: int, against: str = "the oracle"
) -> None:
    """Fail unless the view received exactly the tokens ``expected`` (each once)."""
    __tracebackhide__ = True
    got = Counter(zip(view.src_rank.tolist(), view.src_token.tolist(), strict=True))
    want = Counter(expected)
    if got == want:
        return
    missing = sorted((want - got).elements())
    extra = sorted((got - want).elements())
    dup = sorted(tok for tok, n in got.items() if n > 1)
    parts = []
    if missing:
        parts.append(f"missing {len(missing)}: {missing[:MAX_LISTED]}")
    if extra:
        parts.append(f"unexpected {len(extra)}: {extra[:MAX_LISTED]}")
    if dup:
        parts.append(f"received more than once: {dup[:MAX_LISTED]}")
    raise AssertionError(
        f"received tokens[rank {rank}] differ from {against}: got {sum(got.values())} rows, expected "
        f"{len(expected)} (source rank, source token) pairs; " + " | ".join(parts) + f" [{view.call}]"
    )


def weight_bits(value: torch.Tensor) -> int:
    """The float32 bit pattern of a one-element tensor (NaN payloads and -0.0 compare exactly)."""
    return int(value.reshape(1).to(torch.float32).view(torch.int32)[0])


def describe_weight(value: torch.Tensor) -> str:
    """``0.25 (0x3e800000)``."""
    return f"{float(value)!r} (0x{weight_bits(value) & 0xFFFFFFFF:08x})"


def canonical_order(view: DispatchView) -> torch.Tensor:
    """Row permutation sorting a (non-expand) view by (source rank, source token)."""
    keys = list(zip(view.src_rank.tolist(), view.src_token.tolist(), strict=True))
    return torch.tensor(sorted(range(len(keys)), key=keys.__getitem__), dtype=torch.int64)


#: Extras whose rows follow the received rows (permuted with them); only their stable columns compare.
ROW_EXTRAS = {"recv_src_metadata"}


def comparable_fields(view: DispatchView, canonical: bool) -> dict[str, Any]:
    """Every field of a (non-expand) view that repeated identical dispatches must reproduce bit for bit.

    ``canonical=False`` keeps the raw row order (order is part of the result); ``canonical=True`` sorts the
    rows by source first (order is not).  Of ``recv_src_metadata`` only columns 0 and 1 are kept: in
    non-expand mode the real V2 leaves stale memory in columns 2.. (fixtures/deepep-real, DIVERGENCES.md).
    """
    order = canonical_order(view) if canonical else torch.arange(view.src_rank.numel())
    fields: dict[str, Any] = {
        "source order (src_rank)": view.src_rank[order],
        "source order (src_token)": view.src_token[order],
        "recv_x": view.x[order],
        "recv_topk_idx": view.topk_idx[order],
        "recv_topk_weights": view.topk_weights[order],
        "num_recv_tokens_per_expert_list": torch.tensor(as_ints(view.num_recv_tokens_per_expert)),
    }
    for key, value in sorted(view.extras.items()):
        fields[f"handle/layout {key}"] = value[order, :2] if key in ROW_EXTRAS else value
    return fields


def assert_fields_identical(
    first: dict[str, Any], other: dict[str, Any], *, rank: int, call: str, what: str
) -> None:
    """Fail unless two :func:`comparable_fields` results are bitwise identical; name the first field that
    differs (and its first differing row)."""
    __tracebackhide__ = True
    for name in first:
        a, b = first[name], other.get(name)
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            if bytes_equal(a, b):
                continue
            if a.shape != b.shape or a.dtype != b.dtype:
                detail = f"shape/dtype {tuple(b.shape)} {b.dtype}, first run {tuple(a.shape)} {a.dtype}"
            else:
                rows_a = tensor_bytes(a).view(a.shape[0], -1) if a.dim() else tensor_bytes(a).view(1, -1)
                rows_b = tensor_bytes(b).view(rows_a.shape)
                row = int((rows_a != rows_b).any(dim=1).nonzero()[0])
                if a.dim():
                    got, first_run = b.reshape(b.shape[0], -1)[row], a.reshape(a.shape[0], -1)[row]
                    detail = f"row {row} differs: {got.tolist()[:8]} vs first run {first_run.tolist()[:8]}"
                else:
                    detail = f"{b.item()!r} vs first run {a.item()!r}"
        elif a == b:
            continue
        else:
            detail = f"{b!r} vs first run {a!r}"
        raise AssertionError(f"{name}[rank {rank}] not bitwise identical across {what}: {detail} [{call}]")
