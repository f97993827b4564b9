"""Rank task of P28 (back-to-back rounds): per backend, every round's dispatch and combine (identity experts) on the
same buffer, issued one after the other with no barrier between them, the round's late rank sleeping first; the
combined rows are read only after the last round (each round's outputs must outlive the calls after it)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from conformance.core.cases import BackToBackCase
from conformance.core.example import build_rank_inputs
from conformance.core.views import DispatchOptions, DispatchView
from conformance.tasks.combine import CombineResult, reduction_group
from conformance.tasks.env import RankEnv, rank_task


@dataclass
class Round:
    """One round of one backend on one rank: its dispatch and its combine of the received rows."""

    dispatch: DispatchView
    combined: CombineResult


@rank_task
def back_to_back_rounds(env: RankEnv) -> dict[str, Any]:
    """``{backend: [Round, ...]}`` for every backend declaring ``combine``."""
    case: BackToBackCase = env.case
    rounds = case.rounds()
    inputs = [build_rank_inputs(example, env.rank).to(env.device) for example in rounds]

    def run(adapter: Any) -> list[Round]:
        made = []
        for i, (example, mine) in enumerate(zip(rounds, inputs, strict=True)):
            if case.late[i] == env.rank:
                time.sleep(case.delay_ms / 1000)
            view, raw = adapter.dispatch(mine, example, DispatchOptions(), env.rank)
            combined_x, _ = adapter.combine(raw, raw.recv_x)
            call = (f"round {i + 1} of {len(rounds)}: {adapter.describe_combine(example, env.rank)}, after "
                    f"{view.call}")
            made.append((view, call, combined_x, reduction_group(adapter, raw)))
        # read only now, after the last round
        return [Round(view, CombineResult(call, x.cpu(), None, reduction_group=group))
                for view, call, x, group in made]

    return env.each_backend("dispatch", run, capability="combine", also=("combine",))
