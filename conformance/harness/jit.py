"""DeepEP V2's JIT: the compile log of a run, its warm-up before the first property, and their share of the wall time.

**The log.** Where a backend compiles per shape (the real V2, or a plug-in / class backend over it), the ranks get
``EP_JIT_NVCC_COMPILER`` = :mod:`conformance.tools.nvcc_timed` (the real ``nvcc``, timed: one JSON line per compile
in ``<report dir>/jit.log``; a user's own ``EP_JIT_NVCC_COMPILER`` is left alone) and keep the library's own
``EP_JIT_CACHE_DIR`` (a persistent one makes a second run compile nothing: docs/ci).  :func:`summary` reads the log:
kernels compiled, compile seconds, the wall seconds during which at least one compile ran, and that share of the
run's wall time.

**The warm-up** (``--warm-up auto``: on where a backend compiles per shape and the run draws on a shape vocabulary).
Before the first property, the vocabulary's kernels are compiled by running the properties that use them on each
vocabulary shape, a few examples each, in several small pytest runs side by side (each its own 2-rank world; on one
GPU all of them share it, on several each takes its own), every one writing into the same kernel cache.  A kernel
compiles in one process at a time (each call of the JIT is synchronous), so the side-by-side runs are what make the
compiles concurrent; the run proper then finds its kernels in the cache.  Their verdicts are not the run's (the
run checks every property again); a warm-up run that fails only costs compiles later, and says why (the end of its
output, :func:`log_tail`, in its entry and the progress line).  A run stops at its limit, or once the compile log has
been quiet a while (:data:`QUIET_S`): what is left then is examples, not compiles.  A run that fails before any kernel
compiled ends the warm-up (the other runs would fail the same way: a library whose API the properties cannot drive).

**With xdist** (``-n K``, e.g. several worlds sharing one GPU: ``--rank-setup shared``) the warm-up is made once for
the run, by the first worker to reach it (:func:`warm_up_once`: a lock in the report folder); the others wait for it
(their properties would compile the same kernels meanwhile, each worker on its own) and the controller's report
carries what it did (:func:`shared_warm_up`).
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conformance.core.outcomes import Status

#: The log's file name in the report directory.
LOG = "jit.log"
#: The environment variable naming the log (inherited by the warm-up runs, which log into the parent's).
LOG_ENV = "CONFORMANCE_JIT_LOG"
TOOL = Path(__file__).resolve().parents[1] / "tools" / "nvcc_timed.py"
#: Properties whose kernels depend on the shape (on every vocabulary shape), split in two runs per shape; and those
#: drawn on the small shape only (``Property.shapes == "small"``), on the first.
ALL_SHAPES = (("P1-per-expert-payloads", "P5-combine", "P7-cached-dispatch", "P9-gradients"),
              ("P8-expand-layout", "P13-determinism", "P18-fp8-payloads", "P19-worst-case"))
SMALL_SHAPE = (("P10-events", "P11-qp-cap", "P20-dispatch-options"),
               ("P21-buffer-options", "P22-epilogue-events", "P30-call-sequences"))
#: P12's sweep (each refusal row's bad call and its valid neighbour, made on every run): on the real V2 nearly every
#: valid neighbour is a kernel of its own (another number of SMs, experts, hidden size...), about 30 kernels the sweep
#: would compile one after another, nearly all of its time on a cold cache.  The warm-up makes the sweep in
#: :data:`SWEEP_PARTS` runs side by side, each a part of its cases (:data:`PART_ENV`).
SWEEP = "P12-bad-input"
SWEEP_PARTS = 4
#: The variable that gives a warm-up run its part of every property's explicit cases, ``"I/K"`` (the I-th of K:
#: cases I, I+K, I+2K...; :func:`explicit_part`).
PART_ENV = "CONFORMANCE_EXPLICIT_PART"
#: Examples per property in a warm-up run (the draws reach the options that select other kernels).
EXAMPLES = 2
#: Seconds a warm-up run may take before it is stopped (its compiles come first; a run held up by a slow or hanging
#: property must not hold up the run proper: what it did not compile compiles later, when needed).
JOB_LIMIT_S = 150.0
#: Once every warm-up run has started, no compile has ended for this many seconds and the warm-up has run
#: :data:`QUIET_MIN_S`, the runs still going are stopped: the vocabulary's kernels are compiled, what is left is their
#: examples (the compiles end well before the runs that made them).  A kernel a stopped run had yet to compile
#: compiles when needed.
QUIET_S = 25.0
QUIET_MIN_S = 45.0
#: The file a finished warm-up leaves in the kernel cache: a later run on the same vocabulary, DeepEP and backends
#: skips its warm-up (``--warm-up auto``): the kernels are there.
MARKER = "conformance-warm-up.json"
#: Warm-up runs side by side on a CPU (``--warm-up on`` over the emulation: the self-test of the machinery).
CPU_SIDE_BY_SIDE = 2


def rank_env(compiles: bool, report_dir: str) -> dict[str, str]:
    """The environment the ranks need to log their compiles (nothing where no backend compiles per shape, or where
    the user set ``EP_JIT_NVCC_COMPILER`` themselves)."""
    if not compiles or os.environ.get("EP_JIT_NVCC_COMPILER"):
        return {}
    log = os.environ.get(LOG_ENV) or os.path.join(os.path.abspath(report_dir), LOG)
    return {"EP_JIT_NVCC_COMPILER": str(TOOL), LOG_ENV: log}


def read_log(path: str, since: float = 0.0) -> list[dict[str, Any]]:
    """The compiles logged in ``path`` that started at or after ``since`` (epoch seconds)."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("start", 0) >= since:
            out.append(entry)
    return out


