"""Experiment: can two rank processes share one GPU for the real DeepEP's legacy intranode path?

The legacy ``Buffer`` with ``num_rdma_bytes=0`` shares memory between ranks through CUDA IPC only; the process
group is used only to exchange IPC handles (``all_gather_object``), so a gloo group will do.  If two processes on
the one GPU of the ``nvidia-h200`` kind can build such a buffer and dispatch/combine through it, the V1 properties
can run real against emulated before a two-GPU machine is lent.  This script tries, and prints one JSON line per
rank saying what worked and what failed (the exception, verbatim).

    python docs/real-runs/two_ranks_one_gpu.py            # with the deepep-kit sourced (see its README)
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2
TOKENS, HIDDEN, TOPK, EXPERTS = 8, 256, 2, 4


def rank_main(rank: int, port: int, queue: mp.Queue) -> None:
    steps: dict[str, object] = {"rank": rank}
    try:
        torch.cuda.set_device(0)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                                timeout=datetime.timedelta(seconds=60))
        import deep_ep

        steps["deep_ep"] = getattr(deep_ep, "__version__", "?")
        group = dist.new_group(list(range(WORLD)))
        buffer = deep_ep.Buffer(group, num_nvl_bytes=1 << 30, num_rdma_bytes=0, explicitly_destroy=True)
        steps["buffer"] = "built"
        gen = torch.Generator().manual_seed(rank)
        x = torch.randint(-8, 9, (TOKENS, HIDDEN), generator=gen).to(torch.bfloat16).cuda()
        topk_idx = torch.stack([torch.randperm(EXPERTS, generator=gen)[:TOPK] for _ in range(TOKENS)]).cuda()
        topk_weights = torch.rand(TOKENS, TOPK, generator=gen).cuda()
        per_rank, per_rdma, per_expert, in_rank, _ = buffer.get_dispatch_layout(topk_idx, EXPERTS)
        steps["layout"] = per_rank.tolist()
        recv_x, recv_idx, recv_w, counts, handle, _ = buffer.dispatch(
            x, num_tokens_per_rank=per_rank, num_tokens_per_rdma_rank=per_rdma, is_token_in_rank=in_rank,
            num_tokens_per_expert=per_expert, topk_idx=topk_idx, topk_weights=topk_weights)
        torch.cuda.synchronize()
        steps["dispatch"] = {"recv_rows": int(recv_x.shape[0]), "counts": list(counts)}
        combined, _, _ = buffer.combine(recv_x, handle)
        torch.cuda.synchronize()
        expected = x.float() * in_rank.sum(dim=1, keepdim=True).float()  # identity experts: x times ranks reached
        steps["combine_exact"] = bool(torch.equal(combined.float(), expected))
        buffer.destroy()
        steps["destroy"] = "ok"
        dist.barrier()
        dist.destroy_process_group()
    except BaseException as exc:  # recorded verbatim: the point of the experiment is what fails
        steps["error"] = f"{type(exc).__name__}: {exc}"
        steps["traceback"] = traceback.format_exc()[-2000:]
    queue.put(steps)


def main() -> int:
    if not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA device"}))
        return 2
    port = 29500 + os.getpid() % 1000
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(rank, port, queue)) for rank in range(WORLD)]
    for p in procs:
        p.start()
    results = []
    for _ in procs:
        try:
            results.append(queue.get(timeout=180))
        except Exception:  # a rank hung or died without reporting
            results.append({"error": "no report within 180 s (hung or died)"})
    for p in procs:
        p.join(10)
        if p.is_alive():
            p.kill()
    for r in sorted(results, key=lambda r: r.get("rank", 99)):
        print(json.dumps(r))
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
