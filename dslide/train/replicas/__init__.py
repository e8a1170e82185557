"""Replicas of the sharded model: hybrid data x model parallelism on uneven machines.

Layout. A world of R x P ranks (R = `replicas`) forms R replicas of P model
shards: world rank w is shard p = w % P of replica g = w // P
(dslide.model.sharding.replica_place). Two communicators come from the world
(`layout.Layout`):

    model  the P ranks of replica g: the network's layers are split over them
           (every exchange of a training step stays inside a replica)
    peer   the R ranks holding shard p, one per replica (its rank g = replica g)

Shard p covers the same neurons in every replica (shard weights are per
position, see `dslide.model.sharding.speed_weights`), so averaging two replicas'
rows is an exchange between peers holding the same rows: no layer is ever
gathered.

One module per concern:

    layout      `Layout`: this rank's place (replica, shard) and its two communicators
    board       the words of the replicas' one-sided board (dslide.comm.Board)
    allreduce   `ExactMean`: sync = "allreduce", every replica takes the exact mean of
                the rows any of them changed
    partial     `Gossip`: sync = "partial", asynchronous gossip through one-sided
                mailboxes, no replica waiting for another
    schedule    `Replicas`: the synchronisation schedule of the training loop (which
                global step each replica trains, when it synchronises, the global
                points, the "auto" re-shard)
    reshard     `reshard`: a network re-split over new shares, its parameters moved
"""

from .allreduce import ExactMean
from .layout import Layout
from .partial import Gossip
from .reshard import reshard
from .schedule import Replicas

__all__ = ["ExactMean", "Gossip", "Layout", "Replicas", "reshard"]