def busy_seconds(entries: list[dict[str, Any]]) -> float:
    """Seconds during which at least one compile ran (the union of their intervals)."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted((e["start"], e["end"]) for e in entries):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def summary(path: str, since: float, wall_s: float) -> dict[str, Any]:
    """Kernels compiled (distinct instantiations, compiles: the ranks of a world compile the same kernel each),
    compile seconds, busy seconds and their share of ``wall_s``."""
    entries = [e for e in read_log(path, since) if e.get("kind", "cubin") == "cubin"]
    busy = busy_seconds(entries)
    kinds: dict[str, int] = {}
    for kernel in {e.get("kernel", "") for e in entries}:
        name = kernel.split("<", 1)[0] or "unknown"
        kinds[name] = kinds.get(name, 0) + 1
    return {"log": path, "compiles": len(entries), "kernels": len({e.get("kernel", "") for e in entries}),
            "by_kernel": dict(sorted(kinds.items())),
            "compile_s": round(sum(e["end"] - e["start"] for e in entries), 1),
            "busy_s": round(busy, 1), "wall_s": round(wall_s, 1),
            "share": round(busy / wall_s, 3) if wall_s > 0 else None,
            "failed": sum(1 for e in entries if e.get("exit"))}


@dataclass(frozen=True)
class Job:
    """One warm-up run: the properties' test modules on one vocabulary shape."""

    shape: int
    properties: tuple[str, ...]
    #: this run's part of the explicit cases (``part`` of ``parts``), or ``None``: all of them
    part: int | None = None
    parts: int = 1

    def describe(self, vocabulary: Any) -> str:
        part = f" (part {self.part + 1} of {self.parts} of its explicit cases)" if self.part is not None else ""
        return f"shape {self.shape} ({vocabulary.shapes[self.shape].describe()}): {', '.join(self.properties)}{part}"

    def env(self) -> dict[str, str]:
        """What the run's environment adds: its part of the explicit cases."""
        return {PART_ENV: f"{self.part}/{self.parts}"} if self.part is not None else {}


def jobs(vocabulary: Any) -> list[Job]:
    """Every vocabulary shape with the shape-dependent properties, the first with the small-shape ones too, and P12's
    sweep in parts (its own shapes)."""
    out = [Job(i, group) for i in range(len(vocabulary.shapes)) for group in ALL_SHAPES]
    out += [Job(0, group) for group in SMALL_SHAPE]
    return out + [Job(0, (SWEEP,), part, SWEEP_PARTS) for part in range(SWEEP_PARTS)]


def explicit_part(cases: list[Any]) -> list[Any]:
    """``cases`` (a property's explicit cases), or this warm-up run's part of them (:data:`PART_ENV`)."""
    part = os.environ.get(PART_ENV)
    if not part:
        return cases
    index, _, count = part.partition("/")
    return cases[int(index)::int(count)]


