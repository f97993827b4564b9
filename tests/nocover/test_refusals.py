"""The refusal table of DeepEP 2.1.0 (conformance/versions/2.1.0/refusals.toml) and the emulation's refusals.

(a) The table is well formed: every row has its fields, ids are unique, every emulated row names an
    existing emulation function and has exactly one recipe (its edit columns or a stateful recipe of
    conformance/tasks/refusals/) that applies in its self-test world, assertion messages cite their own source line,
    and (when a DeepEP mirror is present) every cited line holds the row's expression.  The edit columns are made as
    conformance/tasks/refusals/edits.py documents (a stand-in module records the calls).
(b) On gloo worlds (1 node x 2 ranks, 2 nodes x 2 ranks for the internode / hybrid rows, 1 rank for the
    unsupported-rank rows) every emulated row's recipe raises on every rank with the row's exception type and
    message, without hanging, and its neighbour passes on every rank.
    A rank-local refusal on one rank only raises everywhere and leaves the buffer usable (V2, V1 low latency);
    the recipes' shared low-latency buffers are one at a time.
(c) Rows are counted per status.
(d) Every refusal mutant (conformance/mutants/refusals.py) changes what its row's recipe (a dropped
    refusal) or neighbour (a refusal of a valid call) does.
"""

from __future__ import annotations

import collections
import functools
import importlib
import os
import re
import subprocess
from pathlib import Path

import pytest
import tomllib

from conformance import versions
from conformance.core.cases import P12_TOPOLOGIES, p12_rows
from conformance.core.example import Example
from conformance.world.launcher import World, WorldShape

#: Its module-scoped fixtures are built once: under xdist (the self-tests run with -n) its tests share a worker.
pytestmark = pytest.mark.xdist_group("test_refusals")

ROOT = Path(__file__).resolve().parents[2]
TABLE = versions.contract("2.1.0").refusals.path
#: A bare git mirror of DeepEP at the 2.1.0 build (dd758ca); CI has none.
MIRROR = Path(os.environ.get("DEEPEP_MIRROR", "/work/.mirror/deepseek-ai+DeepEP/repo"))

STATUSES = ("emulated", "emulated-differently", "unreachable", "pending", "environment")
LIVE = ("emulated", "emulated-differently")
MATCHES = ("exact", "pattern", "prefix")
EXCEPTIONS = ("RuntimeError", "AssertionError", "ValueError", "TypeError", "IndexError", "AttributeError",
              "ZeroDivisionError")
FIELDS = {
    "id": str, "call": str, "condition": str, "source": str, "expression": str, "snippet": str, "exception": str,
    "message": str, "message_match": str, "reachable_note": str, "before_communication": bool, "status": str,
    "status_note": str, "emulated": str,
}
#: The recipe columns, on live rows only (and each optional there).
RECIPE_FIELDS = {"topology": str, "requires": str, "self_test_only": str, "valid_call": str, "given": dict,
                 "edit": dict}
#: The self-test worlds and the example a row's recipes start from there.
SHAPES = {"1x2": WorldShape(1, 2), "2x2": WorldShape(2, 2), "1x1": WorldShape(1, 1)}
#: The self-test world of each recipe topology: the smallest world it applies to.
WORLD_OF_TOPOLOGY = {"any": "1x2", "single": "1x2", "v1-intranode": "1x2", "v1-internode": "2x2", "hybrid": "2x2",
                     "one-rank": "1x1"}
EXAMPLES = {
    "1x2": Example((6, 4), hidden=256, num_topk=2, num_experts=4, num_max_tokens_per_rank=16, seed=3),
    "2x2": Example((6, 4, 5, 3), hidden=256, num_topk=2, num_experts=8, num_max_tokens_per_rank=16, seed=3),
    "1x1": Example((5,), hidden=256, num_topk=2, num_experts=2, num_max_tokens_per_rank=16, seed=3),
}
TIMEOUT_S = 240
#: Recorded real-library errors (conformance/versions/2.1.0/recorded-errors.json) and the table row of each.
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


def world_of(row: dict) -> str:
    """The self-test world of a live row: the smallest its recipe's topology applies to."""
    return WORLD_OF_TOPOLOGY[row.get("topology", "any")]


