"""Self-tests of ``fixtures/compact.py`` (the compacted recordings) and of the replay's reading of them.

A compacted recording must say exactly what the original says to the fidelity test's comparison
(``tests/helpers/replay.py``): the original compared with its compacted self has no mismatch and checks as many fields
as with itself; one changed byte of a digested tensor is a mismatch that says the digest differs (with the shapes and
the row), wherever the comparison reorders rows (V2 arrival order, expand-mode slots, low-latency blocks); inputs equal
to the reference's become markers that resolve to the reference's bytes, and a reference that changed is refused.
Runs on the committed 2.1.0 recordings (CPU, no world).
"""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import replay

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "fixtures" / "deepep-real"
SECTIONS = ROOT / "fixtures" / "deepep-real-2026-12-05"
COMMITTED_2_5_0 = ROOT / "fixtures" / "deepep-real-2.5.0-2026-12-06"
compact = replay.load_compact()


@pytest.fixture(scope="module")
def reference0() -> dict:
    return torch.load(REFERENCE / "rank0.pt", weights_only=True)


@pytest.fixture(scope="module")
def compacted0(reference0: dict) -> dict:
    """Rank 0 of the reference recording compacted against itself (every input a marker), then resolved."""
    rec = compact.compact_recording(reference0, reference0, "fixtures/deepep-real")
    return compact.resolve(rec, 0, ROOT, load=lambda folder, rank: reference0)


@pytest.fixture(scope="module")
def sections0() -> tuple[dict, dict]:
    """Rank 0 of the 2.1.0 sections recording and its compacted form (no reference), resolved."""
    original = torch.load(SECTIONS / "rank0.pt", weights_only=True)
    return original, compact.resolve(compact.compact_recording(original, None, None), 0, ROOT)


def _count_checked(compare: object, got: dict, rec: dict, *args: object) -> tuple[dict, int]:
    checked: list[str] = []
    mismatches = compare(got, rec, *args, checked)  # type: ignore[operator]
    return mismatches, len(checked)


def test_the_compacted_cases_say_what_the_original_says(reference0: dict, compacted0: dict) -> None:
    digests = 0
    for name, case in reference0["cases"].items():
        mismatches, n = _count_checked(replay.compare_case, case, compacted0["cases"][name], name)
        assert not mismatches, mismatches
        assert n == _count_checked(replay.compare_case, case, case, name)[1], name
        digests += sum(replay.is_digest(v) for part in ("v1", "v2", "v2_det", "v2_expand")
                       for v in compacted0["cases"][name][part].values())
    assert digests > 40, f"only {digests} tensors digested: the test compares little"


def test_the_compacted_sections_say_what_the_original_says(sections0: tuple[dict, dict]) -> None:
    original, compacted = sections0
    kinds = set()
    for sid, section in original["sections"].items():
        if section.get("status") != "ok":
            continue
        mismatches, n = _count_checked(replay.compare_section, section, compacted["sections"][sid], sid)
        assert not mismatches, mismatches
        assert n == _count_checked(replay.compare_section, section, section, sid)[1], sid
        kinds |= {run["kind"] for run in compacted["sections"][sid]["runs"].values()
                  if any(replay.is_digest(v) for v in run.values())}
    assert {"v2_dispatch", "v2_expand", "ll_dispatch"} <= kinds, f"digested runs only of kinds {kinds}"


def _flip(t: torch.Tensor, byte: int) -> torch.Tensor:
    t = t.clone()
    t.reshape(-1).view(torch.uint8)[byte] ^= 0x01
    return t


@pytest.mark.parametrize("part", ["v2", "v2_det", "v2_expand", "v1"])
def test_a_changed_byte_of_a_digested_tensor_is_named(reference0: dict, compacted0: dict, part: str) -> None:
    case = copy.deepcopy(reference0["cases"]["base"])
    row_bytes = case[part]["recv_x"][0].numel() * case[part]["recv_x"].element_size()
    case[part]["recv_x"] = _flip(case[part]["recv_x"], 3 * row_bytes + 5)  # row 3
    assert replay.is_digest(compacted0["cases"]["base"][part]["recv_x"])
    mismatches = replay.compare_case(case, compacted0["cases"]["base"], "base")
    problems = [p for k, p in mismatches.items() if k.startswith(f"base.{part}.recv_x")]
    assert len(mismatches) == 1 and problems, mismatches
    assert "digest differs" in problems[0] and "1 of " in problems[0] and "bfloat16" in problems[0], problems[0]


def test_a_changed_shape_or_dtype_is_named_before_the_digest(compacted0: dict, reference0: dict) -> None:
    case = copy.deepcopy(reference0["cases"]["hidden7168"])
    case["v2"]["combined_x"] = case["v2"]["combined_x"][:-1]
    case["v2_det"]["combined_x"] = case["v2_det"]["combined_x"].float()
    mismatches = replay.compare_case(case, compacted0["cases"]["hidden7168"], "hidden7168")
    assert set(mismatches) == {"hidden7168.v2.combined_x", "hidden7168.v2_det.combined_x"}, mismatches
    assert "(15, 7168), expected bfloat16(16, 7168)" in mismatches["hidden7168.v2.combined_x"]
    assert "got float32(16, 7168)" in mismatches["hidden7168.v2_det.combined_x"]