def command(job: Job, config: Any, report_dir: str, modules: dict[str, str]) -> list[str]:
    """The pytest command of one warm-up run (the run's backends that compile per shape, its world and set-up)."""
    compiling = [b.name for b in config.backends if b.api == "v2" and b.real]
    backends = compiling or [b.name for b in config.backends if b.api == "v2"]  # (--warm-up on, on the emulation)
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
            *[modules[p] for p in job.properties if p in modules], "--backends", ",".join(backends),
            "--nodes", "1", "--ranks-per-node", str(config.shape.ranks_per_node), "--device", config.device,
            "--rank-setup", config.rank_setup, "--shapes", f"{config.shapes}:{job.shape}", "--warm-up", "off",
            "--max-examples", str(EXAMPLES), "--conformance-seed", str(config.seed or 0), "--report-dir", report_dir,
            "--example-timeout", str(config.example_timeout_s), "--max-restarts", "1"]
    # the sweep's parts keep the known defects (a known defect's row, counted as failed, would end the part's
    # explicit cases: Hypothesis stops at an explicit case's failure)
    args += [] if job.part is not None else ["--known-defects", "none"]
    return args + (["--deep-ep", config.deep_ep_mode or ""] if config.deep_ep else [])


def _stop(proc: subprocess.Popen) -> None:
    """Stop a warm-up run: SIGTERM (the run writes its partial report), SIGKILL if it is still there 20 s later."""
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _quiet(log: str | None, wall_started: float, started: float) -> str | None:
    """Why the warm-up's remaining runs can stop (:data:`QUIET_S`), or ``None``: the compile log (``log``, epoch
    seconds) shows compiles of this warm-up, the last ended :data:`QUIET_S` ago, and :data:`QUIET_MIN_S` have passed."""
    if log is None or time.monotonic() - started < QUIET_MIN_S:
        return None
    ends = [e.get("end", 0.0) for e in read_log(log, wall_started)]
    if not ends or time.time() - max(ends) < QUIET_S:
        return None
    return f"after {QUIET_S:.0f} s without a compile (the warm-up's kernels are compiled)"


#: How much of a failed warm-up run's output its entry and the progress line show (its last lines).
TAIL_LINES = 12
TAIL_CHARS = 1500


def log_tail(path: str) -> str:
    """The last :data:`TAIL_LINES` non-empty lines of a warm-up run's output (at most :data:`TAIL_CHARS`)."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as exc:
        return f"(its output could not be read: {exc})"
    lines = [line.rstrip() for line in text.splitlines() if line.strip()][-TAIL_LINES:]
    tail = "\n".join(lines)
    return (tail[-TAIL_CHARS:] if len(tail) > TAIL_CHARS else tail) or "(it printed nothing)"


def _where(folder: str) -> str:
    """Where a stopped warm-up run had got to, from its partial report (its log.txt says more)."""
    try:
        report = json.loads((Path(folder) / "conformance.json").read_text())
    except (OSError, ValueError):
        return "it wrote no report (see its log.txt)"
    reached = [p["id"] for p in report.get("properties", []) if p.get("status") != Status.NOT_RUN]
    return f"the last property it reported: {reached[-1]}" if reached else "it reported no property"


def cache_dir() -> Path:
    """DeepEP's kernel cache (``EP_JIT_CACHE_DIR``, else ``~/.deep_ep``: csrc/jit/compiler.hpp)."""
    return Path(os.environ.get("EP_JIT_CACHE_DIR") or Path.home() / ".deep_ep")


def marker_for(config: Any) -> dict[str, Any]:
    """What a warm-up marker says: the vocabulary, the DeepEP version, the backends that compiled."""
    return {"vocabulary": config.shapes, "deep_ep": (config.deep_ep_probe or {}).get("version"),
            "backends": sorted(b.name for b in config.backends if b.api == "v2" and b.real)}


def warmed(config: Any) -> str | None:
    """Why no warm-up is needed (the cache holds an earlier warm-up of this vocabulary, DeepEP and backends)."""
    try:
        found = json.loads((cache_dir() / MARKER).read_text())
    except (OSError, ValueError):
        return None
    want = marker_for(config)
    if (found.get("vocabulary"), found.get("deep_ep")) == (want["vocabulary"], want["deep_ep"]) and \
            set(want["backends"]) <= set(found.get("backends") or ()):
        return f"the kernel cache {cache_dir()} was warmed for {want['vocabulary']} on deep_ep {want['deep_ep']}"
    return None


def for_selected(todo: list[Job], selected: frozenset[str] | None) -> list[Job]:
    """The warm-up jobs of the properties a run selected (each job with those of its properties only); all of them
    where ``selected`` is ``None``."""
    if selected is None:
        return todo
    return [dataclasses.replace(job, properties=tuple(p for p in job.properties if p in selected))
            for job in todo if set(job.properties) & selected]


