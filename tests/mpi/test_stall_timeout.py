"""Collectives polled against a stall timeout (non-blocking MPI calls and MPI_Test) give
exactly what the blocking ones give, at any number of ranks; sub-communicators inherit
the timeout. (A rank that stops answering: tests/unit/test_safe_runs.py, under mpiexec.)"""

import numpy as np
from mpi4py import MPI

from dslide.comm import Comm


def _everything(c: Comm) -> list:
    r, P = c.rank, c.size
    rs = np.random.default_rng(r)
    out = []
    bounds = np.array([0, *np.cumsum([2 + q for q in range(P)])], dtype=np.int64)
    out.append(c.allgather_columns(np.full((3, 2 + r), float(r), np.float32), bounds))
    out.append(c.reduce_scatter_columns(np.arange(3 * bounds[-1], dtype=np.float32).reshape(3, -1) * (r + 1), bounds))
    block, ids, b = c.allgather_block(np.full((2, r + 1), r + 0.5, np.float32), np.arange(r + 1, dtype=np.int32) + 10 * r)
    out += [block, ids, b]
    mx, se = c.allreduce_logsumexp(np.array([r, -r], np.float32), np.array([1.0, 2.0], np.float32))
    out += [mx, se]
    out.append(c.allreduce_sum(rs.random(5)))
    inplace = np.arange(4, dtype=np.float64) * (r + 1)
    c.allreduce_sum_inplace(inplace)
    out.append(inplace)
    out.append(c.allreduce_max(float(r * 3 % 5)))
    out.append(c.allgather_rows(np.array([r, r * r], np.int64)))
    out.append(c.allgather_object({"rank": r, "text": "x" * r}))
    out.append(c.bcast_object(["from", r], root=P - 1))
    c.barrier()
    members = list(range(P))
    out.append(c.exchange(members, np.arange(r + 2, dtype=np.float64), tag=77, kind="test"))
    counts = np.arange(P, dtype=np.int64) + 1
    out.append(c.alltoallv(np.repeat(np.arange(P) * 10 + r, counts).astype(np.int64), counts,
                           np.full(P, r + 1, dtype=np.int64)))
    return out


def test_collectives_polled_against_a_stall_timeout_give_what_the_blocking_ones_give():
    blocking = Comm(MPI.COMM_WORLD)
    polled = Comm(MPI.COMM_WORLD)
    polled.stall_timeout = 120.0
    want, got = _everything(blocking), _everything(polled)
    assert len(want) == len(got)
    for i, (a, b) in enumerate(zip(want, got)):
        if isinstance(a, list) and a and isinstance(a[0], np.ndarray):
            assert all(np.array_equal(x, y) for x, y in zip(a, b)), i
        elif isinstance(a, np.ndarray):
            assert a.dtype == b.dtype and np.array_equal(a, b), i
        else:
            assert a == b, i
    assert polled.bytes_sent == blocking.bytes_sent  # the same accounting


def test_a_sub_communicator_inherits_the_stall_timeout():
    world = Comm(MPI.COMM_WORLD)
    world.stall_timeout = 30.0
    sub = world.split(world.rank % 2, world.rank)
    if world.size > 1:  # (one process: the stand-in, which calls no MPI)
        assert sub.stall_timeout == 30.0
    assert sub.allreduce_sum(np.array([1.0]))[0] == sub.size
    if sub.size > 1:
        sub.free()


def test_column_collectives_equal_a_numpy_concatenation_and_sum_at_uneven_shards():
    """allgather_columns, reduce_scatter_columns and allgather_block against the plain numpy
    computation of every rank's data (shards of 2 + r columns, B = 5)."""
    c = Comm(MPI.COMM_WORLD)
    r, P, B = c.rank, c.size, 5
    widths = [2 + q for q in range(P)]
    bounds = np.array([0, *np.cumsum(widths)], dtype=np.int64)
    local = [np.random.default_rng(q).random((B, widths[q])).astype(np.float32) for q in range(P)]
    got = c.allgather_columns(local[r], bounds)
    assert got.flags.c_contiguous and np.array_equal(got, np.hstack(local))
    partial = [np.random.default_rng(100 + q).random((B, int(bounds[-1]))).astype(np.float32) for q in range(P)]
    mine = c.reduce_scatter_columns(partial[r], bounds)
    want = np.sum(partial, axis=0, dtype=np.float32)[:, bounds[r]:bounds[r + 1]]
    assert mine.shape == (B, widths[r]) and np.allclose(mine, want, rtol=1e-6, atol=0)
    ids = [np.arange(widths[q], dtype=np.int32) * P + q for q in range(P)]
    block, all_ids, b = c.allgather_block(local[r], ids[r])
    assert np.array_equal(block, np.hstack(local)) and np.array_equal(all_ids, np.concatenate(ids))
    assert np.array_equal(b, bounds)
