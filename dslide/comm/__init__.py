"""The MPI layer: the only package of dslide that imports mpi4py.

Nothing outside dslide.comm imports mpi4py (tests/unit/test_comm.py checks
it); everything MPI does for dslide goes through the names below, which every
caller imports from dslide.comm itself. One module per concern:

    collectives   `Comm`: the collectives, each forward exchange next to its
                  backward partner, their byte and time accounting, the
                  stall census (`StallError`)
    onesided      `Board` and `Mailbox`: the replicas' one-sided (MPI-3 RMA)
                  atomic words and published arrays
    node          where the process runs: launcher, ranks per node, cores,
                  threads per rank
"""

from .collectives import Comm, StallError, _lse_merge, allreduce_bytes
from .node import cores, default_threads, launched_by_mpi, node_ranks, oversubscription
from .onesided import Board, Mailbox

__all__ = ["Board", "Comm", "Mailbox", "StallError", "allreduce_bytes", "cores", "default_threads",
           "launched_by_mpi", "node_ranks", "oversubscription"]
