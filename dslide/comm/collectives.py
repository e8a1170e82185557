"""Collectives: `Comm`, the communicator every layer exchanges through.

`Comm` wraps an mpi4py communicator, or stands in for one when there is a
single process (`Comm()`), with the same interface, so every layer runs
without MPI. Every call uses mpi4py's uppercase buffer methods on numpy
arrays and returns at once when there is one rank.

Forward exchanges are defined next to their backward partners (as in
Megatron-LM's tensor-parallel layers):

    forward                               backward
    allgather_columns   [B, n_r] -> [B, n]   reduce_scatter_columns [B, n] -> [B, n_r]
    allgather_block     [B, m_r] -> [B, m]   reduce_scatter_columns [B, m] -> [B, m_r]
                        (blocks of columns with their ids, m_r varying by rank and step)
    allreduce_logsumexp (max, sumexp)        (none: with the global statistics the
                                              softmax gradient p - y is local)

Byte accounting. `bytes_sent[kind]` counts, for this rank, the payload it
must receive from the others under the bandwidth-optimal algorithms, which
equals what it sends under ring algorithms on average over the ranks:
    allgather of total T with own part T_r:        T - T_r
    reduce-scatter with own part T_r:              (P - 1) * T_r
    all-reduce of S bytes (ring):                  2 (P - 1) / P * S
    all-gather of small results (evaluation):      T - T_r
A data-parallel step all-reduces every gradient: 2 (P - 1) / P * model bytes.
    exchange among k members (replica sync):       what the k - 1 others send
`seconds[kind]` accumulates the wall time spent inside the step's exchanges
(waiting for the other ranks included): a step's time minus these is the
rank's own computing time, from which `shard_weights = "auto"` measures
each rank's speed. The one-sided reads of dslide.comm.onesided's `Mailbox`
add to the same two counters.

Replicas (dslide.train.replicas) add two collectives: `split` (a replica's model
communicator, the communicator of the ranks that hold the same shard in every
replica) and `exchange` (an all-gather among any subset of a communicator's
ranks by point-to-point messages, so a partial all-reduce needs no
communicator per group). Their one-sided `Board` and `Mailbox` are
dslide.comm.onesided.

Stalls. With `stall_timeout` = 0 (the default) every collective is MPI's
blocking call, as above. With `stall_timeout` = T > 0 (`--set
stall_timeout=T`) each collective is started non-blocking (Iallgatherv,
Iallreduce, Ibarrier, ...; `exchange` probes without blocking) and polled
with MPI_Test until it completes or T seconds have passed. A rank whose
collective times out takes a census: it sends a short note to every other
rank of the communicator (point-to-point, on a tag of its own: collectives
and point-to-point messages never match each other) and listens for theirs
for a grace period (T / 2, between 2 and 10 s). The ranks stuck with it have
timed out too and answer; the ranks it did not hear from are the ones that
stopped answering (stopped, hung, or slower than T). It raises StallError
naming them (as ranks of the world); the dslide command prints it and ends
every rank (MPI_Abort). One-sided operations (Board, Mailbox) are not
covered.
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict

import numpy as np

from .node import launched_by_mpi, node_ranks, node_ranks_found

_CENSUS_TAG = 0x5CA1AB  # the notes of a census after a stall (replicas' exchanges use 0x5C)


def _join_blocks(flat: np.ndarray, bounds: np.ndarray, B: int) -> np.ndarray:
    """[B, n] from the ranks' row-major [B, n_r] blocks laid end to end in `flat` (rank r's
    at bounds[r] * B): row pieces copied, no transpose."""
    out = np.empty((B, int(bounds[-1])), dtype=flat.dtype)
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        out[:, lo:hi] = flat[lo * B:hi * B].reshape(B, hi - lo)
    return out


def _split_blocks(a: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """The inverse of `_join_blocks`: a [B, n]'s column slices as row-major blocks end to end."""
    B = a.shape[0]
    flat = np.empty(B * int(bounds[-1]), dtype=a.dtype)
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        flat[lo * B:hi * B].reshape(B, hi - lo)[...] = a[:, lo:hi]
    return flat


class StallError(RuntimeError):
    """A collective did not complete within stall_timeout: the message names the rank(s) that
    stopped answering."""


def allreduce_bytes(nbytes: int, world: int) -> int:
    """Bytes per rank of a ring all-reduce of `nbytes`: 2 (P - 1) / P * nbytes."""
    return (2 * (world - 1) * int(nbytes)) // world


