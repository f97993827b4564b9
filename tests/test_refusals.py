"""The refusal table (conformance/emulation/refusals.toml) and the emulation's refusals.

(a) The table is well formed: every row has its fields, ids are unique, every emulated row names an
    existing emulation function, recipe and neighbour, assertion messages cite their own source line, and
    (when a DeepEP mirror is present) every cited line holds the row's expression.
(b) On gloo worlds (1 node x 2 ranks, 2 nodes x 2 ranks for the internode / hybrid rows, 1 rank for the
    unsupported-rank rows) every emulated row's recipe raises on every rank with the row's exception type and
    message, without hanging, and its neighbour passes on every rank.
    A rank-local refusal on one rank only raises everywhere and leaves the buffer usable (V2, V1 low latency);
    the recipes' shared low-latency buffers are one at a time.
(c) Rows are counted per status.
(d) Every refusal mutant (conformance/mutation/mutants/refusals.py) changes what its row's recipe (a dropped
    refusal) or neighbour (a refusal of a valid call) does.
"""

from __future__ import annotations

import collections
import importlib
import os
import re
import subprocess
from pathlib import Path

import pytest
import tomllib

from conformance.core.example import Example
from conformance.emulation import _refusals
from conformance.world.launcher import World, WorldShape

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "conformance" / "emulation" / "refusals.toml"
#: A bare git mirror of DeepEP at the 2.1.0 build (dd758ca); CI has none.
MIRROR = Path(os.environ.get("DEEPEP_MIRROR", "/work/.mirror/deepseek-ai+DeepEP/repo"))

STATUSES = ("emulated", "emulated-differently", "unreachable", "pending", "environment")
LIVE = ("emulated", "emulated-differently")
MATCHES = ("exact", "pattern", "prefix")
EXCEPTIONS = ("RuntimeError", "AssertionError", "ValueError", "TypeError", "IndexError", "AttributeError",
              "ZeroDivisionError")
FIELDS = {
    "id": str, "api": str, "call": str, "condition": str, "source": str, "expression": str, "snippet": str,
    "exception": str,
    "message": str, "message_match": str, "reachable": bool, "reachable_note": str, "before_communication": bool,
    "status": str, "status_note": str, "emulated": str, "recipe": str, "neighbour": str, "world": str,
    "drawn_by": str,
}
#: The self-test world of each row (``world`` column) and the example its recipes start from.
SHAPES = {"1x2": WorldShape(1, 2), "2x2": WorldShape(2, 2), "1x1": WorldShape(1, 1)}
EXAMPLES = {
    "1x2": Example((6, 4), hidden=256, num_topk=2, num_experts=4, num_max_tokens_per_rank=16, seed=3),
    "2x2": Example((6, 4, 5, 3), hidden=256, num_topk=2, num_experts=8, num_max_tokens_per_rank=16, seed=3),
    "1x1": Example((5,), hidden=256, num_topk=2, num_experts=2, num_max_tokens_per_rank=16, seed=3),
}
TIMEOUT_S = 240
#: Recorded real-library errors (conformance/data/recorded_errors.json) and the table row of each.
RECORDED_ROWS = {
    "v1_int32_topk_idx": "v1_layout_topk_dtype",
    "v1_odd_num_sms": "v1_set_num_sms_odd",
    "v2_bf16_weights": "v2_dispatch_weights_dtype",
    "v2_cached_dispatch_without_num_experts": "v2_dispatch_num_experts_none",
    "v2_experts_not_divisible": "v2_dispatch_experts_not_divisible_auto",
    "v2_int32_topk_idx": "v2_dispatch_topk_dtype",
    "v2_previous_event_without_comm_alloc": "v2_dispatch_previous_event_without_comm_alloc",
    "v2_too_many_qps": "v2_dispatch_qps",
}


def load_table() -> dict:
    with open(TABLE, "rb") as f:
        return tomllib.load(f)


ROWS: list[dict] = load_table()["refusal"]
LIVE_ROWS = [r for r in ROWS if r["status"] in LIVE]


