"""``python -m benchmarks``: measure the suite's speed and write ``reports/benchmark.json``.

Every figure is a median over ``--reps`` repetitions in this one invocation; comparisons (``-n 1`` vs ``-n 2``) are
measured side by side, alternating.  See benchmarks/README.md for what each figure means and the profile command.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

#: A child that starts a world the way a pytest worker does (torch already loaded by the plugin).
_WORLD_CHILD = r"""
import json, sys, time
import torch, torch.distributed  # noqa: F401  (the plugin has them loaded before any world starts)
from conformance.world.launcher import World, WorldShape
nodes, rpn = map(int, sys.argv[1:3])
device = sys.argv[3]
gpus = tuple(str(g) for g in range(nodes * rpn)) if device == "cuda" else ()
world = World(WorldShape(nodes, rpn), device=device, gpu_ids=gpus)
t = time.monotonic(); world.run("os:getpid"); first = time.monotonic() - t
world.kill()
t = time.monotonic(); world.run("os:getpid"); restart = time.monotonic() - t
world.close()
print(json.dumps({"first_start_s": first, "restart_s": restart}))
"""


def median_of(runs: list[float], unit: str, **extra: Any) -> dict[str, Any]:
    """A figure: the median of ``runs`` (kept, rounded) and its unit."""
    return {"median": round(statistics.median(runs), 4), "unit": unit, "runs": [round(r, 4) for r in runs], **extra}


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def world_start(reps: int, device: str = "cpu") -> dict[str, Any]:
    """First start and restart of a world, per shape (each repetition a fresh process): 1x2 and 2x2 on CPU, 1x1 on
    one GPU (NCCL)."""
    out: dict[str, Any] = {}
    for nodes, rpn in ((1, 1),) if device == "cuda" else ((1, 2), (2, 2)):
        runs = []
        for _ in range(reps):
            done = subprocess.run([sys.executable, "-c", _WORLD_CHILD, str(nodes), str(rpn), device], cwd=ROOT,
                                  env=_env(),
                                  capture_output=True, text=True, timeout=300)
            if done.returncode:
                raise RuntimeError(f"world start {nodes}x{rpn} failed:\n{done.stderr[-3000:]}")
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
        name = f"{nodes}x{rpn}" + (" cuda" if device == "cuda" else "")
        out[name] = {key: median_of([r[key] for r in runs], "s") for key in runs[0]}
    return out


def _small_payload() -> tuple[Any, Any]:
    """A small example and a canonical-result-sized reply (T=16 per rank, hidden 128, top-2 of 8 experts)."""
    import torch

    from conformance.core.example import Example

    case = Example(tokens_per_rank=(16, 16), hidden=128, num_topk=2, num_experts=8, seed=1,
                   num_max_tokens_per_rank=16)
    reply = {"recv_x": torch.zeros(32, 128, dtype=torch.bfloat16), "topk_idx": torch.zeros(32, 2, dtype=torch.int64),
             "weights": torch.zeros(32, 2), "counts": [16] * 8}
    return case, reply


def harness_overhead(reps: int, calls: int = 300) -> dict[str, Any]:
    """Controller -> ranks -> controller for one example with the no-op backend (benchmarks.tasks:echo), 1x2."""
    from conformance.world.launcher import World, WorldShape

    case, reply = _small_payload()
    per_call = []
    with World(WorldShape(1, 2)) as world:
        world.run("benchmarks.tasks:echo", case, reply)
        for _ in range(reps):
            t = time.perf_counter()
            for _ in range(calls):
                world.run("benchmarks.tasks:echo", case, reply)
            per_call.append((time.perf_counter() - t) / calls * 1000)
    return median_of(per_call, "ms per example", calls_per_run=calls)


def _session(shape: tuple[int, int] = (1, 2), device: str = "cpu", **world: Any) -> Any:
    from conformance.core.spec import parse_backends
    from conformance.harness.config import RunConfig
    from conformance.harness.session import Session
    from conformance.world.launcher import WorldShape

    session = Session(RunConfig(WorldShape(*shape), tuple(parse_backends("emulated", False)), device,
                                120.0, **world))
    session.world.start()
    return session


def property_rates(reps: int, examples: int, session: Any) -> dict[str, Any]:
    """Examples/s of every property on the emulation (its own strategy, seeded, first failure stops: none here)."""
    from conformance.mutation.killmatrix import property_sort_key
    from conformance.mutation.runner import Budget, first_failure, load_catalog

    catalog, broken = load_catalog()
    if broken:
        raise RuntimeError(f"property modules do not import: {broken}")
    out = {}
    session.world.run("benchmarks.tasks:count_collectives")
    for pid in sorted(catalog, key=property_sort_key):
        rates, collectives = [], []
        for rep in range(reps):
            session.world.run("benchmarks.tasks:take_collective_counts")
            t = time.perf_counter()
            n, case, error = first_failure(session, catalog[pid], Budget(examples, rep))
            took = time.perf_counter() - t
            if error is not None:
                raise RuntimeError(f"{pid} failed on the plain emulation while benchmarking: {error!r} on {case}")
            rates.append(n / took)
            counted = session.world.run("benchmarks.tasks:take_collective_counts")[0]  # rank 0's
            collectives.append(sum(counted.values()) / max(n, 1))
        out[pid] = median_of(rates, "examples/s", examples_per_run=examples,
                             collectives_per_example=round(statistics.median(collectives), 1))
    return out


def cost_growth(reps: int, session: Any, tokens: tuple[int, ...] = (16, 64, 256, 1024),
                hidden: tuple[int, ...] = (128, 1024, 4096)) -> dict[str, Any]:
    """Seconds per P1 example (dispatch both APIs, check) vs tokens per rank and hidden size, and bytes moved."""
    from conformance.core.example import Example

    cells = []
    for t in tokens:
        for h in hidden:
            case = Example(tokens_per_rank=(t, t), hidden=h, num_topk=2, num_experts=8, seed=3,
                           num_max_tokens_per_rank=t)
            session.check("P1-per-expert-payloads", case)  # buffers for this shape are built once, not per rep
            runs = []
            for _ in range(reps):
                start = time.perf_counter()
                session.check("P1-per-expert-payloads", case)
                runs.append(time.perf_counter() - start)
            moved = 2 * t * 2 * h * 2  # ranks x tokens x top-k copies x hidden x bf16 bytes (upper bound)
            cells.append({"tokens_per_rank": t, "hidden": h, "bytes_moved": moved,
                          **median_of(runs, "s per example")})
    small, large = cells[0], cells[-1]
    # growth exponent: time ~ bytes^k between the smallest and the largest cell (k <= 1: no faster than bytes)
    import math

    exponent = math.log(large["median"] / small["median"]) / math.log(large["bytes_moved"] / small["bytes_moved"])
    return {"cells": cells, "growth_exponent_time_vs_bytes": round(exponent, 3)}


def _pytest(args: list[str], report_dir: str, timeout: float = 1800) -> tuple[float, dict[str, Any]]:
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           f"--report-dir={report_dir}", *args], cwd=ROOT, env=_env(), capture_output=True, text=True,
                          timeout=timeout)
    wall = time.monotonic() - start
    if done.returncode != 0:
        raise RuntimeError(f"pytest {' '.join(args)} exited {done.returncode}:\n{done.stdout[-3000:]}")
    return wall, json.loads((Path(report_dir) / "conformance.json").read_text())


def main_job(reps: int, args: list[str]) -> dict[str, Any]:
    """The default main job (``pytest -n auto --nodes 2``): wall time, examples, examples/s."""
    walls, examples = [], []
    for _ in range(reps):
        with tempfile.TemporaryDirectory() as tmp:
            wall, report = _pytest(["-n", "auto", "--nodes", "2", *args], tmp)
        walls.append(wall)
        examples.append(sum(p.get("examples") or 0 for p in report["properties"]))
    return {"wall": median_of(walls, "s"), "examples": median_of(examples, "examples"),
            "examples_per_s": median_of([e / w for e, w in zip(examples, walls, strict=True)], "examples/s"),
            "command": "pytest -n auto --nodes 2 " + " ".join(args)}


def first_example(reps: int) -> dict[str, Any]:
    """``pytest -n 1 -k test_counts --max-examples 1``: pytest start to one example checked and the run ended."""
    walls = []
    for _ in range(reps):
        with tempfile.TemporaryDirectory() as tmp:
            walls.append(_pytest(["-n", "1", "-k", "test_counts", "--max-examples", "1"], tmp)[0])
    return median_of(walls, "s", command="pytest -n 1 -k test_counts --max-examples 1")


def xdist_scaling(reps: int) -> dict[str, Any]:
    """``-n 1`` vs ``-n 2`` on the same subset (P1-P8, 15 examples each), alternating, side by side."""
    subset = [f"conformance/properties/{m}" for m in ("test_p01_payloads.py", "test_p02_counts.py",
                                                     "test_p03_recv_topk_idx.py", "test_p04_weights.py",
                                                     "test_p05_combine.py", "test_p06_round_trip.py",
                                                     "test_p07_cached_dispatch.py", "test_p08_expand_layout.py")]
    subset = [s for s in subset if (ROOT / s).exists()]
    walls: dict[str, list[float]] = {"-n 1": [], "-n 2": []}
    for _ in range(reps):
        for workers in ("1", "2"):
            with tempfile.TemporaryDirectory() as tmp:
                walls[f"-n {workers}"].append(_pytest(["-n", workers, "--nodes", "2", "--max-examples", "15",
                                                       *subset], tmp)[0])
    ratios = [a / b for a, b in zip(walls["-n 1"], walls["-n 2"], strict=True)]
    return {"-n 1": median_of(walls["-n 1"], "s"), "-n 2": median_of(walls["-n 2"], "s"),
            "speedup_n2_over_n1": median_of(ratios, "x"), "properties": [Path(s).stem for s in subset]}


def mutation_matrix(args: list[str]) -> dict[str, Any]:
    """The kill matrix (``python -m conformance.mutation``): wall time and its summary (one run: it is long)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "mutation.json"
        start = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "conformance.mutation", "--report", str(report), *args],
                              cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=7200)
        wall = time.monotonic() - start
        summary = json.loads(report.read_text())["summary"] if report.exists() else {}
    keep = ("harmful", "benign", "harmful_killed", "benign_spared", "survivors", "false_alarms", "unattributed",
            "median_examples_to_kill", "not_applicable")
    return {"wall": {"median": round(wall, 1), "unit": "s", "runs": [round(wall, 1)]}, "exit_status": done.returncode,
            "command": "python -m conformance.mutation " + " ".join(args),
            **{k: summary[k] for k in keep if k in summary}}


