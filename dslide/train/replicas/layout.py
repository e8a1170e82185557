"""This rank's place among the replicas, and the two communicators it trains and averages on."""

from __future__ import annotations

from dataclasses import dataclass

from dslide.comm import Comm
from dslide.model.sharding import replica_place


@dataclass(frozen=True)
class Layout:
    """World rank `world.rank` is shard `shard` of replica `replica` (dslide.model.sharding.replica_place).

    model: the replica's P ranks (rank p = shard p); peer: the R ranks holding this shard,
    one per replica (rank g = replica g; the single-process stand-in with one replica).
    """

    world: Comm
    n_replicas: int
    n_shards: int
    replica: int
    shard: int
    model: Comm
    peer: Comm

    @classmethod
    def split(cls, world: Comm, replicas: int) -> "Layout":
        """The layout of `replicas` replicas over `world` (collective over it: two splits
        when replicas > 1). A ValueError naming the valid choices if the world does not
        divide into them."""
        replica, shard = replica_place(world.rank, world.size, replicas)
        model = world.split(replica, shard) if replicas > 1 else world
        peer = world.split(shard, replica) if replicas > 1 else Comm()
        return cls(world, replicas, world.size // replicas, replica, shard, model, peer)

    @property
    def leader(self) -> bool:
        """Shard 0: the rank that speaks for its replica on the board."""
        return self.shard == 0
