"""Diagnostic: make the calls a set-up limit keeps the suite from making (conformance/core/setup_limits.py), each in
a fresh world of its own under a timeout, and say for each whether it returned, raised (what) or hung.  What it finds
narrows or widens the limit's ``applies`` (only the valid constructor with CPU bytes was seen hanging; the bad calls of
refusal rows v2_init_cpu_handle_alignment and v2_init_cpu_bytes_exceed were never made on that set-up).

    NCCL_MULTI_RANK_GPU_ENABLE=1 python docs/real-runs/setup_limit_probe.py --backends real-v2 --rank-setup shared \
        --device cuda --timeout 60 --out probe.json

Each call costs at most ``--timeout`` seconds and a world start; a hung one is named with the ranks' stacks.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

HERE = Path(__file__).resolve().parent


def probe(settings: Any, name: str) -> list[Any]:
    """Rank side: recipe ``name`` of the refusal table made against the backend's module with no set-up limit
    consulted (``real=False``): ``(exception type, message)``, ``(None, None)`` when it returned."""
    from conformance.backends.factory import get_adapter
    from conformance.core.example import Example
    from conformance.tasks import refusals

    (spec,) = settings.backends
    example = Example(tokens_per_rank=(4, 4), hidden=256, num_topk=2, num_experts=4, num_max_tokens_per_rank=16)
    env = refusals.make_env(get_adapter(spec).module, example, real=False)
    return list(refusals.run(name, env)[:2])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="real-v2")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--rank-setup", default="shared")
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (str(HERE), os.environ.get("PYTHONPATH"))))
    sys.path.insert(0, str(HERE.parents[1]))

    from conformance.core.setup_limits import SETUP_LIMITS
    from conformance.harness.options import build_run_config
    from conformance.harness.session import Session
    from conformance.tasks.env import TaskSettings
    from conformance.world.errors import RankFailure

    config = build_run_config(SimpleNamespace(backends=args.backends, device=args.device, rank_setup=args.rank_setup,
                                              nodes=1, ranks_per_node=2, example_timeout=args.timeout))
    names = ["v2_init_cpu_bytes_without_num_bytes.ok", "v2_init_cpu_handle_alignment",
             "v2_init_cpu_handle_alignment.ok", "v2_init_cpu_bytes_exceed", "v2_init_cpu_bytes_exceed.ok"]
    found: dict[str, Any] = {"limits": [limit.id for limit in SETUP_LIMITS], "set_up": args.rank_setup, "calls": {}}
    for spec in config.backends:
        for name in names:
            session = Session(config)  # a fresh world per call: a hang retires it anyway
            try:
                per_rank = session.world.run("setup_limit_probe:probe", TaskSettings((spec,)), name,
                                             timeout=args.timeout)
                found["calls"][f"{spec.name} {name}"] = {"per_rank": per_rank}
            except RankFailure as failure:
                found["calls"][f"{spec.name} {name}"] = {"failed": str(failure)[:2000]}
            finally:
                session.close()
            print(f"{spec.name} {name}: {json.dumps(found['calls'][f'{spec.name} {name}'])[:400]}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(found, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
