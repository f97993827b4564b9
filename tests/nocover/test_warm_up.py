"""The JIT warm-up's scheduling (``conformance.harness.jit.warm_up``), with stand-in jobs: every job runs, at most
as many side by side as there are slots, each leaves its output in ``job<N>/log.txt``, and a job past its limit is
stopped with SIGTERM (so it can write its partial report) and named as stopped.  On one H200 (runs 19a and 21a) one
warm-up job of ten reached the limit each time, with its output thrown away: nothing said what held it up."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

from conformance.harness import jit

SLOW = 0  # the job number that hangs


def _stand_in(job: jit.Job, config, folder: str, modules) -> list[str]:
    """A job that prints its shape and ends at once, or (job SLOW) sleeps until stopped, saying it got SIGTERM."""
    number = int(Path(folder).name.removeprefix("job"))
    body = ("import signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *a: (print('got SIGTERM', flush=True), sys.exit(3)))\n"
            f"print('stand-in job {number} on shape {job.shape}', flush=True)\n"
            + ("time.sleep(60)\n" if number == SLOW else ""))
    return [sys.executable, "-c", body]


def test_every_job_runs_keeps_its_output_and_a_job_past_its_limit_is_stopped(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(jit, "command", _stand_in)
    monkeypatch.setattr(jit, "JOB_LIMIT_S", 1.5)
    monkeypatch.setattr(jit, "warmed", lambda config: None)
    config = SimpleNamespace(device="cpu", shape=SimpleNamespace(ranks_per_node=2), gpu_ids=[], rank_setup="isolated",
                             rank_env={}, shapes="jit")
    lines: list[str] = []
    result = jit.warm_up(config, str(tmp_path), lines.append)
    from conformance.strategies.vocabulary import named

    assert len(result["jobs"]) == len(jit.jobs(named("jit"))) == 10 + jit.SWEEP_PARTS, result
    assert result["side_by_side"] == jit.CPU_SIDE_BY_SIDE
    stopped = [j for j in result["jobs"] if "stopped" in j]
    assert len(stopped) == 1 and stopped[0]["exit"] == 3, result["jobs"]
    assert "at its 2 s limit" in stopped[0]["stopped"] and "wrote no report" in stopped[0]["stopped"]
    assert "got SIGTERM" in Path(stopped[0]["log"]).read_text()  # SIGTERM, not SIGKILL: it could write its report
    for job in result["jobs"]:
        assert Path(job["log"]).read_text().startswith("stand-in job"), job
    assert any("stopped at its 2 s limit" in line for line in lines), lines
    assert result["wall_s"] < 30


def _compiles_then_lingers(job: jit.Job, config, folder: str, modules) -> list[str]:
    """A job that logs one compile at once (as ``nvcc_timed`` does) and then runs examples for a minute."""
    body = ("import json, os, signal, sys, time\n"
            "now = time.time()\n"
            "with open(os.environ['CONFORMANCE_JIT_LOG'], 'a') as f:\n"
            "    f.write(json.dumps({'start': now, 'end': now, 'exit': 0, 'kernel': 'k', 'kind': 'cubin'}) + '\\n')\n"
            "signal.signal(signal.SIGTERM, lambda *a: sys.exit(3))\n"
            "time.sleep(60)\n")
    return [sys.executable, "-c", body]


def test_once_the_compiles_are_over_the_remaining_runs_are_stopped(tmp_path, monkeypatch) -> None:
    """Runs 16 and 19a (one H200): the warm-up's compiles ended 41-53 s after the first began, its runs went on to
    100 s and 150 s; a quiet compile log ends the warm-up instead."""
    monkeypatch.setattr(jit, "command", _compiles_then_lingers)
    monkeypatch.setattr(jit, "CPU_SIDE_BY_SIDE", 10 + jit.SWEEP_PARTS)
    monkeypatch.setattr(jit, "QUIET_S", 1.0)
    monkeypatch.setattr(jit, "QUIET_MIN_S", 2.5)  # every stand-in has started and logged by then
    monkeypatch.setattr(jit, "warmed", lambda config: None)
    log = tmp_path / "jit.log"
    config = SimpleNamespace(device="cpu", shape=SimpleNamespace(ranks_per_node=2), gpu_ids=[], rank_setup="isolated",
                             rank_env={jit.LOG_ENV: str(log)}, shapes="jit")
    lines: list[str] = []
    result = jit.warm_up(config, str(tmp_path), lines.append)
    assert len(result["jobs"]) == 10 + jit.SWEEP_PARTS and 2.5 <= result["wall_s"] < 30, result
    assert all("without a compile" in job.get("stopped", "") and job["exit"] != 0 for job in result["jobs"]), result
    assert jit.read_log(str(log))


def test_no_compile_log_no_early_stop(tmp_path, monkeypatch) -> None:
    """Without a compile log (the emulation's warm-up) nothing is stopped for quiet."""
    assert jit._quiet(None, 0.0, 0.0) is None
    monkeypatch.setattr(jit, "QUIET_MIN_S", 0.0)
    assert jit._quiet(str(tmp_path / "absent.log"), 0.0, 0.0) is None  # no compile seen yet


def _fails_at_once_or_lingers(job: jit.Job, config, folder: str, modules) -> list[str]:
    """Job 0 fails at once saying why (as every run did on DeepEP 2.5.0, whose API the properties cannot drive), before
    any compile; the others would run a minute."""
    number = int(Path(folder).name.removeprefix("job"))
    body = ("import signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *a: sys.exit(3))\n"
            + ("print('E   AttributeError: module deep_ep has no attribute ElasticBuffer', flush=True)\n"
               "print('1 failed in 0.1s', flush=True)\nsys.exit(1)\n" if number == 0 else "time.sleep(60)\n"))
    return [sys.executable, "-c", body]


def test_a_run_that_fails_before_any_compile_says_why_and_ends_the_warm_up(tmp_path, monkeypatch) -> None:
    """DeepEP 2.5.0 (issue 36): the ten warm-up runs each exited 1 after about 40 s, saying nothing, before the first
    property.  A failed run now shows the end of its output, and one that failed before anything compiled ends the
    warm-up (the others would fail the same way)."""
    monkeypatch.setattr(jit, "command", _fails_at_once_or_lingers)
    monkeypatch.setattr(jit, "warmed", lambda config: None)
    config = SimpleNamespace(device="cpu", shape=SimpleNamespace(ranks_per_node=2), gpu_ids=[], rank_setup="isolated",
                             rank_env={jit.LOG_ENV: str(tmp_path / "jit.log")}, shapes="jit")
    lines: list[str] = []
    result = jit.warm_up(config, str(tmp_path), lines.append)
    failed = [job for job in result["jobs"] if job["exit"] == 1]
    assert len(failed) == 1 and "no attribute ElasticBuffer" in failed[0]["said"], result["jobs"]
    assert any("it said:" in line and "no attribute ElasticBuffer" in line for line in lines), lines
    assert "before any kernel compiled" in result["ended_early"], result
    assert len(result["jobs"]) == jit.CPU_SIDE_BY_SIDE < 10 and result["wall_s"] < 30, result  # none queued started
    assert all("once a run failed" in job["stopped"] for job in result["jobs"] if job is not failed[0]), result


def test_p12_sweep_is_warmed_in_parts_that_make_every_case_once(monkeypatch) -> None:
    """Run 24a (one H100, cold): P12's sweep compiled its valid neighbours' kernels one after another, 157 s.  The
    warm-up makes the sweep in parts side by side: each part's run gets its share through the environment, the parts
    together make every explicit case exactly once, and they keep the known defects (a known defect's row counted as
    failed would end the part's explicit cases)."""
    from conformance.strategies.vocabulary import named

    parts = [job for job in jit.jobs(named("jit")) if job.part is not None]
    assert [job.properties for job in parts] == [(jit.SWEEP,)] * jit.SWEEP_PARTS
    cases = list(range(11))  # run 24a's sweep: 11 cases on one node
    shares = []
    for job in parts:
        monkeypatch.setenv(jit.PART_ENV, job.env()[jit.PART_ENV])
        shares.append(jit.explicit_part(cases))
    assert sorted(case for share in shares for case in share) == cases and all(shares), shares
    monkeypatch.delenv(jit.PART_ENV)
    assert jit.explicit_part(cases) == cases  # the run proper: all of them
    config = SimpleNamespace(backends=[SimpleNamespace(name="real-v2", api="v2", real=True)],
                             shape=SimpleNamespace(ranks_per_node=2), device="cuda", rank_setup="shared", shapes="jit",
                             example_timeout_s=60, seed=1, deep_ep=None, deep_ep_mode=None)
    modules = {jit.SWEEP: "p12.py", "P1-per-expert-payloads": "p1.py"}
    assert "--known-defects" not in jit.command(parts[0], config, "/tmp/x", modules)
    assert "p12.py" in jit.command(parts[0], config, "/tmp/x", modules)
    assert "none" in jit.command(jit.jobs(named("jit"))[0], config, "/tmp/x", modules)
    assert "part 1 of 4" in parts[0].describe(named("jit"))


def test_a_run_of_some_properties_warms_up_for_those_only() -> None:
    """Run 27b (one H100, the real 2.5.0, cold): a run of P12 alone spent its 150 s limit warming up the whole
    catalog's kernels and never reached P12.  The warm-up runs the selected properties' jobs only, each job with the
    selected ones of its properties; none selected: no warm-up run."""
    from conformance.strategies.vocabulary import named

    every = jit.jobs(named("jit"))
    assert jit.for_selected(every, None) == every
    only_p12 = jit.for_selected(every, frozenset({jit.SWEEP}))
    assert len(only_p12) == jit.SWEEP_PARTS and all(job.properties == (jit.SWEEP,) for job in only_p12)
    p1 = jit.for_selected(every, frozenset({"P1-per-expert-payloads", "P14-api-surface"}))
    assert len(p1) == len(named("jit").shapes) and all(job.properties == ("P1-per-expert-payloads",) for job in p1)
    assert jit.for_selected(every, frozenset({"P14-api-surface"})) == []


def _worker_warms_up(report_dir: str, key: str, who: str, out) -> None:
    """(a forked stand-in xdist worker) its call of ``warm_up_once``; the stand-in warm-up (patched before the fork)
    appends a line per making to ``made.txt``."""
    lines: list[str] = []
    out.put((who, jit.warm_up_once(None, report_dir, lines.append, None, key=key, who=who), lines))


def test_xdist_workers_make_one_warm_up_for_the_run(tmp_path, monkeypatch) -> None:
    """With ``-n K`` (several worlds sharing one GPU, ``--rank-setup shared``) every worker reaches the warm-up: one of
    them makes it, the others wait for it and say whose it was; the controller's report reads what it did.  A later
    run in the same report folder (another key) makes its own, once the controller forgot the earlier one."""
    import multiprocessing

    made = tmp_path / "made.txt"

    def stand_in(config, report_dir, progress, selected=None):
        with open(made, "a") as f:
            f.write("made\n")
        import time

        time.sleep(1.0)  # the others arrive while it is being made
        return {"jobs": [{"job": "stand-in"}], "wall_s": 1.0, "side_by_side": 1}

    monkeypatch.setattr(jit, "warm_up", stand_in)
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    workers = [context.Process(target=_worker_warms_up, args=(str(tmp_path), "run1", f"gw{i}", out))
               for i in range(3)]
    for w in workers:
        w.start()
    results = {}
    for _ in workers:
        who, result, lines = out.get(timeout=60)
        results[who] = (result, lines)
    for w in workers:
        w.join(timeout=30)
    assert made.read_text().count("made") == 1, results
    makers = [who for who, (result, _) in results.items() if "jobs" in result]
    assert len(makers) == 1 and results[makers[0]][0]["made_by"] == makers[0], results
    for who, (result, lines) in results.items():
        if who != makers[0]:
            assert result["made_by"] == makers[0] and result["waited_s"] > 0, result
            assert lines == [f"conformance: JIT warm-up made by {makers[0]} for every worker ({who} waited "
                             f"{result['waited_s']:.0f} s)"], lines
    assert jit.shared_warm_up(str(tmp_path), "run1") == results[makers[0]][0]
    jit.forget_shared_warm_ups(str(tmp_path))
    assert jit.shared_warm_up(str(tmp_path), "run1") is None
    again = jit.warm_up_once(None, str(tmp_path), [].append, None, key="run2", who="gw1")
    assert again["made_by"] == "gw1" and made.read_text().count("made") == 2