#: The whole catalog on the real library (issue 25): one H200, two ranks sharing it, the four backends.
CATALOG_ARGS = ("--rank-setup shared --device cuda --nodes 1 --backends real-v1,real-v2,emulated-v1,emulated-v2 "
                "--max-examples 25")


def catalog_command(args: list[str], report_dir: str) -> list[str]:
    """The catalog's pytest command.  The plugin is loaded by name: where the checkout is not installed (the
    accelerator machine), a path option's value after a space (``--baseline /tmp/old.json``) would otherwise root
    pytest in that path's folder and leave every option of the suite unknown (docs/reference.md, "From a checkout
    that is not installed")."""
    return [sys.executable, "-m", "pytest", "-p", "conformance.plugin", "-p", "no:cacheprovider",
            f"--report-dir={report_dir}", *args]


def catalog(args: list[str], report_dir: str, jit_cache: str, fresh: bool, limit_s: float,
            profile: bool = False) -> dict[str, Any]:
    """The whole catalog as ``args`` says (one run: it is long), its JIT cache at ``jit_cache`` (``fresh``: emptied
    first: a cold run): wall time, examples, examples/s after the warm-up, the JIT's kernels and share of the wall,
    per property its examples/s; the run's report stays in ``report_dir`` (``limit_s``: SIGTERM then, the run writes
    its partial report).  ``profile``: the rank profiles (``CONFORMANCE_PROFILE_DIR``, cProfile: it slows the ranks),
    what dominates the rank time; without it the report's per-property wall times say where the time went."""
    import shutil

    from conformance.world.rank import PROFILE_ENV

    if fresh:
        shutil.rmtree(jit_cache, ignore_errors=True)
    profile_dir = tempfile.mkdtemp(prefix="catalog-profile-") if profile else ""
    env = {**_env(), "EP_JIT_CACHE_DIR": jit_cache, **({PROFILE_ENV: profile_dir} if profile else {})}
    start = time.monotonic()
    proc = subprocess.Popen(catalog_command(args, report_dir), cwd=ROOT, env=env)
    try:
        code = proc.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        proc.terminate()
        code = proc.wait(timeout=120)
    wall = time.monotonic() - start
    # run 21a on one H200: the call's limit came after pytest's end, with no word of what the benchmark was doing
    print(f"benchmarks catalog: pytest ended after {wall:.0f} s (exit {code}); reading its report"
          + (f" and the rank profiles in {profile_dir}" if profile else ""), flush=True)
    written = Path(report_dir) / "conformance.json"
    if not written.exists():
        raise SystemExit(f"benchmarks catalog: pytest wrote no report ({written}; exit {code}): its output above says "
                         f"why")
    report = json.loads(written.read_text())
    jit = report.get("jit") or {}
    warm = (jit.get("warm_up") or {}).get("wall_s", 0.0)
    ran = [p for p in report["properties"] if p["status"] not in ("not-run", "skipped")]
    examples = sum(p["examples"] for p in ran)
    rates = {p["id"]: round(p["examples"] / p["wall_s"], 2) for p in ran if p["wall_s"] > 0 and p["examples"]}
    return {"wall": {"median": round(wall, 1), "unit": "s", "runs": [round(wall, 1)]}, "exit_status": code,
            "complete": report.get("complete"), "statuses": report.get("summary"),
            "examples": examples, "examples_per_s_after_warm_up": round(examples / max(wall - warm, 1e-9), 2),
            "examples_per_s_per_property": rates,
            "median_examples_per_s_per_property": round(statistics.median(rates.values()), 2) if rates else None,
            "jit": {k: jit.get(k) for k in ("kernels", "compiles", "compile_s", "busy_s", "share", "by_kernel")},
            "warm_up_s": warm, "jit_cache": "cold (emptied first)" if fresh else "warm (kept)",
            "rank_profile": _timed("rank profiles read", rank_profile_shares, profile_dir) if profile else
            {"skipped": "the ranks were not profiled (--profile-ranks)"},
            "per_property_wall_s": {p["id"]: p["wall_s"] for p in ran},
            # with -n K the properties run side by side: their walls add up to more than the run's
            "property_wall_sum_s": round(sum(p["wall_s"] for p in ran), 1), "xdist_workers": _workers(args),
            "warm_up_made_by": (jit.get("warm_up") or {}).get("made_by"),
            "command": "pytest " + " ".join(args)}