def message_matches(row: dict, message: str) -> bool:
    """Whether ``message`` is the row's message (exactly, as a ``{...}`` pattern, or as a prefix)."""
    return versions.contract("2.1.0").refusals.matches(row["id"], message)


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
        if r["status"] == "pending":
            problems.append(f"{rid}: pending (every reachable row is emulated, with a recipe, or says why not)")
        if r["status"] != "emulated" and not r["status_note"]:
            problems.append(f"{rid}: status {r['status']} needs a status_note saying why")
        live = r["status"] in LIVE
        if bool(r["emulated"]) != live:
            problems.append(f"{rid}: emulated must be {'set' if live else 'empty'} for status {r['status']}")
        unknown = set(r) - set(FIELDS) - (set(RECIPE_FIELDS) if live else set())
        problems += [f"{rid}: {name} is no column of a row of status {r['status']}" for name in sorted(unknown)]
        for name, kind in RECIPE_FIELDS.items():
            if name in r and not (isinstance(r[name], kind) and r[name]):
                problems.append(f"{rid}: {name} {r[name]!r} is not a non-empty {kind.__name__}")
        if ("edit" in r) != ("valid_call" in r) or ("given" in r and "edit" not in r):
            problems.append(f"{rid}: valid_call and edit go together (given only with them)")
    assert not problems, "\n".join(problems)


def test_p12_draws_the_live_rows_of_one_node_that_are_not_self_tests_only() -> None:
    """P12's rows are the live rows whose recipe applies on one node (the suite's worlds, the real library's
    intranode path) and that name no self_test_only reason; the others are made by the self-test alone."""
    from conformance.tasks.refusals import TOPOLOGIES

    assert set(P12_TOPOLOGIES) <= set(TOPOLOGIES) == set(WORLD_OF_TOPOLOGY)
    assert {WORLD_OF_TOPOLOGY[t] for t in P12_TOPOLOGIES} == {"1x2"}
    drawn = set(p12_rows("2.1.0"))
    expected = {r["id"] for r in LIVE_ROWS if world_of(r) == "1x2" and "self_test_only" not in r}
    assert drawn == expected, sorted(drawn ^ expected)
    assert 0 < len(drawn) < len(LIVE_ROWS)


def test_emulated_rows_name_existing_functions_and_recipes() -> None:
    """Every live row names an emulation function that exists and has one recipe: its edit columns (made by
    edits.make) or a stateful recipe (registered with @recipe), which applies to its self-test example."""
    from conformance.tasks import refusals
    from conformance.tasks.refusals import edits

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
        for name in (r["id"], f"{r['id']}.ok"):
            made = refusals.RECIPES.get(name)
            from_edit = isinstance(made, functools.partial) and made.func is edits.make
            if made is None:
                problems.append(f"{r['id']}: no recipe {name!r} (edit columns, or @recipe in tasks/refusals/)")
            elif from_edit != ("edit" in r):
                problems.append(f"{r['id']}: {name} is {'made from' if from_edit else 'a stateful recipe beside'} "
                                f"the row's edit columns, expected {'them' if 'edit' in r else 'a stateful recipe'}")
        if r.get("topology", "any") not in refusals.TOPOLOGIES or r.get("requires", "") not in {"", *refusals.REQUIRES}:
            problems.append(f"{r['id']}: topology {r.get('topology')!r} / requires {r.get('requires')!r} unknown")
        elif not refusals.applies(r["id"], EXAMPLES[world_of(r)], SHAPES[world_of(r)].nodes):
            problems.append(f"{r['id']}: its recipe does not apply to the {world_of(r)} self-test example")
    # the live rows of every version's table (2.5.0's own: tests/nocover/test_emulation_2_5_0.py)
    names = set(refusals.rows())
    strays = [n for n in refusals.RECIPES if n.removesuffix(".ok") not in names]
    assert not problems and not strays, "\n".join(problems + [f"recipe {n} has no live table row" for n in strays])


def test_edit_columns_name_a_valid_call_of_the_row_and_known_changes() -> None:
    """A row's ``valid_call`` is one of edits.VALID_CALLS and the call the row is about; every change of its
    ``given`` / ``edit`` is a literal or parses into edits.OPS; every op is used by some row."""
    from conformance.tasks.refusals import edits

    problems, used = [], set()
    for r in (r for r in LIVE_ROWS if "edit" in r):
        if r["valid_call"] not in edits.VALID_CALLS:
            problems.append(f"{r['id']}: valid_call {r['valid_call']!r} is not one of {sorted(edits.VALID_CALLS)}")
        elif r["valid_call"].split("(")[0] not in r["call"]:
            problems.append(f"{r['id']}: valid_call {r['valid_call']!r} is not the row's call {r['call']!r}")
        given = {k: v for k, v in r.get("given", {}).items() if not (k == "dispatch" and isinstance(v, dict))}
        for path, change in [*given.items(), *r["edit"].items()]:
            if isinstance(change, str):
                try:
                    used.update(name for name, _ in edits.parse(change))
                except ValueError as exc:
                    problems.append(f"{r['id']}: {path} = {change!r}: {exc}")
            elif not isinstance(change, int):
                problems.append(f"{r['id']}: {path} = {change!r} is neither a literal integer / boolean nor changes")
    unused = set(edits.OPS) - used
    assert not problems and not unused, "\n".join(problems + [f"op {name!r} is used by no row" for name in unused])


