"""The rank world: nodes x ranks-per-node processes with torchrun semantics, kept across examples."""

from conformance.world.errors import RankCrashed, RankFailure, RankRaised, RankTimeout, WorldError
from conformance.world.launcher import World, WorldShape

__all__ = ["RankCrashed", "RankFailure", "RankRaised", "RankTimeout", "World", "WorldError", "WorldShape"]
