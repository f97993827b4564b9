"""P12 bad input: every bad call of the refusal table (``conformance/emulation/refusals.toml``, one row per host
refusal of DeepEP 2.1.0 on the argument path of a public call) raises the library's exception on every rank,
nothing hangs, the row's valid neighbour passes, and the next valid dispatch returns the oracle's bytes.

Every run makes every applicable row's calls once (the explicit sweep), then draws one to four rows with
examples; real and emulated backends are held to the same rows, so a run on the real library checks the table.
"""

from __future__ import annotations

from typing import Any

from conformance.assertions import about, assert_raised_everywhere, assert_view_matches_oracle
from conformance.core.cases import BadCallCase, p12_rows
from conformance.emulation import _refusals
from conformance.properties import CheckContext, Property, register
from conformance.strategies.calls import bad_call_cases, bad_call_sweep
from conformance.tasks.bad_input import bad_call_results

#: The row whose refusal is an upstream defect an integrator must work around (a divergence worth reporting).
CACHED_TYPEERROR_ROW = "v2_dispatch_num_experts_none"
CACHED_TYPEERROR_DEFECT = (
    "ElasticBuffer.dispatch(x, handle=handle) without num_experts (and num_sms=0) raises TypeError "
    "\"unsupported operand type(s) for %: 'NoneType' and 'int'\" (DeepEP 2.1.0 computes the SM count before "
    "taking num_experts from the handle). Pass num_experts=handle.num_experts (or num_sms) in cached dispatches."
)


def check(ctx: CheckContext, case: BadCallCase, per_rank: list[dict[str, Any]]) -> None:
    """Per row and backend: every rank raised the row's exception type with its message (exact, prefix or
    pattern), the row's valid neighbour raised on no rank; then every backend's next valid dispatch is exact."""
    __tracebackhide__ = True
    table = p12_rows()
    for row_id in case.rows:
        row = table[row_id]
        for backend in per_rank[0]["rows"][row_id]:
            got = [ranks["rows"][row_id][backend] for ranks in per_rank]
            where = f"{backend}: {row['call']} with {row['condition']} [refusal {row_id}, {row['source']}]"
            with about(ctx, backend):
                assert_raised_everywhere([g["raised"] for g in got], call=where, expected_type=row["exception"],
                                         message_pattern=_refusals.message_pattern(row_id))
                for rank, g in enumerate(got):
                    if g["neighbour"].type is not None:
                        raise AssertionError(f"rank {rank} raised {g['neighbour']} on the valid neighbour of "
                                             f"{row_id} (recipe {row['neighbour']}, the closest valid call) [{where}]")
            if row_id == CACHED_TYPEERROR_ROW:
                ctx.record_divergence(f"{backend}:cached-dispatch-without-num-experts", CACHED_TYPEERROR_DEFECT)
    for rank, ranks in enumerate(per_rank):
        for backend, view in ranks["after"].items():
            with about(ctx, backend):
                assert_view_matches_oracle(ctx, case.example, rank, view, after=f"the refused calls {list(case.rows)}")


PROPERTY = register(Property(
    id="P12-bad-input",
    title="bad calls (one per refusal of the library, from the refusal table) raise the library's exception on "
          "every rank, nothing hangs, the valid neighbour passes, the next valid call is correct",
    strategy=bad_call_cases, task=bad_call_results, check=check, case_type=BadCallCase, explicit=bad_call_sweep,
    needs=("bad_input",),
))
test_bad_input = PROPERTY.test
