"""Under mpiexec -n P on one machine: MPI's shared-memory split counts P ranks on the node,
and threads = 0 gives each rank cores / P threads (at most NUMBA_NUM_THREADS)."""

import os

import numba
from mpi4py import MPI

from dslide import comm as C
from dslide import train as T
from dslide.config import Config


def test_ranks_on_the_node_and_their_threads():
    C.Comm.world()
    P = MPI.COMM_WORLD.size
    assert C.node_ranks() == P  # every rank of the test run is on this machine
    cpus, own = os.cpu_count(), len(os.sched_getaffinity(0))
    share = own if own < cpus else max(1, cpus // P)
    assert C.default_threads() == share
    assert T.rank_threads(Config()) == min(share, numba.config.NUMBA_NUM_THREADS)
