"""Fidelity of ``conformance.emulation`` against the real DeepEP recordings (2 x H200).

Every recorded case is replayed on a 2-rank gloo world (CPU) and every recorded field is compared byte for
byte (``conformance.emulation.replay``); the recorded errors are re-triggered; a Megatron-style integrator
(``fused_a2a.py``) runs unchanged against ``import conformance.emulation as deep_ep``.

The world is a small local harness (spawned processes + FileStore); it can be swapped for
``conformance.world.World`` (``world.run('module:function', ...)``) without touching the rank functions.
"""
from __future__ import annotations

import importlib
import os
import pickle
import tempfile
import time
import traceback
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from conformance.emulation import replay

WORLD_SIZE = 2
TIMEOUT_S = 120
CASES = replay.recorded_case_names()
JOBS = [(f'case:{name}', 'conformance.emulation.replay:replay_recorded_case', (name,)) for name in CASES] + [
    ('errors', 'conformance.emulation.replay:replay_recorded_errors', ()),
    ('megatron', 'tests.test_emulation_fidelity:megatron_style_round_trip', ()),
]


# ------------------------------------------------------------------------------------------ rank side
def _rank_main(rank: int, store_path: str, out_dir: str, jobs: list) -> None:
    torch.set_num_threads(1)
    os.environ['LOCAL_WORLD_SIZE'] = str(WORLD_SIZE)
    store = dist.FileStore(store_path, WORLD_SIZE)
    dist.init_process_group('gloo', store=store, rank=rank, world_size=WORLD_SIZE)
    results = {}
    for name, target, args in jobs:
        module, func = target.split(':')
        checked: list[str] = []
        try:
            fn = getattr(importlib.import_module(module), func)
            kwargs = {'checked': checked} if module.endswith('replay') else {}
            results[name] = {'mismatches': fn(*args, **kwargs), 'checked': checked}
        except Exception:  # noqa: BLE001 - reported to the controller
            results[name] = {'exception': traceback.format_exc(), 'checked': checked}
    Path(out_dir, f'rank{rank}.pkl').write_bytes(pickle.dumps(results))
    dist.destroy_process_group()


def megatron_style_round_trip() -> dict:
    """Megatron ``fused_a2a``-style calls (V1 Buffer, EventOverlap from ``deep_ep.utils``); {} when correct."""
    import conformance.emulation as deep_ep
    from conformance.emulation.utils import EventHandle, EventOverlap

    group = dist.group.WORLD
    rank = group.rank()
    num_experts, hidden = 8, 64
    gen = torch.Generator().manual_seed(rank)
    x = torch.randint(-8, 8, (12, hidden), generator=gen).to(torch.bfloat16)
    token_indices = torch.stack([torch.randperm(num_experts, generator=gen)[:2] for _ in range(12)])
    token_probs = torch.rand(12, 2, generator=gen)
    problems = {}
    for async_finish in (False, True):
        buffer = deep_ep.Buffer(group, 0, 0)
        for config in (deep_ep.Buffer.get_dispatch_config(group.size()),
                       deep_ep.Buffer.get_combine_config(group.size())):
            assert config.get_nvl_buffer_size_hint(hidden * 2, group.size()) > 0
        previous_event = EventOverlap(EventHandle()) if async_finish else None
        per_rank, per_rdma, per_expert, in_rank, event = buffer.get_dispatch_layout(
            token_indices, num_experts, previous_event=previous_event, async_finish=async_finish,
            allocate_on_comm_stream=False)
        recv_x, recv_idx, recv_probs, counts, handle, after = buffer.dispatch(
            x, topk_idx=token_indices, topk_weights=token_probs, num_tokens_per_rank=per_rank,
            num_tokens_per_rdma_rank=per_rdma, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert,
            previous_event=event, async_finish=async_finish, allocate_on_comm_stream=False)
        if async_finish:
            after.current_stream_wait()
        tokens_per_expert = torch.tensor(counts)
        if int(tokens_per_expert.sum()) != int((recv_idx >= 0).sum()):
            problems[f'{async_finish}.counts'] = 'num_recv_tokens_per_expert_list disagrees with recv_topk_idx'
        combined, _, after = buffer.combine(recv_x, handle=handle, async_finish=async_finish,
                                            previous_event=EventOverlap(EventHandle()) if async_finish else None,
                                            allocate_on_comm_stream=False)
        if async_finish:
            after.current_stream_wait()
        reached = in_rank.sum(1, keepdim=True).to(torch.float32)
        if not torch.equal(combined.float(), x.float() * reached):
            problems[f'{async_finish}.combine'] = 'combine(dispatch(x)) != x * number of ranks reached'
        grad_x, _, _, _, _, after = buffer.dispatch(combined.contiguous(), handle=handle, async_finish=async_finish)
        with after:
            pass
        if not torch.equal(grad_x, buffer.dispatch(combined, handle=handle)[0]):
            problems[f'{async_finish}.cached'] = 'cached dispatch is not deterministic'
        grad, grad_probs, _ = buffer.combine(recv_x, handle, topk_weights=recv_probs.float())
        if not torch.equal(grad_probs, token_probs * (token_indices >= 0)):
            problems[f'{async_finish}.probs'] = 'combined probabilities differ from the dispatched ones'
    deep_ep.Buffer.set_num_sms(20)
    return problems


