"""Diagnostic: make every P12 row's bad call and valid neighbour (conformance/emulation/refusals.toml) on the
selected backends, and list every row whose result differs from the table, all at once (P12 itself stops at the
first failing case).  Used to check the table against the real library.

    python docs/real-runs/refusal_sweep.py --backends real-v1,emulated-v1 --rank-setup shared --device cuda \
        --out sweep.json
"""

from __future__ import annotations

import argparse
import json
import sys
from types import SimpleNamespace


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="emulated")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--rank-setup", default="isolated")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--ranks-per-node", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    from conformance.core.cases import p12_rows
    from conformance.emulation import _refusals
    from conformance.harness.options import build_run_config
    from conformance.harness.session import Session
    from conformance.strategies.calls import bad_call_sweep
    from conformance.tasks.bad_input import bad_call_results
    from conformance.world.errors import RankFailure

    config = build_run_config(SimpleNamespace(backends=args.backends, device=args.device, rank_setup=args.rank_setup,
                                              nodes=args.nodes, ranks_per_node=args.ranks_per_node,
                                              example_timeout=60.0))
    session = Session(config)
    rows = p12_rows()
    report: dict[str, dict] = {}
    try:
        for case in bad_call_sweep(config.shape):
            try:
                results = session.run(bad_call_results, case)
            except RankFailure as failure:  # the whole case failed: retry its rows one by one
                for row_id in case.rows:
                    single = type(case)(case.example, (row_id,))
                    try:
                        results = session.run(bad_call_results, single)
                    except RankFailure as again:
                        report[row_id] = {"world": str(again).splitlines()[0][:400]}
                        continue
                    report.update(_judge(rows, _refusals, single, results))
                print(f"case of {len(case.rows)} rows retried one by one: {str(failure).splitlines()[0][:200]}")
                continue
            judged = _judge(rows, _refusals, case, results)
            report.update(judged)
            for row_id, per_backend in judged.items():  # as found: a run stopped by its time limit keeps them
                for backend, verdict in per_backend.items():
                    if not verdict["ok"]:
                        print(f"differs: {row_id} {backend} {json.dumps(verdict)[:600]}", flush=True)
    finally:
        session.close()
    bad = {rid: r for rid, r in report.items() if r.get("world") or any(not b["ok"] for b in r.values()
                                                                      if isinstance(b, dict))}
    print(f"{len(report)} rows checked; {len(bad)} differ from the table")
    for rid, r in sorted(bad.items()):
        print(rid, json.dumps(r)[:700])
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"rows": report, "differ": sorted(bad)}, f, indent=1)
    return 0 if not bad else 1


def _judge(rows: dict, refusals: object, case: object, results: list[dict]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for row_id in case.rows:
        row = rows[row_id]
        per_backend = {}
        for backend in results[0]["rows"][row_id]:
            got = [r["rows"][row_id][backend] for r in results]
            limited = [v for g in got for v in g.values() if not hasattr(v, "side_effect")]  # Unsupported: not made
            if limited:  # a set-up limit (conformance/core/setup_limits.py) kept a call from being made
                per_backend[backend] = {"ok": True, "not_made": limited[0].error[:400]}
                continue
            raised_ok = all(g["raised"].type == row["exception"] and refusals.matches(row_id, g["raised"].message or "")
                            for g in got)
            neighbour_ok = all(g["neighbour"].type is None for g in got)
            side_effects = sorted({s for g in got for s in (g["raised"].side_effect, g["neighbour"].side_effect)
                                   if s is not None})
            per_backend[backend] = {"ok": raised_ok and neighbour_ok and not side_effects,
                                    "side_effects": side_effects,
                                    "raised": [str(g["raised"])[:300] for g in got],
                                    "neighbour": [str(g["neighbour"])[:300] for g in got]}
        out[row_id] = per_backend
    return out


if __name__ == "__main__":
    sys.exit(main())
