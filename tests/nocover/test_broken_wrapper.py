"""A wrapper that always raises (issue 24): its failure is the verdict of every property it takes, found in seconds
without a world restart (each call ends in step on every rank, the world is kept), and the backends beside it are
still checked, on the draws of a run without the wrapper (their verdict is about their own calls)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.conftest import run_suite
from tests.helpers.raising_plugins import MESSAGE

pytestmark = pytest.mark.slow  # a whole run of the suite or more: scheduled first (tests/conftest.py)

WRAPPER = "tests.helpers.raising_plugins:AlwaysRaises"
#: One property per kind of call the wrapper makes: dispatch, cached dispatch (and combine), autograd.
PROPERTIES = ("P1-per-expert-payloads", "P7-cached-dispatch", "P9-gradients")


def test_a_wrapper_that_always_raises_fails_in_seconds_and_the_raw_api_beside_it_is_checked(tmp_path: Path) -> None:
    started = time.monotonic()
    proc, report = run_suite(["-p", "no:xdist", "--backends", f"{WRAPPER},emulated-v1", "--deep-ep", "emulation",
                              "--device", "cpu", "--max-examples", "5", "--max-restarts", "0", "-k",
                              "p01 or p07 or p09"], tmp_path / "reports", timeout=300)
    wall = time.monotonic() - started
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    by_id = {p["id"]: p for p in report["properties"]}
    for pid in PROPERTIES:
        wrapper, raw = by_id[pid]["verdicts"][WRAPPER], by_id[pid]["verdicts"]["emulated-v1"]
        assert wrapper["status"] == "failed" and wrapper["held"] == 0, (pid, wrapper)
        assert MESSAGE in wrapper["reason"] and "the world was kept" in wrapper["reason"], (pid, wrapper["reason"])
        assert "budget" not in wrapper["reason"], (pid, wrapper["reason"])  # no restart was charged (max 0)
        # the raw API beside it: judged on draws of its own (those of a run without the wrapper), and it held
        assert raw["status"] == "passed" and raw["held"] == raw["checked"] > 0 < wrapper["checked"], (pid, raw)
    # three properties, each shrinking its failure: seconds, not minutes (about 15 s here, most of it pytest's start)
    assert wall < 60, f"{wall:.0f} s"
