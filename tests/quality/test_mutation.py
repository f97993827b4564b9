"""Self-tests of the mutation tool (``python -m conformance.mutation``): the CLI on a fast subset, its exit
statuses, the engine's classification of failures, and the kill-matrix summary."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hypothesis import strategies as st

from conformance.canonical import receipts_from_view
from conformance.core.example import Example
from conformance.mutants import load_catalog
from conformance.mutation.killmatrix import exit_status, mutant_entry, property_outcome, summarize
from conformance.mutation.runner import Budget, first_failure, run_property, short_message
from conformance.tasks.dispatch import dispatch_views
from conformance.world.errors import RankRaised, RankTimeout
from tests.helpers import zygote

ROOT = Path(__file__).resolve().parents[2]
P1 = "P1-per-expert-payloads"
FAST_HARMFUL = ["flip-one-byte", "drop-one-token", "wrong-source-index"]
FAST_BENIGN = ["v2-reversed-receive-order"]
ENTRY_KEYS = {"name", "kind", "description", "killed", "killed_by", "examples_to_kill", "wall_s", "properties"}
SUMMARY_KEYS = {"harmful", "benign", "harmful_killed", "benign_spared", "survivors", "false_alarms",
                "median_examples_to_kill", "wall_s", "max_examples", "world"}


def run_cli(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    """Run the mutation CLI in a process of its own (tests/helpers/zygote.py); return the process and its report (``{}``
    if none)."""
    report = tmp_path / "mutation.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc, _ = zygote.run("conformance.mutation", ["--report", str(report), *args], cwd=ROOT, env=env, timeout=300)
    return proc, (json.loads(report.read_text()) if report.exists() else {})


# ----------------------------------------------------------------------------------------------- CLI
def test_fast_subset_kills_the_harmful_and_spares_the_benign(tmp_path: Path) -> None:
    names = FAST_HARMFUL + FAST_BENIGN
    proc, report = run_cli(tmp_path, "--mutants", ",".join(names), "--properties", P1, "--max-examples", "12")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [e["name"] for e in report["mutants"]] == names
    for entry in report["mutants"]:
        assert set(entry) >= ENTRY_KEYS and entry["kind"] == load_catalog()[entry["name"]].kind
        assert list(entry["properties"]) == [P1]
        cell = entry["properties"][P1]
        if entry["kind"] == "harmful":
            assert entry["killed"] and entry["killed_by"] == [P1], entry
            assert 1 <= entry["examples_to_kill"] == cell["examples"] <= 12
            assert cell["outcome"] == "killed" and cell["message"] and json.loads(cell["example"])
        else:
            assert not entry["killed"] and entry["killed_by"] == [] and entry["examples_to_kill"] is None, entry
            assert (cell["outcome"], cell["examples"], cell["message"], cell["example"]) == ("held", 12, None, None)
        assert entry["name"] in proc.stdout  # the table row
    summary = report["summary"]
    assert set(summary) >= SUMMARY_KEYS
    assert (summary["harmful"], summary["harmful_killed"]) == (len(FAST_HARMFUL), len(FAST_HARMFUL))
    assert (summary["benign"], summary["benign_spared"]) == (1, 1)
    assert summary["survivors"] == summary["false_alarms"] == []
    assert summary["median_examples_to_kill"] == sorted(e["examples_to_kill"] for e in report["mutants"][:3])[1]
    assert summary["max_examples"] == 12 and summary["world"]["nodes"] * summary["world"]["ranks_per_node"] == 2


def test_a_surviving_harmful_mutant_fails_the_run_also_across_jobs(tmp_path: Path) -> None:
    # One example per property is Hypothesis' simplest draw: no rank sends a token, so nothing can be
    # corrupted and both mutants survive.  Two worker processes, one mutant each; rows merge in order.
    proc, report = run_cli(tmp_path, "--mutants", "flip-one-byte,drop-one-token", "--properties", P1,
                           "--max-examples", "1", "--jobs", "2")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert report["summary"]["survivors"] == ["flip-one-byte", "drop-one-token"]
    assert [e["name"] for e in report["mutants"]] == ["flip-one-byte", "drop-one-token"]
    assert all(e["properties"][P1]["outcome"] == "held" and e["properties"][P1]["examples"] == 1
               for e in report["mutants"])
    assert "SURVIVOR (harmful, no property failed): flip-one-byte" in proc.stdout


@pytest.mark.parametrize("option, bad, valid", [("--mutants", "no-such-mutant", "flip-one-byte"),
                                                ("--properties", "P99-nothing", P1)])
def test_unknown_names_exit_2_listing_the_valid_ones(tmp_path: Path, option: str, bad: str, valid: str) -> None:
    proc, report = run_cli(tmp_path, option, bad)
    assert proc.returncode == 2 and report == {}
    assert f"unknown {bad}" in proc.stderr and valid in proc.stderr


# ------------------------------------------------------------------------------- engine (no world)
class FakeSession:
    """Stands in for a Session: ``check`` runs ``behaviour(case, mutant)``; records what it saw."""

    def __init__(self, behaviour) -> None:
        self.behaviour, self.mutant, self.seen = behaviour, "m", []
        self.config = SimpleNamespace(world_size=2, shape=SimpleNamespace(size=2, nodes=1, ranks_per_node=2))

    @contextlib.contextmanager
    def planted(self, mutant):
        previous, self.mutant = self.mutant, mutant
        try:
            yield
        finally:
            self.mutant = previous

    def check(self, property_id: str, case: int) -> None:
        self.seen.append((case, self.mutant))
        self.behaviour(case, self.mutant)


def _fails_when(predicate, exc=AssertionError):
    def behaviour(case: int, mutant: str | None) -> None:
        if predicate(case, mutant):
            raise exc("planted")
    return behaviour


INTS = st.integers(0, 1000)
PROP = SimpleNamespace(id="P", strategy=lambda world: INTS, explicit=None)


def test_first_failure_is_seeded_and_stops_at_the_first_failing_draw() -> None:
    runs = []
    for _ in range(2):
        session = FakeSession(_fails_when(lambda case, mutant: case > 900))
        runs.append((first_failure(session, PROP, Budget(50, seed=3)), list(session.seen)))
    (count, case, error), seen = runs[0]
    assert runs[0][0][:2] == runs[1][0][:2] and runs[0][1] == runs[1][1]  # same seed, same draws
    assert case > 900 and isinstance(error, AssertionError) and count == len(seen)
    assert all(c <= 900 for c, _ in seen[:-1]) and seen[-1][0] == case  # nothing checked after it


def test_run_property_classifies_failures() -> None:
    budget = Budget(20, seed=0)
    mutant_only = _fails_when(lambda case, mutant: mutant is not None and case > 0)
    cell = run_property(FakeSession(mutant_only), PROP, budget)
    assert cell["outcome"] == "killed" and cell["message"] == "AssertionError: planted" and int(cell["example"]) > 0
    hang = _fails_when(lambda case, mutant: mutant is not None, lambda msg: RankTimeout("t", {1: msg}))
    cell = run_property(FakeSession(hang), PROP, budget)
    assert cell["outcome"] == "killed" and cell["examples"] == 1 and "RankTimeout" in cell["message"]
    always = _fails_when(lambda case, mutant: case > 0)
    assert run_property(FakeSession(always), PROP, budget)["outcome"] == "unattributed"
    crash = _fails_when(lambda case, mutant: True, TypeError)
    assert run_property(FakeSession(crash), PROP, budget)["outcome"] == "error"
    never = _fails_when(lambda case, mutant: False)
    cell = run_property(FakeSession(never), PROP, budget)
    assert (cell["outcome"], cell["examples"], cell["message"]) == ("held", 20, None) and cell["wall_s"] >= 0


def test_short_message_names_where_a_rank_hung_and_what_a_rank_raised() -> None:
    stacks = ('Thread 0x1 (most recent call first):\n  File "rank.py", line 94 in watch\n\n'
              'Current thread 0x2 (most recent call first):\n  File "payloads.py", line 9 in mutate\n'
              '  File "patching.py", line 50 in after\n')
    hung = short_message(RankTimeout("dispatch_views", {1: stacks, 0: "waiting"}, culprits=[1]))
    assert hung.startswith("RankTimeout: dispatch_views: timed out") and 'hung at File "payloads.py"' in hung
    raised = short_message(RankRaised("dispatch_views", {0: "Traceback ...\n  ...\nValueError: bad ids\n"}))
    assert raised.endswith("rank 0: ValueError: bad ids")


# ----------------------------------------------------------------------------------- kill matrix
def _entry(name: str, kind: str, cells: dict[str, tuple[str, int]]) -> dict:
    return mutant_entry(name, kind, "d", {pid: property_outcome(o, n, None if o == "held" else "msg")
                                          for pid, (o, n) in cells.items()}, 1.0)


def test_entry_derives_killers_and_examples_to_kill() -> None:
    entry = _entry("m", "harmful", {"P10-x": ("killed", 3), "P2-y": ("killed", 7), "P3-z": ("unattributed", 1),
                                    "P4-w": ("held", 25)})
    assert entry["killed"] and entry["killed_by"] == ["P2-y", "P10-x"] and entry["examples_to_kill"] == 3
    none = _entry("n", "harmful", {"P1-a": ("held", 25), "P3-z": ("unattributed", 1)})
    assert not none["killed"] and none["killed_by"] == [] and none["examples_to_kill"] is None


def test_summary_counts_median_survivors_and_false_alarms() -> None:
    entries = [
        _entry("a", "harmful", {"P1-a": ("killed", 2)}),
        _entry("b", "harmful", {"P1-a": ("killed", 5)}),
        _entry("c", "harmful", {"P1-a": ("held", 25)}),
        _entry("d", "benign", {"P1-a": ("held", 25)}),
        _entry("e", "benign", {"P1-a": ("killed", 9)}),
    ]
    summary = summarize(entries, wall_s=3.21, max_examples=25, world={"nodes": 1})
    assert summary["median_examples_to_kill"] == 3.5  # of the killed harmful mutants only (2, 5)
    assert (summary["harmful"], summary["harmful_killed"], summary["benign"], summary["benign_spared"]) == (3, 2, 2, 1)
    assert summary["survivors"] == ["c"] and summary["false_alarms"] == ["e"]
    assert exit_status(summary) == 1
    clean = summarize(entries[:2] + entries[3:4], wall_s=1, max_examples=25, world={})
    assert clean["median_examples_to_kill"] == 3.5 and exit_status(clean) == 0
    broken = summarize([_entry("a", "harmful", {"P1-a": ("killed", 2), "P2-b": ("error", 1)})], wall_s=1,
                       max_examples=25, world={})
    assert broken["errors"] == ["a / P2-b: msg"] and exit_status(broken) == 1
    assert summarize([entries[2]], wall_s=1, max_examples=25, world={})["median_examples_to_kill"] is None


# ------------------------------------------------------------------------- the benign mutant bites
def test_benign_reordering_changes_v2_rows_but_not_the_receipts(emulated_session) -> None:
    """Spared must mean 'allowed', not 'inert': the V2 raw order really changes, V1 and receipts do not."""
    # top-k = every expert, nothing masked: each rank receives every token of every rank.
    example = Example(tokens_per_rank=(5, 4), hidden=128, num_topk=4, num_experts=4, num_max_tokens_per_rank=16)
    with emulated_session.planted(None):
        clean = emulated_session.run(dispatch_views, example)
    with emulated_session.planted("v2-reversed-receive-order"):
        mutated = emulated_session.run(dispatch_views, example)
    for before, after in zip(clean, mutated, strict=True):
        v1, v2 = before["emulated-v1"], before["emulated-v2"]
        assert torch.equal(after["emulated-v1"].src_token, v1.src_token)
        assert not torch.equal(after["emulated-v2"].src_token, v2.src_token)
        assert torch.equal(after["emulated-v2"].src_rank, v2.src_rank)  # still grouped by source rank
        for field in ("expert", "src_rank", "src_token", "x", "weight"):
            assert torch.equal(getattr(receipts_from_view(after["emulated-v2"]), field),
                               getattr(receipts_from_view(v2), field))
