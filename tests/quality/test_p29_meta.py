"""Meta-tests of P29-cuda-graphs: with the emulation's stand-in for a graph planted (the emulation captures no
graphs: unsupported otherwise) it catches a replay that keeps the capture's outputs, naming the replay and the input
set, and holds on a faithful replay (one and two nodes); without a stand-in the emulation is unsupported, saying
why, not passed."""

from conformance.core.cases import GraphCase
from conformance.core.example import Example
from conformance.core.outcomes import NotChecked
from conformance.strategies.cuda_graphs import graph_cases
from conformance.tasks.cuda_graphs import graph_replays
from tests.helpers.meta import assert_caught, assert_holds, fails, sample

PID = "P29-cuda-graphs"
MUTANT = "graph-replay-frozen"
STAND_IN = "graph-stand-in"
#: Two input sets on two ranks; replayed on set 1, then on set 0 (the captured one).
CASE = GraphCase(example=Example(tokens_per_rank=(6, 4), hidden=256, num_topk=2, num_experts=4,
                                 payload="integers", seed=7), num_sets=2, replays=(1, 0))


def test_cuda_graphs_catches_a_replay_that_keeps_the_captured_outputs(emulated_session) -> None:
    message = fails(emulated_session, PID, CASE, MUTANT)
    assert message is not None and "replay 1 (of the graph captured on input set 0) on input set 1" in message, message
    assert fails(emulated_session, PID, CASE, STAND_IN) is None
    example, message = assert_caught(emulated_session, PID, MUTANT, graph_cases(2), shrink=False)
    assert "replay" in message, (example, message)


def test_cuda_graphs_is_unsupported_on_the_emulation_without_a_stand_in(emulated_session) -> None:
    per_rank = emulated_session.run(graph_replays, CASE)
    reasons = [result for ranks in per_rank for result in ranks.values()]
    assert reasons and all(isinstance(r, NotChecked) and "CUDA graphs need a GPU" in r.reason for r in reasons), \
        reasons
    assert fails(emulated_session, PID, CASE, None) is None


def test_cuda_graphs_holds_with_the_stand_in_including_two_nodes(emulated_session, two_node_session) -> None:
    assert_holds(emulated_session, PID, sample(graph_cases(2), 5), STAND_IN)
    assert_holds(two_node_session, PID, sample(graph_cases(4), 3), STAND_IN)
