"""P5 combine: the sum over receiving ranks of the expert outputs (plus bias), and the combined top-k weights.

The expert on rank ``d`` returns every received row as ``bf16(row * (1 + d))`` and every received weight
as the float32 ``weight * (1 + d)``, so each receiving rank contributes something different and a lost,
doubled or misplaced contribution changes the result.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from conformance.backends.views import Unsupported
from conformance.checks.assert_numeric import assert_bytes_equal, assert_close_across, assert_within_bound
from conformance.checks.registry import register
from conformance.example import Example, build_all_inputs
from conformance.oracle.reduction import expected_combined_weights, expected_scaled_combine, scaled_weight
from conformance.tasks.combine import build_biases

#: ``exact``: small-integer payloads and biases, every sum exactly representable -> byte-exact.
#: ``bounded``: random payloads -> within the derived float32-accumulation bound (see assert_numeric).
MODES = ("exact", "bounded")


@dataclass(frozen=True)
class CombineCase:
    """An example plus how combine is called: ``num_bias`` bias tensors (0, 1 or 2) and the comparison mode."""

    example: Example
    num_bias: int = 0
    mode: str = "exact"

    @property
    def world_size(self) -> int:
        """Number of ranks the case is written for."""
        return self.example.world_size

    def to_json(self) -> str:
        """A one-line JSON form, used in reproduction commands."""
        fields = {"example": dataclasses.asdict(self.example), "num_bias": self.num_bias, "mode": self.mode}
        return json.dumps(fields, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> CombineCase:
        """Inverse of :meth:`to_json`."""
        fields = json.loads(text)
        example = Example.from_json(json.dumps(fields["example"]))
        return cls(example=example, num_bias=fields["num_bias"], mode=fields["mode"])

    def validate(self) -> None:
        """Raise ``ValueError`` unless the case is valid."""
        self.example.validate()
        if self.num_bias not in (0, 1, 2):
            raise ValueError(f"num_bias={self.num_bias} must be 0, 1 or 2")
        if self.mode not in MODES:
            raise ValueError(f"mode={self.mode!r} must be one of {MODES}")
        if self.mode == "exact" and self.example.payload != "integers":
            raise ValueError("mode 'exact' needs payload='integers' (exactly summable values)")
        if self.example.payload == "special":
            raise ValueError("combine sums payloads: NaN/Inf payloads have no meaningful sum to compare")


@register("P5-combine", case=CombineCase)
def check_combine(session, case: CombineCase) -> None:  # noqa: ANN001 - conformance.session.Session
    """combined_x = sum over the ranks a token reached of their expert outputs, plus the biases: byte-exact in
    ``exact`` mode (and byte-identical across backends), within the float32-accumulation bound in ``bounded``
    mode.  combined_topk_weights[t, k] = the weight the owner of slot k's expert returned (0 at -1 slots),
    byte-exact and byte-identical across backends.  A backend's known combine limit is reported unsupported."""
    __tracebackhide__ = True
    example = case.example
    inputs = build_all_inputs(example)
    ranks_per_node = session.config.shape.ranks_per_node
    two_level = session.config.shape.nodes > 1
    results = session.run("conformance.tasks.combine:combine_outputs", example, case.num_bias)
    for rank, per_backend in enumerate(results):
        biases = build_biases(example, rank, case.num_bias)
        expected = expected_scaled_combine(example, inputs, rank, biases, ranks_per_node)
        own_weights = inputs[rank].topk_weights
        weights = expected_combined_weights(
            example, inputs, rank, lambda dst, token, slot, w=own_weights: scaled_weight(w[token, slot], dst)
        )
        seen = []
        for backend, result in per_backend.items():
            if isinstance(result, Unsupported):
                session.record_unsupported(result, example)
                continue
            if case.mode == "exact":
                assert_bytes_equal(
                    result.combined_x, expected.rounded(), name="combined_x", rank=rank, call=result.call
                )
            else:
                assert_within_bound(
                    result.combined_x, expected, two_level=two_level, name="combined_x", rank=rank, call=result.call
                )
            if result.combined_topk_weights is None:
                raise AssertionError(f"combined_topk_weights[rank {rank}] is None though topk_weights were passed "
                                     f"[{result.call}]")
            assert_bytes_equal(
                result.combined_topk_weights, weights, name="combined_topk_weights", rank=rank, call=result.call,
                labels=("token", "slot"),
            )
            seen.append((backend, result))
        for (first, first_result), (_, other) in zip(seen, seen[1:], strict=False):
            if case.mode == "exact":
                assert_bytes_equal(other.combined_x, first_result.combined_x, name="combined_x", rank=rank,
                                   call=other.call, against=first)
            else:
                assert_close_across(other.combined_x, first_result.combined_x, expected, two_level=two_level,
                                    name="combined_x", rank=rank, call=other.call, against=first)
            assert_bytes_equal(other.combined_topk_weights, first_result.combined_topk_weights,
                               name="combined_topk_weights", rank=rank, call=other.call, labels=("token", "slot"),
                               against=first)
