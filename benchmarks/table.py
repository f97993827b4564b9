"""``python -m benchmarks.table [reports/benchmark.json]``: the speed table of docs/reference.md, printed from a
benchmark file."""

from __future__ import annotations

import json
import statistics
import sys
from typing import Any


def rows(results: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(figure, value, target) rows of the figures present in ``results``."""
    f = results["figures"]
    out = []
    for shape, v in f.get("world_start", {}).items():
        if isinstance(v, dict) and "first_start_s" in v:
            out.append((f"world start {shape} (first / after a retirement)",
                        f"{v['first_start_s']['median']:.2f} s / {v['restart_s']['median']:.2f} s", "<= 3 s"))
    if "harness_overhead" in f:
        out.append(("harness overhead per example (no-op backend, 1x2)", f"{f['harness_overhead']['median']:.2f} ms",
                    "<= 5 ms"))
    props = {k: v for k, v in f.get("properties", {}).items() if isinstance(v, dict) and "median" in v}
    if props:
        rates = [v["median"] for v in props.values()]
        slow = min(props, key=lambda k: props[k]["median"])
        profiled = " (ranks profiled: slower)" if "rank_profile" in f else ""
        out.append((f"examples/s per property, 1x2 world (median over properties; slowest){profiled}",
                    f"{statistics.median(rates):.1f} (min {props[slow]['median']:.1f}, {slow.split('-')[0]})",
                    ">= 50"))
        counted = {k: v["collectives_per_example"] for k, v in props.items() if "collectives_per_example" in v}
        if counted:
            most = max(counted, key=lambda k: counted[k])
            out.append(("collectives per example on rank 0 (median over properties; most)",
                        f"{statistics.median(counted.values()):.1f} (max {counted[most]:.1f}, {most.split('-')[0]})",
                        ""))
    if "cost_growth" in f:
        c = f["cost_growth"]["cells"]
        out.append(("P1 example, T=16 h=128 -> T=1024 h=4096 (growth exponent vs bytes)",
                    f"{c[0]['median'] * 1000:.0f} ms -> {c[-1]['median'] * 1000:.0f} ms "
                    f"({f['cost_growth']['growth_exponent_time_vs_bytes']})", "<= 1"))
    if "first_example" in f:
        out.append(("`pytest -n 1 -k test_counts --max-examples 1`", f"{f['first_example']['median']:.1f} s", "<= 8 s"))
    if "main_job" in f:
        m = f["main_job"]
        out.append(("main job `pytest -n auto --nodes 2`",
                    f"{m['wall']['median']:.1f} s, {m['examples']['median']:.0f} examples, "
                    f"{m['examples_per_s']['median']:.1f} examples/s", "<= 60 s"))
    if "xdist_scaling" in f:
        x = f["xdist_scaling"]
        out.append(("P1-P8 x 15 examples: `-n 1` / `-n 2`",
                    f"{x['-n 1']['median']:.1f} s / {x['-n 2']['median']:.1f} s "
                    f"(x{x['speedup_n2_over_n1']['median']:.2f})", ""))
    if "mutation" in f:
        m = f["mutation"]
        out.append((f"kill matrix (`{m['command']}`)",
                    f"{m['wall']['median'] / 60:.1f} min, {m.get('harmful_killed')}/{m.get('harmful')} killed, "
                    f"{m.get('benign_spared')}/{m.get('benign')} spared, median {m.get('median_examples_to_kill')} "
                    f"examples to kill", "<= 5 min, median <= 5"))
    if "rank_profile" in f and "sync_and_copy_share" in f["rank_profile"]:
        out.append(("share of rank task time in synchronisation and copies (profiled)",
                    f"{100 * f['rank_profile']['sync_and_copy_share']:.0f} %", ""))
    return out


def markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    head = (f"{m['cores']} cores ({m['cpu']}), {'GPU ' + m['gpu'] + ', ' if m.get('gpu') else ''}Python {m['python']}, "
            f"torch {m['torch']}, device {results.get('device', 'cpu')}, medians of {results['reps']}, "
            f"load at start {m['load_average_at_start'][0]}, {results['started']}")
    lines = [head, "", "| figure | measured | target |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rows(results)]
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown(json.load(open(sys.argv[1] if len(sys.argv) > 1 else "reports/benchmark.json"))))
