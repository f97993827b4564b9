"""Meta-tests of P7 (cached dispatch): stale cached payloads are caught; payload-byte mutants (NaN
canonicalisation, -0.0 flushing) are caught by P1 and by P7 with special payloads; the property holds on the
emulation (one and two nodes); the strategy reaches the corners."""

import torch

from conformance.core.example import SPECIAL_BF16_BITS, build_all_inputs
from conformance.strategies import examples
from conformance.strategies.combine import cached_dispatch_examples
from tests.helpers.meta import assert_caught, assert_holds, assert_reaches, sample

P1 = "P1-per-expert-payloads"
P7 = "P7-cached-dispatch"
SPECIAL_ONLY = {"hidden_sizes": (128,), "payloads": ("special",), "max_tokens": (16,)}


def test_p7_catches_a_stale_cached_dispatch(emulated_session) -> None:
    example, message = assert_caught(
        emulated_session, P7, "cached-dispatch-stale", cached_dispatch_examples(2), shrink=False)
    assert sum(example.tokens_per_rank) >= 1
    assert "second payload" in message and "cached_dispatch" in message


def test_p1_catches_nan_canonicalisation(emulated_session) -> None:
    example, message = assert_caught(
        emulated_session, P1, "nan-canonicalised", examples(2, **SPECIAL_ONLY), shrink=False)
    assert example.payload == "special" and "bytes differ" in message and "0x7fc0" in message


def test_p1_catches_negative_zero_flushed(emulated_session) -> None:
    example, message = assert_caught(
        emulated_session, P1, "negative-zero-flushed", examples(2, **SPECIAL_ONLY), shrink=False)
    assert "bytes differ" in message and "0x8000" in message


def test_p7_catches_payload_byte_mutants_too(emulated_session) -> None:
    for mutant in ("nan-canonicalised", "negative-zero-flushed"):
        assert_caught(emulated_session, P7, mutant, cached_dispatch_examples(2), shrink=False)


def test_p7_holds_on_the_emulation_including_two_nodes(emulated_session, two_node_session) -> None:
    assert_holds(emulated_session, P7, sample(cached_dispatch_examples(2), 12))
    assert_holds(two_node_session, P7, sample(cached_dispatch_examples(4), 6))


def _has_bits(example, bits: int) -> bool:
    signed = bits - 0x10000 if bits >= 0x8000 else bits
    return any(bool((r.x.contiguous().view(torch.int16) == signed).any()) for r in build_all_inputs(example))


def test_p7_strategy_reaches_the_corners() -> None:
    strategy = cached_dispatch_examples(2)
    assert_reaches(strategy, lambda e: e.payload == "special" and _has_bits(e, 0x7FC1))  # NaN payload
    assert_reaches(strategy, lambda e: e.payload == "special" and _has_bits(e, 0x8000))  # -0.0
    assert_reaches(strategy, lambda e: 0 in e.tokens_per_rank and sum(e.tokens_per_rank) > 0)
    assert_reaches(strategy, lambda e: min(e.tokens_per_rank) >= 8 and e.mask_ratio == 0)
    assert 0x7FC1 in SPECIAL_BF16_BITS and 0x8000 in SPECIAL_BF16_BITS
