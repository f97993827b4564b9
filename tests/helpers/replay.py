"""Replay the real-library recordings (``fixtures/deepep-real``, ``fixtures/deepep-real-2.5.0-2026-12-06``, ...)
against the emulation of the recording's DeepEP version, inside one rank; compare recordings with each other.

Call from an initialised 2-rank world (any backend); every rank calls the same function:

    mismatches = replay_recorded_case('base')      # {} when every field matches byte for byte
    mismatches = replay_recorded_errors()
    mismatches = replay_recorded_section('v1_fp8_dispatch')   # a section recorded by fixtures/record.py

Each recording is replayed against the emulation of the version it recorded (``meta['deep_ep']``: 2.1.0 ->
``conformance.emulation``, 2.5.0 -> ``conformance.emulation.v2_5_0``, the module ``--deep-ep emulation:VERSION``
selects: :func:`emulation_of`), through that version's classes (its contract, ``conformance/versions/<version>/``:
V2 is ``ElasticBuffer`` on 2.1.0, ``EPBuffer`` on 2.5.0).  A call the version does not have is made all the same and
must raise what the real library raised (2.5.0's ``Buffer``: ``AttributeError: module 'deep_ep' has no attribute
'Buffer'``); nothing is skipped for a version.

The old cases and errors are replayed with this module's own calls (written from the recordings' README,
independently of ``fixtures/record.py``); a section of ``fixtures/record.py`` is replayed with that script's calls
for the section (the script is where those calls are defined), the emulation as the module under test.  Every
replay runs the calls, then compares what came back with the recording through the same functions
(:func:`compare_case`, :func:`compare_errors`, :func:`compare_section`), which also compare two recordings
(``tests/nocover/test_record.py``).  Where the library leaves an order open (V2 arrival order, low-latency blocks) or
memory unwritten (worst-case padding), the comparison normalises as documented at each function.

A recording compacted by ``fixtures/compact.py`` is read as it was recorded: its reference markers are the reference
recording's inputs, and a tensor kept as its digests (:class:`Digest`) is compared by hashing the emulation's tensor,
row by row where the comparison orders rows (a mismatch says the digest differs, with the shapes and the rows).

Recorded inputs are CPU tensors; they are moved to ``device`` (default: CPU).  The recording read is
``fixtures/deepep-real`` unless ``fixtures_dir`` or the environment variable ``DEEPEP_REAL_FIXTURES`` names another.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist

from conformance import versions
from conformance.backends import alias

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_FIXTURES = ROOT / "fixtures" / "deepep-real"
#: The newest recording of ``fixtures/record.py``'s sections (two ranks sharing one H200; its README says how).
SECTIONS_FIXTURES = ROOT / "fixtures" / "deepep-real-2026-12-05"
#: The real DeepEP 2.5.0's recording (the old cases and errors; two ranks sharing one H100; compacted).
FIXTURES_2_5_0 = ROOT / "fixtures" / "deepep-real-2.5.0-2026-12-06"
#: What the fidelity self-test replays by default: ``(cases and errors, sections)`` of each recorded version.
FIDELITY_RECORDINGS = ((DEFAULT_FIXTURES, SECTIONS_FIXTURES), (FIXTURES_2_5_0, FIXTURES_2_5_0))
RECORDER = ROOT / "fixtures" / "record.py"
COMPACT = ROOT / "fixtures" / "compact.py"
V2_KWARGS = {"num_max_tokens_per_rank": 128, "hidden": 7168, "num_topk": 8}
V1_HANDLE = ("rank_prefix_matrix", "channel_prefix_matrix", "recv_channel_prefix_matrix", "recv_src_idx",
             "is_token_in_rank", "send_head")
V2_SCALARS = ("do_expand", "num_experts", "expert_alignment", "num_max_tokens_per_rank", "num_sms", "num_recv_tokens",
              "num_expanded_tokens", "num_recv_tokens_per_expert_list", "psum_num_recv_tokens_per_scaleup_rank",
              "psum_num_recv_tokens_per_expert", "num_unaligned_recv_tokens_per_expert")
Mismatches = dict[str, str]


class _Missing:
    """A field the compared result does not have."""

    def __repr__(self) -> str:
        return "<missing>"


MISSING = _Missing()


def fixtures_root(fixtures_dir: str | None = None) -> Path:
    return Path(fixtures_dir or os.environ.get("DEEPEP_REAL_FIXTURES", DEFAULT_FIXTURES))


def sections_dir(fixtures_dir: str | None = None) -> str:
    """Where the recorded sections are replayed from: ``fixtures_dir``, else ``DEEPEP_REAL_FIXTURES``, else
    :data:`SECTIONS_FIXTURES` (the old cases' default, ``fixtures/deepep-real``, has no sections)."""
    return str(fixtures_dir or os.environ.get("DEEPEP_REAL_FIXTURES", SECTIONS_FIXTURES))


@contextlib.contextmanager
def recorded_machine(rec: dict) -> Iterator[None]:
    """The emulation's stand-ins for the recording machine while a recording replays: a recording made with both
    ranks on one GPU (``rank_setup`` shared) saw no NVLink bandwidth between them (the library's ``get_nvlink_gbs()``
    found no NVLink link and returned 0: the 2.5.0 recording's log says ``Failed to get NVLink connection speed``), so
    the real V2 took its floor of 4 SMs where the emulation's two-GPU model takes more (22 on 2.1.0: fixtures/
    deepep-real-2026-12-02/README.md; 28 on 2.5.0 for the cases' ``base``): ``DEEP_EP_EMULATION_NVLINK_GBS=1`` gives
    it that condition (any bandwidth below a few GB/s gives two ranks the floor), unless the caller set the
    variable."""
    shared = rec.get("meta", {}).get("recorder", {}).get("rank_setup") == "shared"
    if not shared or "DEEP_EP_EMULATION_NVLINK_GBS" in os.environ:
        yield
        return
    os.environ["DEEP_EP_EMULATION_NVLINK_GBS"] = "1"
    try:
        yield
    finally:
        del os.environ["DEEP_EP_EMULATION_NVLINK_GBS"]


def fidelity_recordings() -> list[tuple[str, str]]:
    """``(cases and errors, sections)`` folders the fidelity self-test replays: ``DEEPEP_REAL_FIXTURES`` (one folder,
    both) where set, else :data:`FIDELITY_RECORDINGS` (the 2.1.0 reference recordings and the real 2.5.0's)."""
    if os.environ.get("DEEPEP_REAL_FIXTURES"):
        return [(os.environ["DEEPEP_REAL_FIXTURES"],) * 2]
    return [(str(cases), str(sections)) for cases, sections in FIDELITY_RECORDINGS]


@functools.lru_cache(maxsize=1)
def load_compact() -> ModuleType:
    """``fixtures/compact.py`` as a module (the compacted format: reference markers, :class:`Digest`)."""
    return _load_script("fixtures_compact", COMPACT)


def _load_script(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def is_digest(value: object) -> bool:
    """Whether ``value`` is a recorded tensor kept as its digests (``fixtures/compact.py``)."""
    return isinstance(value, load_compact().Digest)


def _recorded_tensor(value: object) -> bool:
    return isinstance(value, torch.Tensor) or is_digest(value)


@functools.lru_cache(maxsize=8)
def load_recording(rank: int, fixtures_dir: str | None = None) -> dict:
    """The recorded dict of ``rank`` (``rank{rank}.pt``); a compacted recording resolved (``fixtures/compact.py``:
    its inputs read from the reference it names, its large tensors as :class:`Digest` objects)."""
    rec = torch.load(fixtures_root(fixtures_dir) / f"rank{rank}.pt", weights_only=True)
    compact = load_compact()
    if not compact.is_compacted(rec):
        return rec
    return compact.resolve(rec, rank, ROOT, load=lambda folder, r: load_recording(r, str(folder)))


def recording_version(fixtures_dir: str | None = None) -> str:
    """The DeepEP version a recording was made on: its ``meta['deep_ep']`` (e.g. ``2.5.0``); a recording without the
    ``meta`` unit (the sections-only recordings ``fixtures/deepep-real-2026-12-02`` and ``-05``, merged from runs
    that did not record it; their READMEs: DeepEP 2.1.0) is the default version's."""
    meta = load_recording(0, fixtures_dir)["meta"]
    if "deep_ep" not in meta and "meta" not in meta.get("recorder", {}).get("units", {}):
        return versions.DEFAULT_VERSION
    recorded = meta.get("deep_ep")
    version = versions.base_version(recorded)
    if version is None:
        raise ValueError(f"{fixtures_root(fixtures_dir)}: meta['deep_ep'] is {recorded!r}, no DeepEP version")
    return version


def emulation_of(version: str) -> ModuleType:
    """The emulation of DeepEP ``version``: the module ``--deep-ep emulation:VERSION`` gives the ranks as
    ``deep_ep`` (``conformance.backends.alias.emulation_module``, from the version's contract)."""
    return importlib.import_module(alias.emulation_module(version))


def v2_class(version: str) -> type:
    """The V2 buffer class of DeepEP ``version``'s emulation, by the version's contract (``ElasticBuffer``,
    ``EPBuffer``)."""
    name = versions.contract(version).class_name("v2")
    if name is None:
        raise ValueError(f"DeepEP {version} has no V2 API; nothing of its recording can be replayed")
    return getattr(emulation_of(version), name)


def recorded_case_names(fixtures_dir: str | None = None) -> list[str]:
    """Names of the recorded cases."""
    return list(load_recording(0, fixtures_dir)["cases"])


@functools.lru_cache(maxsize=1)
def load_recorder() -> ModuleType:
    """``fixtures/record.py`` as a module (its section calls and section ids)."""
    return _load_script("fixtures_record", RECORDER)


def recorder_section_ids() -> list[str]:
    """Every section ``fixtures/record.py`` records beyond the old format."""
    return list(load_recorder().SECTIONS)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().cpu().contiguous()
    return t.reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)


class _Checker:
    """Collects mismatches and the names of the checked fields."""

    def __init__(self, prefix: str, checked: list[str] | None) -> None:
        self.prefix = prefix
        self.mismatches: Mismatches = {}
        self.checked = checked if checked is not None else []

    def eq(self, name: str, got: object, expected: object) -> None:
        key = f"{self.prefix}.{name}"
        self.checked.append(key)
        problem = _difference(got, expected)
        if problem:
            self.mismatches[key] = problem

    def fail(self, name: str, problem: str) -> None:
        key = f"{self.prefix}.{name}"
        self.checked.append(key)
        self.mismatches[key] = problem

    def sub(self, prefix: str) -> _Checker:
        """A checker of ``prefix`` that reports into this one."""
        child = _Checker(f"{self.prefix}.{prefix}", self.checked)
        child.mismatches = self.mismatches
        return child


def _difference(got: object, expected: object) -> str | None:
    if is_digest(expected):  # kept as its digests (fixtures/compact.py): the got side is hashed
        return expected.difference(got)
    if is_digest(got):
        return load_compact().Digest.of(expected).difference(got) if isinstance(expected, torch.Tensor) else (
            f"got a tensor's digest, expected {expected!r}")
    if isinstance(expected, torch.Tensor) or isinstance(got, torch.Tensor):
        if not (isinstance(expected, torch.Tensor) and isinstance(got, torch.Tensor)):
            return f"got {type(got).__name__}, expected {type(expected).__name__}"
        if got.dtype != expected.dtype or tuple(got.shape) != tuple(expected.shape):
            return f"got {got.dtype}{tuple(got.shape)}, expected {expected.dtype}{tuple(expected.shape)}"
        if not torch.equal(_bytes(got), _bytes(expected)):
            diff = (_bytes(got) != _bytes(expected)).nonzero()
            return f"bytes differ ({diff.numel()} bytes, first at byte {int(diff[0])})"
        return None
    if isinstance(expected, dict) and isinstance(got, dict) and set(got) == set(expected):
        problems = [f"{k}: {p}" for k in expected if (p := _difference(got[k], expected[k]))]
        return "; ".join(problems) or None
    if got != expected:
        return f"got {got!r}, expected {expected!r}"
    return None


def _errors_agree(chk: _Checker, got: dict, rec: dict) -> bool:
    """Compare a recorded ``{'error': text}`` (the emulation must raise the same, the message as a prefix); True when
    neither raised (the fields are then compared)."""
    if "error" in got or "error" in rec:
        if "error" not in rec:
            chk.fail("error", f"unexpected {got['error']}")
        elif "error" not in got:
            chk.fail("error", f"no exception, expected {rec['error']!r}")
        elif not comparable_message(got["error"]).startswith(comparable_message(rec["error"])):
            chk.fail("error", f"got {comparable_message(got['error'])!r}, expected "
                              f"{comparable_message(rec['error'])!r} (as compared: comparable_message)")
        else:
            chk.eq("error", True, True)
        return False
    return True


def _order_by_key(meta: torch.Tensor) -> torch.Tensor:
    return torch.sort(meta[:, 0].cpu().to(torch.int64), stable=True).indices


def _check_dst_slots(chk: _Checker, got: torch.Tensor, expected: torch.Tensor) -> None:
    """Arrival-order slots: compare which slots are set and the set of slot values."""
    got, expected = got.cpu(), expected.cpu()
    chk.eq("handle.dst_buffer_slot_idx.mask", got >= 0, expected >= 0)
    chk.eq(
        "handle.dst_buffer_slot_idx.values_as_set",
        torch.sort(got[got >= 0]).values,
        torch.sort(expected[expected >= 0]).values,
    )


def _get(d: dict, key: str) -> Any:
    return d[key] if isinstance(d, dict) and key in d else MISSING


# ------------------------------------------------------------------------------------------ comparisons
def compare_v1(chk: _Checker, got: dict, rec: dict) -> None:
    """A V1 result: every recorded field byte for byte (V1's order is defined: source rank, source token)."""
    if not _errors_agree(chk, got, rec):
        return
    for name, expected in rec.items():
        if name in ("layout", "handle", "shapes") and isinstance(expected, dict):
            for sub, value in expected.items():
                chk.eq(f"{name}.{sub}", _get(_get(got, name), sub), value)
        elif name != "kind":
            chk.eq(name, _get(got, name), expected)


def _v2_rows(chk: _Checker, name: str, got: Any, exp: Any, go: torch.Tensor, eo: torch.Tensor) -> None:
    if isinstance(got, torch.Tensor) and _recorded_tensor(exp) and tuple(got.shape[:1]) == tuple(exp.shape[:1]):
        chk.eq(name, got.cpu()[go], exp[eo])
    else:
        chk.eq(name, got, exp)


#: Per-row fields of a V2 dispatch result: compared in source order.
V2_ROW_FIELDS = ("recv_x", "recv_sf", "recv_topk_idx", "recv_topk_weights", "cached_recv_x")


def _metadata(chk: _Checker, got: dict, rec: dict,
              order_of: tuple[Any, dict] | None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The (got, recorded) ``recv_src_metadata`` that order a V2 result's rows (``order_of``: the handles of the
    dispatch a cached one reused); None, the difference noted, when the calls raised or the rows differ."""
    if not _errors_agree(chk, got, rec):
        return None
    got_handle, rec_handle = order_of if order_of else (_get(got, "handle"), rec["handle"])
    got_meta, exp_meta = _get(got_handle, "recv_src_metadata"), rec_handle["recv_src_metadata"]
    if not isinstance(got_meta, torch.Tensor) or got_meta.shape[0] != exp_meta.shape[0]:
        chk.eq("handle.recv_src_metadata", got_meta, exp_meta)
        return None
    return got_meta.cpu(), exp_meta


def compare_v2(chk: _Checker, got: dict, rec: dict, deterministic: bool = False,
               order_of: tuple[dict, dict] | None = None) -> None:
    """A V2 non-expand result.  The default V2 order is arrival order: per-row fields are compared in source order
    (rows keyed by ``recv_src_metadata[:, 0]``, the source token's global index; ``order_of``: the (got, recorded)
    results whose handle ordered a cached dispatch's rows); metadata columns 2.. (stale in non-expand mode) and
    ``dst_buffer_slot_idx`` values (arrival slots) are compared as masks and sets; everything else byte for byte."""
    metas = _metadata(chk, got, rec, order_of)
    if metas is None:
        return
    got_meta, exp_meta = metas
    go, eo = _order_by_key(got_meta), _order_by_key(exp_meta)
    if deterministic:
        chk.eq("order_equals_v1", torch.equal(got_meta[:, 0], exp_meta[:, 0]), True)
    for name, expected in rec.items():
        if name in V2_ROW_FIELDS:
            _v2_rows(chk, name, _get(got, name), expected, go, eo)
        elif name == "handle":
            _compare_v2_handle(chk, _get(got, "handle"), expected, go, eo)
        elif name not in ("kind", "after"):
            chk.eq(name, _get(got, name), expected)


def _compare_v2_handle(chk: _Checker, got: Any, rec: dict, go: torch.Tensor, eo: torch.Tensor) -> None:
    for name in V2_SCALARS:
        chk.eq(f"handle.{name}", _get(got, name), rec[name])
    meta = _get(got, "recv_src_metadata")
    chk.eq("handle.recv_src_metadata[:, :2]", meta[go, :2] if isinstance(meta, torch.Tensor) else meta,
           rec["recv_src_metadata"][eo, :2])
    _compare_dst_slots(chk, got, rec)


def _compare_dst_slots(chk: _Checker, got_handle: Any, rec_handle: dict) -> None:
    slots = _get(got_handle, "dst_buffer_slot_idx")
    if isinstance(slots, torch.Tensor):
        _check_dst_slots(chk, slots, rec_handle["dst_buffer_slot_idx"])
    else:
        chk.eq("handle.dst_buffer_slot_idx", slots, rec_handle["dst_buffer_slot_idx"])


def _expanded_rows(meta: torch.Tensor) -> dict[tuple[int, int], int]:
    """``{(source token, top-k slot): row of the expanded table}``."""
    rows = {}
    for row in meta.tolist():
        for k, slot in enumerate(row[2:]):
            if slot >= 0:
                rows[(row[0], k)] = slot
    return rows


def _per_slot(chk: _Checker, name: str, got_t: Any, exp_t: Any, got_meta: torch.Tensor,
              exp_meta: torch.Tensor) -> None:
    """An expand-mode table compared per (source token, top-k slot): the row each slot points to."""
    if not isinstance(got_t, torch.Tensor):
        chk.eq(name, got_t, exp_t)
        return
    got_rows, exp_rows = _expanded_rows(got_meta.cpu()), _expanded_rows(exp_meta)
    keys = sorted(exp_rows)
    if sorted(got_rows) != keys:
        chk.fail(f"{name}[per (token, slot)]", "different (token, slot) keys")
        return
    got_index = torch.tensor([got_rows[k] for k in keys], dtype=torch.int64)
    exp_index = torch.tensor([exp_rows[k] for k in keys], dtype=torch.int64)
    chk.eq(f"{name}[per (token, slot)]", got_t.cpu()[got_index], exp_t[exp_index])


def _all_zero(rows: Any) -> bool:
    """Whether every byte of ``rows`` (a tensor, or a recorded one's :class:`Digest`) is zero."""
    if is_digest(rows):
        row_bytes = getattr(torch, rows.dtype.removeprefix("torch.")).itemsize
        for size in rows.shape[1:]:
            row_bytes *= size
        return bool((rows.rows == load_compact().zero_row_digest(row_bytes)).all())
    return bool((_bytes(rows) == 0).all())


def _padding_rows(meta: torch.Tensor, rows: int) -> torch.Tensor:
    """The rows of an expanded table no (token, slot) points to."""
    used = torch.zeros(rows, dtype=torch.bool)
    slots = meta[:, 2:].reshape(-1).to(torch.int64)
    used[slots[slots >= 0]] = True
    return torch.nonzero(~used).flatten()


def compare_v2_expand(chk: _Checker, got: dict, rec: dict, order_of: tuple[dict, dict] | None = None) -> None:
    """A V2 expand-mode result: tables per (source token, top-k slot), metadata rows in source order, the slots
    inside their experts' segments; with ``zero_padding`` the rows no slot points to are all zero bytes."""
    metas = _metadata(chk, got, rec, order_of)
    if metas is None:
        return
    got_meta, exp_meta = metas
    for name, expected in rec.items():
        if name in ("recv_x", "recv_sf", "recv_topk_weights") and _recorded_tensor(expected):
            got_t = _get(got, name)
            chk.eq(f"{name}.shape", tuple(got_t.shape) if isinstance(got_t, torch.Tensor) else got_t,
                   tuple(expected.shape))
            _per_slot(chk, name, got_t, expected, got_meta, exp_meta)
        elif name == "handle":
            handle = _get(got, "handle")
            for scalar in V2_SCALARS:
                chk.eq(f"handle.{scalar}", _get(handle, scalar), expected[scalar])
            _compare_dst_slots(chk, handle, expected)
            go, eo = _order_by_key(got_meta), _order_by_key(exp_meta)
            chk.eq("handle.recv_src_metadata[:, :2]", got_meta[go, :2], exp_meta[eo, :2])
            chk.eq("handle.recv_src_metadata[:, 2:].mask", got_meta[go, 2:] >= 0, exp_meta[eo, 2:] >= 0)
            chk.eq("expand_slots_inside_expert_segments", _slots_inside_segments(got_meta, handle), True)
        elif name not in ("kind", "after"):
            chk.eq(name, _get(got, name), expected)
    if rec.get("zero_padding") and isinstance(_get(got, "recv_x"), torch.Tensor):
        for who, table, meta in (("got", got["recv_x"].cpu(), got_meta), ("recorded", rec["recv_x"], exp_meta)):
            pad = table[_padding_rows(meta, table.shape[0])]
            chk.eq(f"recv_x.padding_rows_zero ({who})", _all_zero(pad), True)


def _slots_inside_segments(meta: torch.Tensor, handle: Any) -> bool:
    """Every slot lies inside its expert's segment [aligned start, start + raw count)."""
    psum, raw = _get(handle, "psum_num_recv_tokens_per_expert"), _get(handle, "num_unaligned_recv_tokens_per_expert")
    if not (isinstance(psum, torch.Tensor) and isinstance(raw, torch.Tensor)):
        return False
    starts = (psum - raw).cpu().tolist()
    segments = list(zip(starts, raw.cpu().tolist(), strict=True))
    return all(any(s <= slot < s + c for s, c in segments) for row in meta.tolist() for slot in row[2:] if slot >= 0)


def compare_case(got: dict, rec: dict, prefix: str, checked: list[str] | None = None) -> Mismatches:
    """One case of the old format (``v1``, ``v2``, ``v2_det``, ``v2_expand``, and its inputs when ``got`` holds
    them): ``{field: problem}``."""
    mismatches: Mismatches = {}
    chk = _Checker(prefix, checked)
    for name in ("case", "x", "topk_idx", "topk_weights"):
        if name in got:
            chk.eq(f"inputs.{name}", got[name], rec[name])
    mismatches.update(chk.mismatches)
    for key, compare in (("v1", compare_v1), ("v2", compare_v2),
                         ("v2_det", functools.partial(compare_v2, deterministic=True)),
                         ("v2_expand", compare_v2_expand)):
        chk = _Checker(f"{prefix}.{key}", checked)
        compare(chk, got[key], rec[key])
        mismatches.update(chk.mismatches)
    return mismatches


#: The directory a DeepEP build was made in, as its assertion messages show it before ``csrc/`` or ``deep_ep/``
#: (``/tmp/src/DeepEP/`` for the kit's wheel, none for the 2 x H200 recordings, ``<DeepEP build root>/`` in the
#: emulation's messages of JIT-compiled code), or before deep_jit's ``deep_jit/utils/`` (2.5.0's kit:
#: ``/tmp/ep25src/src/third-party/deep_jit/include/``): not part of the contract (the refusal table matches it the
#: same way).
_BUILD_ROOT = re.compile(r"(?<=\()(?:[^()]*/(?=deep_jit/utils/)|[^()]*?/(?=(?:csrc|deep_ep)/))")
#: A JIT build that failed (DeepEP 2.5.0's deep_jit, command.hpp): the head of the message, up to the exit code.
_JIT_FAILURE = re.compile(r"^(.*?deep_jit/utils/command\.hpp:\d+\): exit_code == 0: command failed with exit code "
                          r"\d+:)\n", re.S)
_STATIC_ASSERTION = re.compile(r'static assertion failed with "([^"]*)"')


def without_build_root(message: str) -> str:
    """``message`` with the build directory of its source paths removed."""
    return _BUILD_ROOT.sub("", message)


def comparable_message(message: str) -> str:
    """An exception's text as the replay compares it: without the build directory (:func:`without_build_root`); for a
    JIT build that failed (deep_jit's ``command failed with exit code N:``, then the NVCC command line and its
    output), the head up to the exit code and the static assertions NVCC names, in order of first appearance: the
    command line (temporary paths, the machine's include paths) and the rest of the compiler's output are the
    machine's, not the library's contract."""
    message = without_build_root(message)
    failure = _JIT_FAILURE.match(message)
    if failure is None:
        return message
    named = list(dict.fromkeys(_STATIC_ASSERTION.findall(message)))
    return f"{failure.group(1)} <the command and its output> static assertions failed: {named}"

def compare_errors(chk: _Checker, got: dict[str, tuple[str, str]], rec: dict, returned: dict | None = None) -> None:
    """Recorded errors ``{name: (exception type, message)}``: the same type and message; ``returned``: the calls
    that did not raise (a recorded error they did not raise is a mismatch)."""
    returned = returned or {}
    for name, (exc_type, message) in rec.items():
        if name in got:
            chk.eq(f"{name}.type", got[name][0], exc_type)
            chk.eq(f"{name}.message", comparable_message(got[name][1]), comparable_message(message))
        elif name in returned:
            chk.fail(name, f"no exception (returned {returned[name]}), expected {exc_type}: {message}")
        else:
            chk.fail(name, "no emulated trigger for this recorded error")


def _compare_ll_dispatch(chk: _Checker, got: dict, rec: dict) -> None:
    """A low-latency dispatch: per local expert, the valid rows in (source rank, source token) order (the real
    kernel places each source rank's block, and the tokens in it, in arrival order); the block counts of
    ``layout_range`` (low 32 bits) byte for byte, its begin offsets (arrival order) not."""
    for name, expected in rec.items():
        if name in ("recv_x_valid", "recv_x_scales_valid", "src_info_valid"):
            got_t = _get(got, name)
            if not isinstance(got_t, torch.Tensor) or got_t.shape[:1] != expected.shape[:1]:
                chk.eq(name, got_t, expected)
                continue
            chk.eq(f"{name}[by source]", got_t[_ll_order(got)], expected[_ll_order(rec)])
        elif name == "layout_range":
            got_t = _get(got, name)
            chk.eq("layout_range.counts", got_t & 0xFFFFFFFF if isinstance(got_t, torch.Tensor) else got_t,
                   expected & 0xFFFFFFFF)
        elif name != "kind":
            chk.eq(name, _get(got, name), expected)


def _ll_order(run: dict) -> torch.Tensor:
    """The permutation of a low-latency dispatch's valid rows into (local expert, source rank, source token)."""
    keys, offset = [], 0
    counts, layout, src = run["recv_count"].tolist(), run["layout_range"].tolist(), run["src_info_valid"].tolist()
    for e, n in enumerate(counts):
        blocks = [((v >> 32), v & 0xFFFFFFFF) for v in layout[e]]
        for j in range(n):
            source = next((s for s, (b, c) in enumerate(blocks) if b <= j < b + c), -1)
            keys.append((e, source, src[offset + j], offset + j))
        offset += n
    return torch.tensor([k[-1] for k in sorted(keys)], dtype=torch.int64)


def _compare_exact(chk: _Checker, got: dict, rec: dict) -> None:
    for name, expected in rec.items():
        if name != "kind":
            chk.eq(name, _get(got, name), expected)


def _compare_errors_run(chk: _Checker, got: dict, rec: dict) -> None:
    compare_errors(chk, _get(got, "errors") if "errors" in got else {}, rec["errors"], got.get("returned"))
    for name, what in rec["returned"].items():
        if name in got.get("errors", {}):
            chk.fail(name, f"raised {got['errors'][name]}, expected no exception (returned {what})")
        else:
            chk.eq(f"{name}.returned", _get(got.get("returned", {}), name), what)


def _compare_graph(chk: _Checker, got: dict, rec: dict) -> None:
    """A CUDA-graph run (``fixtures/record.py`` sections ``cuda_graphs``, ``capture_build``): its eager calls (the
    API's comparison) and what the rank did after a build inside a capture; the graph's own outcome (the replays,
    what the build raised) only where this side ran on a GPU too (a CPU has no graphs: those fields are left
    unchecked there, and say so in ``unsupported``; never passed as equal)."""
    api = rec["api"]
    chk.eq("api", _get(got, "api"), api)
    if "eager" in rec:
        (compare_v1 if api == "v1" else compare_v2)(chk.sub("eager"), _get(got, "eager"), rec["eager"])
    if "eager_after" in rec:  # the build's aftermath: an eager dispatch on a buffer built after it (or its error)
        after, expected = _get(got, "eager_after"), rec["eager_after"]
        for name in ("recv_rows", "error"):
            if name in expected or name in (after if isinstance(after, dict) else {}):
                chk.eq(f"eager_after.{name}", _get(after, name), expected.get(name))
        if "dispatch" in expected:  # (absent where the build's aftermath raised)
            (compare_v1 if api == "v1" else compare_v2)(chk.sub("eager_after.dispatch"),
                                                        _get(after, "dispatch"), expected["dispatch"])
    if "unsupported" not in got:
        for name in ("replays_equal_eager", "graph_error", "raised", "raised_first", "built", "stream_left_switched",
                     "unsupported"):
            if name in rec or name in got:
                chk.eq(name, got.get(name), rec.get(name))


def lookup_failed_inside_capture(recorded_run: dict, got_error: str) -> bool:
    """Whether a recorded CUDA-graph run (kind ``graph``: ``capture_build``) says what a replay on the CPU that raised
    ``got_error`` says.  On a GPU the recorder builds the buffer inside a capture, so the lookup of a class the
    version lacks (2.5.0's ``deep_ep.Buffer``) raises there (``raised``; ``raised_first`` None: nothing before it;
    ``built`` False) and again for the eager build after it (``eager_after.error``), the run itself holding no
    ``error``; on a CPU there is no capture: the same lookup raises first and the run is that ``error``.  Equal only
    where every one of those is the replay's error, word for word."""
    return (recorded_run.get("kind") == "graph" and "error" not in recorded_run
            and recorded_run.get("raised") == got_error and recorded_run.get("raised_first") is None
            and recorded_run.get("built") is False and recorded_run.get("eager_after") == {"error": got_error})


def compare_run(chk: _Checker, got: dict, rec: dict, got_runs: dict, rec_runs: dict) -> None:
    """One run of a ``fixtures/record.py`` section, by its ``kind`` (see each comparison)."""
    kind = rec.get("kind")
    if "error" in got and lookup_failed_inside_capture(rec, got["error"]):
        chk.eq("error", got["error"], rec["raised"])  # this side has no capture: the lookup raised first
        return
    if not _errors_agree(chk, got, rec):
        return
    if _get(got, "kind") != kind:
        chk.fail("kind", f"got {_get(got, 'kind')!r}, expected {kind!r}")
        return
    after = rec.get("after")
    order_of = (_get(_get(got_runs, after), "handle"), rec_runs[after]["handle"]) if after else None
    if kind == "v2_cached" and after and "do_expand" in rec_runs[after]["handle"]:
        expand = bool(rec_runs[after]["handle"]["do_expand"])
        (compare_v2_expand if expand else compare_v2)(chk, got, rec, order_of=order_of)
        return
    compares: dict[str, Callable[[_Checker, dict, dict], None]] = {
        "v1_dispatch": compare_v1, "v2_dispatch": compare_v2, "v2_expand": compare_v2_expand,
        "ll_dispatch": _compare_ll_dispatch, "ll_combine": _compare_exact, "value": _compare_exact,
        "errors": _compare_errors_run, "graph": _compare_graph}
    if kind not in compares:
        chk.fail("kind", f"no comparison for runs of kind {kind!r}")
        return
    compares[kind](chk, got, rec)


def compare_section(got: dict, rec: dict, prefix: str, checked: list[str] | None = None) -> Mismatches:
    """Every recorded run of one section (``rec['runs']``) against ``got`` (a section record or its runs)."""
    got_runs, rec_runs = got.get("runs", got), rec["runs"]
    chk = _Checker(prefix, checked)
    for name in ("inputs",):
        if name in got:
            chk.eq(name, got[name], rec[name])
    for name, run in rec_runs.items():
        sub = chk.sub(name)
        if name not in got_runs:
            sub.fail("run", "not run")
            continue
        compare_run(sub, got_runs[name], run, got_runs, rec_runs)
    return chk.mismatches


# ------------------------------------------------------------------------ the replay's own calls (old cases)
def _cpu(t: Any) -> Any:
    return t.detach().cpu() if isinstance(t, torch.Tensor) else t


def _error(exc: BaseException) -> dict:
    return {"error": f"{type(exc).__name__}: {exc}"}


def _run_v1(module: ModuleType, group: dist.ProcessGroup, meta: dict, x: torch.Tensor, idx: torch.Tensor,
            w: torch.Tensor) -> dict:
    """V1 as the recorder calls it: ``deep_ep.Buffer`` looked up on the module (DeepEP 2.5.0 has none: the lookup's
    ``AttributeError`` is the recording)."""
    try:
        buf = module.Buffer(group, num_nvl_bytes=1 << 30)
    except Exception as exc:  # noqa: BLE001 - compared with the recorded error
        return _error(exc)
    per_rank, per_rdma, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, meta["num_experts"])
    recv_x, recv_idx, recv_w, counts, handle, _ = buf.dispatch(
        x,
        num_tokens_per_rank=per_rank,
        num_tokens_per_rdma_rank=per_rdma,
        is_token_in_rank=in_rank,
        num_tokens_per_expert=per_expert,
        topk_idx=idx,
        topk_weights=w,
        expert_alignment=meta["expert_alignment"],
    )
    combined_x, combined_w, _ = buf.combine(recv_x, handle, topk_weights=recv_w)
    handle_after_combine = dict(zip(V1_HANDLE, (_cpu(t).clone() for t in handle), strict=True))  # send_head rewritten
    layout = {"num_tokens_per_rank": per_rank, "num_tokens_per_rdma_rank": per_rdma,
              "num_tokens_per_expert": per_expert, "is_token_in_rank": in_rank}
    return {"layout": {k: _cpu(v) for k, v in layout.items()}, "recv_x": _cpu(recv_x), "recv_topk_idx": _cpu(recv_idx),
            "recv_topk_weights": _cpu(recv_w), "num_recv_tokens_per_expert_list": counts,
            "combined_x": _cpu(combined_x), "combined_topk_weights": _cpu(combined_w), "handle": handle_after_combine,
            "cached_recv_x": _cpu(buf.dispatch(x, handle=handle)[0])}


def _v2_handle_dict(handle: Any) -> dict:
    return {name: _cpu(getattr(handle, name)) for name in (*V2_SCALARS, "recv_src_metadata", "dst_buffer_slot_idx")}


def _run_v2(v2: type, group: dist.ProcessGroup, meta: dict, key: str, x: torch.Tensor, idx: torch.Tensor,
            w: torch.Tensor) -> dict:
    buf = v2(group, deterministic=key == "v2_det", **V2_KWARGS)
    kwargs = {"num_experts": meta["num_experts"], "num_max_tokens_per_rank": 128,
              "expert_alignment": meta["expert_alignment"]}
    try:
        recv_x, recv_idx, recv_w, handle, _ = buf.dispatch(x, idx, w, **kwargs)
        combined_x, combined_w, _ = buf.combine(recv_x, handle, topk_weights=recv_w)
        cached = buf.dispatch(x, handle=handle, num_experts=meta["num_experts"])[0]
    except Exception as exc:  # noqa: BLE001 - compared with the recorded error
        return _error(exc)
    return {"recv_x": _cpu(recv_x), "recv_topk_idx": _cpu(recv_idx), "recv_topk_weights": _cpu(recv_w),
            "handle": _v2_handle_dict(handle), "combined_x": _cpu(combined_x),
            "combined_topk_weights": _cpu(combined_w), "cached_recv_x": _cpu(cached)}


def _run_v2_expand(v2: type, group: dist.ProcessGroup, meta: dict, x: torch.Tensor, idx: torch.Tensor,
                   w: torch.Tensor) -> dict:
    buf = v2(group, **V2_KWARGS)
    try:
        recv_x, recv_idx, recv_w, handle, _ = buf.dispatch(
            x,
            idx,
            w,
            num_experts=meta["num_experts"],
            num_max_tokens_per_rank=128,
            expert_alignment=meta["expert_alignment"],
            do_expand=True,
        )
    except Exception as exc:  # noqa: BLE001 - compared with the recorded error
        return _error(exc)
    return {"recv_x": _cpu(recv_x), "recv_topk_idx": _cpu(recv_idx), "recv_topk_weights": _cpu(recv_w),
            "handle": _v2_handle_dict(handle)}


def replay_recorded_case(
    case_name: str,
    group: dist.ProcessGroup | None = None,
    device: torch.device | str = "cpu",
    fixtures_dir: str | None = None,
    checked: list[str] | None = None,
) -> Mismatches:
    """Replay one recorded case on this rank against the emulation of the recording's DeepEP version; returns
    ``{field: problem}`` (empty when all match).

    Arguments:
        case_name: a key of the recording's ``cases``.
        group: the 2-rank process group (default: the world).
        device: where the inputs are placed.
        checked: if given, the names of every checked field are appended to it.
    """
    group = group or dist.group.WORLD
    case = load_recording(group.rank(), fixtures_dir)["cases"][case_name]
    version = recording_version(fixtures_dir)
    module, v2 = emulation_of(version), v2_class(version)
    x, topk_idx, topk_weights = (case[k].to(device) for k in ("x", "topk_idx", "topk_weights"))
    meta = case["case"]
    with recorded_machine(load_recording(group.rank(), fixtures_dir)):
        got = {
            "v1": _run_v1(module, group, meta, x, topk_idx, topk_weights),
            "v2": _run_v2(v2, group, meta, "v2", x, topk_idx, topk_weights),
            "v2_det": _run_v2(v2, group, meta, "v2_det", x, topk_idx, topk_weights),
            "v2_expand": _run_v2_expand(v2, group, meta, x, topk_idx, topk_weights),
        }
    return compare_case(got, case, case_name, checked)


def replay_recorded_errors(
    group: dist.ProcessGroup | None = None,
    device: torch.device | str = "cpu",
    fixtures_dir: str | None = None,
    checked: list[str] | None = None,
) -> Mismatches:
    """Re-trigger every recorded error (same calls on every rank) on the emulation of the recording's version;
    compare exception type and message.  The V1 calls exist where the version has ``Buffer`` (the recorder makes
    them only there): a recording without them is compared with an emulation that has none
    (``errors.v1_api_present``)."""
    group = group or dist.group.WORLD
    rec = load_recording(group.rank(), fixtures_dir)
    with recorded_machine(rec):
        return _replay_errors(group, device, rec, recording_version(fixtures_dir), checked)


def _replay_errors(group: dist.ProcessGroup, device: torch.device | str, rec: dict, version: str,
                   checked: list[str] | None) -> Mismatches:
    module = emulation_of(version)
    case = rec["cases"]["base"]
    x, topk_idx, topk_weights = (case[k].to(device) for k in ("x", "topk_idx", "topk_weights"))
    num_experts = case["case"]["num_experts"]
    v2 = v2_class(version)(group, **V2_KWARGS)
    _, _, _, handle, _ = v2.dispatch(x, topk_idx, topk_weights, num_experts=num_experts)
    calls: dict[str, Callable[[], object]] = {
        "v2_previous_event_without_comm_alloc": lambda: v2.dispatch(
            x, topk_idx, topk_weights, num_experts=num_experts, previous_event=v2.capture()
        ),
        "v2_int32_topk_idx": lambda: v2.dispatch(x, topk_idx.int(), topk_weights, num_experts=num_experts),
        "v2_bf16_weights": lambda: v2.dispatch(x, topk_idx, topk_weights.bfloat16(), num_experts=num_experts),
        "v2_too_many_qps": lambda: v2.dispatch(
            x, topk_idx, topk_weights, num_experts=num_experts, num_qps=v2.num_allocated_qps + 1
        ),
        "v2_experts_not_divisible": lambda: v2.dispatch(
            x, topk_idx.clamp(max=6), topk_weights, num_experts=7
        ),
        "v2_cached_dispatch_without_num_experts": lambda: v2.dispatch(x, handle=handle),
        "v1_int32_topk_idx": lambda: module.Buffer(group, num_nvl_bytes=1 << 30).get_dispatch_layout(
            topk_idx.int(), num_experts),
        "v1_odd_num_sms": lambda: module.Buffer.set_num_sms(21),
    }
    raised, returned = {}, {}
    for name in rec["errors"]:
        if name in calls:
            try:
                calls[name]()
                returned[name] = "returned normally"
            except Exception as exc:  # noqa: BLE001 - compared with the recorded error
                raised[name] = (type(exc).__name__, str(exc))
    chk = _Checker("errors", checked)
    compare_errors(chk, raised, rec["errors"], returned)
    recorded_v1 = any(name.startswith("v1_") for name in [*rec["errors"], *rec.get("errors_not_raised", {})])
    chk.eq("v1_api_present", hasattr(module, "Buffer"), recorded_v1)
    # the buffer stays usable after the QP refusal
    recv_x = v2.dispatch(x, topk_idx, topk_weights, num_experts=num_experts)[0]
    chk.eq("v2_usable_after_errors.num_rows", recv_x.shape[0], case["v2"]["recv_x"].shape[0])
    return chk.mismatches


def recorded_section_status(section_id: str, fixtures_dir: str | None = None) -> str | None:
    """``None`` when rank 0 of the recording holds ``section_id`` replayably; otherwise why not (the reason a test
    that would replay it is skipped with)."""
    root = sections_dir(fixtures_dir)
    rec = load_recording(0, root)
    sections = rec.get("sections", {})
    if section_id not in sections:
        return (f"no real recording of section {section_id!r} exists yet ({root} has no 'sections' entry for it; "
                f"make one with fixtures/record.py, docs/real-runs/README.md): nothing checked")
    section = sections[section_id]
    if section.get("status") != "ok":
        return (f"the recording {root} holds section {section_id!r} as {section.get('status')!r} "
                f"({section.get('error') or section.get('skipped')}): nothing to replay")
    return None


def replay_recorded_section(
    section_id: str,
    group: dist.ProcessGroup | None = None,
    device: torch.device | str = "cpu",
    fixtures_dir: str | None = None,
    checked: list[str] | None = None,
) -> Mismatches:
    """Replay one section of ``fixtures/record.py`` on this rank: its calls with the emulation of the recording's
    version as the module under test, on the recorded inputs; compare every recorded run (:func:`compare_section`)."""
    group = group or dist.group.WORLD
    root = sections_dir(fixtures_dir)
    recording = load_recording(group.rank(), root)
    rec = recording["sections"][section_id]
    recorder = load_recorder()
    module = emulation_of(recording_version(root))
    ctx = recorder.Context(module, group, group.rank(), group.size(), torch.device(device))
    try:
        with recorded_machine(recording):
            got = recorder.SECTIONS[section_id].run(ctx, rec["inputs"])
    finally:
        ctx.close()
    return compare_section(got, rec, section_id, checked)


def main() -> int:
    """Replay every recording of :func:`fidelity_recordings` under
    ``torchrun --nproc_per_node 2 -m tests.helpers.replay``.

    Uses NCCL with CUDA tensors when GPUs are visible, else gloo with CPU tensors; exit status 1 on any
    mismatch.
    """
    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    device: torch.device | str = "cpu"
    if use_cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    checked: list[str] = []
    failures: Mismatches = {}
    for cases, sections in fidelity_recordings():
        found: Mismatches = {}
        for name in recorded_case_names(cases):
            found.update(replay_recorded_case(name, device=device, fixtures_dir=cases, checked=checked))
        found.update(replay_recorded_errors(device=device, fixtures_dir=cases, checked=checked))
        for section_id in recorder_section_ids():
            reason = recorded_section_status(section_id, sections)
            if reason:
                print(f"rank {dist.get_rank()}: {section_id}: skipped: {reason}")
            else:
                found.update(replay_recorded_section(section_id, device=device, fixtures_dir=sections,
                                                     checked=checked))
        failures.update({f"{Path(cases).name}: {key}": problem for key, problem in found.items()})
    print(f"rank {dist.get_rank()} on {device}: {len(checked)} fields checked, {len(failures)} mismatches")
    for key, problem in failures.items():
        print(f"  {key}: {problem}")
    dist.destroy_process_group()
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
