"""``_comm.exchange``, the emulation's network: a call's preflight and its rows in one collective where they fit
(``EAGER_BYTES``), two where they do not; bit-exact either way; a refusal on one rank raised on every rank."""

from __future__ import annotations

import pytest

from conformance.emulation._comm import EAGER_BYTES
from conformance.world.launcher import World, WorldShape

#: Its module-scoped fixtures are built once: under xdist (the self-tests run with -n) its tests share a worker.
pytestmark = pytest.mark.xdist_group("test_exchange")

HIDDEN = 64  # bf16 row: 128 bytes, plus 4 fp8, 3 bool and 8 int64 bytes
ROW_BYTES = HIDDEN * 2 + 4 + 3 + 8


@pytest.fixture(scope="module")
def world():
    w = World(WorldShape(nodes=1, ranks_per_node=3), start_timeout_s=120)
    w.start()
    yield w
    w.close()


@pytest.mark.parametrize("rows, rounds", [
    ([3, 0, 5], 1),                                         # small: preflight and rows in one collective
    ([0, 0, 0], 1),                                         # nobody sends a row
    ([EAGER_BYTES // ROW_BYTES + 1, 1, 0], 2),              # one rank's rows exceed the eager bytes: a second round
    ([EAGER_BYTES // ROW_BYTES - 1, 700, 2 * EAGER_BYTES // ROW_BYTES], 2),
])
def test_rows_arrive_bit_exact_in_one_round_or_two(world: World, rows: list[int], rounds: int) -> None:
    results = world.run("tests.helpers.exchange_tasks:exchange_matches", rows, HIDDEN, timeout=60)
    for rank, got in enumerate(results):
        assert got["mismatches"] == [], f"rank {rank}: fields differ from what was sent: {got['mismatches']}"
        assert got["table"] == [[n, r, 5] for r, n in enumerate(rows)], f"rank {rank}: preflight table {got['table']}"
        assert got["collectives"] == rounds, (
            f"rank {rank}: {got['collectives']} all_gather(s) for rows {rows}, expected {rounds}")
        assert got["names"] == ["x", "fp8", "flag", "token", "nothing", "absent"]


@pytest.mark.parametrize("refusing", [0, 2])
def test_a_refusal_on_one_rank_is_raised_on_every_rank(world: World, refusing: int) -> None:
    raised = world.run("tests.helpers.exchange_tasks:exchange_refused", [4, 4, 4], refusing, timeout=60)
    assert raised == ["ValueError" if r == refusing else "PeerRefused" for r in range(3)], raised
    # and the world goes on: the next exchange is whole
    assert all(r["mismatches"] == [] for r in world.run("tests.helpers.exchange_tasks:exchange_matches", [2, 2, 2],
                                                        HIDDEN, timeout=60))