def test_edit_columns_are_made_as_documented() -> None:
    """edits.make on a stand-in module that records the calls: the neighbour is the valid call with ``given``, the
    offending call the neighbour with ``edit``; an edit that does not read the value replaces what ``given`` set
    there, which is then not made (no capture() before the offending call); ``x[i]`` changes or appends an element
    of a tuple; ``valid`` is the valid call's value; ``= ...`` an integer expression of the example."""
    import torch

    from conformance.core.example import build_rank_inputs
    from conformance.tasks import refusals
    from conformance.tasks.refusals import edits

    made: list[tuple[str, dict]] = []

    class Buffer:
        num_sms = 20

        def __init__(self, group: object = None, **kwargs: object) -> None:
            made.append(("Buffer", kwargs))

        def get_dispatch_layout(self, topk_idx: torch.Tensor, num_experts: int) -> tuple:
            ints = torch.zeros(2, dtype=torch.int32)
            return ints, None, torch.zeros(num_experts, dtype=torch.int32), torch.zeros(len(topk_idx), 2).bool(), None

        def dispatch(self, **kwargs: object) -> None:
            made.append(("dispatch", kwargs))

        def capture(self) -> str:
            made.append(("capture", {}))
            return "event"

        def destroy(self) -> None:
            pass

    module = type("Module", (), {"Buffer": Buffer})
    example = EXAMPLES["1x2"]
    env = refusals.BadCallEnv(module, None, 0, 2, example, build_rank_inputs(example, 0), torch.device("cpu"))

    def calls(row: dict, bad: bool) -> list[tuple[str, dict]]:
        made.clear()
        edits.make(env, {"valid_call": "Buffer.dispatch", **row}, bad)
        return [(name, kwargs) for name, kwargs in made if name != "Buffer"]

    comm = {"given": {"allocate_on_comm_stream": True, "async_finish": True, "previous_event": "capture"},
            "edit": {"async_finish": "unset", "previous_event": "unset"}}
    got = calls(comm, False)
    assert [name for name, _ in got] == ["capture", "dispatch"]
    assert got[1][1]["previous_event"] == "event" and got[1][1]["async_finish"] is True
    [(name, offending)] = calls(comm, True)
    assert name == "dispatch" and offending["allocate_on_comm_stream"] is True  # no capture() before it
    assert "previous_event" not in offending and "async_finish" not in offending

    scales = {"given": {"x": "fp8", "x[1]": "int32"}, "edit": {"x[1]": "float64", "x[2]": "None"}}
    [(_, neighbour)] = calls(scales, False)
    assert [t.dtype for t in neighbour["x"]] == [torch.float8_e4m3fn, torch.int32]
    [(_, offending)] = calls(scales, True)
    x8, sf, none = offending["x"]
    assert x8.dtype == torch.float8_e4m3fn and sf.dtype == torch.float64 and none is None
    assert sf.shape == (len(env.inputs.x), example.hidden // 128) and bool((sf == 1).all())

    pairing = {"given": {"topk_idx": "None", "topk_weights": "None"}, "edit": {"topk_idx": "valid"}}
    [(_, neighbour)] = calls(pairing, False)
    [(_, offending)] = calls(pairing, True)
    assert neighbour["topk_idx"] is None and offending["topk_weights"] is None
    assert offending["topk_idx"] is env.inputs.topk_idx

    counts = {"edit": {"num_worst_tokens": "= num_max_tokens_per_rank * num_ranks + min(1, 2)",
                       "num_tokens_per_expert": "zeros num_ranks * 3; [:5]", "topk_weights": "bfloat16; unsqueeze 0"}}
    [(_, offending)] = calls(counts, True)
    assert offending["num_worst_tokens"] == example.num_max_tokens_per_rank * 2 + 1
    assert offending["num_tokens_per_expert"].shape == (5,) and offending["num_tokens_per_expert"].dtype == torch.int32
    assert offending["topk_weights"].shape == (1, *env.inputs.topk_weights.shape)
    assert offending["topk_weights"].dtype == torch.bfloat16
    with pytest.raises(ValueError, match="unknown op 'int33'"):
        calls({"edit": {"x": "int33"}}, True)


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

    recorded = json.loads((TABLE.parent / "recorded-errors.json").read_text())["errors"]
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
    names = [n for r in LIVE_ROWS if world_of(r) == kind for n in (r["id"], f"{r['id']}.ok")]
    return world.run("tests.helpers.refusal_tasks:run_recipes", names, EXAMPLES[kind].to_json(), timeout=TIMEOUT_S)


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
    for r in (r for r in LIVE_ROWS if world_of(r) == kind):
        for rank, per_rank in enumerate(results[kind]):
            got_type, got_message = per_rank[r["id"]]
            if got_type != r["exception"] or not message_matches(r, got_message or ""):
                problems.append(f"{r['id']} rank {rank}: got {got_type}: {got_message!r}\n"
                                f"    expected {r['exception']}: {r['message']!r} ({r['message_match']})")
    assert not problems, f"{len(problems)} recipe(s) on the {kind} world:\n" + "\n".join(problems)


@pytest.mark.parametrize("kind", list(SHAPES))
def test_neighbours_pass_on_every_rank(results, kind: str) -> None:
    problems = [
        f"{r['id']} rank {rank}: neighbour {r['id']}.ok raised {per_rank[r['id'] + '.ok']}"
        for r in LIVE_ROWS if world_of(r) == kind
        for rank, per_rank in enumerate(results[kind])
        if per_rank[f"{r['id']}.ok"] != (None, None)
    ]
    assert not problems, "\n".join(problems)


def test_a_rank_local_refusal_on_one_rank_raises_everywhere_and_leaves_the_buffer_usable(world_1x2) -> None:
    """V2 too many tokens on rank 0 only: rank 0 raises the library's error (buffer.hpp:756), rank 1 the
    emulation's PeerRefused (its real counterpart would wait in the kernel), and the next dispatch works."""
    row = next(r for r in ROWS if r["id"] == "v2_dispatch_too_many_tokens")
    example = EXAMPLES["1x2"]
    per_rank = world_1x2.run("tests.helpers.refusal_tasks:too_many_tokens_on_rank_0", example.to_json(),
                             timeout=TIMEOUT_S)
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
    per_rank = world_1x2.run("tests.helpers.refusal_tasks:ll_rank_local_on_rank_0", example.to_json(), call,
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
    per_rank = world_1x2.run("tests.helpers.refusal_tasks:ll_two_mistakes", EXAMPLES["1x2"].to_json(),
                             timeout=TIMEOUT_S)
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
    from conformance.tasks import refusals

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
    with refusals.SharedBuffers() as shared:
        env = refusals.BadCallEnv(module, None, 0, 2, example, build_rank_inputs(example, 0), torch.device("cpu"),
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
    reachable = collections.Counter(r["status"] for r in ROWS if r["status"] != "unreachable")
    with capsys.disabled():
        print(f"\nrefusal table: {len(ROWS)} rows; " + ", ".join(f"{s} {counts[s]}" for s in STATUSES)
              + f"; reachable rows: {sum(reachable.values())} (" + ", ".join(f"{s} {reachable[s]}" for s in STATUSES
                                                                           if reachable[s]) + ")")
    assert sum(counts.values()) == len(ROWS) and set(counts) <= set(STATUSES)
    assert counts["emulated"] > 0


# ---------------------------------------------------------------------------------------- (d) mutants
def test_every_refusal_mutant_changes_its_rows_behaviour(world_1x2) -> None:
    from conformance.mutants import load_catalog, refusals

    by_id = {r["id"]: r for r in ROWS}
    problems = []
    for name, row_id in refusals.TARGETS.items():
        assert load_catalog()[name].kind == "harmful"
        row = by_id[row_id]
        assert world_of(row) == "1x2", f"{name}: its row {row_id} needs the {world_of(row)} world"
        example = EXAMPLES["1x2"].to_json()
        per_rank = world_1x2.run("tests.helpers.refusal_tasks:run_recipes", [row_id, f"{row_id}.ok"], example, name,
                                 timeout=TIMEOUT_S)
        for rank, got in enumerate(per_rank):
            recipe_type, recipe_message = got[row_id]
            still_refused = recipe_type == row["exception"] and message_matches(row, recipe_message or "")
            neighbour_passes = got[f"{row_id}.ok"] == (None, None)
            if still_refused and neighbour_passes:
                problems.append(f"{name} ({row_id}) rank {rank}: recipe still refused and neighbour still passes")
    assert not problems, "\n".join(problems)