def _workers(args: list[str]) -> str | int:
    """The ``-n`` of pytest arguments (``1``: none; ``auto`` as given: the report's header says how many started)."""
    value = None
    for i, arg in enumerate(args):
        if arg in ("-n", "--numprocesses") and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith("--numprocesses="):
            value = arg.partition("=")[2]
        elif arg.startswith("-n") and not arg.startswith("--") and len(arg) > 2:
            value = arg[2:]
    if value is None:
        return 1
    return int(value) if value.isdigit() else value


def _timed(what: str, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, saying how long it took (the catalog figure's steps after pytest, on a limited device call)."""
    began = time.monotonic()
    try:
        return fn(*args)
    finally:
        print(f"benchmarks catalog: {what} in {time.monotonic() - began:.1f} s", flush=True)


#: Rank-side functions that wait for the device or copy between host and device (cProfile names).
_SYNC_AND_COPY = ("synchronize", "'cpu'", "'cuda'", "'to'", "'copy_'", "'item'", "'tolist'", "'clone'",
                  "'numpy'", "wait", "record_stream")


def rank_profile_shares(folder: str) -> dict[str, Any]:
    """From the ranks' cProfile dumps: the share of task time in CUDA synchronisation and host/device copies."""
    import pstats

    files = sorted(Path(folder).glob("rank*.prof"))
    if not files:
        return {"error": f"no rank profile in {folder} (the world did not shut down cleanly?)"}
    stats = pstats.Stats(*map(str, files))
    total = sum(row[2] for row in stats.stats.values())  # tottime over every function
    hits: dict[str, float] = {}
    for (_, _, name), row in stats.stats.items():
        key = next((k for k in _SYNC_AND_COPY if k in name), None)
        if key is not None:
            hits[name] = hits.get(name, 0.0) + row[2]
    top = sorted(hits.items(), key=lambda kv: -kv[1])[:8]
    by_own = sorted(((f"{Path(file).name}:{line} {name}", row[2]) for (file, line, name), row in stats.stats.items()),
                    key=lambda kv: -kv[1])[:12]
    return {"task_time_s": round(total, 3), "sync_and_copy_s": round(sum(hits.values()), 3),
            "sync_and_copy_share": round(sum(hits.values()) / total, 4) if total else None,
            "top": [{"function": n, "s": round(s, 3)} for n, s in top], "ranks": len(files),
            "dominant": [{"function": n, "own_s": round(s, 3)} for n, s in by_own]}


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
            "gpu": gpu, "load_average_at_start": [round(x, 2) for x in os.getloadavg()], "host": platform.node()}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="reports/benchmark.json", help="where the figures go (JSON)")
    p.add_argument("--reps", type=int, default=3, help="repetitions of every figure (the median is reported)")
    p.add_argument("--long-reps", type=int, default=0,
                   help="repetitions of the pytest-run figures (first_example, main_job, xdist_scaling; "
                        "default: --reps)")
    p.add_argument("--examples", type=int, default=25, help="examples per property for the examples/s figures")
    p.add_argument("--only", default="", help="comma-separated subset of: " + ", ".join(FIGURES))
    p.add_argument("--skip", default="", help="comma-separated figures to leave out (e.g. mutation: it is long)")
    p.add_argument("--mutation-args", default="--jobs 2 --first-kill --order-from docs/kill-matrix.json",
                   help="options of the kill-matrix run")
    p.add_argument("--profile-ranks", action="store_true",
                   help="profile the ranks (cProfile) during the per-property figures and the catalog run, and report "
                        "the share of their time in synchronisation and copies (slows those figures: they are marked "
                        "profiled)")
    p.add_argument("--catalog-args", default=CATALOG_ARGS, help="the catalog figure's pytest arguments")
    p.add_argument("--catalog-report", default="reports/catalog", help="where the catalog figure's run reports")
    p.add_argument("--jit-cache", default=os.environ.get("EP_JIT_CACHE_DIR", "/tmp/deep_ep_jit"),
                   help="the catalog figure's EP_JIT_CACHE_DIR")
    p.add_argument("--cold", action="store_true", help="empty the JIT cache before the catalog figure (a cold run)")
    p.add_argument("--catalog-limit", type=float, default=3600, help="seconds before the catalog run is stopped")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="cuda: the emulation over CUDA (two ranks sharing the first GPU, gloo) for the per-example "
                        "figures, with the share of rank time in CUDA synchronisation and copies")
    args = p.parse_args(argv)
    args.long_reps = args.long_reps or args.reps
    chosen = set(filter(None, args.only.split(","))) or set(FIGURES) - {"catalog"}  # catalog: a real-library run
    unknown = (chosen | set(filter(None, args.skip.split(",")))) - set(FIGURES)
    if unknown:
        p.error(f"unknown figure(s) {sorted(unknown)}; choose from {', '.join(FIGURES)}")
    args.figures = [f for f in FIGURES if f in chosen and f not in args.skip.split(",")]
    return args


