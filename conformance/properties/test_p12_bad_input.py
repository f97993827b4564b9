"""P12 bad input: every rank raises (the recorded exception where one was recorded), nothing hangs, and the
very next valid dispatch on the same buffer returns the oracle's bytes."""

from __future__ import annotations

from typing import Any

from conformance.assertions import about, assert_refused_then_usable, by_backend
from conformance.core.cases import BadInputCase
from conformance.oracle.recorded import recorded_errors
from conformance.properties import CheckContext, Property, register
from conformance.strategies.calls import bad_input_cases
from conformance.tasks.bad_input import bad_input_results

#: (defect, api) -> the name of the real library's recorded error (fixtures/deepep-real, ``errors``).
#: Defects without an entry were not recorded (the real kernels hang or corrupt): any exception on every
#: rank is accepted there.
RECORDED = {
    ("int32_topk_idx", "v1"): "v1_int32_topk_idx",
    ("int32_topk_idx", "v2"): "v2_int32_topk_idx",
    ("bf16_weights", "v2"): "v2_bf16_weights",
    ("experts_not_divisible", "v2"): "v2_experts_not_divisible",
    ("v2_previous_event_without_allocate", "v2"): "v2_previous_event_without_comm_alloc",
    ("v2_cached_dispatch_without_num_experts", "v2"): "v2_cached_dispatch_without_num_experts",
    ("odd_num_sms", "v1"): "v1_odd_num_sms",
}
#: Recorded message prefix of the V2 combine JIT failure for hidden=128 (cases ``small`` / ``all_masked``).
HIDDEN_128_PREFIX = 'Assertion exception (csrc/jit/compiler.hpp:239): false and "NVCC compilation failed"'
CACHED_TYPEERROR_DEFECT = (
    "ElasticBuffer.dispatch(x, handle=handle) without num_experts (and num_sms=0) raises TypeError "
    "\"unsupported operand type(s) for %: 'NoneType' and 'int'\" (DeepEP 2.1.0 computes the SM count before "
    "taking num_experts from the handle). Pass num_experts=handle.num_experts (or num_sms) in cached dispatches."
)


def check(ctx: CheckContext, case: BadInputCase, per_rank: list[dict[str, Any]]) -> None:
    """Each bad call raises on every rank (recorded type and message where recorded), and the next valid
    dispatch on the same buffer returns the oracle's receipts."""
    __tracebackhide__ = True
    for backend, results in by_backend(per_rank).items():
        with about(ctx, backend):
            api = backend.rsplit("-", 1)[1]
            call = f"{backend} with defect {case.defect} ({case.example.to_json()})"
            recorded = RECORDED.get((case.defect, api))
            if recorded is not None:
                expected_type, expected_message = recorded_errors()[recorded]
                expected = {"expected_type": expected_type, "expected_message": expected_message}
            elif case.defect == "v2_combine_hidden_128":
                expected = {"expected_type": "RuntimeError", "message_prefix": HIDDEN_128_PREFIX}
            else:
                expected = {}
            if case.defect == "v2_cached_dispatch_without_num_experts":
                ctx.record_divergence(f"{backend}:cached-dispatch-without-num-experts", CACHED_TYPEERROR_DEFECT)
            assert_refused_then_usable(ctx, case.example, results, refused="raised", after="after", call=call,
                                       what=f"the rejected {case.defect}", **expected)
            for rank, got in enumerate(results):
                if "num_sms" in got and got["num_sms"][0] != got["num_sms"][1]:
                    raise AssertionError(f"Buffer.num_sms[rank {rank}] changed from {got['num_sms'][0]} to "
                                         f"{got['num_sms'][1]} although set_num_sms raised [{call}]")


PROPERTY = register(Property(
    id="P12-bad-input",
    title="bad calls raise a clear exception on every rank, nothing hangs, the next valid call is correct",
    strategy=bad_input_cases, task=bad_input_results, check=check, case_type=BadInputCase,
    needs=("bad_input",),
))
test_bad_input = PROPERTY.test