def message_matches(row: dict, message: str) -> bool:
    """Whether ``message`` is the row's message (exactly, as a ``{...}`` pattern, or as a prefix)."""
    return _refusals.matches(row["id"], message)


# ---------------------------------------------------------------------------------------- (a) the table
def test_every_row_has_its_fields_and_a_consistent_status() -> None:
    problems = []
    ids = collections.Counter(r["id"] for r in ROWS)
    problems += [f"duplicate id {i}" for i, n in ids.items() if n > 1]
    for r in ROWS:
        rid = r.get("id", "?")
        for name, kind in FIELDS.items():
            if not isinstance(r.get(name), kind):
                problems.append(f"{rid}: field {name} missing or not {kind.__name__}")
        if problems and problems[-1].startswith(rid):
            continue
        if r["status"] not in STATUSES or r["message_match"] not in MATCHES or r["exception"] not in EXCEPTIONS:
            problems.append(f"{rid}: bad status / message_match / exception")
        if not re.fullmatch(r"[\w./-]+\.(hpp|cu|cuh|py):\d+", r["source"]):
            problems.append(f"{rid}: source {r['source']!r} is not file:line")
        if (r["status"] == "unreachable") == r["reachable"]:
            problems.append(f"{rid}: status {r['status']} but reachable={r['reachable']}")
        if r["status"] == "pending":
            problems.append(f"{rid}: pending (every reachable row is emulated, with a recipe, or says why not)")
        if r["status"] != "emulated" and not r["status_note"]:
            problems.append(f"{rid}: status {r['status']} needs a status_note saying why")
        live = r["status"] in LIVE
        for name in ("emulated", "recipe", "neighbour", "world", "drawn_by"):
            if bool(r[name]) != live:
                problems.append(f"{rid}: {name} must be {'set' if live else 'empty'} for status {r['status']}")
        if live and (r["world"] not in SHAPES or r["drawn_by"] not in ("P12-bad-input", "self-test")):
            problems.append(f"{rid}: world {r['world']!r} / drawn_by {r['drawn_by']!r}")
        if live and r["drawn_by"] == "P12-bad-input" and r["world"] != "1x2":
            problems.append(f"{rid}: P12 draws on the suite's worlds; a {r['world']} recipe is a self-test")
    assert not problems, "\n".join(problems)


def test_emulated_rows_name_existing_functions_and_recipes() -> None:
    from conformance.tasks import bad_calls

    problems = []
    for r in LIVE_ROWS:
        path, _, qualname = r["emulated"].partition(":")
        module = path.removesuffix(".py").replace("/", ".")
        try:
            obj = importlib.import_module(module)
            for part in qualname.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError) as exc:
            problems.append(f"{r['id']}: emulated {r['emulated']!r} does not exist ({exc})")
        for name in (r["recipe"], r["neighbour"]):
            if name not in bad_calls.RECIPES:
                problems.append(f"{r['id']}: no recipe {name!r} in conformance/tasks/bad_calls.py")
        if not bad_calls.applies(r["recipe"], EXAMPLES[r["world"]], SHAPES[r["world"]].nodes):
            problems.append(f"{r['id']}: its recipe does not apply to the {r['world']} self-test example")
    names = {r["id"] for r in LIVE_ROWS}
    strays = [n for n in bad_calls.RECIPES if n.removesuffix(".ok") not in names]
    assert not problems and not strays, "\n".join(problems + [f"recipe {n} has no live table row" for n in strays])


def test_assertion_messages_cite_their_own_source_line_and_expression() -> None:
    problems = []
    for r in ROWS:
        m = re.fullmatch(r"Assertion exception \((.+?):(\d+)\): (.*)", r["message"], re.S)
        if r["exception"] != "RuntimeError" or m is None:
            continue
        path, line, text = m.groups()
        src_path, src_line = r["source"].rsplit(":", 1)
        if line != src_line or not os.path.normpath(path.replace("{build_root}/", "")).endswith(
                os.path.normpath(src_path).removeprefix("csrc/")):
            problems.append(f"{r['id']}: message cites {path}:{line}, source is {r['source']}")
        if text != r["expression"]:
            problems.append(f"{r['id']}: message text {text!r} != expression {r['expression']!r}")
    assert not problems, "\n".join(problems)


