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
    monkeypatch.setattr(jit, "JOB_LIMIT_S", 3.0)
    monkeypatch.setattr(jit, "warmed", lambda config: None)
    config = SimpleNamespace(device="cpu", shape=SimpleNamespace(ranks_per_node=2), gpu_ids=[], rank_setup="isolated",
                             rank_env={}, shapes="jit")
    lines: list[str] = []
    result = jit.warm_up(config, str(tmp_path), lines.append)
    from conformance.strategies.vocabulary import named

    assert len(result["jobs"]) == len(jit.jobs(named("jit"))) == 10, result
    assert result["side_by_side"] == jit.CPU_SIDE_BY_SIDE
    stopped = [j for j in result["jobs"] if "stopped" in j]
    assert len(stopped) == 1 and stopped[0]["exit"] == 3, result["jobs"]
    assert "at its 3 s limit" in stopped[0]["stopped"] and "wrote no report" in stopped[0]["stopped"]
    assert "got SIGTERM" in Path(stopped[0]["log"]).read_text()  # SIGTERM, not SIGKILL: it could write its report
    for job in result["jobs"]:
        assert Path(job["log"]).read_text().startswith("stand-in job"), job
    assert any("stopped at its 3 s limit" in line for line in lines), lines
    assert result["wall_s"] < 30
