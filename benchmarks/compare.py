"""``python -m benchmarks.compare BASELINE``: the figures of an earlier checkout and of this one, side by side.

``BASELINE`` is a checkout of the revision to compare with (``git worktree add /tmp/before <rev>``; it must have
``benchmarks/``).  Each repetition runs ``python -m benchmarks --only FIGURES --reps 1`` once in each tree (the
order alternates between repetitions, so a machine that slows down mid-run does not favour one side), with that
tree first on ``PYTHONPATH``: same interpreter, same packages, same load.  The JSON
(``reports/benchmark-compare.json``) keeps every run of every headline figure of both sides and, per figure, the
median of the per-repetition ratios current / baseline; ``--markdown`` prints the table the closing notes quote.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.__main__ import ROOT, machine

DEFAULT_FIGURES = ("world_start", "harness_overhead", "properties", "first_example", "main_job")


def headline(figures: dict[str, Any]) -> dict[str, float]:
    """The numbers a comparison is about, from one ``python -m benchmarks`` result (``figures``)."""
    out: dict[str, float] = {}
    for shape, value in figures.get("world_start", {}).items():
        if isinstance(value, dict) and "first_start_s" in value:
            out[f"world start {shape}, first (s)"] = value["first_start_s"]["median"]
            out[f"world start {shape}, after a retirement (s)"] = value["restart_s"]["median"]
    if "harness_overhead" in figures:
        out["harness overhead per example (ms)"] = figures["harness_overhead"]["median"]
    props = {k: v["median"] for k, v in figures.get("properties", {}).items() if isinstance(v, dict) and "median" in v}
    if props:
        out["examples/s, median over properties (1x2)"] = statistics.median(props.values())
        out["examples/s, slowest property (1x2)"] = min(props.values())
        for pid, rate in props.items():
            out[f"examples/s {pid.split('-')[0]}"] = rate
    if "first_example" in figures:
        out["pytest -n 1 -k test_counts --max-examples 1 (s)"] = figures["first_example"]["median"]
    if "main_job" in figures:
        main = figures["main_job"]
        out["main job wall (s)"] = main["wall"]["median"]
        out["main job examples"] = main["examples"]["median"]
        out["main job examples/s"] = main["examples_per_s"]["median"]
    if "mutation" in figures:
        out["kill matrix wall (s)"] = figures["mutation"]["wall"]["median"]
        if figures["mutation"].get("median_examples_to_kill") is not None:
            out["kill matrix median examples to kill"] = figures["mutation"]["median_examples_to_kill"]
    return out


def run_side(tree: Path, figures: str, examples: int, extra: list[str]) -> dict[str, float]:
    """One ``python -m benchmarks`` run in ``tree``: its headline numbers."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "benchmark.json"
        env = {**os.environ, "PYTHONPATH": str(tree) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        done = subprocess.run([sys.executable, "-m", "benchmarks", "--only", figures, "--reps", "1",
                               "--examples", str(examples), "--out", str(out), *extra],
                              cwd=tree, env=env, capture_output=True, text=True, timeout=7200)
        if done.returncode != 0 or not out.exists():
            raise RuntimeError(f"python -m benchmarks in {tree} exited {done.returncode}:\n{done.stderr[-3000:]}")
        return headline(json.loads(out.read_text())["figures"])


def compare(baseline: Path, figures: str, reps: int, examples: int, extra: list[str]) -> dict[str, Any]:
    """``reps`` alternating runs of both trees: every headline number of both sides, and the ratios."""
    runs: dict[str, list[dict[str, float]]] = {"baseline": [], "current": []}
    for rep in range(reps):
        sides = (("baseline", baseline), ("current", ROOT))
        for side, tree in sides if rep % 2 == 0 else tuple(reversed(sides)):
            print(f"benchmarks.compare: repetition {rep + 1}/{reps}, {side} ({tree}) ...", flush=True)
            runs[side].append(run_side(tree, figures, examples, extra))
    keys = [k for k in runs["current"][0] if all(k in r for r in runs["baseline"] + runs["current"])]
    table = {}
    for key in keys:
        before = [r[key] for r in runs["baseline"]]
        after = [r[key] for r in runs["current"]]
        ratios = [a / b for a, b in zip(after, before, strict=True) if b]
        table[key] = {"baseline": {"median": round(statistics.median(before), 4), "runs": before},
                      "current": {"median": round(statistics.median(after), 4), "runs": after},
                      "ratio_current_over_baseline": round(statistics.median(ratios), 3) if ratios else None}
    return table


def markdown(result: dict[str, Any]) -> str:
    lines = [f"{result['baseline_tree']} ({result['baseline_revision']}) vs {result['current_revision']}, "
             f"{result['machine']['cores']} cores, medians of {result['reps']} alternating repetitions, "
             f"load at start {result['machine']['load_average_at_start'][0]}, {result['started']}", "",
             "| figure | before | after | after / before |", "|---|---|---|---|"]
    for key, row in result["figures"].items():
        lines.append(f"| {key} | {row['baseline']['median']:.4g} | {row['current']['median']:.4g} | "
                     f"{row['ratio_current_over_baseline']} |")
    return "\n".join(lines)


def _revision(tree: Path) -> str:
    done = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or "?"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.compare", description=__doc__.split("\n\n")[0])
    p.add_argument("baseline", nargs="?", help="a checkout of the revision to compare with")
    p.add_argument("--figures", default=",".join(DEFAULT_FIGURES), help="figures of python -m benchmarks to compare")
    p.add_argument("--reps", type=int, default=3, help="alternating repetitions (medians are reported)")
    p.add_argument("--examples", type=int, default=25, help="examples per property (the properties figure)")
    p.add_argument("--benchmark-args", default="", help="more options for python -m benchmarks on both sides")
    p.add_argument("--out", default="reports/benchmark-compare.json")
    p.add_argument("--markdown", metavar="FILE", help="print the table of an earlier comparison and exit")
    args = p.parse_args(argv)
    if args.markdown:
        print(markdown(json.loads(Path(args.markdown).read_text())))
        return 0
    if not args.baseline:
        p.error("give the baseline checkout (or --markdown FILE)")
    baseline = Path(args.baseline).resolve()
    if not (baseline / "benchmarks" / "__main__.py").exists():
        p.error(f"{baseline} has no benchmarks/ (a checkout of a revision from 2026-12-02 on is needed)")
    result: dict[str, Any] = {"schema": 1, "machine": machine(), "reps": args.reps, "started":
                              time.strftime("%Y-%m-%dT%H:%M:%S%z"), "baseline_tree": str(baseline),
                              "baseline_revision": _revision(baseline), "current_revision": _revision(ROOT)}
    result["figures"] = compare(baseline, args.figures, args.reps, args.examples, args.benchmark_args.split())
    result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    out = ROOT / args.out if not os.path.isabs(args.out) else Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(markdown(result))
    print(f"benchmarks.compare: wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
