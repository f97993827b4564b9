#!/usr/bin/env python3
"""Merge the sections of one or more recordings of ``fixtures/record.py`` into a compacted recording, compacted the
same way (``fixtures/compact.py``: payloads as digests; section inputs, handles, metadata, errors verbatim).

    python3 docs/real-runs/2026-12-06-1xH100/merge_sections.py FIXTURE SRC [SRC ...] --note "run 29 ..."

Every section found in ``SRC/rank{r}.pt`` (any status: an ``error`` section is a recording too) replaces the fixture's
section of that id.  ``meta.recorder.sections_<key>`` says where each came from (the source's recorder meta: commit,
date, module file, units and their seconds, the ``meta`` unit's fields if it ran), ``meta.compact.sections_<key>`` the
sources' sizes and SHA-256 and the compaction counts.  The cases, errors and the fixture's own meta stay as they are.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]


def load_compact():
    spec = importlib.util.spec_from_file_location("fixtures_compact", ROOT / "fixtures" / "compact.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def share_equal_tensors(value, seen: dict):
    """``value`` with every tensor equal to one seen before replaced by that one (read-only recordings)."""
    if isinstance(value, dict):
        return {k: share_equal_tensors(v, seen) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(share_equal_tensors(v, seen) for v in value)
    if isinstance(value, torch.Tensor) and value.is_contiguous() and value.storage_offset() == 0 and \
            value.untyped_storage().nbytes() == value.numel() * value.element_size():
        raw = value.detach().cpu().reshape(-1).view(torch.uint8).numpy().tobytes() if value.numel() else b""
        key = (str(value.dtype), tuple(value.shape), tuple(value.stride()), raw)
        return seen.setdefault(key, value)
    return value


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("fixture", type=Path)
    p.add_argument("sources", type=Path, nargs="+")
    p.add_argument("--key", required=True, help="suffix of the meta entries (e.g. run29)")
    p.add_argument("--note", required=True, help="where the sections come from (a run of docs/real-runs/README.md)")
    args = p.parse_args(argv)
    compact = load_compact()
    for rank in (0, 1):
        target = args.fixture / f"rank{rank}.pt"
        rec = torch.load(target, weights_only=True)
        origin: dict = {"from": args.note, "sources": {}}
        sizes: dict = {}
        for src in args.sources:
            path = src / f"rank{rank}.pt"
            if not path.exists():
                print(f"{path}: absent, skipped")
                continue
            raw = torch.load(path, weights_only=True)
            counts = compact.Counts()
            sections = compact.compact_value(raw.get("sections", {}), "sections", None, "", compact.DEFAULT_THRESHOLD,
                                             counts)
            recorder = raw["meta"].get("recorder", {})
            unit_meta = {k: v for k, v in raw["meta"].items() if k != "recorder"}
            origin["sources"][src.name] = {
                **{k: recorder.get(k) for k in ("commit", "date", "module_file", "rank_setup", "section_timeout_s",
                                                "starts", "units", "destroy_errors")},
                **({"meta_unit": unit_meta} if unit_meta else {}), "sections": sorted(sections)}
            sizes[src.name] = {**compact.file_digest(path), "digests": counts.digests,
                               "verbatim_tensors": counts.verbatim_tensors}
            for sid, section in sections.items():
                rec["sections"][sid] = section
                print(f"rank {rank}: {sid} ({section.get('status')}) from {src}")
        rec["sections"] = share_equal_tensors(rec["sections"], {})
        rec["meta"]["recorder"][f"sections_{args.key}"] = origin
        rec["meta"]["compact"][f"sections_{args.key}"] = sizes
        torch.save(rec, target)
        print(f"{target}: {target.stat().st_size} bytes, sections {sorted(rec['sections'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
