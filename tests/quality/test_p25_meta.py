"""Meta-tests of P25-clean-exit: it catches a V2 destroy() that does not release the buffer (the destructor then
crashes the exit) and a wrapper that leaves its buffer to the garbage collector; a wrapper with a teardown passes; the
raw V2 left to the collector is the library's known defect; the emulation behaves as the library does at exit."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conformance.core.cases import ExitCase
from conformance.strategies.lifecycle import exit_cases, exit_example
from tests.conftest import ROOT, run_suite
from tests.helpers import zygote
from tests.helpers.meta import assert_caught, fails

pytestmark = pytest.mark.slow  # a whole run of the suite or more: scheduled first (tests/conftest.py)

PID = "P25-clean-exit"


def test_catches_a_destroy_that_leaves_the_buffer_to_the_destructor(emulated_session) -> None:
    case, message = assert_caught(emulated_session, PID, "v2-destroy-leaves-the-runtime", exit_cases(2), shrink=False)
    assert case.scenario == "teardown", case
    assert "emulated-v2" in message and "illegal memory access" in message and "SIGABRT" in message, message


def test_holds_on_the_emulation_and_the_raw_v2_left_to_the_collector_is_the_known_defect(emulated_session) -> None:
    assert fails(emulated_session, PID, ExitCase(exit_example(2), "teardown"), None) is None
    recorder = emulated_session.recorder
    assert fails(emulated_session, PID, ExitCase(exit_example(2), "garbage-collected"), None) is None
    assert "v2-buffer-outlives-process-group" in recorder.known_defects, recorder.known_defects


def test_a_wrapper_without_teardown_fails_and_one_with_a_teardown_passes(tmp_path: Path) -> None:
    tears, leaves = "tests.helpers.exit_plugins:TearsDown", "tests.helpers.exit_plugins:LeavesItToTheCollector"
    proc, report = run_suite(["-p", "no:xdist", "--backends", f"emulated-v2,{tears},{leaves}", "--deep-ep",
                              "emulation", "--device", "cpu", "conformance/properties/test_p25_clean_exit.py"],
                             tmp_path / "reports", timeout=600)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    (p25,) = [p for p in report["properties"] if p["id"] == PID]
    assert p25["verdicts"][tears]["status"] == "passed", p25["verdicts"][tears]
    verdict = p25["verdicts"][leaves]
    assert verdict["status"] == "failed" and "A defect of the wrapper" in verdict["reason"], verdict
    assert "no teardown" in verdict["reason"] and "illegal memory access" in verdict["reason"], verdict["reason"]


def test_the_emulated_elastic_buffer_dies_at_exit_only_when_collected_after_its_group(tmp_path: Path) -> None:
    """Three interpreters (forked from the self-tests' zygote, which is what a fresh one is: tests/helpers/zygote.py),
    each exiting after ``destroy_process_group()`` with the buffer collected after it, destroyed or dropped before."""
    script = """
import sys, torch.distributed as dist
sys.path.insert(0, {root!r})
from conformance import emulation
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=0, world_size=1)
KEPT = emulation.ElasticBuffer(dist.group.WORLD, num_max_tokens_per_rank=16, hidden=256, num_topk=1,
                               explicitly_destroy={explicit})
{before}
dist.destroy_process_group()
print("exiting", flush=True)
"""
    outcomes = {}
    for name, explicit, before in (("collected after", False, ""), ("destroyed before", True, "KEPT.destroy()"),
                                   ("dropped before", False, "KEPT = None")):
        module = f"exit_at_{len(outcomes)}"
        (tmp_path / f"{module}.py").write_text(script.format(root=str(ROOT), port=29000 + len(outcomes),
                                                             explicit=explicit, before=before))
        proc, _ = zygote.run(module, [], cwd=tmp_path, env=dict(os.environ), timeout=120)
        outcomes[name] = (proc.returncode, proc.stderr)
    code, err = outcomes["collected after"]
    assert code == -6 and "cudaErrorIllegalAddress" in err and "buffer.hpp:203" in err, outcomes
    assert outcomes["destroyed before"][0] == 0 and outcomes["dropped before"][0] == 0, outcomes
