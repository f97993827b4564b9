"""End to end: the main job on a planted defect fails, with a shrunk counterexample and a reproduction line.  (The
version gate on a planted regression is tests/nocover/test_report_versions.py's gate test: it checks every assertion of
the three runs that stood here.)"""

import json
import os

import pytest

from tests.conftest import ROOT
from tests.helpers import zygote

pytestmark = pytest.mark.slow  # a whole run of the suite or more: scheduled first (tests/conftest.py)


def test_main_job_reports_a_planted_defect(planted_run) -> None:
    """The session's run of P1 and P5 with a planted byte flip (tests/conftest.py: PLANTED_RUN)."""
    proc, report = planted_run.proc, planted_run.report
    assert proc.returncode == 1, proc.stdout[-3000:]
    (entry,) = [p for p in report["properties"] if p["id"] == "P1-per-expert-payloads"]
    assert entry["status"] == "failed"
    assert sum(entry["counterexample"]["tokens_per_rank"]) == 1, entry["counterexample"]
    assert "recv_x[rank 3, expert" in entry["message"] and "src (" in entry["message"]
    # the flipped byte reaches P1 and P5 (its combine sums the flipped row), nothing else of the run
    assert report["summary"]["failed"] == 2 and {p["id"] for p in report["properties"] if p["status"] == "failed"} \
        == {"P1-per-expert-payloads", "P5-combine"}, report["summary"]
    assert report["environment"]["backends"][0]["real"] is False
    # The reproduction line replays the same failure outside pytest.
    repro = entry["repro"].split(" ", 3)
    assert repro[:3] == ["python", "-m", "conformance.repro"]
    replay, _ = zygote.run("conformance.repro", _split(repro[3]), cwd=ROOT, env=dict(os.environ), timeout=300)
    assert replay.returncode == 1 and "bytes differ" in replay.stdout, replay.stdout + replay.stderr


def test_main_job_passes_and_writes_the_report(catalog_runs) -> None:
    """The main job's form (``-n 2 --nodes 2``): the session's two-node catalog run."""
    proc, report = catalog_runs[2].proc, catalog_runs[2].report
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert report["summary"]["failed"] == 0 and report["summary"]["total"] >= 1
    env = report["environment"]
    assert (env["nodes"], env["ranks_per_node"], env["device"]) == (2, 2, "cpu")
    assert isinstance(env["seed"], int) and env["torch"]
    for entry in report["properties"]:
        assert set(entry) >= {"id", "test", "backends", "status", "examples", "wall_s", "counterexample", "repro",
                              "message"}
        # every property drew examples, but an option's mode that is off (P31 without --soak): skipped, saying why
        assert entry["examples"] > 0 or (entry["status"] == "skipped" and entry["message"]), entry
    json.dumps(report)


def _split(text: str) -> list[str]:
    import shlex

    return shlex.split(text)


def test_a_rank_dying_mid_example_is_a_clear_failure_and_the_world_recovers(emulated_session) -> None:
    """The library kills a rank inside dispatch: the check fails naming that rank (others' stacks shown),
    the world is rebuilt, and the very next example runs normally."""

    from conformance.core.example import Example
    from conformance.world.errors import RankCrashed

    example = Example(tokens_per_rank=(0, 2), hidden=128, num_topk=1, num_experts=2)
    with emulated_session.planted("rank-dies-in-dispatch"), pytest.raises(RankCrashed) as info:
        emulated_session.check("P1-per-expert-payloads", example)
    assert info.value.culprits == [1] and "exited with code -9" in info.value.per_rank[1]
    assert info.value.per_rank[0]  # the survivor's side too: its traceback (gloo saw the peer go) or stacks
    emulated_session.check("P1-per-expert-payloads", example)  # a fresh world, same session: holds again
    replay, _ = zygote.run("conformance.repro", ["P1-per-expert-payloads", example.to_json(), "--backends", "emulated",
                                                 "--device", "cpu", "--mutant", "rank-dies-in-dispatch"],
                           cwd=ROOT, env=dict(os.environ), timeout=300)
    assert replay.returncode == 1 and "crashed (process died) on rank(s) [1]" in replay.stdout, replay.stdout


def test_a_repro_line_naming_the_shape_vocabulary_replays() -> None:
    """A run on the jit vocabulary writes ``--shapes jit`` into its repro lines; repro takes it (the case is replayed
    as given, already on its shapes)."""
    case = ('{"tokens_per_rank":[1,1],"hidden":256,"num_topk":1,"num_experts":2,"expert_alignment":1,'
            '"routing":"random","mask_ratio":0.0,"payload":"integers","seed":0,"num_max_tokens_per_rank":16}')
    replay, _ = zygote.run("conformance.repro", ["P2-counts", case, "--backends", "emulated", "--device", "cpu",
                                                 "--shapes", "jit"], cwd=ROOT, env=dict(os.environ), timeout=300)
    assert replay.returncode == 0 and "PASSED P2-counts" in replay.stdout, replay.stdout + replay.stderr
