"""Replay the real-library recordings (``fixtures/deepep-real``) against the emulation, inside one rank.

Call from an initialised 2-rank world (any backend); every rank calls the same function:

    mismatches = replay_recorded_case('base')      # {} when every field matches byte for byte
    mismatches = replay_recorded_errors()

Recorded inputs are CPU tensors; they are moved to ``device`` (default: CPU).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from conformance.emulation.elastic import ElasticBuffer
from conformance.emulation.legacy import Buffer

DEFAULT_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "deepep-real"
V2_KWARGS = {"num_max_tokens_per_rank": 128, "hidden": 7168, "num_topk": 8}
Mismatches = dict[str, str]


@functools.lru_cache(maxsize=4)
def load_recording(rank: int, fixtures_dir: str | None = None) -> dict:
    """The recorded dict of ``rank`` (``rank{rank}.pt``)."""
    root = Path(fixtures_dir or os.environ.get("DEEPEP_REAL_FIXTURES", DEFAULT_FIXTURES))
    return torch.load(root / f"rank{rank}.pt", weights_only=True)


def recorded_case_names(fixtures_dir: str | None = None) -> list[str]:
    """Names of the recorded cases."""
    return list(load_recording(0, fixtures_dir)["cases"])


def _bytes(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().cpu().contiguous()
    return t.reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)


class _Checker:
    """Collects mismatches and the names of the checked fields."""

    def __init__(self, prefix: str, checked: list[str] | None) -> None:
        self.prefix = prefix
        self.mismatches: Mismatches = {}
        self.checked = checked if checked is not None else []

    def eq(self, name: str, got: object, expected: object) -> None:
        key = f"{self.prefix}.{name}"
        self.checked.append(key)
        problem = _difference(got, expected)
        if problem:
            self.mismatches[key] = problem

    def fail(self, name: str, problem: str) -> None:
        key = f"{self.prefix}.{name}"
        self.checked.append(key)
        self.mismatches[key] = problem


def _difference(got: object, expected: object) -> str | None:
    if isinstance(expected, torch.Tensor) or isinstance(got, torch.Tensor):
        if not (isinstance(expected, torch.Tensor) and isinstance(got, torch.Tensor)):
            return f"got {type(got).__name__}, expected {type(expected).__name__}"
        if got.dtype != expected.dtype or tuple(got.shape) != tuple(expected.shape):
            return f"got {got.dtype}{tuple(got.shape)}, expected {expected.dtype}{tuple(expected.shape)}"
        if not torch.equal(_bytes(got), _bytes(expected)):
            diff = (_bytes(got) != _bytes(expected)).nonzero()
            return f"bytes differ ({diff.numel()} bytes, first at byte {int(diff[0])})"
        return None
    if got != expected:
        return f"got {got!r}, expected {expected!r}"
    return None


def _order_by_key(meta: torch.Tensor) -> torch.Tensor:
    return torch.sort(meta[:, 0].cpu().to(torch.int64), stable=True).indices


def _check_dst_slots(chk: _Checker, got: torch.Tensor, expected: torch.Tensor) -> None:
    """Arrival-order slots: compare which slots are set and the set of slot values."""
    got, expected = got.cpu(), expected.cpu()
    chk.eq("handle.dst_buffer_slot_idx.mask", got >= 0, expected >= 0)
    chk.eq(
        "handle.dst_buffer_slot_idx.values_as_set",
        torch.sort(got[got >= 0]).values,
        torch.sort(expected[expected >= 0]).values,
    )


def _check_v1(
    chk: _Checker,
    group: dist.ProcessGroup,
    case: dict,
    x: torch.Tensor,
    topk_idx: torch.Tensor,
    topk_weights: torch.Tensor,
) -> None:
    rec, meta = case["v1"], case["case"]
    buf = Buffer(group, num_nvl_bytes=1 << 30)
    per_rank, per_rdma, per_expert, in_rank, _ = buf.get_dispatch_layout(topk_idx, meta["num_experts"])
    for name, got in (
        ("num_tokens_per_rank", per_rank),
        ("num_tokens_per_rdma_rank", per_rdma),
        ("num_tokens_per_expert", per_expert),
        ("is_token_in_rank", in_rank),
    ):
        chk.eq(f"layout.{name}", got, rec["layout"][name])
    recv_x, recv_idx, recv_w, counts, handle, _ = buf.dispatch(
        x,
        num_tokens_per_rank=per_rank,
        num_tokens_per_rdma_rank=per_rdma,
        is_token_in_rank=in_rank,
        num_tokens_per_expert=per_expert,
        topk_idx=topk_idx,
        topk_weights=topk_weights,
        expert_alignment=meta["expert_alignment"],
    )
    chk.eq("recv_x", recv_x, rec["recv_x"])
    chk.eq("recv_topk_idx", recv_idx, rec["recv_topk_idx"])
    chk.eq("recv_topk_weights", recv_w, rec["recv_topk_weights"])
    chk.eq("num_recv_tokens_per_expert_list", counts, rec["num_recv_tokens_per_expert_list"])
    combined_x, combined_w, _ = buf.combine(recv_x, handle, topk_weights=recv_w)
    chk.eq("combined_x", combined_x, rec["combined_x"])
    chk.eq("combined_topk_weights", combined_w, rec["combined_topk_weights"])
    names = (
        "rank_prefix_matrix",
        "channel_prefix_matrix",
        "recv_channel_prefix_matrix",
        "recv_src_idx",
        "is_token_in_rank",
        "send_head",
    )
    for name, got in zip(names, handle, strict=True):  # recorded after combine (send_head rewritten)
        chk.eq(f"handle.{name}", got, rec["handle"][name])
    cached = buf.dispatch(x, handle=handle)[0]
    chk.eq("cached_recv_x", cached, rec["cached_recv_x"])


def _v2_handle_scalars(chk: _Checker, handle: object, rec: dict) -> None:
    for name in (
        "do_expand",
        "num_experts",
        "expert_alignment",
        "num_max_tokens_per_rank",
        "num_sms",
        "num_recv_tokens",
        "num_expanded_tokens",
        "num_recv_tokens_per_expert_list",
        "psum_num_recv_tokens_per_scaleup_rank",
        "psum_num_recv_tokens_per_expert",
        "num_unaligned_recv_tokens_per_expert",
    ):
        chk.eq(f"handle.{name}", getattr(handle, name), rec["handle"][name])
    _check_dst_slots(chk, handle.dst_buffer_slot_idx, rec["handle"]["dst_buffer_slot_idx"])


def _check_v2(
    chk: _Checker,
    group: dist.ProcessGroup,
    case: dict,
    key: str,
    x: torch.Tensor,
    topk_idx: torch.Tensor,
    topk_weights: torch.Tensor,
) -> None:
    rec, meta = case[key], case["case"]
    buf = ElasticBuffer(group, deterministic=key == "v2_det", **V2_KWARGS)
    kwargs = {
        "num_experts": meta["num_experts"],
        "num_max_tokens_per_rank": 128,
        "expert_alignment": meta["expert_alignment"],
    }
    try:
        recv_x, recv_idx, recv_w, handle, _ = buf.dispatch(x, topk_idx, topk_weights, **kwargs)
        combined_x, combined_w, _ = buf.combine(recv_x, handle, topk_weights=recv_w)
        cached = buf.dispatch(x, handle=handle, num_experts=meta["num_experts"])[0]
    except Exception as exc:  # noqa: BLE001 - compared with the recorded error
        got_error = f"{type(exc).__name__}: {exc}"
        if "error" not in rec:
            chk.fail("error", f"unexpected {got_error}")
        elif not got_error.startswith(rec["error"]):
            chk.fail("error", f"got {got_error!r}, expected {rec['error']!r}")
        else:
            chk.eq("error", True, True)
        return
    if "error" in rec:
        chk.fail("error", f"no exception, expected {rec['error']!r}")
        return
    got_meta, exp_meta = handle.recv_src_metadata.cpu(), rec["handle"]["recv_src_metadata"]
    # default V2 order is arrival order: compare rows keyed by source global index
    go, eo = _order_by_key(got_meta), _order_by_key(exp_meta)
    if key == "v2_det":
        chk.eq("order_equals_v1", torch.equal(got_meta[:, 0], exp_meta[:, 0]), True)
    chk.eq("recv_x", recv_x.cpu()[go], rec["recv_x"][eo])
    chk.eq("recv_topk_idx", recv_idx.cpu()[go], rec["recv_topk_idx"][eo])
    chk.eq("recv_topk_weights", recv_w.cpu()[go], rec["recv_topk_weights"][eo])
    chk.eq("handle.recv_src_metadata[:, :2]", got_meta[go, :2], exp_meta[eo, :2])
    _v2_handle_scalars(chk, handle, rec)
    chk.eq("combined_x", combined_x, rec["combined_x"])
    chk.eq("combined_topk_weights", combined_w, rec["combined_topk_weights"])
    chk.eq("cached_recv_x", cached.cpu()[go], rec["cached_recv_x"][eo])


def _expanded_rows(meta: torch.Tensor, table: torch.Tensor) -> dict[tuple[int, int], torch.Tensor]:
    rows = {}
    for row in meta.tolist():
        for k, slot in enumerate(row[2:]):
            if slot >= 0:
                rows[(row[0], k)] = table[slot]
    return rows


def _check_v2_expand(
    chk: _Checker,
    group: dist.ProcessGroup,
    case: dict,
    x: torch.Tensor,
    topk_idx: torch.Tensor,
    topk_weights: torch.Tensor,
) -> None:
    rec, meta = case["v2_expand"], case["case"]
    buf = ElasticBuffer(group, **V2_KWARGS)
    recv_x, recv_idx, recv_w, handle, _ = buf.dispatch(
        x,
        topk_idx,
        topk_weights,
        num_experts=meta["num_experts"],
        num_max_tokens_per_rank=128,
        expert_alignment=meta["expert_alignment"],
        do_expand=True,
    )
    chk.eq("recv_topk_idx", recv_idx, rec["recv_topk_idx"])
    chk.eq("recv_x.shape", tuple(recv_x.shape), tuple(rec["recv_x"].shape))
    chk.eq("recv_topk_weights.shape", tuple(recv_w.shape), tuple(rec["recv_topk_weights"].shape))
    _v2_handle_scalars(chk, handle, rec)
    got_meta, exp_meta = handle.recv_src_metadata.cpu(), rec["handle"]["recv_src_metadata"]
    go, eo = _order_by_key(got_meta), _order_by_key(exp_meta)
    chk.eq("handle.recv_src_metadata[:, :2]", got_meta[go, :2], exp_meta[eo, :2])
    chk.eq("handle.recv_src_metadata[:, 2:].mask", got_meta[go, 2:] >= 0, exp_meta[eo, 2:] >= 0)
    # per (source token, top-k slot): the expanded row's bytes and weight
    for name, got_t, exp_t in (
        ("recv_x", recv_x.cpu(), rec["recv_x"]),
        ("recv_topk_weights", recv_w.cpu(), rec["recv_topk_weights"]),
    ):
        got_rows, exp_rows = _expanded_rows(got_meta, got_t), _expanded_rows(exp_meta, exp_t)
        keys = sorted(exp_rows)
        if sorted(got_rows) != keys:
            chk.fail(f"{name}[per (token, slot)]", "different (token, slot) keys")
            continue
        got_stack = torch.stack([got_rows[k] for k in keys]) if keys else got_t[:0]
        exp_stack = torch.stack([exp_rows[k] for k in keys]) if keys else exp_t[:0]
        chk.eq(f"{name}[per (token, slot)]", got_stack, exp_stack)
    # every slot lies inside its expert's segment [aligned start, start + raw count)
    psum, raw = (
        handle.psum_num_recv_tokens_per_expert.cpu(),
        handle.num_unaligned_recv_tokens_per_expert.cpu(),
    )
    starts = psum - raw
    idx = topk_idx.cpu()
    del idx
    ok = True
    for row in got_meta.tolist():
        for slot in row[2:]:
            if slot >= 0 and not any(
                int(s) <= slot < int(s) + int(c) for s, c in zip(starts, raw, strict=True)
            ):
                ok = False
    chk.eq("expand_slots_inside_expert_segments", ok, True)


def replay_recorded_case(
    case_name: str,
    group: dist.ProcessGroup | None = None,
    device: torch.device | str = "cpu",
    fixtures_dir: str | None = None,
    checked: list[str] | None = None,
) -> Mismatches:
    """Replay one recorded case on this rank; returns ``{field: problem}`` (empty when all match).

    Arguments:
        case_name: a key of the recording's ``cases``.
        group: the 2-rank process group (default: the world).
        device: where the inputs are placed.
        checked: if given, the names of every checked field are appended to it.
    """
    group = group or dist.group.WORLD
    case = load_recording(group.rank(), fixtures_dir)["cases"][case_name]
    x, topk_idx, topk_weights = (case[k].to(device) for k in ("x", "topk_idx", "topk_weights"))
    mismatches: Mismatches = {}
    runs: list[tuple[str, Callable[[_Checker], None]]] = [
        ("v1", lambda c: _check_v1(c, group, case, x, topk_idx, topk_weights)),
        ("v2", lambda c: _check_v2(c, group, case, "v2", x, topk_idx, topk_weights)),
        ("v2_det", lambda c: _check_v2(c, group, case, "v2_det", x, topk_idx, topk_weights)),
        ("v2_expand", lambda c: _check_v2_expand(c, group, case, x, topk_idx, topk_weights)),
    ]
    for api, run in runs:
        chk = _Checker(f"{case_name}.{api}", checked)
        run(chk)
        mismatches.update(chk.mismatches)
    return mismatches


def replay_recorded_errors(
    group: dist.ProcessGroup | None = None,
    device: torch.device | str = "cpu",
    fixtures_dir: str | None = None,
    checked: list[str] | None = None,
) -> Mismatches:
    """Re-trigger every recorded error (same calls on every rank); compare exception type and message."""
    group = group or dist.group.WORLD
    rec = load_recording(group.rank(), fixtures_dir)
    case = rec["cases"]["base"]
    x, topk_idx, topk_weights = (case[k].to(device) for k in ("x", "topk_idx", "topk_weights"))
    num_experts = case["case"]["num_experts"]
    v2 = ElasticBuffer(group, **V2_KWARGS)
    v1 = Buffer(group, num_nvl_bytes=1 << 30)
    _, _, _, handle, _ = v2.dispatch(x, topk_idx, topk_weights, num_experts=num_experts)
    calls: dict[str, Callable[[], object]] = {
        "v2_previous_event_without_comm_alloc": lambda: v2.dispatch(
            x, topk_idx, topk_weights, num_experts=num_experts, previous_event=v2.capture()
        ),
        "v2_int32_topk_idx": lambda: v2.dispatch(x, topk_idx.int(), topk_weights, num_experts=num_experts),
        "v2_bf16_weights": lambda: v2.dispatch(x, topk_idx, topk_weights.bfloat16(), num_experts=num_experts),
        "v2_too_many_qps": lambda: v2.dispatch(
            x, topk_idx, topk_weights, num_experts=num_experts, num_qps=v2.num_allocated_qps + 1
        ),
        "v2_experts_not_divisible": lambda: v2.dispatch(
            x, topk_idx.clamp(max=6), topk_weights, num_experts=7
        ),
        "v2_cached_dispatch_without_num_experts": lambda: v2.dispatch(x, handle=handle),
        "v1_int32_topk_idx": lambda: v1.get_dispatch_layout(topk_idx.int(), num_experts),
        "v1_odd_num_sms": lambda: Buffer.set_num_sms(21),
    }
    chk = _Checker("errors", checked)
    for name, (exc_type, message) in rec["errors"].items():
        if name not in calls:
            chk.fail(name, "no emulated trigger for this recorded error")
            continue
        try:
            calls[name]()
        except Exception as exc:  # noqa: BLE001 - compared with the recorded error
            chk.eq(f"{name}.type", type(exc).__name__, exc_type)
            chk.eq(f"{name}.message", str(exc), message)
        else:
            chk.fail(name, f"no exception, expected {exc_type}: {message}")
    # the buffer stays usable after the QP refusal
    recv_x = v2.dispatch(x, topk_idx, topk_weights, num_experts=num_experts)[0]
    chk.eq("v2_usable_after_errors.num_rows", recv_x.shape[0], case["v2"]["recv_x"].shape[0])
    return chk.mismatches


def main() -> int:
    """Replay every recording under ``torchrun --nproc_per_node 2 -m tests.replay``.

    Uses NCCL with CUDA tensors when GPUs are visible, else gloo with CPU tensors; exit status 1 on any
    mismatch.
    """
    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    device: torch.device | str = "cpu"
    if use_cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    checked: list[str] = []
    failures: Mismatches = {}
    for name in recorded_case_names():
        failures.update(replay_recorded_case(name, device=device, checked=checked))
    failures.update(replay_recorded_errors(device=device, checked=checked))
    print(f"rank {dist.get_rank()} on {device}: {len(checked)} fields checked, {len(failures)} mismatches")
    for key, problem in failures.items():
        print(f"  {key}: {problem}")
    dist.destroy_process_group()
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
