"""Reproduction of P27's finding on the real DeepEP (issue 27): an ``ElasticBuffer`` built on a NCCL process group
made just before it, no collective run on it yet, and the workarounds.

Each scenario runs in a fresh world of two rank processes (both on GPU 0, as ``--rank-setup shared``: the world's
group is gloo, ``NCCL_MULTI_RANK_GPU_ENABLE=1``); per scenario one JSON line: each rank's outcome (``ok`` with the
rows its dispatch received, the exception, or the signal that killed it).

    source .deepep-kit/activate.sh; python docs/real-runs/2026-12-05-1xH200/fresh_nccl_group.py

Scenarios:
  fresh_nccl          dist.new_group(backend="nccl"), then ElasticBuffer(group, ...) and one dispatch
  after_collective    the same with one all_reduce on the group before the buffer (workaround 1)
  no_comm_reuse       the same with EP_REUSE_NCCL_COMM=0 (DeepEP makes its own communicator; workaround 2)
  eager_device_id     dist.new_group(backend="nccl", device_id=cuda:0): the communicator made eagerly (workaround 3)
  fresh_gloo          dist.new_group() (gloo here), the suite's default way (control)
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import sys

os.environ.update({"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
                   "NCCL_MULTI_RANK_GPU_ENABLE": "1"})

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

SCENARIOS = ("fresh_gloo", "after_collective", "no_comm_reuse", "eager_device_id", "fresh_nccl")


def rank_main(rank: int, scenario: str, port: int, queue: mp.Queue) -> None:
    if scenario == "no_comm_reuse":
        os.environ["EP_REUSE_NCCL_COMM"] = "0"
    torch.cuda.set_device(0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    import deep_ep

    try:
        kwargs = {} if scenario == "fresh_gloo" else {"backend": "nccl"}
        if scenario == "eager_device_id":  # PyTorch then creates the group's communicator now
            kwargs["device_id"] = torch.device("cuda", 0)
        group = dist.new_group([0, 1], **kwargs)
        if scenario == "after_collective":
            dist.all_reduce(torch.zeros(1, device="cuda"), group=group)
        if scenario != "fresh_gloo":  # what deep_ep/utils/comm.py reuses (EP_REUSE_NCCL_COMM=1): PyTorch's comm
            backend = group._get_backend(torch.device("cuda"))
            ptr = hex(int(backend._comm_ptr())) if hasattr(backend, "_comm_ptr") else "no _comm_ptr"
            print(json.dumps({"scenario": scenario, "rank": rank, "comm_ptr_before_the_buffer": ptr}), flush=True)
        buffer = deep_ep.ElasticBuffer(group, num_max_tokens_per_rank=16, hidden=256, num_topk=2,
                                       explicitly_destroy=True)
        gen = torch.Generator().manual_seed(rank)
        x = torch.randn(8, 256, generator=gen).to(torch.bfloat16).cuda()
        idx = torch.stack([torch.randperm(4, generator=gen)[:2] for _ in range(8)]).cuda()
        w = torch.rand(8, 2, generator=gen).cuda()
        recv_x = buffer.dispatch(x, idx, w, num_experts=4)[0]
        torch.cuda.synchronize()
        queue.put((rank, f"ok: received {recv_x.shape[0]} rows"))
        buffer.destroy()
        dist.destroy_process_group(group)
    except Exception as exc:  # noqa: BLE001 - the outcome
        queue.put((rank, f"raised {type(exc).__name__}: {str(exc)[:300]}"))
    dist.destroy_process_group()


def main() -> int:
    ctx = mp.get_context("spawn")
    for n, scenario in enumerate(SCENARIOS):
        queue = ctx.Queue()
        procs = [ctx.Process(target=rank_main, args=(r, scenario, 29600 + 10 * n + os.getpid() % 7, queue))
                 for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
        outcome: dict = {}
        while not queue.empty():
            rank, what = queue.get()
            outcome[rank] = what
        for r, p in enumerate(procs):
            if p.is_alive():
                p.kill()
                outcome.setdefault(r, "hung (killed after 120 s)")
            elif p.exitcode and p.exitcode < 0:
                outcome.setdefault(r, f"killed by {signal.Signals(-p.exitcode).name}")
            else:
                outcome.setdefault(r, f"exited {p.exitcode} without a report")
        print(json.dumps({"scenario": scenario, "ranks": outcome}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
