"""Assert helpers whose messages name the value, what it should be, and the call that produced it.

Style borrowed from array-api-tests: ``recv_x[rank 1, expert 3, src (0, 17)] bytes differ: got ...,
expected ... [ElasticBuffer.dispatch(...)]``.  ``__tracebackhide__`` keeps pytest's traceback on the
property, not on the helper.
"""

from __future__ import annotations

from collections import Counter

import torch

from conformance.oracle import Receipts

#: How many differing rows a message lists before summarising the rest.
MAX_LISTED = 5


def tensor_bytes(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes of ``t`` (so NaN payloads and -0.0 compare exactly)."""
    return t.contiguous().view(-1).view(torch.uint8)


def bytes_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Byte-exact equality (shape and dtype included)."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(tensor_bytes(a), tensor_bytes(b))


def hex_row(row: torch.Tensor, columns: list[int]) -> str:
    """Show ``row``'s values at ``columns`` as bit patterns and values."""
    bits = row.contiguous().view(torch.int16) if row.dtype == torch.bfloat16 else row
    shown = [f"[{c}]=0x{int(bits[c]) & 0xFFFF:04x} ({float(row[c])!r})" for c in columns]
    return ", ".join(shown)


def _describe_key(key: tuple[int, int, int]) -> str:
    expert, src_rank, src_token = key
    return f"expert {expert}, src ({src_rank}, {src_token})"


def assert_receipts_equal(
    observed: Receipts, expected: Receipts, *, rank: int, call: str, against: str = "the oracle"
) -> None:
    """Fail unless ``observed`` has exactly ``expected``'s rows: same keys, byte-identical x, same weight."""
    __tracebackhide__ = True
    obs_keys, exp_keys = observed.keys(), expected.keys()
    if obs_keys != exp_keys:
        obs_count, exp_count = Counter(obs_keys), Counter(exp_keys)
        missing = sorted((exp_count - obs_count).elements())
        extra = sorted((obs_count - exp_count).elements())
        dup = sorted(k for k, n in obs_count.items() if n > 1)
        parts = []
        if missing:
            parts.append(f"missing {len(missing)}: " + "; ".join(map(_describe_key, missing[:MAX_LISTED])))
        if extra:
            parts.append(f"unexpected {len(extra)}: " + "; ".join(map(_describe_key, extra[:MAX_LISTED])))
        if dup:
            parts.append("received more than once: " + "; ".join(map(_describe_key, dup[:MAX_LISTED])))
        raise AssertionError(
            f"receipts[rank {rank}] differ from {against}: got {len(obs_keys)} (expert, source) rows, "
            f"expected {len(exp_keys)}; " + " | ".join(parts) + f" [{call}]"
        )
    if not bytes_equal(observed.x, expected.x):
        differs = (tensor_bytes(observed.x).view(observed.x.shape[0], -1)
                   != tensor_bytes(expected.x).view(expected.x.shape[0], -1)).any(dim=1)
        bad_rows = differs.nonzero().flatten().tolist()
        row = bad_rows[0]
        columns = (observed.x[row].view(torch.int16) != expected.x[row].view(torch.int16)).nonzero().flatten().tolist()
        raise AssertionError(
            f"recv_x[rank {rank}, {_describe_key(obs_keys[row])}] bytes differ from {against} at "
            f"{len(columns)} column(s): got {hex_row(observed.x[row], columns[:3])}; "
            f"expected {hex_row(expected.x[row], columns[:3])}"
            + (f" (and {len(bad_rows) - 1} more rows differ)" if len(bad_rows) > 1 else "")
            + f" [{call}]"
        )
    if not bytes_equal(observed.weight, expected.weight):
        row = int((tensor_bytes(observed.weight).view(-1, 4) != tensor_bytes(expected.weight).view(-1, 4))
                  .any(dim=1).nonzero()[0])
        raise AssertionError(
            f"recv_topk_weights[rank {rank}, {_describe_key(obs_keys[row])}] = {float(observed.weight[row])!r}, "
            f"expected {float(expected.weight[row])!r} ({against}) [{call}]"
        )
