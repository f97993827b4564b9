"""P12 bad input: every rank raises (the recorded exception where one was recorded), nothing hangs, and the
very next valid dispatch on the same buffer returns the oracle's bytes."""

from __future__ import annotations

import json
from dataclasses import dataclass

from conformance.checks.assert_errors import assert_raised_everywhere, assert_view_matches_oracle, recorded_errors
from conformance.checks.registry import register
from conformance.example import Example

#: Which API each defect applies to.
DEFECT_APIS: dict[str, tuple[str, ...]] = {
    "int32_topk_idx": ("v1", "v2"),
    "bf16_weights": ("v1", "v2"),
    "experts_not_divisible": ("v1", "v2"),
    "expert_id_out_of_range": ("v1", "v2"),
    "too_many_tokens": ("v2",),
    "v2_combine_hidden_128": ("v2",),
    "v2_previous_event_without_allocate": ("v2",),
    "v2_cached_dispatch_without_num_experts": ("v2",),
    "odd_num_sms": ("v1",),
}
BAD_INPUT_DEFECTS = tuple(DEFECT_APIS)

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


def needs_tokens(defect: str) -> bool:
    """Whether ``defect`` needs at least one token somewhere."""
    return defect == "expert_id_out_of_range"


@dataclass(frozen=True)
class BadInputCase:
    """A valid example and the one defect planted into the call made with it."""

    example: Example
    defect: str

    @property
    def world_size(self) -> int:
        """Number of ranks the case is written for."""
        return self.example.world_size

    def to_json(self) -> str:
        """One-line JSON (the example nested as an object)."""
        return json.dumps({"example": json.loads(self.example.to_json()), "defect": self.defect},
                          separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> BadInputCase:
        """Inverse of :meth:`to_json`."""
        fields = json.loads(text)
        return cls(Example.from_json(json.dumps(fields["example"])), fields["defect"])

    def validate(self) -> None:
        """Raise ``ValueError`` unless the example is valid and the defect can be planted into it."""
        self.example.validate()
        if self.defect not in DEFECT_APIS:
            raise ValueError(f"unknown defect {self.defect!r}; known: {BAD_INPUT_DEFECTS}")
        if needs_tokens(self.defect) and sum(self.example.tokens_per_rank) == 0:
            raise ValueError(f"defect {self.defect} needs at least one token")
        if self.defect == "v2_combine_hidden_128" and self.example.hidden != 128:
            raise ValueError("defect v2_combine_hidden_128 needs hidden=128")


@register("P12-bad-input", case=BadInputCase)
def check_bad_input(session, case: BadInputCase) -> None:  # noqa: ANN001 - conformance.session.Session
    """Each bad call raises on every rank (recorded type and message where recorded), and the next valid
    dispatch on the same buffer returns the oracle's receipts."""
    __tracebackhide__ = True
    per_rank = session.run("conformance.tasks.errors:bad_input_results", case)
    for backend in per_rank[0]:
        api = backend.rsplit("-", 1)[1]
        results = [ranks[backend] for ranks in per_rank]
        call = f"{backend} with defect {case.defect} ({case.example.to_json()})"
        recorded = RECORDED.get((case.defect, api))
        raised = [got["raised"] for got in results]
        if recorded is not None:
            expected_type, expected_message = recorded_errors()[recorded]
            assert_raised_everywhere(raised, expected_type=expected_type, expected_message=expected_message, call=call)
        elif case.defect == "v2_combine_hidden_128":
            assert_raised_everywhere(raised, expected_type="RuntimeError", message_prefix=HIDDEN_128_PREFIX, call=call)
        else:
            assert_raised_everywhere(raised, call=call)
        if case.defect == "v2_cached_dispatch_without_num_experts":
            session.record_divergence(f"{backend}:cached-dispatch-without-num-experts", CACHED_TYPEERROR_DEFECT)
        for rank, got in enumerate(results):
            if "num_sms" in got and got["num_sms"][0] != got["num_sms"][1]:
                raise AssertionError(
                    f"Buffer.num_sms[rank {rank}] changed from {got['num_sms'][0]} to {got['num_sms'][1]} although "
                    f"set_num_sms raised [{call}]"
                )
            assert_view_matches_oracle(session, case.example, rank, got["after"], after=f"the rejected {case.defect}")
