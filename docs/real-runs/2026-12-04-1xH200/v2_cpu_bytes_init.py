"""Diagnostic of the P11 hang of 2026-12-04 (catalog run, seed 2503): two ranks on one GPU build and destroy
``ElasticBuffer(num_bytes=hint + cpu, num_cpu_bytes=cpu, num_allocated_qps=q, explicitly_destroy=True)`` in the order
given, each step under a watchdog; the first step that does not finish in ``--step-timeout`` seconds is reported with
the ranks' Python stacks (faulthandler), and the world ends.  ``--fresh`` runs every configuration in a world of its
own instead.

    NCCL_MULTI_RANK_GPU_ENABLE=1 python docs/real-runs/2026-12-04-1xH200/v2_cpu_bytes_init.py \
        --configs 0:17,0:129,2:17,2:129,2:129,2:129
(``C:Q``: C MiB of CPU bytes, Q allocated QPs.)  One JSON line per step and rank.
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import json
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

MIB = 1 << 20


def rank_main(rank: int, port: int, configs: list[tuple[int, int]], step_timeout: float) -> None:
    torch.cuda.set_device(0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=120))
    import deep_ep

    group = dist.new_group([0, 1])
    for step, (cpu_mib, qps) in enumerate(configs):
        started = time.monotonic()
        # A hung constructor holds the GIL (run 18 of 2026-12-04: a Python watchdog thread never ran), so the
        # watchdog is faulthandler's own C thread: it prints the stacks and exits the rank with status 1.
        print(json.dumps({"rank": rank, "step": step, "starting": [cpu_mib, qps]}), flush=True)
        faulthandler.dump_traceback_later(step_timeout, exit=True)
        out: dict = {"rank": rank, "step": step, "cpu_mib": cpu_mib, "qps": qps}
        try:
            hint = int(deep_ep.ElasticBuffer.get_buffer_size_hint(group, 64, 256, 2))
            buffer = deep_ep.ElasticBuffer(group, num_bytes=hint + cpu_mib * MIB, num_cpu_bytes=cpu_mib * MIB,
                                           num_max_tokens_per_rank=64, hidden=256, num_topk=2,
                                           num_allocated_qps=qps, explicitly_destroy=True)
            out["built_s"] = round(time.monotonic() - started, 2)
            out["hybrid"] = bool(buffer.allow_hybrid_mode)
            buffer.destroy()
            out["destroyed_s"] = round(time.monotonic() - started, 2)
        except Exception as exc:  # recorded verbatim
            out["error"] = f"{type(exc).__name__}: {exc}"[:500]
        faulthandler.cancel_dump_traceback_later()
        print(json.dumps(out), flush=True)
        dist.barrier(group)
    dist.destroy_process_group()


def world(configs: list[tuple[int, int]], step_timeout: float, port: int) -> int:
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=rank_main, args=(r, port, configs, step_timeout)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(step_timeout * len(configs) + 120)
        if p.is_alive():
            p.kill()
    codes = [p.exitcode for p in procs]
    print(json.dumps({"world": [f"{c}:{q}" for c, q in configs], "exit_codes": codes}), flush=True)
    return 0 if codes == [0, 0] else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default="0:17,0:129,2:17,2:129,2:129,2:129")
    parser.add_argument("--step-timeout", type=float, default=40.0)
    parser.add_argument("--fresh", action="store_true")
    args = parser.parse_args()
    configs = [tuple(int(v) for v in c.split(":")) for c in args.configs.split(",")]
    if args.fresh:
        return max(world([c], args.step_timeout, 29611 + i) for i, c in enumerate(configs))
    return world(configs, args.step_timeout, 29610)


if __name__ == "__main__":
    sys.exit(main())