def test_recorded_errors_are_the_table_messages() -> None:
    import json

    recorded = json.loads((ROOT / "conformance" / "data" / "recorded_errors.json").read_text())["errors"]
    by_id = {r["id"]: r for r in ROWS}
    assert set(recorded) == set(RECORDED_ROWS)
    for name, (exc_type, message) in recorded.items():
        row = by_id[RECORDED_ROWS[name]]
        assert (row["exception"], row["status"]) == (exc_type, "emulated"), name
        assert message_matches(row, message), f"{name}: {message!r} vs table {row['message']!r}"


def _normalise(text: str) -> str:
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r"\s+", " ", text).strip()


def test_cited_lines_hold_their_expressions_in_the_deepep_source() -> None:
    if not (MIRROR / "HEAD").exists():
        pytest.skip(f"no DeepEP mirror at {MIRROR} (set DEEPEP_MIRROR to a bare git mirror of the 2.1.0 build); "
                    "the table's sources were verified against it when it was built")
    files: dict[str, list[str]] = {}
    problems = []
    for r in ROWS:
        path, line = r["source"].rsplit(":", 1)
        if path not in files:
            shown = subprocess.run(["git", "-C", str(MIRROR), "show", f"HEAD:{path}"], capture_output=True,
                                   text=True)
            files[path] = shown.stdout.splitlines() if shown.returncode == 0 else []
        lines = files[path]
        if not lines or int(line) > len(lines):
            problems.append(f"{r['id']}: {r['source']} not in the mirror")
        elif r["snippet"]:  # the check is not written on its line (a SWITCH_* macro, a Python-level failure)
            if r["snippet"] not in lines[int(line) - 1]:
                problems.append(f"{r['id']}: {r['source']} does not hold {r['snippet']!r}")
        elif _normalise(r["expression"]) not in _normalise("\n".join(lines[int(line) - 1:int(line) + 12])):
            problems.append(f"{r['id']}: {r['source']} does not hold {r['expression']!r}")
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------------------- (b) recipes on gloo worlds
@pytest.fixture(scope="module")
def world_1x2():
    """The 2-rank world, kept for the whole module (the mutant test reuses it)."""
    with World(SHAPES["1x2"]) as world:
        yield world


def _run_rows(world: World, kind: str) -> list[dict]:
    names = [n for r in LIVE_ROWS if r["world"] == kind for n in (r["recipe"], r["neighbour"])]
    return world.run("tests.refusal_tasks:run_recipes", names, EXAMPLES[kind].to_json(), timeout=TIMEOUT_S)


@pytest.fixture(scope="module")
def results(world_1x2) -> dict[str, list[dict]]:
    """Per world kind: every rank's ``{recipe name: (type, message)}`` for its rows' recipes and neighbours
    (one task per world; the 2x2 and 1-rank worlds are closed right after theirs)."""
    out = {"1x2": _run_rows(world_1x2, "1x2")}
    for kind in ("2x2", "1x1"):
        with World(SHAPES[kind]) as world:
            out[kind] = _run_rows(world, kind)
    return out


@pytest.mark.parametrize("kind", list(SHAPES))
def test_recipes_raise_the_table_exception_on_every_rank(results, kind: str) -> None:
    problems = []
    for r in (r for r in LIVE_ROWS if r["world"] == kind):
        for rank, per_rank in enumerate(results[kind]):
            got_type, got_message = per_rank[r["recipe"]]
            if got_type != r["exception"] or not message_matches(r, got_message or ""):
                problems.append(f"{r['id']} rank {rank}: got {got_type}: {got_message!r}\n"
                                f"    expected {r['exception']}: {r['message']!r} ({r['message_match']})")
    assert not problems, f"{len(problems)} recipe(s) on the {kind} world:\n" + "\n".join(problems)