def _lse_merge(inbuf, outbuf, datatype):
    """MPI user op: merge per-sample (max, sum of exp(z - max)) pairs."""
    a = np.frombuffer(inbuf, dtype=np.float64).reshape(-1, 2)
    b = np.frombuffer(outbuf, dtype=np.float64).reshape(-1, 2)
    m = np.maximum(a[:, 0], b[:, 0])
    finite = np.isfinite(m)
    safe = np.where(finite, m, 0.0)
    with np.errstate(invalid="ignore", over="ignore"):
        s = np.where(finite, a[:, 1] * np.exp(a[:, 0] - safe) + b[:, 1] * np.exp(b[:, 0] - safe), 0.0)
    b[:, 0] = m
    b[:, 1] = s


class Comm:
    """A communicator: an mpi4py Intracomm, or None for one process without MPI."""

    def __init__(self, mpi_comm=None):
        self._mpi = mpi_comm
        self.rank = 0 if mpi_comm is None else mpi_comm.Get_rank()
        self.size = 1 if mpi_comm is None else mpi_comm.Get_size()
        self.bytes_sent: dict[str, int] = defaultdict(int)
        self.seconds: dict[str, float] = defaultdict(float)
        self._lse_op = None
        self._pair_type = None
        #: seconds a collective may take before the ranks that did not join it are named and
        #: StallError raised; 0: MPI's blocking calls, no limit (see the module docstring)
        self.stall_timeout = 0.0

    @classmethod
    def world(cls) -> "Comm":
        """COMM_WORLD when started under an MPI launcher, else the single-process stand-in.
        Collective under MPI (it counts the ranks on each node: `node_ranks`)."""
        if not launched_by_mpi():
            return cls(None)
        from mpi4py import MPI

        if not node_ranks_found():
            node_ranks(MPI.COMM_WORLD)  # collective, once: every rank comes here first
        return cls(MPI.COMM_WORLD)

    # -- bookkeeping ---------------------------------------------------------------

    def _count(self, kind: str, nbytes: int, t0: float | None = None) -> None:
        self.bytes_sent[kind] += int(nbytes)
        if t0 is not None:
            self.seconds[kind] += time.perf_counter() - t0

    # -- collectives, blocking or polled against stall_timeout ------------------------------

    def _call(self, name: str, *args, what: str, **kw):
        """MPI collective `name` (e.g. "Allgatherv"): the blocking call when stall_timeout is 0,
        else its non-blocking twin ("Iallgatherv") polled until done or timed out."""
        if not self.stall_timeout:
            return getattr(self._mpi, name)(*args, **kw)
        req = getattr(self._mpi, "I" + name[0].lower() + name[1:])(*args, **kw)
        self._wait([req], what)
        return None

    def _wait(self, reqs: list, what: str) -> None:
        """Poll requests until all complete; StallError after stall_timeout seconds."""
        from mpi4py import MPI

        deadline = time.monotonic() + self.stall_timeout
        spins, nap = 0, 0.0
        while not MPI.Request.Testall(reqs):
            spins += 1
            if spins < 2000:  # the first milliseconds: spin, as a blocking wait would
                continue
            if time.monotonic() > deadline:
                self._stalled(what)
            nap = min(0.001, nap + 5e-5)  # then naps of up to 1 ms: at most that much later than MPI_Wait
            time.sleep(nap)

    def _stalled(self, what: str) -> None:
        """The census after a timeout (module docstring); raises StallError."""
        from mpi4py import MPI

        others = [q for q in range(self.size) if q != self.rank]
        note = np.array([self.rank], dtype=np.int64)
        # kept (with their buffer) but never waited for: the run ends
        self._census = [self._mpi.Isend(note, dest=q, tag=_CENSUS_TAG) for q in others]
        bufs = {q: np.empty(1, dtype=np.int64) for q in others}
        pending = {q: self._mpi.Irecv(bufs[q], source=q, tag=_CENSUS_TAG) for q in others}
        end = time.monotonic() + min(10.0, max(2.0, self.stall_timeout / 2))
        while pending and time.monotonic() < end:
            for q in [q for q, r in pending.items() if r.Test()]:
                del pending[q]
            time.sleep(0.01)
        limit = f"{what} did not complete within stall_timeout = {self.stall_timeout:g} s"
        if not pending:  # everyone is alive, and waiting in something else
            raise StallError(f"every rank answered, but {limit} (the ranks are in different collectives)")
        world = MPI.Group.Translate_ranks(self._mpi.Get_group(), sorted(pending), MPI.COMM_WORLD.Get_group())
        names = ", ".join(str(w) for w in world)
        raise StallError(f"rank{'s' if len(world) > 1 else ''} {names} stopped answering: {limit}")

    # -- forward: all-gather of column slices; backward: reduce-scatter -------------

    def allgather_columns(self, local: np.ndarray, bounds: np.ndarray, kind: str = "allgather") -> np.ndarray:
        """Y = [Y_0 ... Y_{P-1}]: concatenate column slices [B, n_r] into [B, n].

        bounds: int64 [P + 1], rank r's columns are [bounds[r], bounds[r + 1]).
        Backward partner: `reduce_scatter_columns`.
        """
        if self.size == 1:
            return local
        t0 = time.perf_counter()
        B = local.shape[0]
        n = int(bounds[-1])
        counts = np.diff(bounds) * B
        recv = np.empty(n * B, dtype=local.dtype)
        self._call("Allgatherv", np.ascontiguousarray(local), [recv, (counts, bounds[:-1] * B)],
                   what=f"allgather_columns ({kind!r})")
        self._count(kind, (n - local.shape[1]) * B * local.itemsize, t0)
        return recv.reshape(1, n) if B == 1 else _join_blocks(recv, bounds, B)  # one row: already joined

    def reduce_scatter_columns(self, partial: np.ndarray, bounds: np.ndarray, kind: str = "reduce_scatter") -> np.ndarray:
        """dY_r = sum over ranks of partial[:, bounds[r]:bounds[r+1]]: [B, n] -> [B, n_r].

        Backward partner of `allgather_columns`: each rank holds a partial sum
        of the gradient for all n columns and keeps the total of its own.
        """
        if self.size == 1:
            return partial
        from mpi4py import MPI

        t0 = time.perf_counter()
        B = partial.shape[0]
        counts = np.diff(bounds) * B
        mine = int(bounds[self.rank + 1] - bounds[self.rank])
        send = _split_blocks(partial, bounds)
        recv = np.empty((B, mine), dtype=partial.dtype)
        self._call("Reduce_scatter", send, recv, recvcounts=counts, op=MPI.SUM,
                   what=f"reduce_scatter_columns ({kind!r})")
        self._count(kind, (self.size - 1) * mine * B * partial.itemsize, t0)
        return recv

    # -- forward: all-gather of column blocks with ids; backward: reduce_scatter_columns --

    def allgather_block(self, local: np.ndarray, ids: np.ndarray, kind: str = "allgather_block"):
        """Y = [Y_0 ... Y_{P-1}] for blocks of columns whose number varies by rank and step.

        local float [B, m_r], ids int32 [m_r] (the columns' global ids). Returns
        (Y float [B, m], ids int32 [m], bounds int64 [P + 1]): rank r's columns
        are bounds[r]:bounds[r+1]. Backward partner: `reduce_scatter_columns`
        with those bounds.
        """
        ids = np.ascontiguousarray(ids, dtype=np.int32)
        if self.size == 1:
            return local, ids, np.array([0, ids.shape[0]], dtype=np.int64)
        t0 = time.perf_counter()
        B = local.shape[0]
        counts = np.empty(self.size, dtype=np.int64)
        what = f"allgather_block ({kind!r})"
        self._call("Allgather", np.array([ids.shape[0]], dtype=np.int64), counts, what=what)
        bounds = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        m = int(bounds[-1])
        all_ids = np.empty(m, dtype=np.int32)
        self._call("Allgatherv", ids, [all_ids, (counts, bounds[:-1])], what=what)
        recv = np.empty(m * B, dtype=local.dtype)
        self._call("Allgatherv", np.ascontiguousarray(local), [recv, (counts * B, bounds[:-1] * B)], what=what)
        others = m - ids.shape[0]
        self._count(kind, (self.size - 1) * 8 + others * (4 + B * local.itemsize), t0)
        return _join_blocks(recv, bounds, B), all_ids, bounds

    # -- the softmax normaliser across ranks ---------------------------------------

    def allreduce_logsumexp(self, mx: np.ndarray, sumexp: np.ndarray, kind: str = "softmax_stats"):
        """Per sample, merge (m_r, s_r = sum_j exp(z_j - m_r)) over ranks into (M, S).

        M = max_r m_r, S = sum_r s_r exp(m_r - M): one all-reduce of B pairs
        (float64). Backward: none, dz = p - y is local once M and S are known.
        """
        if self.size == 1:
            return mx.astype(np.float64), sumexp.astype(np.float64)
        from mpi4py import MPI

        t0 = time.perf_counter()
        if self._lse_op is None:
            self._lse_op = MPI.Op.Create(_lse_merge, commute=True)
            self._pair_type = MPI.DOUBLE.Create_contiguous(2).Commit()
        buf = np.empty((mx.shape[0], 2), dtype=np.float64)
        buf[:, 0] = mx
        buf[:, 1] = sumexp
        out = np.empty_like(buf)
        self._call("Allreduce", [buf, mx.shape[0], self._pair_type], [out, mx.shape[0], self._pair_type],
                   op=self._lse_op, what=f"allreduce_logsumexp ({kind!r})")
        self._count(kind, allreduce_bytes(buf.nbytes, self.size), t0)
        return out[:, 0].copy(), out[:, 1].copy()

    # -- small collectives -----------------------------------------------------------

    def allreduce_sum(self, arr: np.ndarray, kind: str = "metrics") -> np.ndarray:
        """Element-wise sum over ranks (a new array)."""
        arr = np.ascontiguousarray(arr)
        if self.size == 1:
            return arr.copy()
        from mpi4py import MPI

        out = np.empty_like(arr)
        t0 = time.perf_counter()
        self._call("Allreduce", arr, out, op=MPI.SUM, what=f"allreduce_sum ({kind!r})")
        self._count(kind, allreduce_bytes(arr.nbytes, self.size), t0)
        return out

    def allreduce_sum_inplace(self, arr: np.ndarray, kind: str = "gradients") -> None:
        """In-place element-wise sum over ranks of a contiguous array (data-parallel gradients)."""
        if self.size == 1:
            return
        from mpi4py import MPI

        t0 = time.perf_counter()
        self._call("Allreduce", MPI.IN_PLACE, arr, op=MPI.SUM, what=f"allreduce_sum_inplace ({kind!r})")
        self._count(kind, allreduce_bytes(arr.nbytes, self.size), t0)

    def allreduce_max(self, value: float) -> float:
        if self.size == 1:
            return value
        from mpi4py import MPI

        if self.stall_timeout:
            out = np.empty(1)
            self._call("Allreduce", np.array([float(value)]), out, op=MPI.MAX, what="allreduce_max")
            return float(out[0])
        return self._mpi.allreduce(value, op=MPI.MAX)

    def allgather_rows(self, local: np.ndarray, kind: str = "evaluation") -> np.ndarray:
        """Stack every rank's equally shaped array: [...] -> [P, ...]."""
        local = np.ascontiguousarray(local)
        if self.size == 1:
            return local[None]
        out = np.empty((self.size,) + local.shape, dtype=local.dtype)
        self._call("Allgather", local, out, what=f"allgather_rows ({kind!r})")
        self._count(kind, (self.size - 1) * local.nbytes)
        return out

    def allgather_object(self, obj):
        """Every rank's small Python object, as a list (setup and error reports only)."""
        if self.size == 1:
            return [obj]
        if self.stall_timeout:  # pickled by hand: mpi4py's object collectives only block
            import pickle

            data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
            sizes = np.empty(self.size, dtype=np.int64)
            self._call("Allgather", np.array([data.size], dtype=np.int64), sizes, what="allgather_object")
            offsets = np.concatenate(([0], np.cumsum(sizes)))
            buf = np.empty(int(offsets[-1]), dtype=np.uint8)
            self._call("Allgatherv", data, [buf, (sizes, offsets[:-1])], what="allgather_object")
            return [pickle.loads(buf[offsets[r]:offsets[r + 1]].tobytes()) for r in range(self.size)]
        return self._mpi.allgather(obj)

    def bcast_object(self, obj, root: int = 0):
        if self.size == 1:
            return obj
        if self.stall_timeout:
            import pickle

            data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8) if self.rank == root else None
            size = np.array([data.size if data is not None else 0], dtype=np.int64)
            self._call("Bcast", size, root=root, what="bcast_object")
            buf = data.copy() if data is not None else np.empty(int(size[0]), dtype=np.uint8)
            self._call("Bcast", buf, root=root, what="bcast_object")
            return obj if self.rank == root else pickle.loads(buf.tobytes())
        return self._mpi.bcast(obj, root=root)

    def barrier(self) -> None:
        if self.size > 1:
            self._call("Barrier", what="barrier")

    def failed_ranks(self, failed: bool) -> list[int]:
        """The ranks whose `failed` is true, on every rank: an all-gather of one byte each, so
        that a step that may fail on some ranks only (reading files) ends alike on all of them.
        Also a barrier."""
        if self.size == 1:
            return [0] if failed else []
        flags = np.empty(self.size, dtype=np.uint8)
        self._call("Allgather", np.array([1 if failed else 0], dtype=np.uint8), flags, what="failed_ranks")
        return [int(r) for r in np.flatnonzero(flags)]

    # -- replicas: sub-communicators, exchanges among a subset, layout changes ------------

    def split(self, color: int, key: int) -> "Comm":
        """The ranks with the same `color`, ordered by `key` (collective over this communicator)."""
        if self.size == 1:
            return Comm(None)
        sub = Comm(self._mpi.Split(color, key))
        sub.stall_timeout = self.stall_timeout
        return sub

    def exchange(self, members, arr: np.ndarray, tag: int, kind: str) -> list:
        """Every member's 1-D array, in the order of `members` (ranks of this communicator,
        this one among them): an all-gather among a subset, by point-to-point messages.

        Only the members call it (the others go on with their work); each posts its
        sends first and then receives, so it completes as soon as every member has
        called it. Sizes may differ by member. Consecutive exchanges between the
        same members arrive in order (MPI's non-overtaking rule on one tag).
        """
        arr = np.ascontiguousarray(arr)
        members = [int(m) for m in members]
        if self.rank not in members:
            raise ValueError(f"rank {self.rank} calls an exchange among {members} without being a member")
        if len(members) == 1:
            return [arr]
        from mpi4py import MPI

        t0 = time.perf_counter()
        reqs = [self._mpi.Isend(arr, dest=m, tag=tag) for m in members if m != self.rank]
        out, got = [], 0
        status = MPI.Status()
        for m in members:
            if m == self.rank:
                out.append(arr)
                continue
            if self.stall_timeout:  # probe without blocking, against the deadline
                deadline = time.monotonic() + self.stall_timeout
                while not self._mpi.Iprobe(source=m, tag=tag, status=status):
                    if time.monotonic() > deadline:
                        self._stalled(f"exchange ({kind!r}) with rank {m}")
                    time.sleep(1e-4)
            else:
                self._mpi.Probe(source=m, tag=tag, status=status)
            buf = np.empty(status.Get_count(MPI.BYTE) // arr.itemsize, dtype=arr.dtype)
            self._mpi.Recv(buf, source=m, tag=tag)
            out.append(buf)
            got += buf.nbytes
        if self.stall_timeout:
            self._wait(reqs, f"exchange ({kind!r})")
        else:
            MPI.Request.Waitall(reqs)
        self._count(kind, got, t0)
        return out

    def alltoallv(self, send: np.ndarray, send_counts, recv_counts, kind: str = "reshard") -> np.ndarray:
        """Personalised exchange of a 1-D array: rank q gets send[offsets[q]:...] of
        send_counts[q] items from every rank; returns what this rank received, in rank
        order (recv_counts[p] items from rank p; counts known to both sides)."""
        send = np.ascontiguousarray(send)
        sc = np.asarray(send_counts, dtype=np.int64)
        rc = np.asarray(recv_counts, dtype=np.int64)
        if self.size == 1:
            return send[: int(rc[0])].copy()
        t0 = time.perf_counter()
        recv = np.empty(int(rc.sum()), dtype=send.dtype)
        so = np.concatenate(([0], np.cumsum(sc)[:-1]))
        ro = np.concatenate(([0], np.cumsum(rc)[:-1]))
        self._call("Alltoallv", [send, (sc, so)], [recv, (rc, ro)], what=f"alltoallv ({kind!r})")
        self._count(kind, (rc.sum() - rc[self.rank]) * send.itemsize, t0)
        return recv

    def free(self) -> None:
        """Release the MPI communicator (not COMM_WORLD)."""
        if self._mpi is not None and self.size > 1:
            from mpi4py import MPI

            if self._mpi != MPI.COMM_WORLD:
                self._mpi.Free()
            self._mpi = None

    def abort(self, code: int = 1, delay: float = 0.5) -> None:
        """End every rank at once (after an error on this one), `delay` seconds after flushing."""
        if self.size > 1:
            # mpiexec forwards a rank's stderr through its proxy, and Abort kills the proxies:
            # without the pause, CI runs lost the error message printed just before
            sys.stderr.flush()
            time.sleep(delay)
            self._mpi.Abort(code)
        raise SystemExit(code)
