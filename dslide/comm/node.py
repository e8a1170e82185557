"""Where this process runs: whether an MPI launcher started it, the ranks on its node, its cores.

`default_threads` gives each rank its node's cores divided among the node's
ranks (`threads = 0`); `node_ranks` finds that count with MPI's shared-memory
split, once, when `Comm.world()` (dslide.comm.collectives) is first called.
"""

from __future__ import annotations

import os
import sys

_LAUNCHER_VARS = ("PMI_SIZE", "PMI_RANK", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS", "PMIX_RANK", "HYDRA_CONTROL_FD")


def launched_by_mpi() -> bool:
    """True when this process was started by an MPI launcher (or mpi4py is loaded)."""
    return "mpi4py.MPI" in sys.modules or any(v in os.environ for v in _LAUNCHER_VARS)


#: ranks of the MPI world on this process's node, found once by `Comm.world()` (MPI's
#: shared-memory split); 1 until then and without MPI
_NODE_RANKS = [1]
_NODE_RANKS_FOUND: list = []  # non-empty once the split was made


def node_ranks(mpi_comm=None) -> int:
    """Ranks of the world on this node: the size of MPI_Comm_split_type(COMM_TYPE_SHARED).

    With mpi_comm (collective: every rank of it calls this) the split is made and kept;
    without, the count kept by the last such call (1 if none)."""
    if mpi_comm is not None and mpi_comm.Get_size() > 1:
        from mpi4py import MPI

        node = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED, mpi_comm.Get_rank())
        _NODE_RANKS[0] = node.Get_size()
        _NODE_RANKS_FOUND.append(True)
        node.Free()
    return _NODE_RANKS[0]


def cores() -> int:
    """The cores this process may run on (its CPU affinity, which a launcher's binding or a
    cpuset narrows; os.cpu_count() where affinity is unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_threads() -> int:
    """Threads per rank when `threads = 0`: the node's cores shared by its ranks.

    A process bound by its launcher to fewer cores than the node has takes all of its
    own (the launcher already divided them); an unbound one takes cores / ranks on its
    node (at least 1), so `mpiexec -n 2` on 2 cores runs 1 thread per rank, as torchrun
    sets one per process."""
    own, node = cores(), os.cpu_count() or 1
    if own < node:
        return max(1, own)
    return max(1, node // node_ranks())


def oversubscription(threads: int) -> str | None:
    """A one-line notice when `threads` per rank on this node's ranks exceed its cores, else None."""
    n, c = node_ranks(), os.cpu_count() or 1
    if cores() < c:
        n, c = 1, cores()  # bound: this rank's own cores
    if threads * n <= c:
        return None
    who = f"{threads} thread(s) x {n} rank(s) on this node" if n > 1 else f"{threads} thread(s)"
    return (f"dslide: notice: {who} on {c} core(s): threads will take turns on the cores "
            f"(threads = 0 gives each rank its share, {max(1, c // n)})")


def node_ranks_found() -> bool:
    """True once a collective `node_ranks(mpi_comm)` call made the split."""
    return bool(_NODE_RANKS_FOUND)
