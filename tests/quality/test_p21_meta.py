"""Meta-tests of P21-buffer-options: it catches a combine that ignores allow_multiple_reduction either way (on one node
through the expand-mode per-rank rounding, on two through the per-node one too) and expand-mode combined weights in
the wrong slots, it spares a different SM schedule for
prefer_overlap_with_compute=False (which really changes handle.num_sms), it holds on the emulation (one and two nodes),
the tree rule and the three-level tree by hand, and its strategy reaches its corners."""

import dataclasses

import pytest
import torch

from conformance.core.cases import BufferOptionsCase
from conformance.core.example import Example, build_all_inputs
from conformance.oracle import expected_received_tokens, expected_recv_topk_idx
from conformance.oracle.tree import predict_levels, v2_combine_groups
from conformance.strategies.options import buffer_option_cases
from conformance.tasks.options import buffer_option_combine
from conformance.world.errors import RankRaised
from tests.helpers.meta import assert_caught, assert_holds, assert_reaches, fails, sample

PID = "P21-buffer-options"


def multi_local_slots(example: Example) -> bool:
    """Some received token has two or more slots on one rank (two expanded rows for that rank to reduce)."""
    inputs = build_all_inputs(example)
    return any(sum(i >= 0 for i in expected_recv_topk_idx(example, inputs, rank, *tok)) >= 2
               for rank in range(example.world_size) for tok in expected_received_tokens(example, inputs, rank))


def test_the_tree_rule_follows_the_kernels() -> None:
    assert v2_combine_groups(True, False, 1, 2) == ()  # one node, one row per rank: nothing reduced on the way
    assert v2_combine_groups(True, True, 1, 2) == (1,)  # expand: each rank rounds its own rows first
    assert v2_combine_groups(True, False, 2, 2) == (2,)  # hybrid: each node's forwarder rounds
    assert v2_combine_groups(True, True, 2, 2) == (1, 2)
    assert all(v2_combine_groups(False, e, n, 2) == () for e in (False, True) for n in (1, 2))


def test_three_levels_by_hand_round_where_two_do_not() -> None:
    bf16 = lambda *v: torch.tensor(v, dtype=torch.bfloat16)  # noqa: E731
    # rank 0 holds two rows of the token (1 and 2**-8), rank 1 one (2**-8); every float32 sum is exact.
    rows = [(0, bf16(1.0)), (0, bf16(2.0**-8)), (1, bf16(2.0**-8))]
    once, exact_once = predict_levels(rows, [], (), 1)
    per_rank, exact_rank = predict_levels(rows, [], (1,), 1)
    assert exact_once.all() and exact_rank.all()
    # one rounding: 1 + 2**-7 is a bf16 value; per rank first: bf16(1 + 2**-8) = 1 (tie to even), then 1 + 2**-8 -> 1.
    assert once.tolist() == [1.0 + 2.0**-7] and per_rank.tolist() == [1.0]


def test_catches_an_ignored_allow_multiple_reduction_false_on_one_node(emulated_session) -> None:
    """On one node only the expand-mode combine tells the trees apart (a rank with two rows of one token)."""
    case, message = assert_caught(emulated_session, PID, "single-reduction-ignored", buffer_option_cases(2),
                                  shrink=False)
    assert "do_expand=True" in message and "reduction tree" in message, message
    assert "allow_multiple_reduction=False" in message and multi_local_slots(case.example), message


def test_catches_an_ignored_allow_multiple_reduction_true(emulated_session) -> None:
    """A buffer built with allow_multiple_reduction=True whose combine sends every expanded row unreduced cannot take
    expand mode's 1-D weights (the library's kernel traps there, the emulation refuses): every case's expand-mode
    combine with weights fails, the backend named."""
    (case,) = sample(buffer_option_cases(2), 1)
    with emulated_session.planted("multiple-reduction-ignored"), pytest.raises(RankRaised) as raised:
        emulated_session.check(PID, case)
    assert "emulated-v2" in str(raised.value) and "takes no topk_weights" in str(raised.value), str(raised.value)


def test_catches_a_per_node_rounding_without_allow_multiple_reduction_on_two_nodes(two_node_session) -> None:
    """(The other way round, a combine that rounds once though it should per node, P5 catches on two nodes too.)
    Drawn cases, not shrunk: shrinking on four ranks takes minutes."""
    for case in sample(buffer_option_cases(4), 10):
        message = fails(two_node_session, PID, case, "single-reduction-ignored")
        if message is not None:
            break
    else:
        raise AssertionError("none of 10 drawn cases caught a per-node rounding without allow_multiple_reduction")
    assert "reduction tree" in message and "allow_multiple_reduction=False" in message, message
    assert fails(two_node_session, PID, case, None) is None


