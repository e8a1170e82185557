"""One-sided exchanges of the replicas (dslide.train.replicas): `Board` and `Mailbox`.

`Board`: a few int64 words on one rank that every rank reads and changes with
one-sided atomic operations (MPI-3 RMA: compare-and-swap, fetch-and-add)
without the host's participation. `Mailbox`: per rank two slots of published
arrays that any rank copies one-sidedly (MPI-3 RMA get), which is how a
replica averages with another's latest state without waiting for it (partial
sync). Both live on a `Comm` (dslide.comm.collectives) and, with one process,
on a local array read by the same code. What a mailbox read copies from
another rank counts in that Comm's `bytes_sent` and `seconds` under its kind.
`stall_timeout` does not cover them.
"""

from __future__ import annotations

import time

import numpy as np

from .collectives import Comm


class Board:
    """`n` int64 words on rank `host` of `comm`, changed only by atomic one-sided operations.

    Every rank may read, add to, swap or compare-and-swap a word at any time
    without the host taking part (MPI-3 passive-target RMA: one `Lock_all`
    epoch for the board's life, `Flush` after each operation, so each is
    complete, and visible to the next, when it returns). Operations on one
    word are atomic with respect to each other. With one process (or the
    single-process stand-in) the words are a local array. Creation and
    `free` are collective over `comm`.
    """

    def __init__(self, comm: Comm, n: int, host: int = 0):
        self.n, self.host = int(n), int(host)
        self._comm = comm
        self._win = None
        if comm.size == 1:
            self._local = np.zeros(self.n, dtype=np.int64)
            return
        from mpi4py import MPI

        self._MPI = MPI
        size = self.n * 8 if comm.rank == self.host else 0
        self._win = MPI.Win.Allocate(size, 8, comm=comm._mpi)
        if comm.rank == self.host:
            np.frombuffer(self._win.tomemory(), dtype=np.int64)[:] = 0
        comm._mpi.Barrier()  # the words are zero before anyone touches them
        self._win.Lock_all()
        self._one = np.zeros(1, dtype=np.int64)
        self._cmp = np.zeros(1, dtype=np.int64)
        self._res = np.zeros(1, dtype=np.int64)

    def _op(self, i: int, value: int, op) -> int:
        self._one[0] = value
        self._win.Fetch_and_op(self._one, self._res, self.host, i, op)
        self._win.Flush(self.host)
        return int(self._res[0])

    def read(self, i: int) -> int:
        if self._win is None:
            return int(self._local[i])
        return self._op(i, 0, self._MPI.NO_OP)

    def add(self, i: int, value: int) -> int:
        """Word i += value; returns the old value."""
        if self._win is None:
            old = int(self._local[i])
            self._local[i] += value
            return old
        return self._op(i, value, self._MPI.SUM)

    def swap(self, i: int, value: int) -> int:
        """Word i = value; returns the old value."""
        if self._win is None:
            old = int(self._local[i])
            self._local[i] = value
            return old
        return self._op(i, value, self._MPI.REPLACE)

    def cas(self, i: int, expected: int, value: int) -> int:
        """Word i = value if it equals `expected`; returns the old value (== expected: done)."""
        if self._win is None:
            old = int(self._local[i])
            if old == expected:
                self._local[i] = value
            return old
        self._one[0], self._cmp[0] = value, expected
        self._win.Compare_and_swap(self._one, self._cmp, self._res, self.host, i)
        self._win.Flush(self.host)
        return int(self._res[0])

    def free(self) -> None:
        """Collective: every rank has stopped using the board."""
        self._win = _free_window(self._win, self._comm)


