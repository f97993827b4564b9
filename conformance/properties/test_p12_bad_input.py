"""P12 bad input: every bad call of the refusal table of the DeepEP version under test
(``conformance/versions/<version>/refusals.toml``, one row per host refusal on the argument path of a public call)
raises the library's exception on every rank, nothing hangs, the row's valid neighbour passes, neither call leaves the
caller's current CUDA stream switched (a refusal raised after the library switched to its communication stream would
poison every later call of the thread), and the next valid dispatch returns the oracle's bytes.  A call that a
set-up limit names (``core/setup_limits.py``: e.g. an ``ElasticBuffer`` with ``num_cpu_bytes > 0`` on the real
library with ranks sharing one GPU, where it never returns) is not made: that part of the row is listed as not checked
for the backend, with the limit's evidence.

Every run makes every applicable row's calls once (the explicit sweep), then draws one to four rows with
examples; real and emulated backends are held to the same rows, so a run on the real library checks the table.

One row is not a refusal the contract allows but a valid call it promises: a V2 cached ``dispatch(x,
handle=handle)`` without ``num_experts`` (the handle has it).  It must work; DeepEP 2.1.0 raises a TypeError there
(the emulation follows), which is the known defect ``v2-cached-dispatch-without-num-experts``
(conformance/versions/2.1.0/known-defects.toml): reported as ``known-defect`` while DeepEP has it, and as fixed
once it no longer fails.  It is checked last, so the other rows of its example are judged first.

The refusal table. `conformance/versions/2.1.0/refusals.toml` lists every host-side refusal of DeepEP 2.1.0 on the
argument path of the constructors, `get_dispatch_layout`, `dispatch`, `combine`, the low-latency calls
(`clean_low_latency_buffer`, the shrink-mode mask calls, `get_next_low_latency_combine_buffer` and the size hint
included) and `get_local_buffer_tensor` (492 rows, each with its source line, exception and message, whether Python
can reach it, and its status in the emulation: 352 emulated exactly, 16 emulated with a documented difference, 110
unreachable from Python, 14 depending on hardware or network; none pending). The emulation raises from the table, in
the library's check order. Each emulated row also says how the suite makes its call: a standard mistake is data in the
row itself (`valid_call`, `given`, `edit`: the valid neighbour call and the one change, which
`conformance/tasks/refusals/edits.py` interprets); a stateful one (earlier calls, a destroyed buffer, a low-latency
buffer's state, a handle from another buffer) is a recipe in `conformance/tasks/refusals/`, one module per call family
(the low-latency rows of a task share one low-latency buffer at a time, and the combine rows one dispatch). P12 makes
every applicable row's calls on every run (262 rows on one node, 178 on two) and then draws rows with examples; real
and emulated backends are held to the same rows, so a run on the real library checks the table itself. Review the
table whenever the recorded API surface changes. Each DeepEP version has its own table (2.5.0's:
`conformance/versions/2.5.0/refusals.toml`, read from its source): a backend is held to the table of the version it
is driven by, a row id naming the same refusal (and the same recipe) in every version that has it.
"""

from __future__ import annotations

from typing import Any

from conformance.assertions import assert_no_side_effect, assert_raised_everywhere, assert_view_matches_oracle
from conformance.core.cases import BadCallCase, p12_rows
from conformance.core.outcomes import NotChecked, Why
from conformance.core.spec import is_builtin_name
from conformance.properties import CheckContext, Property, register
from conformance.strategies.calls import bad_call_cases, bad_call_sweep
from conformance.tasks.bad_input import bad_call_results

#: Rows of valid calls the contract promises (the library's refusal there is a known defect, not a contract).
MUST_WORK = {
    "v2_dispatch_num_experts_none": "a cached ElasticBuffer.dispatch(x, handle=handle) must work without num_experts "
                                    "(the handle holds it)",
}


