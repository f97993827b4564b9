"""Row identity by payload: encode (source rank, source token) in a token's first columns.

Used where a handle does not say where a received row came from (V1 internode): a cached dispatch of
this payload puts each identity row exactly where the data row went.
"""

from __future__ import annotations

import torch

_BASE = 256  # bf16 holds every integer 0..256 exactly


def identity_payload(num_tokens: int, hidden: int, rank: int, like: torch.Tensor) -> torch.Tensor:
    """``[num_tokens, hidden]`` bf16 whose row t reads (rank, t // 256, t % 256, 0, ...)."""
    if hidden < 3:
        raise ValueError("identity payloads need hidden >= 3")
    payload = torch.zeros(num_tokens, hidden, dtype=torch.bfloat16, device=like.device)
    tokens = torch.arange(num_tokens, device=like.device)
    payload[:, 0] = rank
    payload[:, 1] = (tokens // _BASE).to(torch.bfloat16)
    payload[:, 2] = (tokens % _BASE).to(torch.bfloat16)
    return payload


def decode_identity(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of :func:`identity_payload` on received rows: (src_rank, src_token) as int64."""
    ints = rows[:, :3].float().round().to(torch.int64)
    return ints[:, 0], ints[:, 1] * _BASE + ints[:, 2]
