"""Every assert helper of the suite, in one message style: the value, what it should be, and the call.

``name[rank r, label i, ...] = got, expected want (why) [call]``, the way array-api-tests' ``assert_*`` helpers
read, e.g. ``recv_x[rank 1, expert 3, src (0, 17)] bytes differ from the oracle at 2 column(s): got ...;
expected ... [ElasticBuffer.dispatch(...) on rank 1]``.  Bit patterns are shown with the values, so NaN
payloads, -0.0 and subnormals are visible.  ``__tracebackhide__`` keeps pytest's traceback on the property.

:func:`for_each_backend` is the one loop over ranks x backends x consecutive backend pairs that the checks
share; it records :class:`~conformance.core.outcomes.NotChecked` results instead of checking them.

(Over 400 lines: the helpers share the formatting and the byte views below, and splitting them by property
would bring back the duplicates this module replaced.)
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import torch

from conformance.canonical import Token, receipts_from_view
from conformance.core.example import Example, RankInputs, build_all_inputs
from conformance.core.outcomes import NotChecked
from conformance.core.views import DispatchView, Raised
from conformance.oracle import ExpectedSum, Receipts, expected_receipts
from conformance.oracle.bounds import reduction_bound
from conformance.oracle.tree import tree_groups

#: How many differing items a message lists before summarising the rest.
MAX_LISTED = 5
#: How many differing columns of one row a message shows.
MAX_COLUMNS = 3
#: Below this magnitude a value is subnormal (bf16 shares float32's exponent range).
SMALLEST_NORMAL = torch.finfo(torch.float32).tiny
_INT_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class RecordsNotChecked(Protocol):
    """Where the helpers note what a backend was not checked on (its clean rejection of a configuration: a
    :class:`~conformance.core.outcomes.NotChecked` result), and which backend (or pair of backends) they are
    checking, so that a failure is charged to it (the check's context)."""

    def not_checked(self, item: NotChecked, case: Any = None) -> None: ...

    def checking(self, backends: tuple[str, ...] | None) -> None: ...


class Mismatch(AssertionError):
    """A failed comparison that also carries what differs as data (the HTML report draws it): ``detail`` has
    ``name``, ``rank``, ``index`` / ``labels`` (the first differing element), ``tokens`` (the offending source
    tokens as ``[rank, token]``, when known), ``got`` / ``expected`` (``[{"col", "hex", "value"}]``), ``against``
    and ``call``.  Its message is the same one-line message as any other failure."""

    def __init__(self, message: str, detail: dict[str, Any]) -> None:
        super().__init__(message)
        self.detail = detail


# --------------------------------------------------------------------------------------------- formatting


def tensor_bytes(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes of ``t`` (so NaN payloads and -0.0 compare exactly)."""
    return t.contiguous().view(-1).view(torch.uint8)


def bytes_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Byte-exact equality (shape and dtype included)."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(tensor_bytes(a), tensor_bytes(b))


def as_ints(value: Any) -> list[int]:
    """A tensor, list or tuple of integers as a plain list."""
    return [int(v) for v in (value.tolist() if isinstance(value, torch.Tensor) else value)]


def hex_row(row: torch.Tensor, columns: list[int]) -> str:
    """``row``'s values at ``columns`` as bit patterns (bf16/fp16: 16 bits, float32: 32 bits) and values."""
    if row.dtype in (torch.bfloat16, torch.float16):
        bits, mask, digits = row.contiguous().view(torch.int16), 0xFFFF, 4
    elif row.dtype == torch.float32:
        bits, mask, digits = row.contiguous().view(torch.int32), 0xFFFFFFFF, 8
    else:
        return ", ".join(f"[{c}]={row[c].item()!r}" for c in columns)
    return ", ".join(f"[{c}]=0x{int(bits[c]) & mask:0{digits}x} ({float(row[c])!r})" for c in columns)


def cells(row: torch.Tensor, columns: list[int]) -> list[dict[str, Any]]:
    """``row``'s values at ``columns`` as data: ``{"col", "hex", "value"}`` (what :func:`hex_row` prints)."""
    out = []
    for c in columns:
        value = row[c]
        if row.dtype in (torch.bfloat16, torch.float16):
            bits = f"0x{int(value.reshape(1).view(torch.int16)[0]) & 0xFFFF:04x}"
        elif row.dtype == torch.float32:
            bits = f"0x{int(value.reshape(1).view(torch.int32)[0]) & 0xFFFFFFFF:08x}"
        else:
            bits = ""
        out.append({"col": int(c), "hex": bits, "value": repr(float(value) if value.is_floating_point()
                                                             else value.item())})
    return out


def mismatch_detail(name: str, rank: int, index: Sequence[int], labels: Sequence[str], got_row: torch.Tensor,
                    expected_row: torch.Tensor, columns: list[int], *, against: str, call: str,
                    tokens: Sequence[tuple[int, int]] = ()) -> dict[str, Any]:
    """The ``detail`` of a :class:`Mismatch` (see there)."""
    return {"name": name, "rank": rank, "index": [int(i) for i in index], "labels": list(labels),
            "tokens": [[int(r), int(t)] for r, t in tokens], "got": cells(got_row, columns),
            "expected": cells(expected_row, columns), "against": against, "call": call}


def weight_bits(value: torch.Tensor) -> int:
    """The float32 bit pattern of a one-element tensor (NaN payloads and -0.0 compare exactly)."""
    return int(value.reshape(1).to(torch.float32).view(torch.int32)[0])


def describe_weight(value: torch.Tensor) -> str:
    """``0.25 (0x3e800000)``."""
    return f"{float(value)!r} (0x{weight_bits(value) & 0xFFFFFFFF:08x})"


def where(name: str, rank: int, index: Sequence[int] = (), labels: Sequence[str] = ()) -> str:
    """``name[rank r, label i, ...]``."""
    inner = "".join(f", {label} {i}" for label, i in zip(labels, index, strict=False))
    return f"{name}[rank {rank}{inner}]"


def _describe_key(key: tuple[int, int, int]) -> str:
    expert, src_rank, src_token = key
    return f"expert {expert}, src ({src_rank}, {src_token})"


def _listing(missing: Sequence[Any], extra: Sequence[Any], duplicated: Sequence[Any],
             describe: Callable[[Any], str] = repr) -> str:
    parts = []
    for title, items in (("missing", missing), ("unexpected", extra)):
        if items:
            parts.append(f"{title} {len(items)}: " + "; ".join(map(describe, items[:MAX_LISTED])))
    if duplicated:
        parts.append("received more than once: " + "; ".join(map(describe, duplicated[:MAX_LISTED])))
    return " | ".join(parts)


def _shape_message(name: str, rank: int, got: torch.Tensor, expected: torch.Tensor, against: str, call: str) -> str:
    return (f"{name}[rank {rank}] has shape {tuple(got.shape)} {got.dtype}, expected {tuple(expected.shape)} "
            f"{expected.dtype} ({against}) [{call}]")


# ------------------------------------------------------------------------------------------ the loop


def for_each_backend(
    recorder: RecordsNotChecked,
    case: Any,
    per_rank: list[dict[str, Any]],
    check: Callable[[int, str, Any], Any],
    pairwise: Callable[[int, tuple[str, Any], tuple[str, Any]], None] | None = None,
    *,
    backend_major: bool = False,
) -> None:
    """For every rank and backend: ``check(rank, backend, result)`` (a :class:`NotChecked` result is recorded,
    not checked); then ``pairwise(rank, (first, a), (other, b))`` for each compared pair of checked backends (the
    context's ``pairs(names)``, ``conformance.harness.pairs.compared_pairs``; consecutive ones for a context without
    it), with what ``check`` returned (the result itself when it returned ``None``)."""
    __tracebackhide__ = True
    if backend_major:
        _each_backend_whole(recorder, case, per_rank, check)
        if pairwise is not None:
            raise TypeError("for_each_backend(backend_major=True) compares no pairs")
        return
    pairing = getattr(recorder, "pairs", None) or consecutive_pairs
    for rank, per_backend in enumerate(per_rank):
        seen: list[tuple[str, Any]] = []
        for backend, result in per_backend.items():
            if isinstance(result, NotChecked):
                recorder.not_checked(result, case)
                continue
            recorder.checking((backend,))
            value = check(rank, backend, result)
            seen.append((backend, result if value is None else value))
        if pairwise is not None:
            results = dict(seen)
            for first, other in pairing([name for name, _ in seen]):
                recorder.checking((first, other))
                pairwise(rank, (first, results[first]), (other, results[other]))
    recorder.checking(None)


def per_supported_backend(recorder: RecordsNotChecked, per_rank: list[dict[str, Any]], case: Any
                          ) -> Iterator[tuple[str, list[Any]]]:
    """:func:`per_backend`'s items whose results are not :class:`NotChecked` (those are recorded for ``case``)."""
    for backend, results in per_backend(recorder, per_rank):
        if isinstance(results[0], NotChecked):
            recorder.not_checked(results[0], case)
        else:
            yield backend, results


def _each_backend_whole(recorder: RecordsNotChecked, case: Any, per_rank: list[dict[str, Any]],
                        check: Callable[[int, str, Any], Any]) -> None:
    """Every rank of one backend, then the next, each backend to its end: one that held is counted as held (the
    context's ``complete``) even when another fails; once every backend was checked, the first failure is raised,
    carrying every backend's (``failed_columns``: ``{backend: message}``; ``column_failures``: ``{backend:
    AssertionError}``), so that each failing backend is charged its own (the session counts a known defect among
    them apart)."""
    __tracebackhide__ = True
    complete = getattr(recorder, "complete", None)
    failures: dict[str, AssertionError] = {}
    for backend in (per_rank[0] if per_rank else {}):
        try:
            for rank, per_backend in enumerate(per_rank):
                result = per_backend[backend]
                if isinstance(result, NotChecked):
                    recorder.not_checked(result, case)
                    continue
                recorder.checking((backend,))
                check(rank, backend, result)
        except AssertionError as failure:
            failures[backend] = failure
            continue
        if complete is not None and not any(isinstance(r[backend], NotChecked) for r in per_rank):
            complete((backend,))
    recorder.checking((next(iter(failures)),) if failures else None)
    if failures:
        first = next(iter(failures.values()))
        first.failed_columns = {name: str(f) for name, f in failures.items()}  # type: ignore[attr-defined]
        first.column_failures = failures  # type: ignore[attr-defined]
        raise first


def consecutive_pairs(names: Sequence[str]) -> list[tuple[str, str]]:
    """Each backend with the one before it (the pairs of a context that does not choose them)."""
    return list(zip(names, names[1:], strict=False))


def by_backend(per_rank: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """``{backend: [result of rank 0, rank 1, ...]}`` (for checks that look at every rank at once)."""
    return {backend: [ranks[backend] for ranks in per_rank] for backend in (per_rank[0] if per_rank else {})}


def per_backend(recorder: RecordsNotChecked, per_rank: list[dict[str, Any]]) -> Iterator[tuple[str, list[Any]]]:
    """:func:`by_backend`'s items, telling ``recorder`` which backend is being checked (a failure raised in the
    loop body is charged to it)."""
    for backend, results in by_backend(per_rank).items():
        recorder.checking((backend,))
        yield backend, results
    recorder.checking(None)


# -------------------------------------------------------------------------------------- bytes and counts


def assert_bytes_equal(
    got: torch.Tensor | None,
    expected: torch.Tensor | None,
    *,
    name: str,
    rank: int,
    call: str,
    labels: tuple[str, ...] = ("token", "col"),
    against: str = "the oracle",
) -> None:
    """Same shape, dtype and bytes; the message names the first differing element by ``labels`` (e.g. token and
    column) with its bit pattern.  ``None`` matches only ``None``."""
    __tracebackhide__ = True
    if got is None or expected is None:
        if got is not expected:
            raise AssertionError(f"{name}[rank {rank}] is {got!r}, expected {expected!r} ({against}) [{call}]")
        return
    if got.shape != expected.shape or got.dtype != expected.dtype:
        raise AssertionError(_shape_message(name, rank, got, expected, against, call))
    int_dtype = _INT_OF_WIDTH[got.element_size()]
    differs = got.contiguous().view(int_dtype) != expected.contiguous().view(int_dtype)
    if not bool(differs.any()):
        return
    bad = differs.nonzero()
    first = tuple(int(i) for i in bad[0])
    row = first[:-1] if got.dim() > 1 else ()
    columns = differs[row].nonzero().flatten().tolist() if got.dim() > 1 else [first[0]]
    got_row, exp_row = (got[row], expected[row]) if got.dim() > 1 else (got, expected)
    tokens = [(rank, first[0])] if labels and labels[0] == "token" else []
    raise Mismatch(
        f"{where(name, rank, first, labels)} bytes differ from {against} ({len(bad)} element(s) in all): "
        f"got {hex_row(got_row.flatten(), columns[:MAX_COLUMNS])}; "
        f"expected {hex_row(exp_row.flatten(), columns[:MAX_COLUMNS])} [{call}]",
        mismatch_detail(name, rank, first, labels, got_row.flatten(), exp_row.flatten(), columns[:MAX_COLUMNS],
                        against=against, call=call, tokens=tokens),
    )


def assert_ints_equal(name: str, got: Any, expected: Any, *, call: str, why: str = "the oracle") -> None:
    """The integer sequences ``got`` and ``expected`` are equal; the message names the first difference."""
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


def assert_value_equal(name: str, got: Any, expected: Any, *, call: str, why: str = "the oracle") -> None:
    """The scalar ``got`` (a count, a size, a flag) equals ``expected``; the message names both and the call."""
    __tracebackhide__ = True
    if type(got) is not type(expected) and not (isinstance(got, int | float) and isinstance(expected, int | float)):
        raise AssertionError(f"{name} = {got!r} ({type(got).__name__}), expected {expected!r} ({why}) [{call}]")
    if got != expected:
        raise AssertionError(f"{name} = {got!r}, expected {expected!r} ({why}) [{call}]")


def assert_receipts_equal(
    observed: Receipts, expected: Receipts, *, rank: int, call: str, against: str = "the oracle"
) -> None:
    """``observed`` has exactly ``expected``'s rows: same (expert, source) keys, byte-identical x, same weight."""
    __tracebackhide__ = True
    obs_keys, exp_keys = observed.keys(), expected.keys()
    if obs_keys != exp_keys:
        obs_count, exp_count = Counter(obs_keys), Counter(exp_keys)
        listing = _listing(sorted((exp_count - obs_count).elements()), sorted((obs_count - exp_count).elements()),
                           sorted(k for k, n in obs_count.items() if n > 1), _describe_key)
        raise AssertionError(
            f"receipts[rank {rank}] differ from {against}: got {len(obs_keys)} (expert, source) rows, "
            f"expected {len(exp_keys)}; {listing} [{call}]"
        )
    if not bytes_equal(observed.x, expected.x):
        rows = observed.x.shape[0]
        differs = (tensor_bytes(observed.x).view(rows, -1) != tensor_bytes(expected.x).view(rows, -1)).any(dim=1)
        bad_rows = differs.nonzero().flatten().tolist()
        row = bad_rows[0]
        columns = (observed.x[row].view(torch.int16) != expected.x[row].view(torch.int16)).nonzero().flatten().tolist()
        expert, src_rank, src_token = obs_keys[row]
        tokens = [(k[1], k[2]) for k in (obs_keys[r] for r in bad_rows[:MAX_LISTED])]
        raise Mismatch(
            f"recv_x[rank {rank}, {_describe_key(obs_keys[row])}] bytes differ from {against} at "
            f"{len(columns)} column(s): got {hex_row(observed.x[row], columns[:MAX_COLUMNS])}; "
            f"expected {hex_row(expected.x[row], columns[:MAX_COLUMNS])}"
            + (f" (and {len(bad_rows) - 1} more rows differ)" if len(bad_rows) > 1 else "") + f" [{call}]",
            mismatch_detail("recv_x", rank, (expert, src_rank, src_token), ("expert", "src rank", "src token"),
                            observed.x[row], expected.x[row], columns[:MAX_COLUMNS], against=against, call=call,
                            tokens=tokens),
        )
    if not bytes_equal(observed.weight, expected.weight):
        row = int((tensor_bytes(observed.weight).view(-1, 4) != tensor_bytes(expected.weight).view(-1, 4))
                  .any(dim=1).nonzero()[0])
        expert, src_rank, src_token = obs_keys[row]
        raise Mismatch(
            f"recv_topk_weights[rank {rank}, {_describe_key(obs_keys[row])}] = {float(observed.weight[row])!r}, "
            f"expected {float(expected.weight[row])!r} ({against}) [{call}]",
            mismatch_detail("recv_topk_weights", rank, (expert, src_rank, src_token),
                            ("expert", "src rank", "src token"), observed.weight[row:row + 1],
                            expected.weight[row:row + 1], [0], against=against, call=call,
                            tokens=[(src_rank, src_token)]),
        )


def assert_same_tokens(view: DispatchView, expected: Sequence[Token], *, rank: int, against: str = "the oracle"
                       ) -> None:
    """The view received exactly the tokens ``expected`` (each once)."""
    __tracebackhide__ = True
    got = Counter(zip(view.src_rank.tolist(), view.src_token.tolist(), strict=True))
    want = Counter(expected)
    if got == want:
        return
    listing = _listing(sorted((want - got).elements()), sorted((got - want).elements()),
                       sorted(tok for tok, n in got.items() if n > 1))
    raise AssertionError(
        f"received tokens[rank {rank}] differ from {against}: got {sum(got.values())} rows, expected "
        f"{len(expected)} (source rank, source token) pairs; {listing} [{view.call}]"
    )


@functools.lru_cache(maxsize=4)
def _all_inputs(example: Example) -> list[RankInputs]:
    return build_all_inputs(example)


@functools.lru_cache(maxsize=16)
def _oracle_receipts(example: Example, rank: int) -> Receipts:
    """The oracle's receipts of ``rank`` (read only; cached: a check compares several backends' and calls' views of
    one example with them, every rank's from the same inputs)."""
    return expected_receipts(example, _all_inputs(example), rank)


def refused_on_every_rank(outcomes: Sequence[Any], *, call: str) -> bool:
    """``True`` when every rank's outcome is a :class:`Raised` with a message (one clear refusal), ``False`` when none
    is (the call went on everywhere); a refusal on some ranks only, or one without a message, fails naming the
    ranks."""
    __tracebackhide__ = True
    refused = [isinstance(o, Raised) for o in outcomes]
    if all(refused):
        for rank, o in enumerate(outcomes):
            if not (o.message or "").strip():
                raise AssertionError(f"rank {rank} refused with {o.type} and no message: a user cannot tell what to "
                                     f"change [{call}]")
        return True
    if any(refused):
        raise AssertionError(f"refused on rank(s) {[r for r, x in enumerate(refused) if x]} only "
                             f"({', '.join(str(o) for o in outcomes if isinstance(o, Raised))}); the other ranks went "
                             f"on [{call}]")
    return False


def assert_view_matches_oracle(recorder: RecordsNotChecked, example: Example, rank: int,
                               view: DispatchView | NotChecked, *, after: str = "") -> DispatchView | None:
    """``view`` holds the oracle's receipts for ``rank`` (a :class:`NotChecked` view is recorded, not failed)."""
    __tracebackhide__ = True
    if isinstance(view, NotChecked):
        recorder.not_checked(view, example)
        return None
    expected = _oracle_receipts(example, rank)
    call = view.call + (f" (the call right after {after})" if after else "")
    assert_receipts_equal(receipts_from_view(view), expected, rank=rank, call=call)
    return view


def assert_views_equal(observed: DispatchView, reference: DispatchView, *, rank: int, what: str) -> None:
    """Two views of the same dispatch agree: per-expert receipts byte for byte and per-expert counts."""
    __tracebackhide__ = True
    assert_receipts_equal(receipts_from_view(observed), receipts_from_view(reference), rank=rank,
                          call=f"{observed.call}, {what}", against=f"the synchronous {reference.backend} dispatch")
    assert_ints_equal(f"num_recv_tokens_per_expert_list[rank {rank}]", observed.num_recv_tokens_per_expert,
                      reference.num_recv_tokens_per_expert, call=f"{observed.call}, {what}",
                      why="synchronous dispatch")


def assert_fields_identical(first: dict[str, Any], other: dict[str, Any], *, rank: int, call: str, what: str) -> None:
    """Two ``canonical.comparable_fields`` results are bitwise identical; name the first field that differs
    (and its first differing row)."""
    __tracebackhide__ = True
    for name in first:
        a, b = first[name], other.get(name)
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            if bytes_equal(a, b):
                continue
            if a.shape != b.shape or a.dtype != b.dtype:
                detail = f"shape/dtype {tuple(b.shape)} {b.dtype}, first run {tuple(a.shape)} {a.dtype}"
            elif a.dim():
                rows_a = tensor_bytes(a).view(a.shape[0], -1)
                row = int((rows_a != tensor_bytes(b).view(rows_a.shape)).any(dim=1).nonzero()[0])
                got, first_run = b.reshape(b.shape[0], -1)[row], a.reshape(a.shape[0], -1)[row]
                detail = f"row {row} differs: {got.tolist()[:8]} vs first run {first_run.tolist()[:8]}"
            else:
                detail = f"{b.item()!r} vs first run {a.item()!r}"
        elif a == b:
            continue
        else:
            detail = f"{b!r} vs first run {a!r}"
        raise AssertionError(f"{name}[rank {rank}] not bitwise identical across {what}: {detail} [{call}]")


# ---------------------------------------------------------------------------------------------- numbers


def assert_within_bound(got: torch.Tensor, expected: ExpectedSum, *, two_level: bool, name: str, rank: int,
                        call: str, levels: int | None = None) -> None:
    """Every element of bf16 ``got`` is within ``oracle.bounds.reduction_bound`` of the exact sum (``levels``: the
    tree's roundings, when more than ``two_level`` says)."""
    __tracebackhide__ = True
    if got.shape != expected.exact.shape:
        raise AssertionError(
            f"{name}[rank {rank}] has shape {tuple(got.shape)}, expected {tuple(expected.exact.shape)} [{call}]")
    levels = (2 if two_level else 1) if levels is None else levels
    bound = reduction_bound(got, expected, two_level, levels)
    error = (got.to(torch.float64) - expected.exact).abs()
    bad = ~(error <= bound)  # NaN errors count as violations
    if not bool(bad.any()):
        return
    token, col = (int(i) for i in bad.nonzero()[0])
    exact = expected.exact[token].to(torch.float32)
    raise Mismatch(
        f"{where(name, rank, (token, col), ('token', 'col'))} = {float(got[token, col])!r} is "
        f"{float(error[token, col]):.6g} from the exact sum {float(expected.exact[token, col])!r}, more than the "
        f"bound {float(bound[token, col]):.6g} (1/2 ulp_bf16 + float32 accumulation over "
        f"{int(expected.num_terms[token])} term(s){f', {levels} levels' if levels > 1 else ''}); "
        f"{int(bad.sum())} element(s) out of bound [{call}]",
        mismatch_detail(name, rank, (token, col), ("token", "col"), got[token], exact, [col],
                        against="the exact sum (float32 shown)", call=call, tokens=[(rank, token)]),
    )


def describe_groups(groups: tuple[int, ...]) -> str:
    """The tree of inner levels ``groups`` (innermost first, see ``oracle.tree.predict_levels``) in words."""
    if not groups:
        return "one float32 sum of the contributions and biases, rounded once to bf16"
    steps = [("each rank's own rows of the token (expanded slots)" if g == 1 else
              f"the contributions of each group of {g} rank(s) (a node)") + " summed in float32 and rounded to bf16"
             for g in groups]
    return ", then ".join(steps) + ", then the biases and those partials summed in float32 and rounded again"


def assert_reduction(got: torch.Tensor, expected: ExpectedSum, *, ranks_per_group: int | None, world_size: int,
                     two_level: bool, name: str, rank: int, call: str, require_determined: bool = False) -> None:
    """A combine-like bf16 result against the library's reduction tree (:mod:`conformance.oracle.tree`): byte for
    byte wherever every float32 sum of the tree is exact, within the bound elsewhere.  ``ranks_per_group`` is the
    backend's tree (``None``: the backend does not say, the bound with ``two_level`` applies everywhere).
    ``require_determined``: the case was drawn so that every element is determined (exact mode)."""
    __tracebackhide__ = True
    if ranks_per_group is None:
        if got.shape != expected.exact.shape:
            raise AssertionError(
                f"{name}[rank {rank}] has shape {tuple(got.shape)}, expected {tuple(expected.exact.shape)} [{call}]")
        if require_determined:
            assert_bytes_equal(got, expected.rounded(), name=name, rank=rank, call=call)
        else:
            assert_within_bound(got, expected, two_level=two_level, name=name, rank=rank, call=call)
        return
    assert_tree(got, expected, tree_groups(ranks_per_group, world_size), name=name, rank=rank, call=call,
                require_determined=require_determined)


def assert_tree(got: torch.Tensor, expected: ExpectedSum, groups: tuple[int, ...], *, name: str, rank: int, call: str,
                require_determined: bool = False) -> None:
    """``got`` against the reduction tree with inner levels ``groups`` (``oracle.tree.predict_levels``): byte for
    byte wherever every float32 sum of the tree is exact, within the bound of that many levels elsewhere."""
    __tracebackhide__ = True
    if got.shape != expected.exact.shape:
        raise AssertionError(
            f"{name}[rank {rank}] has shape {tuple(got.shape)}, expected {tuple(expected.exact.shape)} [{call}]")
    tree = expected.tree_of(groups)
    if require_determined and not bool(tree.determined.all()):
        token, col = (int(i) for i in (~tree.determined).nonzero()[0])
        raise AssertionError(f"the suite drew an exact-mode case whose float32 sums are not exact at {name}[rank "
                             f"{rank}, token {token}, col {col}]: a defect of the strategy, not of the library")
    assert_tree_bytes(got, expected, groups, name=name, rank=rank, call=call)
    rest = ~tree.determined
    if bool(rest.any()):
        assert_within_bound(torch.where(rest, got, tree.value), expected, two_level=tree.levels == 2, name=name,
                            rank=rank, call=call, levels=tree.levels)


def assert_tree_bytes(got: torch.Tensor, expected: ExpectedSum, groups: tuple[int, ...], *, name: str, rank: int,
                      call: str, mask: torch.Tensor | None = None) -> None:
    """``got`` equals the reduction tree with inner levels ``groups`` byte for byte wherever the tree determines
    it (every float32 sum on the way exact) and ``mask`` (``[T, H]``, default everywhere) holds; elsewhere
    nothing is checked here."""
    __tracebackhide__ = True
    tree = expected.tree_of(groups)
    checked = tree.determined if mask is None else tree.determined & mask
    differs = checked & (got.contiguous().view(torch.int16) != tree.value.contiguous().view(torch.int16))
    if bool(differs.any()):
        token, col = (int(i) for i in differs.nonzero()[0])
        columns = differs[token].nonzero().flatten().tolist()
        raise Mismatch(
            f"{where(name, rank, (token, col), ('token', 'col'))} = {float(got[token, col])!r}, but the library's "
            f"reduction tree ({describe_groups(groups)}) gives "
            f"{float(tree.value[token, col])!r} exactly here (every float32 sum on the way is exact); "
            f"{int(differs.sum())} element(s) differ [{call}]",
            mismatch_detail(name, rank, (token, col), ("token", "col"), got[token], tree.value[token], columns,
                            against="the reduction tree", call=call, tokens=[(rank, token)]),
        )


def assert_close_across(got: torch.Tensor, other: torch.Tensor, expected: ExpectedSum, *, two_level: bool, name: str,
                        rank: int, call: str, against: str) -> None:
    """Two backends' bf16 results differ by at most the sum of their bounds (triangle inequality)."""
    __tracebackhide__ = True
    bound = reduction_bound(got, expected, two_level) + reduction_bound(other, expected, two_level)
    bad = ~((got.to(torch.float64) - other.to(torch.float64)).abs() <= bound)
    if bool(bad.any()):
        token, col = (int(i) for i in bad.nonzero()[0])
        raise AssertionError(
            f"{where(name, rank, (token, col), ('token', 'col'))} = {float(got[token, col])!r}, {against} gives "
            f"{float(other[token, col])!r}: further apart than both bounds allow ({float(bound[token, col]):.6g}) "
            f"[{call}]"
        )


def assert_within_tolerance(name: str, got: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor, *, call: str,
                            rank: int) -> None:
    """Every ``|got - expected| <= bound`` (float64 ``expected`` and ``bound``, ``[tokens, hidden]``); a NaN fails."""
    __tracebackhide__ = True
    err = (got.to(torch.float64) - expected).abs()
    bad = ~(err <= bound)
    if bool(bad.any()):
        t, c = torch.nonzero(bad)[0].tolist()
        raise AssertionError(f"{where(name, rank, (t, c), ('token', 'col'))} is {float(got[t, c])}, expected "
                             f"{float(expected[t, c])} within {float(bound[t, c]):.3g} (error {float(err[t, c]):.3g}) "
                             f"[{call}]")


def assert_counter_accumulates(name: str, got: torch.Tensor, previous: torch.Tensor, *, call: str, why: str = "",
                               unchanged: Sequence[int] = ()) -> None:
    """A cumulative counter (one entry per rank): every entry at least ``previous`` (it only ever adds), and the
    entries in ``unchanged`` exactly ``previous`` (nothing may be added there; ``why`` says why)."""
    __tracebackhide__ = True
    got, previous = got.to(torch.int64), previous.to(torch.int64)
    for i in range(previous.numel()):
        if i in unchanged and int(got[i]) != int(previous[i]):
            raise AssertionError(f"{name}[{i}] is {int(got[i])}, expected {int(previous[i])} unchanged ({why}) "
                                 f"[{call}]")
        if int(got[i]) < int(previous[i]):
            raise AssertionError(f"{name}[{i}] is {int(got[i])}, expected at least {int(previous[i])} (its value "
                                 f"before the call: the counter accumulates) [{call}]")


def assert_returned_iff(name: str, returned: bool, option: str, requested: bool, *, what: str, call: str) -> None:
    """An optional result (a receive hook, an event) is there exactly when the call's ``option`` asked for it."""
    __tracebackhide__ = True
    if returned != requested:
        raise AssertionError(f"{name} is {what if returned else 'None'}, expected {what if requested else 'None'} "
                             f"({option}={requested}) [{call}]")


def same_value(got: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """Elementwise: same bytes, or both NaN (any payload), or both zero (either sign), or a subnormal expected
    value flushed to zero (GPU float32 reductions may run flush-to-zero; seen on CUDA with the emulation).
    Dispatch moves bytes and must keep subnormals (P1); only reductions may flush them."""
    int_dtype = _INT_OF_WIDTH[got.element_size()]
    same_bytes = got.contiguous().view(int_dtype) == expected.contiguous().view(int_dtype)
    both_nan = torch.isnan(got) & torch.isnan(expected)
    both_zero = (got == 0) & (expected == 0)
    flushed = (got == 0) & (expected.float().abs() < SMALLEST_NORMAL)
    return same_bytes | both_nan | both_zero | flushed


def _first_bad(name: str, rank: int, bad: torch.Tensor, got: torch.Tensor, expected: torch.Tensor) -> str:
    token, col = (int(i) for i in bad.nonzero()[0])
    columns = bad[token].nonzero().flatten().tolist()
    return (f"{where(name, rank, (token, col), ('token', 'col'))} differs ({int(bad.sum())} element(s) in all): "
            f"got {hex_row(got[token], columns[:MAX_COLUMNS])}; "
            f"expected {hex_row(expected[token], columns[:MAX_COLUMNS])}")


def _first_bad_detail(name: str, rank: int, bad: torch.Tensor, got: torch.Tensor, expected: torch.Tensor, *,
                      against: str, call: str) -> dict[str, Any]:
    token, col = (int(i) for i in bad.nonzero()[0])
    columns = bad[token].nonzero().flatten().tolist()[:MAX_COLUMNS]
    return mismatch_detail(name, rank, (token, col), ("token", "col"), got[token], expected[token], columns,
                           against=against, call=call, tokens=[(rank, token)])


def assert_same_values(got: torch.Tensor, expected: torch.Tensor, *, name: str, rank: int, call: str,
                       against: str = "the oracle") -> None:
    """Every element has the same bytes, except that any NaN matches any NaN, -0.0 matches +0.0 and a subnormal
    may be flushed to zero (the reduction converts to float32 and back: NaN payloads, the sign of a zero sum and
    subnormal results are not promised)."""
    __tracebackhide__ = True
    if got.shape != expected.shape or got.dtype != expected.dtype:
        raise AssertionError(_shape_message(name, rank, got, expected, against, call))
    bad = ~same_value(got, expected)
    if bool(bad.any()):
        message = _first_bad(name, rank, bad, got, expected).replace(" differs ", f" differs from {against} ")
        raise Mismatch(f"{message} [{call}]", _first_bad_detail(name, rank, bad, got, expected, against=against,
                                                                call=call))


def assert_sum_or_special(got: torch.Tensor, expected: ExpectedSum, expected_bf16: torch.Tensor, *, two_level: bool,
                          name: str, rank: int, call: str, groups: tuple[int, ...] | None = None) -> None:
    """Bounded comparison that also admits special values: where the exact sum is NaN or +-Inf, ``got`` must be
    NaN (any payload) or the same infinity; everywhere else it must be within the bound, and (``groups``: the
    backend's reduction tree, see :func:`assert_tree`) byte for byte the tree's wherever that determines a nonzero
    sum (the sign of a zero sum of -0.0 payloads is not the tree's to say)."""
    __tracebackhide__ = True
    if groups is not None:
        assert_tree_bytes(got, expected, groups, name=name, rank=rank, call=call, mask=expected.exact != 0)
    special = ~torch.isfinite(expected.exact)
    if bool(special.any()):
        wrong = special & ~same_value(got, expected_bf16)
        if bool(wrong.any()):
            raise Mismatch(_first_bad(name, rank, wrong, got, expected_bf16)
                           + " (a non-finite sum; NaN matches any NaN)" + f" [{call}]",
                           _first_bad_detail(name, rank, wrong, got, expected_bf16, against="the oracle", call=call))
    zero = torch.zeros((), dtype=torch.float64)
    finite = ExpectedSum(torch.where(special, zero, expected.exact), torch.where(special, zero, expected.abs_sum),
                         expected.num_terms, expected.num_groups)
    assert_within_bound(torch.where(special, torch.zeros_like(got), got), finite, two_level=two_level, name=name,
                        rank=rank, call=call)


def assert_positive_zero_rows(got: torch.Tensor, tokens: list[int], *, name: str, rank: int, call: str,
                              label: str = "token", why: str = "reached no rank and must come back as +0.0") -> None:
    """The rows ``tokens`` of ``got`` are all +0.0 (bit pattern 0), as combine returns for a token that reached
    no rank (``label`` / ``why``: how the message names a row and says why it must be zero)."""
    __tracebackhide__ = True
    if not tokens:
        return
    int_dtype = _INT_OF_WIDTH[got.element_size()]
    bits = got[torch.tensor(tokens, dtype=torch.int64)].reshape(len(tokens), -1).contiguous().view(int_dtype)
    bad = (bits != 0).any(dim=1)
    if bool(bad.any()):
        index = int(bad.nonzero()[0])
        token, row = tokens[index], got[tokens[index]].reshape(-1)
        columns = (bits[index] != 0).nonzero().flatten().tolist()
        raise AssertionError(
            f"{name}[rank {rank}, {label} {token}] {why}, got "
            f"{hex_row(row, columns[:MAX_COLUMNS])} ({len(columns)} non-+0.0 column(s)); {int(bad.sum())} such "
            f"{label}(s) [{call}]"
        )


def assert_no_expert_rows(got: torch.Tensor, start: int, *, name: str, rank: int, call: str, why: str) -> None:
    """Every entry of the rows ``start..`` of the expert-index tensor ``got`` is -1 ("no expert"): the rows past a
    worst-case output's valid ones, which a consumer reading the tensor whole takes for expert ids (``why``: where
    the valid count comes from)."""
    __tracebackhide__ = True
    tail = got[start:]
    bad = tail != -1
    if tail.numel() and bool(bad.any()):
        values = torch.unique(tail[bad]).tolist()
        shown = ", ".join(str(v) for v in values[:4]) + (", ..." if len(values) > 4 else "")
        raise AssertionError(
            f"{name}[rank {rank}, rows {start}..{got.shape[0] - 1}] ({why}) hold {int(bad.sum())} of {tail.numel()} "
            f"entries that are not -1 ({shown}), expected -1 (no expert): a consumer that reads the tensor whole "
            f"takes them for expert ids [{call}]"
        )


# ---------------------------------------------------------------------------------------------- refusals


#: ``(/tmp/src/DeepEP/csrc/elastic/buffer.hpp:540)``: the library's exceptions name their source file as the build saw
#: it (``__FILE__``); a wheel built elsewhere prefixes its build directory.
_SOURCE_PATH = re.compile(r"(?<=\()[^()\s]*?/(?=(?:csrc|deep_ep)/[^()\s]*:\d+\))")


def without_build_directory(message: str) -> str:
    """``message`` with every source path made relative to the library's tree (``(csrc/...:540)``): the same
    refusal from a wheel built in another directory compares equal."""
    return _SOURCE_PATH.sub("", message)


def assert_raised_everywhere(raised: list[Raised], *, call: str, expected_type: str | tuple[str, ...] | None = None,
                             expected_message: str | None = None, message_prefix: str | None = None,
                             message_pattern: str | None = None) -> None:
    """Every rank raised; with the expected type / exact message / message prefix / message regex when given."""
    __tracebackhide__ = True
    types = (expected_type,) if isinstance(expected_type, str) else expected_type
    if expected_message is not None:
        expected_message = without_build_directory(expected_message)
    for rank, got in enumerate(raised):
        message = without_build_directory(got.message or "")
        if got.type is None:
            raise AssertionError(
                f"rank {rank} returned normally, expected " + (f"{'/'.join(types)}" if types else "an exception")
                + f" on every rank (per rank: {', '.join(map(str, raised))}) [{call}]"
            )
        if types is not None and got.type not in types:
            raise AssertionError(f"rank {rank} raised {got}, expected {'/'.join(types)}"
                                 + (f"({expected_message!r})" if expected_message is not None else "") + f" [{call}]")
        if expected_message is not None and message != expected_message:
            raise AssertionError(f"rank {rank} raised {got}, expected message {expected_message!r} [{call}]")
        if message_prefix is not None and not message.startswith(without_build_directory(message_prefix)):
            raise AssertionError(f"rank {rank} raised {got}, expected a message starting {message_prefix!r} [{call}]")
        if message_pattern is not None and re.fullmatch(message_pattern, message, re.S) is None:
            raise AssertionError(f"rank {rank} raised {got}, expected a message matching {message_pattern!r} [{call}]")


def assert_no_side_effect(raised: list[Raised], *, call: str, what: str = "the call") -> None:
    """No rank's call left anything behind in its thread (:attr:`Raised.side_effect`, e.g. a switched current CUDA
    stream): a refusal must leave the caller as it found it."""
    __tracebackhide__ = True
    for rank, got in enumerate(raised):
        if got.side_effect is not None:
            raise AssertionError(f"rank {rank}: {what} ({got}) {got.side_effect} [{call}]")


def assert_refused_then_usable(recorder: RecordsNotChecked, example: Example, results: list[dict[str, Any]], *,
                               refused: str, after: str, call: str, what: str, **expected: Any) -> None:
    """A refused call: ``results[rank][refused]`` (a :class:`Raised`) shows it raised on every rank (with
    ``expected`` type / message / prefix, see :func:`assert_raised_everywhere`), and the valid dispatch right
    after it, ``results[rank][after]``, returned the oracle's receipts on every rank (the buffer stayed usable)."""
    __tracebackhide__ = True
    assert_raised_everywhere([got[refused] for got in results], call=call, **expected)
    for rank, got in enumerate(results):
        assert_view_matches_oracle(recorder, example, rank, got[after], after=what)