def check(ctx: CheckContext, case: BadCallCase, per_rank: list[dict[str, Any]]) -> None:
    """Per row and backend: every rank raised the row's exception type with its message (exact, prefix or
    pattern; a class backend that declares ``bad_input``: the type only), the row's valid neighbour raised on no
    rank, neither call left the thread's current CUDA stream switched; then every backend's next valid dispatch is
    exact."""
    __tracebackhide__ = True
    table = p12_rows()
    must_work = [row_id for row_id in case.rows if row_id in MUST_WORK]
    for row_id in case.rows:
        if row_id in MUST_WORK:
            continue
        row = table[row_id]
        for backend in per_rank[0]["rows"][row_id]:
            got = [ranks["rows"][row_id][backend] for ranks in per_rank]
            refusals = ctx.contract(backend).refusals  # the table of the backend's DeepEP version
            row = refusals.row(row_id)
            where = f"{backend}: {row['call']} with {row['condition']} [refusal {row_id}, {row['source']}]"
            ctx.checking((backend,))
            # the exception type for every backend; the message for the library's own (built-in) backends only
            exact = is_builtin_name(backend)
            if not _not_made(ctx, backend, row_id, "the bad call", [g["raised"] for g in got]):
                assert_raised_everywhere([g["raised"] for g in got], call=where, expected_type=row["exception"],
                                         message_pattern=refusals.message_pattern(row_id) if exact else None)
                assert_no_side_effect([g["raised"] for g in got], call=where, what="the bad call")
            if not _not_made(ctx, backend, row_id, "the valid neighbour", [g["neighbour"] for g in got]):
                _neighbour_passed(got, row_id, where)
    for rank, ranks in enumerate(per_rank):
        for backend, view in ranks["after"].items():
            ctx.checking((backend,))
            assert_view_matches_oracle(ctx, case.example, rank, view, after=f"the refused calls {list(case.rows)}")
    for row_id in must_work:
        row = table[row_id]
        for backend in per_rank[0]["rows"][row_id]:
            got = [ranks["rows"][row_id][backend] for ranks in per_rank]
            where = f"{backend}: {row['call']} with {row['condition']} [row {row_id}, {row['source']}]"
            ctx.checking((backend,))
            if _not_made(ctx, backend, row_id, "the valid neighbour", [g["neighbour"] for g in got]) or \
                    _not_made(ctx, backend, row_id, "the call", [g["raised"] for g in got]):
                continue
            _neighbour_passed(got, row_id, where)
            for rank, g in enumerate(got):
                if g["raised"].type is not None:
                    raise AssertionError(f"rank {rank} raised {g['raised'].type}: {g['raised'].message}; "
                                         f"{MUST_WORK[row_id]} [{where}]")
    ctx.checking(None)


def _not_made(ctx: CheckContext, backend: str, row_id: str, what: str, results: list[Any]) -> bool:
    """Whether a set-up limit kept the call from being made (a :class:`NotChecked` result on every rank: the
    recipes are the same on every rank): then recorded as a part of the check ``backend`` could not take here, with
    the limit's reason and evidence, and not checked."""
    limited = [r for r in results if isinstance(r, NotChecked)]
    if not limited:
        return False
    ctx.not_checked(NotChecked.part(
        backend, Why.SETUP, f"refusal row {row_id}: {what} was not made ({limited[0].condition})"))
    ctx.not_checked(NotChecked.part(backend, Why.SETUP, limited[0].reason))
    return True


def _neighbour_passed(got: list[dict[str, Any]], row_id: str, where: str) -> None:
    for rank, g in enumerate(got):
        if g["neighbour"].type is not None:
            raise AssertionError(f"rank {rank} raised {g['neighbour']} on the valid neighbour of {row_id} (recipe "
                                 f"{row_id}.ok, the closest valid call) [{where}]")
    assert_no_side_effect([g["neighbour"] for g in got], call=where, what=f"the valid neighbour of {row_id}")


PROPERTY = register(Property(
    id="P12-bad-input",
    title="bad calls (one per refusal of the library, from the refusal table) raise the library's exception on "
          "every rank, nothing hangs, the valid neighbour passes, the next valid call is correct",
    strategy=bad_call_cases, task=bad_call_results, check=check, case_type=BadCallCase, explicit=bad_call_sweep,
    needs=("bad_input",), shapes="own",
))
test_bad_input = PROPERTY.test
