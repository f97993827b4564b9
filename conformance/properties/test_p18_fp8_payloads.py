"""P18 FP8 payloads: a normal-mode dispatch of ``(float8_e4m3fn x, float32 scales)`` delivers, for every token the
oracle sends to a rank, its E4M3 bytes and its own scale row byte for byte (V1 ``Buffer.dispatch``; V2
``ElasticBuffer.dispatch`` row-major and with ``use_tma_aligned_col_major_sf``, whose scales are laid out
``stride (1, align(rows, 4))``, on the buffer sized for bf16 and on one built with ``use_fp8_dispatch=True``, whose
size is the library's formula for FP8 dispatches), so V1, V2 and the oracle agree per token.

On the real library: held on the real V1 (docs/real-runs/, run 10b) and V2 (run 11b); its recording replays exactly.
"""

from __future__ import annotations

from typing import Any

from conformance.assertions import assert_value_equal, for_each_backend
from conformance.checks.fp8_rows import call_of, check_rows
from conformance.core.example import Example, build_all_inputs, fp8_payload
from conformance.oracle import expected_received_tokens
from conformance.oracle.buffer_size import expected_buffer_size
from conformance.properties import CheckContext, Property, register
from conformance.strategies import sized
from conformance.strategies.low_latency import fp8_examples
from conformance.tasks.low_latency import fp8_runs


def check_fp8_buffer(run: dict[str, Any], example: Example, shape: Any, call: str) -> None:
    """A buffer built with ``use_fp8_dispatch=True`` is sized as the library's formula sizes FP8 dispatches (and
    ``get_buffer_size_hint(use_fp8_dispatch=True)`` says the same); its rows were checked like the others'."""
    __tracebackhide__ = True
    expected = expected_buffer_size(example.num_max_tokens_per_rank, example.hidden, example.num_topk,
                                    use_fp8_dispatch=True, allow_hybrid_mode=True, allow_multiple_reduction=True,
                                    num_nodes=shape.nodes, ranks_per_node=shape.ranks_per_node)
    why = "the library's formula for FP8 dispatches (csrc/elastic/buffer.hpp:652-680)"
    assert_value_equal("num_bytes", run["num_bytes"], expected, call=call, why=why)
    assert_value_equal("get_buffer_size_hint(use_fp8_dispatch=True)", run["size_hint"], expected, call=call, why=why)


def check(ctx: CheckContext, example: Example, per_rank: list[dict[str, Any]]) -> None:
    """Every variant of every backend against the oracle (so V1 and V2 agree), and V2's scale layout."""
    __tracebackhide__ = True
    inputs = build_all_inputs(example)
    payloads = [fp8_payload(example, r) for r in range(example.world_size)]

    def one(rank: int, backend: str, result: dict[str, Any]) -> None:
        expected = expected_received_tokens(example, inputs, rank)
        for variant in ("plain", "col_major", "fp8_buffer"):
            if variant not in result:
                continue
            run = result[variant]
            call = call_of(backend, variant, example, rank)
            check_rows(run, example, rank, expected, payloads, call)
            if variant == "fp8_buffer":
                check_fp8_buffer(run, example, ctx.shape, call)
            rows, packs = run["scales"].shape
            want = (1, -(-rows // 4) * 4 if rows else 1) if variant == "col_major" else (packs, 1)
            if rows > 1 and packs > 1 and run["scales_stride"] != want:
                raise AssertionError(f"received scale strides are {run['scales_stride']}, expected {want} "
                                     f"({'TMA-aligned column-major' if variant == 'col_major' else 'row-major'}) "
                                     f"[{call}]")

    for_each_backend(ctx, example, per_rank, one)


PROPERTY = register(Property(
    id="P18-fp8-payloads",
    title="FP8 (x, scales) dispatch: each token's E4M3 bytes and its own scale row arrive byte for byte at the "
          "oracle's ranks; V1, V2 row-major and V2 TMA column-major agree, on V2 buffers built with and without "
          "use_fp8_dispatch",
    strategy=sized(fp8_examples), task=fp8_runs, check=check, needs=("fp8",),
))
test_fp8_payloads = PROPERTY.test
