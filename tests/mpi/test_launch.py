"""The MPI launcher works: every rank sees the same world and an all-reduce sums ranks."""

import numpy as np
from mpi4py import MPI


def test_allreduce_sums_ranks():
    world = MPI.COMM_WORLD
    send = np.array([world.rank + 1], dtype=np.int64)
    recv = np.zeros(1, dtype=np.int64)
    world.Allreduce(send, recv)
    assert recv[0] == world.size * (world.size + 1) // 2
