"""Rank tasks for the GPU world self-test."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def gpu_identity() -> dict:
    """Which GPU this rank sees, and the process group backend."""
    props = torch.cuda.get_device_properties(0)
    return {
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "device_count": torch.cuda.device_count(),
        "uuid": str(getattr(props, "uuid", props.name)),
        "backend": dist.get_backend(),
        "nvls": os.environ.get("NCCL_NVLS_ENABLE"),
    }


def ep_group() -> dict:
    """The group buffers are built on, and (on GPUs) the device this rank selected."""
    from conformance.world.rank import context

    ctx = context()
    out = {"is_world": ctx.group is dist.group.WORLD, "size": dist.get_world_size(ctx.group),
           "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}
    if torch.cuda.is_available() and ctx.device == "cuda":
        out.update(current=torch.cuda.current_device(), device_count=torch.cuda.device_count(),
                   uuid=str(getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "uuid", "")))
    return out
