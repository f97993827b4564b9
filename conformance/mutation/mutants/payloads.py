"""The mutant catalog.  Each patches one thing, as narrowly as a real bug would."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from conformance.mutation.patching import patch_dispatch_views
from conformance.mutation.registry import register


@register("flip-one-byte", "harmful", "one bit of one byte of one received token flips (last rank, row 0)")
def flip_one_byte() -> Iterator[None]:
    def mutate(view, rank: int, world_size: int) -> None:
        if rank == world_size - 1 and view.x.shape[0] > 0:
            view.x.view(-1).view(torch.uint8)[0] ^= 0x01

    with patch_dispatch_views(mutate):
        yield
