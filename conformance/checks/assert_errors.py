"""Assert helpers for events, QP caps and bad input: exceptions seen on every rank, and "still usable after".

Rank tasks catch the exceptions they expect and return them as :class:`Raised` (type name, message), one
per rank; the controller asserts here.  Expected exceptions come from the real library's recordings
(``fixtures/deepep-real``, ``errors``) wherever one was recorded.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from conformance.backends.views import DispatchView, Unsupported
from conformance.canonical import receipts_from_view
from conformance.checks.assertions import assert_receipts_equal, bytes_equal, tensor_bytes
from conformance.example import Example, build_all_inputs
from conformance.oracle import expected_receipts

#: The recorded errors, copied from fixtures/deepep-real (tests/test_recorded_data.py keeps the copy exact) so
#: that an installed suite has them without the 17 MB recordings.
RECORDED_ERRORS = Path(__file__).resolve().parents[1] / "data" / "recorded_errors.json"


@dataclass(frozen=True)
class Raised:
    """What one call raised on one rank (``None`` fields: it did not raise)."""

    type: str | None
    message: str | None

    @classmethod
    def of(cls, exc: BaseException | None) -> Raised:
        """From a caught exception (or ``None`` when the call returned)."""
        return cls(None, None) if exc is None else cls(type(exc).__name__, str(exc))

    def __str__(self) -> str:
        return "returned normally" if self.type is None else f"{self.type}({self.message!r})"


@functools.lru_cache(maxsize=1)
def recorded_errors() -> dict[str, tuple[str, str]]:
    """``{name: (exception type, message)}`` recorded from the real DeepEP 2.1.0 (same on both ranks)."""
    errors = json.loads(RECORDED_ERRORS.read_text())["errors"]
    return {name: (kind, message) for name, (kind, message) in errors.items()}


def assert_raised_everywhere(
    raised: list[Raised], *, call: str, expected_type: str | tuple[str, ...] | None = None,
    expected_message: str | None = None, message_prefix: str | None = None,
) -> None:
    """Every rank raised; with the expected type / exact message / message prefix when given."""
    __tracebackhide__ = True
    types = (expected_type,) if isinstance(expected_type, str) else expected_type
    for rank, got in enumerate(raised):
        if got.type is None:
            raise AssertionError(
                f"rank {rank} returned normally, expected "
                + (f"{'/'.join(types)}" if types else "an exception")
                + f" on every rank (per rank: {', '.join(map(str, raised))}) [{call}]"
            )
        if types is not None and got.type not in types:
            raise AssertionError(
                f"rank {rank} raised {got}, expected {'/'.join(types)}"
                + (f"({expected_message!r})" if expected_message is not None else "") + f" [{call}]"
            )
        if expected_message is not None and got.message != expected_message:
            raise AssertionError(f"rank {rank} raised {got}, expected message {expected_message!r} [{call}]")
        if message_prefix is not None and not (got.message or "").startswith(message_prefix):
            raise AssertionError(f"rank {rank} raised {got}, expected a message starting {message_prefix!r} [{call}]")


def assert_view_matches_oracle(
    session, example: Example, rank: int, view: DispatchView | Unsupported, *, after: str = ""  # noqa: ANN001
) -> DispatchView | None:
    """``view`` holds the oracle's receipts for ``rank`` (an Unsupported view is recorded, not failed)."""
    __tracebackhide__ = True
    if isinstance(view, Unsupported):
        session.record_unsupported(view, example)
        return None
    expected = expected_receipts(example, build_all_inputs(example), rank)
    call = view.call + (f" (the call right after {after})" if after else "")
    assert_receipts_equal(receipts_from_view(view), expected, rank=rank, call=call)
    return view


def assert_views_equal(observed: DispatchView, reference: DispatchView, *, rank: int, what: str) -> None:
    """Two views of the same dispatch agree: per-expert receipts byte for byte and per-expert counts."""
    __tracebackhide__ = True
    assert_receipts_equal(
        receipts_from_view(observed), receipts_from_view(reference), rank=rank, call=f"{observed.call}, {what}",
        against=f"the synchronous {reference.backend} dispatch",
    )
    if observed.num_recv_tokens_per_expert != reference.num_recv_tokens_per_expert:
        raise AssertionError(
            f"num_recv_tokens_per_expert_list[rank {rank}] = {observed.num_recv_tokens_per_expert}, expected "
            f"{reference.num_recv_tokens_per_expert} (synchronous dispatch) [{observed.call}, {what}]"
        )


def assert_tensor_bytes_equal(observed: torch.Tensor | None, expected: torch.Tensor | None, *, name: str,
                              rank: int, call: str, against: str) -> None:
    """Byte-exact tensor equality with a message naming the first differing row."""
    __tracebackhide__ = True
    if observed is None or expected is None:
        if observed is not expected:
            raise AssertionError(f"{name}[rank {rank}] is {observed!r}, expected {expected!r} ({against}) [{call}]")
        return
    if bytes_equal(observed, expected):
        return
    if observed.shape != expected.shape or observed.dtype != expected.dtype:
        raise AssertionError(
            f"{name}[rank {rank}] has shape {tuple(observed.shape)} {observed.dtype}, expected "
            f"{tuple(expected.shape)} {expected.dtype} ({against}) [{call}]"
        )
    rows = observed.shape[0] if observed.dim() else 1
    differs = (tensor_bytes(observed).view(rows, -1) != tensor_bytes(expected).view(rows, -1)).any(dim=1)
    row = int(differs.nonzero()[0])
    raise AssertionError(
        f"{name}[rank {rank}, row {row}] bytes differ from {against} ({int(differs.sum())} row(s) differ): "
        f"got {observed[row].flatten()[:4].tolist()}, expected {expected[row].flatten()[:4].tolist()} [{call}]"
    )