def test_expand_padding_and_low_latency_blocks_are_compared_through_digests(sections0: tuple[dict, dict]) -> None:
    original, compacted = sections0
    options = original["sections"]["v2_dispatch_options"]["runs"]["expand_zero_padding"]
    got = copy.deepcopy(options)
    meta = got["handle"]["recv_src_metadata"]
    pad = replay._padding_rows(meta, got["recv_x"].shape[0])  # noqa: SLF001 - the comparison's own helper
    assert pad.numel(), "the recording has no padding rows to perturb"
    row_bytes = got["recv_x"][0].numel() * got["recv_x"].element_size()
    got["recv_x"] = _flip(got["recv_x"], int(pad[0]) * row_bytes)
    chk = replay._Checker("opts", None)  # noqa: SLF001 - the fidelity test's checker
    rec = compacted["sections"]["v2_dispatch_options"]["runs"]["expand_zero_padding"]
    replay.compare_run(chk, got, rec, {}, {})
    assert "opts.recv_x.padding_rows_zero (got)" in chk.mismatches, chk.mismatches
    ll = original["sections"]["v1_low_latency"]["runs"]["dispatch_bf16"]
    got = copy.deepcopy(ll)
    got["recv_x_valid"] = _flip(got["recv_x_valid"], 0)
    chk = replay._Checker("ll", None)  # noqa: SLF001
    replay.compare_run(chk, got, compacted["sections"]["v1_low_latency"]["runs"]["dispatch_bf16"], {}, {})
    assert list(chk.mismatches) == ["ll.recv_x_valid[by source]"], chk.mismatches
    assert "digest differs" in chk.mismatches["ll.recv_x_valid[by source]"]


def test_inputs_become_reference_markers_and_a_changed_reference_is_refused(reference0: dict) -> None:
    rec = compact.compact_recording(reference0, reference0, "fixtures/deepep-real")
    assert rec["meta"]["compact"]["reference_markers"] == 3 * len(reference0["cases"])
    marker = rec["cases"]["base"]["x"]
    assert marker["compact"] == "reference" and marker["path"] == "cases/base/x", marker
    changed = copy.deepcopy(reference0)
    changed["cases"]["base"]["x"] = _flip(changed["cases"]["base"]["x"], 0)
    with pytest.raises(ValueError, match="no longer holds cases/base/x"):
        compact.resolve(rec, 0, ROOT, load=lambda folder, rank: changed)
    other = copy.deepcopy(reference0)
    other["cases"]["base"]["x"] = _flip(other["cases"]["base"]["x"], 0)  # inputs that differ: kept verbatim
    kept = compact.compact_recording(other, reference0, "fixtures/deepep-real")["cases"]["base"]["x"]
    assert isinstance(kept, torch.Tensor) and torch.equal(kept, other["cases"]["base"]["x"])


def test_what_the_comparison_reads_stays_verbatim(reference0: dict) -> None:
    rec = compact.compact_recording(reference0, None, None, threshold=0)
    case = rec["cases"]["hidden7168"]
    for part in ("v2", "v2_expand"):
        for name, value in case[part]["handle"].items():
            assert not isinstance(value, dict), f"{part}.handle.{name} digested"
        assert isinstance(case[part]["handle"]["recv_src_metadata"], torch.Tensor)
    assert isinstance(case["v2"]["recv_topk_idx"], torch.Tensor)
    assert all(isinstance(case[k], torch.Tensor) for k in ("x", "topk_idx", "topk_weights"))  # inputs
    assert rec["errors"] == reference0["errors"]
    assert case["v2"]["recv_x"]["compact"] == "digest" and case["v2"]["recv_x"]["row_sha256"].shape == (32, 32)
    with pytest.raises(ValueError, match="compacted already"):
        compact.compact_recording(rec, None, None)


def test_the_command_line_writes_both_ranks(tmp_path: Path) -> None:
    out = tmp_path / "c"
    proc = subprocess.run([sys.executable, str(ROOT / "fixtures" / "compact.py"), str(REFERENCE), str(out),
                           "--threshold", "65536"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for rank in (0, 1):
        rec = torch.load(out / f"rank{rank}.pt", weights_only=True)
        meta = rec["meta"]["compact"]
        assert meta["threshold_bytes"] == 65536 and meta["reference"] == "fixtures/deepep-real", meta
        assert meta["source"][f"rank{rank}.pt"]["bytes"] == (REFERENCE / f"rank{rank}.pt").stat().st_size
        assert meta["digests"] > 0 and meta["reference_markers"] == 3 * len(rec["cases"])
    assert "reference markers" in proc.stdout


def test_the_committed_2_5_0_recording_is_compact_and_says_how() -> None:
    """The device carries the tracked tree within 64 MiB: the 2.5.0 recording adds at most about 1.5 MB."""
    size = sum(p.stat().st_size for p in COMMITTED_2_5_0.iterdir())
    assert size < 1_500_000, f"{COMMITTED_2_5_0} holds {size} bytes"
    for rank in (0, 1):
        meta = torch.load(COMMITTED_2_5_0 / f"rank{rank}.pt", weights_only=True)["meta"]
        assert meta["deep_ep"] == "2.5.0" and meta["compact"]["reference"] == "fixtures/deepep-real"
        assert meta["compact"]["source"][f"rank{rank}.pt"]["bytes"] > 6_000_000, meta["compact"]["source"]
