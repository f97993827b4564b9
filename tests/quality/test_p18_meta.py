"""Meta-tests of P18-fp8-payloads: its planted defects are caught, it holds on the emulation, its strategy reaches its
corners."""

import pytest

from conformance.strategies.low_latency import fp8_examples
from tests.helpers.meta import FIND_SETTINGS, assert_caught, assert_holds, sample

PID = "P18-fp8-payloads"


#: Draws to find a case: fp8-hint-sizes-combine-in-fp8 needs a shape whose FP8 buffer size crosses a 2 MiB boundary
#: once the combine layout is halved, 11 draws of 300 (3.7%, the same with a derived or a drawn routing): 60 draws miss
#: it one time in ten, 200 one time in 2000.
DRAWS = {"fp8-hint-sizes-combine-in-fp8": 200}


@pytest.mark.parametrize("mutant", ['fp8-scales-not-moved', 'fp8-hint-sizes-combine-in-fp8'])
def test_catches(emulated_session, mutant: str) -> None:
    example, message = assert_caught(emulated_session, PID, mutant, fp8_examples(2),
                                     max_examples=DRAWS.get(mutant, FIND_SETTINGS.max_examples), shrink=False)
    assert "expected" in message and "[" in message, message  # value, expectation and the call


def test_holds_on_the_emulation(emulated_session) -> None:
    assert_holds(emulated_session, PID, sample(fp8_examples(2), 6))


def test_fp8_buffers_are_built_with_use_fp8_dispatch(emulated_session) -> None:
    """The V2 run on the FP8-sized buffer really is on a buffer built with ``use_fp8_dispatch=True``: its size
    differs from the bf16 buffer's where the dispatch layout decides it."""
    import dataclasses

    from conformance.tasks.low_latency import fp8_runs

    (example,) = sample(fp8_examples(2), 1)
    example = dataclasses.replace(example, hidden=2048, num_max_tokens_per_rank=256, num_topk=1)
    results = emulated_session.run(fp8_runs, example)
    runs = results[0]["emulated-v2"]
    assert runs["fp8_buffer"]["num_bytes"] < runs["plain"]["num_bytes"]