def test_catches_expand_mode_combined_weights_in_the_wrong_slots(emulated_session) -> None:
    """The 1-D weights of an expand-mode combine (with allow_multiple_reduction) come back per slot."""
    _, message = assert_caught(emulated_session, PID, "expand-combined-weights-slot-shifted", buffer_option_cases(2),
                               shrink=False)
    assert "combined_topk_weights" in message and "1-D expand-mode weights" in message, message
    assert "do_expand=True" in message and "[buffer allow_multiple_reduction=False]" not in message, message


def test_catches_a_size_hint_that_sizes_the_combine_in_fp8(emulated_session) -> None:
    case, message = assert_caught(emulated_session, PID, "fp8-hint-sizes-combine-in-fp8", buffer_option_cases(2),
                                  shrink=False)
    assert "use_fp8_dispatch=True" in message and "the size hint" in message, message
    assert case.size_tokens * case.size_hidden > 0


def test_catches_a_direct_mode_hint_sized_for_hybrid_mode_on_two_nodes(two_node_session) -> None:
    """Drawn cases, not shrunk (shrinking on four ranks takes minutes); on one node both modes size alike."""
    for case in sample(buffer_option_cases(4), 5):
        message = fails(two_node_session, PID, case, "hint-ignores-allow-hybrid-mode")
        if message is not None:
            break
    else:
        raise AssertionError("none of 5 drawn cases caught a direct-mode size hint sized for hybrid mode")
    assert "allow_hybrid_mode=False" in message and "the size hint" in message, message
    assert fails(two_node_session, PID, case, None) is None


def test_the_size_oracle_by_hand() -> None:
    """One node of 2 ranks, 128 tokens of hidden 7168, top-8 (the recorded buffer: 4 MiB, fixtures/deepep-real):
    a bf16 dispatch token is 14336 + 0 + align(8 * 8 + 9 * 4 = 100, 32) = 14464 bytes, two receive slots of 128
    tokens: 3.7 MB, 4 MiB aligned; the combine (2 slots of 14336 + 64 bytes) is smaller."""
    from conformance.oracle.buffer_size import expected_buffer_size, token_bytes

    assert token_bytes(2 * 7168, 0, 8, True) == 14464
    assert expected_buffer_size(128, 7168, 8, use_fp8_dispatch=False, allow_hybrid_mode=True,
                                allow_multiple_reduction=True, num_nodes=1, ranks_per_node=2) == 4 << 20
    # FP8: 7168 + 896 + 128 bytes per dispatch token, 2.1 MB; the bf16 combine (3.7 MB) decides: 4 MiB still
    assert expected_buffer_size(128, 7168, 8, use_fp8_dispatch=True, allow_hybrid_mode=True,
                                allow_multiple_reduction=True, num_nodes=1, ranks_per_node=2) == 4 << 20


def test_holds_on_the_emulation_including_two_nodes(emulated_session, two_node_session) -> None:
    assert_holds(emulated_session, PID, sample(buffer_option_cases(2), 12))
    assert_holds(two_node_session, PID, sample(buffer_option_cases(4), 6))


def test_spares_a_different_sm_schedule_which_really_changes_the_sm_count(emulated_session) -> None:
    cases = sample(buffer_option_cases(2), 8)
    assert_holds(emulated_session, PID, cases, mutant="overlap-off-uses-every-sm")
    off = dataclasses.replace(next(c for c in cases if sum(c.example.tokens_per_rank)),
                              prefer_overlap_with_compute=False)
    with emulated_session.planted(None):
        clean = emulated_session.run(buffer_option_combine, off)
    with emulated_session.planted("overlap-off-uses-every-sm"):
        mutated = emulated_session.run(buffer_option_combine, off)
    for before, after in zip(clean, mutated, strict=True):
        for run, result in before["emulated-v2"].items():
            changed = after["emulated-v2"][run]
            assert result.num_sms != changed.num_sms
            assert torch.equal(result.combined_x.view(torch.int16), changed.combined_x.view(torch.int16))


def test_strategy_reaches_its_corners() -> None:
    strategy = buffer_option_cases(2)
    assert_reaches(strategy, lambda c: c.mode == "exact" and multi_local_slots(c.example), 1000)
    assert_reaches(strategy, lambda c: not c.prefer_overlap_with_compute, 1000)
    assert_reaches(strategy, lambda c: c.mode == "bounded" and multi_local_slots(c.example), 1000)
    assert_reaches(strategy, lambda c: c.num_bias == 2 and c.mode == "exact", 1000)
    assert_reaches(strategy, lambda c: c.size_tokens > 2048 and c.size_hidden >= 4096, 1000)  # beyond 2 MiB
    assert_reaches(strategy, lambda c: c.size_topk == 0, 1000)  # sized for 32 slots
    assert all(isinstance(c, BufferOptionsCase) and c.example.hidden % 256 == 0 for c in sample(strategy, 20))
