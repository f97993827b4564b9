"""Node topology of a process group, with torchrun semantics (``LOCAL_WORLD_SIZE``)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch.distributed as dist


@dataclass(frozen=True)
class Topology:
    """Ranks grouped into nodes of ``ranks_per_node`` consecutive ranks."""

    rank: int
    num_ranks: int
    ranks_per_node: int

    @property
    def num_nodes(self) -> int:
        """Number of nodes (RDMA / scale-out ranks)."""
        return self.num_ranks // self.ranks_per_node

    @property
    def node(self) -> int:
        """This rank's node index."""
        return self.rank // self.ranks_per_node

    @property
    def local_rank(self) -> int:
        """This rank's index inside its node."""
        return self.rank % self.ranks_per_node


def get_topology(group: dist.ProcessGroup) -> Topology:
    """Topology of ``group``; ``LOCAL_WORLD_SIZE`` (default: the whole group) gives ranks per node."""
    num_ranks = group.size()
    ranks_per_node = int(os.environ.get("LOCAL_WORLD_SIZE", num_ranks) or num_ranks)
    ranks_per_node = max(1, min(ranks_per_node, num_ranks))
    if num_ranks % ranks_per_node != 0:
        raise RuntimeError(
            f"deep_ep emulation: group size {num_ranks} is not a multiple of "
            f"LOCAL_WORLD_SIZE={ranks_per_node}"
        )
    return Topology(group.rank(), num_ranks, ranks_per_node)