class Mailbox:
    """Every rank of `comm` publishes versions of a few 1-D arrays ("parts") that any
    rank reads one-sidedly, without the publisher taking part (MPI-3 passive-target
    RMA on a window allocated by MPI, one `Lock_all` epoch for the mailbox's life).

    Each rank exposes two slots of `capacity` bytes; version v (v >= 1) goes to slot
    v % 2, so the previous version stays readable while the next one is written. A slot:

        int64 [2 + n]   stamp (the version; -1 while being written), n, bytes of each part
        parts           one after the other, each starting at a multiple of 8 bytes

    A reader checks the stamp (an atomic read) before and after it copies: if the
    stamp changed, the publisher was writing over that slot (it published two newer
    versions meanwhile) and `get` returns None instead of a torn copy. The stamp is
    changed with atomic operations and the parts with plain stores between two of
    them (`Win.Sync` orders them), which is what MPI's unified memory model allows on
    a window every rank can load and store.

    With one process the slots are a local array read by the same code path.
    Creation and `free` are collective over `comm`.
    """

    def __init__(self, comm: Comm, capacity: int):
        self._comm = comm
        self.capacity = _align8(int(capacity) + 8 * 64)
        self._win = None
        self._recv = np.empty(0, dtype=np.uint8)
        if comm.size == 1:
            self._mem = np.zeros(2 * self.capacity, dtype=np.uint8)
            self._stamps().fill(-1)
            return
        from mpi4py import MPI

        self._MPI = MPI
        self._win = MPI.Win.Allocate(2 * self.capacity, 1, comm=comm._mpi)
        self._mem = np.frombuffer(self._win.tomemory(), dtype=np.uint8)
        self._stamps().fill(-1)
        comm._mpi.Barrier()  # no slot is read before every stamp says "empty"
        self._win.Lock_all()
        self._one = np.zeros(1, dtype=np.int64)
        self._res = np.zeros(1, dtype=np.int64)

    def _stamps(self) -> np.ndarray:
        return self._mem.view(np.int64)[:: self.capacity // 8][:2]

    def _stamp(self, rank: int, slot: int, value: int | None = None) -> int:
        """Atomic read (value None) or swap of a slot's stamp on `rank`; returns the old stamp."""
        off = slot * self.capacity
        if self._win is None:
            old = int(self._stamps()[slot])
            if value is not None:
                self._stamps()[slot] = value
            return old
        self._one[0] = 0 if value is None else value
        op = self._MPI.NO_OP if value is None else self._MPI.REPLACE
        self._win.Fetch_and_op(self._one, self._res, rank, off, op)
        self._win.Flush(rank)
        return int(self._res[0])

    def publish(self, version: int, parts: list) -> int:
        """Write `parts` as `version` of this rank's mailbox; returns its bytes. A part is an
        array (written whole, flattened) or (array, ids): its rows `ids` along axis 0,
        gathered straight into the slot (no copy in between)."""
        if version < 1:
            raise ValueError(f"mailbox version {version} must be >= 1")
        shapes = []  # (source, ids or None, bytes)
        for p in parts:
            a, ids = p if isinstance(p, tuple) else (p, None)
            row = a.nbytes // max(1, a.shape[0]) if a.ndim else a.nbytes
            shapes.append((a, ids, a.nbytes if ids is None else ids.shape[0] * row))
        head = 8 * (2 + len(parts))
        total = head + sum(_align8(nb) for _, _, nb in shapes)
        if total > self.capacity:
            raise ValueError(f"mailbox version {version} needs {total} bytes, more than its capacity "
                             f"{self.capacity}")
        slot = version % 2
        me = self._comm.rank
        self._stamp(me, slot, -1)
        base = slot * self.capacity
        hdr = self._mem[base:base + head].view(np.int64)
        hdr[1] = len(parts)
        off = base + head
        for i, (a, ids, nb) in enumerate(shapes):
            hdr[2 + i] = nb
            dst = self._mem[off:off + nb].view(a.dtype)
            if ids is None:
                dst[...] = a.reshape(-1)
            else:
                # mode "clip" (ids are in range): "raise" would gather into a temporary first
                np.take(a, ids, axis=0, out=dst.reshape((ids.shape[0],) + a.shape[1:]), mode="clip")
            off += _align8(nb)
        if self._win is not None:
            self._win.Sync()  # the parts are stored before the stamp says so
        self._stamp(me, slot, version)
        return total

    def lengths(self, rank: int, version: int, n: int) -> np.ndarray | None:
        """Bytes of each of the `n` parts of `rank`'s `version`, or None (not that version)."""
        slot = version % 2
        if self._stamp(rank, slot) != version:
            return None
        hdr = self._fetch(rank, [(slot * self.capacity + 16, 8 * n)], "replica_ids")[0].view(np.int64)
        return hdr.copy()

    def get(self, rank: int, version: int, lengths: np.ndarray, want: list, kind: str) -> list | None:
        """Prefixes of parts of `rank`'s `version`: want = [(part index, bytes)]; returns the
        byte arrays (views into one receive buffer, reused by the next `get`), or
        None when the slot no longer holds `version` (the copy would be torn)."""
        slot = version % 2
        n = lengths.shape[0]
        starts = slot * self.capacity + 8 * (2 + n) + np.concatenate(([0], np.cumsum([_align8(int(b)) for b in lengths])))
        for i, nb in want:
            if nb > lengths[i]:
                raise ValueError(f"part {i} of version {version} on rank {rank} has {lengths[i]} bytes, "
                                 f"{nb} asked")
        out = self._fetch(rank, [(int(starts[i]), int(nb)) for i, nb in want], kind)
        if self._stamp(rank, slot) != version:
            return None
        return out

    def _fetch(self, rank: int, ranges: list, kind: str) -> list:
        total = sum(_align8(nb) for _, nb in ranges)
        if self._recv.nbytes < total:  # kept: fresh pages cost more than the copy
            self._recv = np.empty(total + total // 4, dtype=np.uint8)
        buf = self._recv
        t0 = time.perf_counter()
        out, off = [], 0
        for start, nb in ranges:
            dst = buf[off:off + nb]
            if nb:
                if self._win is None:
                    dst[:] = self._mem[start:start + nb]
                else:
                    self._win.Get([dst, self._MPI.BYTE], rank, [start, nb, self._MPI.BYTE])
            out.append(dst)
            off += _align8(nb)
        if self._win is not None:
            self._win.Flush(rank)
        if rank != self._comm.rank:
            self._comm._count(kind, sum(nb for _, nb in ranges), t0)
        return out

    def free(self) -> None:
        """Collective: every rank has stopped using the mailbox."""
        if self._win is not None:
            self._mem = None  # a view of the window's memory
        self._win = _free_window(self._win, self._comm)


def _free_window(win, comm: Comm) -> None:
    """End the window's lock-all epoch and free it once every rank is done (collective);
    returns None (the caller's new handle)."""
    if win is not None:
        win.Unlock_all()
        comm._mpi.Barrier()
        win.Free()
    return None


def _align8(n: int) -> int:
    return (int(n) + 7) // 8 * 8