FIGURES = ("world_start", "harness_overhead", "properties", "cost_growth", "first_example", "main_job",
           "xdist_scaling", "mutation", "catalog")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out_path = ROOT / args.out if not os.path.isabs(args.out) else Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"schema": 1, "machine": machine(), "reps": args.reps, "device": args.device,
                               "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "figures": {}}

    def save() -> None:
        out_path.write_text(json.dumps(results, indent=1) + "\n")

    session = None
    for figure in args.figures:
        start = time.monotonic()
        print(f"benchmark: {figure} ...", flush=True)
        if figure == "world_start":
            value = world_start(args.reps, args.device)
        elif figure == "harness_overhead":
            value = harness_overhead(args.reps)
        elif figure in ("properties", "cost_growth"):
            if session is None:
                world: dict[str, Any] = {"rank_setup": "shared", "gpu_ids": ("0",)} if args.device == "cuda" else {}
                if args.profile_ranks:
                    from conformance.harness.options import GPU_RANK_ENV
                    from conformance.world.rank import PROFILE_ENV

                    profile_dir = tempfile.mkdtemp(prefix="benchmark-profile-")
                    env = dict(GPU_RANK_ENV) if args.device == "cuda" else {}
                    world["rank_env"] = {**env, PROFILE_ENV: profile_dir}
                elif args.device == "cuda":
                    from conformance.harness.options import GPU_RANK_ENV

                    world["rank_env"] = dict(GPU_RANK_ENV)
                session = _session(device=args.device, **world)
            value = (property_rates(args.reps, args.examples, session) if figure == "properties"
                     else cost_growth(args.reps, session))
        elif figure == "first_example":
            value = first_example(args.long_reps)
        elif figure == "main_job":
            value = main_job(args.long_reps, [])
        elif figure == "xdist_scaling":
            value = xdist_scaling(args.long_reps)
        elif figure == "catalog":
            value = catalog(args.catalog_args.split(), args.catalog_report, args.jit_cache, args.cold,
                            args.catalog_limit, args.profile_ranks)
        else:
            value = mutation_matrix(args.mutation_args.split())
        results["figures"][figure] = {**value, "took_s": round(time.monotonic() - start, 1)} \
            if isinstance(value, dict) else value
        save()
        print(f"benchmark: {figure} done in {time.monotonic() - start:.1f} s", flush=True)
    if session is not None:
        session.close()
        if args.profile_ranks:
            results["figures"]["rank_profile"] = {**rank_profile_shares(profile_dir), "profiled": True}
    results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    save()
    print(f"benchmark: wrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