def warm_up(config: Any, report_dir: str, progress: Callable[[str], None],
            selected: frozenset[str] | None = None) -> dict[str, Any]:
    """Run the warm-up jobs of the ``selected`` properties (all where ``None``) side by side (as many at once as the
    GPUs allow: all of them on a shared GPU); return what each did and the warm-up's wall time.  Skipped where the
    kernel cache is already warm (:func:`warmed`) or no selected property has a job.  Only a warm-up of every job
    leaves the marker that lets a later run skip it."""
    skip = warmed(config)
    if skip:
        progress(f"conformance: JIT warm-up skipped: {skip} (delete {cache_dir() / MARKER} to warm it again)")
        return {"jobs": [], "wall_s": 0.0, "side_by_side": 0, "skipped": skip}
    from conformance.properties import module_files
    from conformance.strategies.vocabulary import named
    from conformance.world.rank import die_with_parent

    vocabulary = named(config.shapes)
    modules = module_files()
    every = jobs(vocabulary)
    todo = for_selected(every, selected)
    if not todo:
        progress("conformance: JIT warm-up skipped: no selected property has warm-up runs (their kernels compile "
                 "when first needed)")
        return {"jobs": [], "wall_s": 0.0, "side_by_side": 0, "skipped": "no selected property has warm-up runs"}
    per_world = config.shape.ranks_per_node
    gpus = list(config.gpu_ids)
    if config.device != "cuda":
        slots: list[list[str]] = [[]] * CPU_SIDE_BY_SIDE
    elif config.rank_setup == "shared":
        slots = [gpus[:1]] * len(todo)
    else:
        slots = [gpus[i:i + per_world] for i in range(0, len(gpus) - per_world + 1, per_world)] or [gpus[:per_world]]
    started, wall_started = time.monotonic(), time.time()
    running: list[tuple[Job, subprocess.Popen, int, float, str]] = []  # job, process, slot, start, folder
    quieted: dict[int, str] = {}  # pid -> why the run was stopped once the compiles were over (:func:`_quiet`)
    result_note: list[str] = []  # why the warm-up ended before its runs did
    done: list[dict[str, Any]] = []
    free = list(range(len(slots)))
    queue = list(enumerate(todo))
    base = os.path.join(os.path.abspath(report_dir), "warm-up")
    progress(f"conformance: JIT warm-up: {len(todo)} small runs of the properties on the {vocabulary.name} shapes "
             f"({min(len(slots), len(todo))} side by side), before the first property")
    try:
        while queue or running:
            while queue and free:
                index, job = queue.pop(0)
                slot = free.pop(0)
                env = dict(os.environ, CUDA_VISIBLE_DEVICES=",".join(slots[slot]))
                if LOG_ENV in config.rank_env:  # the warm-up's compiles go into the run's own log
                    env[LOG_ENV] = config.rank_env[LOG_ENV]
                env.pop("PYTEST_XDIST_WORKER", None)
                env.update(job.env())
                folder = os.path.join(base, f"job{index}")
                os.makedirs(folder, exist_ok=True)
                with open(os.path.join(folder, "log.txt"), "wb") as log:  # why a job failed or ran long
                    proc = subprocess.Popen(command(job, config, folder, modules), env=env, stdout=log,
                                            stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
                running.append((job, proc, slot, time.monotonic(), folder))
            time.sleep(0.5)
            quiet = _quiet(config.rank_env.get(LOG_ENV), wall_started, started) if not queue else None
            if quiet:  # SIGTERM to every run still going at once (each writes its partial report)
                for _, proc, _, _, _ in running:
                    if proc.poll() is None:
                        proc.terminate()
                        quieted[proc.pid] = quiet
            for entry in list(running):
                job, proc, slot, began, folder = entry
                limit = proc.poll() is None and time.monotonic() - began > JOB_LIMIT_S
                stopped = f"at its {JOB_LIMIT_S:.0f} s limit" if limit else quieted.get(proc.pid)
                if stopped:  # SIGTERM first: the job writes its partial report, which says where it was
                    _stop(proc)
                if proc.poll() is None:
                    continue
                running.remove(entry)
                free.append(slot)
                done.append({"job": job.describe(vocabulary), "exit": proc.returncode,
                             "wall_s": round(time.monotonic() - began, 1), "log": os.path.join(folder, "log.txt")})
                if stopped:
                    done[-1]["stopped"] = f"{stopped}; {_where(folder)}"
                elif proc.returncode:  # it failed on its own: what it said last is why
                    done[-1]["said"] = log_tail(os.path.join(folder, "log.txt"))
                progress(f"conformance: JIT warm-up {len(done)}/{len(todo)} done: {job.describe(vocabulary)} in "
                         f"{time.monotonic() - began:.0f} s (exit {proc.returncode})"
                         + (f"; stopped {done[-1]['stopped']}" if stopped else "")
                         + (f"; it said:\n{done[-1]['said']}" if "said" in done[-1] else ""))
                log = config.rank_env.get(LOG_ENV)
                if "said" in done[-1] and not (log and read_log(log, wall_started)) and \
                        (queue or any(other.poll() is None for _, other, _, _, _ in running)):
                    # a run that failed before anything compiled: the others would fail the same way (a library
                    # whose API the properties cannot drive: DeepEP 2.5.0's ten runs each exited 1 after 40 s)
                    given_up = (f"job {len(done)} failed (exit {proc.returncode}) before any kernel compiled: the "
                                f"other {len(queue) + len(running)} runs were not waited for")
                    result_note.append(given_up)
                    progress(f"conformance: JIT warm-up ends: {given_up}; the run proper compiles what it needs")
                    queue.clear()
                    for _, other, _, _, _ in running:
                        if other.poll() is None:
                            other.terminate()
                            quieted[other.pid] = "once a run failed before any kernel compiled"
    finally:  # an interrupted run leaves no warm-up run behind
        for _, proc, _, _, _ in running:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    result = {"jobs": done, "wall_s": round(time.monotonic() - started, 1), "side_by_side": min(len(slots), len(todo))}
    if result_note:
        result["ended_early"] = result_note[0]
    if config.device == "cuda" and todo == every:
        try:
            cache_dir().mkdir(parents=True, exist_ok=True)
            (cache_dir() / MARKER).write_text(json.dumps({**marker_for(config), "jobs": done}, indent=1))
        except OSError:
            pass
    return result


#: The xdist workers' warm-up (:func:`warm_up_once`): in ``<report dir>/warm-up/``, the lock the workers take and what
#: the one that made it did (``result-<run key>.json``).
SHARED_LOCK = ".lock"
SHARED_RESULT = "result-{key}.json"


def _shared_folder(report_dir: str) -> str:
    return os.path.join(os.path.abspath(report_dir), "warm-up")


def warm_up_once(config: Any, report_dir: str, progress: Callable[[str], None], selected: frozenset[str] | None,
                 *, key: str, who: str) -> dict[str, Any]:
    """(an xdist worker) The run's warm-up (:func:`warm_up`), made once for all its workers: the first worker to take
    the lock makes it and leaves what it did under the run's ``key``; the others wait for the lock (their properties
    would otherwise compile the same kernels at the same time, each on its own) and return where it was made and how
    long they waited.  A worker that dies while making it leaves no result: the next one to take the lock makes it."""
    folder = _shared_folder(report_dir)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, SHARED_RESULT.format(key=key))
    began = time.monotonic()
    with open(os.path.join(folder, SHARED_LOCK), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes (or the process ends)
        try:
            made = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            made = None
        if made is not None:
            waited = round(time.monotonic() - began, 1)
            progress(f"conformance: JIT warm-up made by {made.get('made_by')} for every worker ({who} waited "
                     f"{waited:.0f} s)")
            return {"made_by": made.get("made_by"), "waited_s": waited}
        result = {**warm_up(config, report_dir, progress, selected), "made_by": who}
        with open(path + ".tmp", "w") as f:
            json.dump(result, f)
        os.replace(path + ".tmp", path)
        return result


def shared_warm_up(report_dir: str, key: str) -> dict[str, Any] | None:
    """(the xdist controller) What the run's one warm-up did (:func:`warm_up_once`), or ``None``: none was made."""
    try:
        return json.loads(Path(_shared_folder(report_dir), SHARED_RESULT.format(key=key)).read_text())
    except (OSError, ValueError):
        return None


def forget_shared_warm_ups(report_dir: str) -> None:
    """(a run's controller, at its start) Remove what earlier runs' warm-ups left in the report folder's
    ``warm-up/result-*.json``."""
    for stale in Path(_shared_folder(report_dir)).glob(SHARED_RESULT.format(key="*")):
        try:
            stale.unlink()
        except OSError:
            pass