@pytest.mark.parametrize("kind", list(SHAPES))
def test_neighbours_pass_on_every_rank(results, kind: str) -> None:
    problems = [
        f"{r['id']} rank {rank}: neighbour {r['neighbour']} raised {per_rank[r['neighbour']]}"
        for r in LIVE_ROWS if r["world"] == kind
        for rank, per_rank in enumerate(results[kind])
        if per_rank[r["neighbour"]] != (None, None)
    ]
    assert not problems, "\n".join(problems)


def test_a_rank_local_refusal_on_one_rank_raises_everywhere_and_leaves_the_buffer_usable(world_1x2) -> None:
    """V2 too many tokens on rank 0 only: rank 0 raises the library's error (buffer.hpp:756), rank 1 the
    emulation's PeerRefused (its real counterpart would wait in the kernel), and the next dispatch works."""
    row = next(r for r in ROWS if r["id"] == "v2_dispatch_too_many_tokens")
    example = EXAMPLES["1x2"]
    per_rank = world_1x2.run("tests.refusal_tasks:too_many_tokens_on_rank_0", example.to_json(), timeout=TIMEOUT_S)
    (type0, message0), (type1, message1) = (got["raised"] for got in per_rank)
    assert type0 == row["exception"] and message_matches(row, message0), per_rank[0]
    assert type1 == "PeerRefused" and "rank(s) [0]" in message1, per_rank[1]
    from conformance.core.example import build_all_inputs

    epr = example.experts_per_rank
    inputs = build_all_inputs(example)
    expected = [sum(int(((i.topk_idx >= 0) & (i.topk_idx // epr == rank)).any(1).sum()) for i in inputs)
                for rank in range(example.world_size)]
    assert [got["after_rows"] for got in per_rank] == expected


@pytest.mark.parametrize(("call", "row_id"), [("dispatch", "v1_ll_dispatch_1481"), ("combine", "v1_ll_combine_1623")])
def test_a_rank_local_low_latency_refusal_on_one_rank_raises_everywhere_and_leaves_the_buffer_usable(
        world_1x2, call: str, row_id: str) -> None:
    """Low-latency token counts only rank 0 gets wrong: rank 0 raises the library's error, rank 1 PeerRefused (its
    real counterpart would wait in the kernel), and the next dispatch and combine on the same buffer work."""
    row = next(r for r in ROWS if r["id"] == row_id)
    example = EXAMPLES["1x2"]
    per_rank = world_1x2.run("tests.refusal_tasks:ll_rank_local_on_rank_0", example.to_json(), call,
                             timeout=TIMEOUT_S)
    (type0, message0), (type1, message1) = (got["raised"] for got in per_rank)
    assert type0 == row["exception"] and message_matches(row, message0), per_rank[0]
    assert type1 == "PeerRefused" and "rank(s) [0]" in message1, per_rank[1]
    from conformance.core.example import build_all_inputs

    epr = example.experts_per_rank
    slots = [sum(int(((i.topk_idx >= 0) & (i.topk_idx // epr == rank)).sum()) for i in build_all_inputs(example))
             for rank in range(example.world_size)]
    assert [got["after_rows"] for got in per_rank] == slots
    assert [got["combined_rows"] for got in per_rank] == list(example.tokens_per_rank)


def test_low_latency_calls_with_two_mistakes_get_the_librarys_first_check(world_1x2) -> None:
    """A rank-local token-count check ends the checks (the later ones do not fire first), and the combine launcher
    checks zero-copy with LogFMT before SWITCH_HIDDEN (internode_ll.cu:1182, :1236)."""
    per_rank = world_1x2.run("tests.refusal_tasks:ll_two_mistakes", EXAMPLES["1x2"].to_json(), timeout=TIMEOUT_S)
    expected = {"dispatch_1481_1482": "v1_ll_dispatch_1481", "combine_1623_1624": "v1_ll_combine_1623",
                "combine_1182_1236": "v1_ll_combine_kernel_1182"}
    by_id = {r["id"]: r for r in ROWS}
    for rank, got in enumerate(per_rank):
        for call, row_id in expected.items():
            kind, message = got[call]
            assert kind == by_id[row_id]["exception"] and message_matches(by_id[row_id], message or ""), (
                f"rank {rank}, {call}: got {kind}: {message!r}, expected the first check {row_id}")


def test_shared_low_latency_buffers_are_one_at_a_time() -> None:
    """SharedBuffers keeps one buffer (per module and shape) and what was made on it; another shape, an RDMA buffer
    a recipe builds, or the end of the task destroys it (the real library has one NVSHMEM per process)."""
    import torch

    from conformance.core.example import build_rank_inputs
    from conformance.tasks import bad_calls

    destroyed: list[int] = []

    class Buffer:
        count = 0

        def __init__(self, group: object = None, **kwargs: object) -> None:
            Buffer.count += 1
            self.id = Buffer.count

        def destroy(self) -> None:
            destroyed.append(self.id)

    module = type("Module", (), {"Buffer": Buffer})
    example = EXAMPLES["1x2"]
    with bad_calls.SharedBuffers() as shared:
        env = bad_calls.BadCallEnv(module, None, 0, 2, example, build_rank_inputs(example, 0), torch.device("cpu"),
                                   shared=shared)
        first = env.ll_buffer()
        assert env.ll_buffer() is first and shared.memo("x", object) is shared.memo("x", object)
        made = shared.memo("x", object)
        other = env.ll_buffer(env.ll_shape(num_max_tokens=env.ll_shape().num_max_tokens + 4))
        assert destroyed == [first.id] and shared.memo("x", object) is not made
        private = env.ll_buffer(private=True)  # an RDMA buffer of the recipe's own: the shared one goes first
        assert destroyed == [first.id, other.id] and private not in (first, other)
        again = env.ll_buffer()
        env.release()
        assert destroyed == [first.id, other.id, private.id]
    assert destroyed == [first.id, other.id, private.id, again.id]


# ---------------------------------------------------------------------------------------- (c) counts
def test_rows_per_status(capsys) -> None:
    counts = collections.Counter(r["status"] for r in ROWS)
    reachable = collections.Counter(r["status"] for r in ROWS if r["reachable"])
    with capsys.disabled():
        print(f"\nrefusal table: {len(ROWS)} rows; " + ", ".join(f"{s} {counts[s]}" for s in STATUSES)
              + f"; reachable rows: {sum(reachable.values())} (" + ", ".join(f"{s} {reachable[s]}" for s in STATUSES
                                                                           if reachable[s]) + ")")
    assert sum(counts.values()) == len(ROWS) and set(counts) <= set(STATUSES)
    assert not reachable["unreachable"] and counts["emulated"] > 0


# ---------------------------------------------------------------------------------------- (d) mutants
def test_every_refusal_mutant_changes_its_rows_behaviour(world_1x2) -> None:
    from conformance.mutants import load_catalog, refusals

    by_id = {r["id"]: r for r in ROWS}
    problems = []
    for name, row_id in refusals.TARGETS.items():
        assert load_catalog()[name].kind == "harmful"
        row = by_id[row_id]
        assert row["world"] == "1x2", f"{name}: its row {row_id} needs the {row['world']} world"
        example = EXAMPLES["1x2"].to_json()
        per_rank = world_1x2.run("tests.refusal_tasks:run_recipes", [row["recipe"], row["neighbour"]], example, name,
                             timeout=TIMEOUT_S)
        for rank, got in enumerate(per_rank):
            recipe_type, recipe_message = got[row["recipe"]]
            still_refused = recipe_type == row["exception"] and message_matches(row, recipe_message or "")
            neighbour_passes = got[row["neighbour"]] == (None, None)
            if still_refused and neighbour_passes:
                problems.append(f"{name} ({row_id}) rank {rank}: recipe still refused and neighbour still passes")
    assert not problems, "\n".join(problems)