# ------------------------------------------------------------------------------------ controller side
def _run_world(jobs: list) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        ctx = mp.start_processes(_rank_main, args=(os.path.join(tmp, 'store'), tmp, jobs), nprocs=WORLD_SIZE,
                                 start_method='spawn', join=False)
        deadline = time.monotonic() + TIMEOUT_S
        try:
            while not ctx.join(timeout=1):
                if time.monotonic() > deadline:
                    raise TimeoutError(f'emulation fidelity world did not finish in {TIMEOUT_S}s')
        finally:
            for proc in ctx.processes:
                if proc.is_alive():
                    proc.kill()
                    proc.join(5)
        return [pickle.loads(Path(tmp, f'rank{r}.pkl').read_bytes()) for r in range(WORLD_SIZE)]


@pytest.fixture(scope='module')
def world_results() -> list[dict]:
    return _run_world(JOBS)


def _assert_clean(world_results: list[dict], name: str) -> None:
    __tracebackhide__ = True
    for rank, results in enumerate(world_results):
        res = results[name]
        assert 'exception' not in res, f'rank {rank} raised in {name}:\n{res["exception"]}'
        assert res['checked'] or name == 'megatron', f'rank {rank}: nothing was checked in {name}'
        assert not res['mismatches'], f'rank {rank} {name}: ' + '\n'.join(
            f'  {k}: {v}' for k, v in res['mismatches'].items())


@pytest.mark.parametrize('case', CASES)
def test_recorded_case_matches_byte_for_byte(world_results: list[dict], case: str) -> None:
    _assert_clean(world_results, f'case:{case}')


def test_recorded_errors_match(world_results: list[dict]) -> None:
    _assert_clean(world_results, 'errors')


def test_megatron_style_integrator_runs_unchanged(world_results: list[dict]) -> None:
    _assert_clean(world_results, 'megatron')


def test_import_surface() -> None:
    import conformance.emulation as deep_ep
    from conformance.emulation.utils import EventOverlap as FromUtils
    from conformance.emulation.utils.event import EventOverlap as FromEvent

    assert FromUtils is FromEvent is deep_ep.EventOverlap
    assert deep_ep.topk_idx_t is torch.int64
    for name in ('Buffer', 'ElasticBuffer', 'EPHandle', 'EventHandle', 'Config'):
        assert hasattr(deep_ep, name)
    with pytest.raises(AssertionError, match='The SM count must be even'):
        deep_ep.Buffer.set_num_sms(21)
