"""sync = "allreduce": the replicas average, exactly, every row any of them changed.

What is averaged. Each layer marks the rows of W its update changed (its
`touched` mask, which replicas take through `Layer.take_touched`); an
allreduce synchronisation, and every global point, of the set S of all R
replicas takes the union U of their sets of rows, and every member's rows U
of W (and an LSH layer's biases; a dense layer's bias, which every step
changes, whole) become the members' mean, computed in float64 in member
order, so members get bit-identical values and the mean of identical values
is exact:

    w_i[U] <- (1 / |S|) sum_{m in S} w_m[U]       for every i in S

Only ids and rows cross the network (`Comm.exchange`): |S| - 1 messages of
|U| ids, then of |U| rows, per member. Rows outside U are left alone.
(partial averages one-sidedly between global points: dslide.train.replicas.partial.)

Adam's moments are not averaged: each replica keeps its own m and v. They
are per-coordinate statistics of the replica's own gradients (v a scale,
m a ~10-step running mean of its recent gradients at beta1 = 0.9), which
local-SGD methods keep local; averaging them would triple the bytes of
every synchronisation (W, m, v) for rows whose moments agree up to
sampling noise. A checkpoint (or a re-shard) takes replica 0's moments.

Masks. Every synchronisation includes every replica, so rows no replica
touched since the last one are equal everywhere (they were equal after it):
U = union of `touched` is exact (`take_touched` clears it).
"""

from __future__ import annotations

import time

import numpy as np

from dslide.timings import Timings

from .layout import Layout

TAG = 0x5C  # message tag of the exchanges on the peer communicator


class ExactMean:
    """The exact mean among replicas of the rows they changed: the averaging of sync =
    "allreduce", and of every global point. Each rank averages its own shard with its peers.
    Reports syncs (synchronisations taken part in) and group_sizes (their members)."""

    def __init__(self, layout: Layout, timings: Timings):
        self.layout = layout
        self.timings = timings  # adds "sync_wait"
        self.network = None
        self.syncs = 0
        self.group_sizes: list[int] = []

    def attach(self, net) -> None:
        """Average `net`'s layers from now on (a new network after a re-shard)."""
        self.network = net

    def average(self, members: list[int], ids: list[np.ndarray], flags: int = 0) -> tuple[list[np.ndarray], int]:
        """Average the rows in the union of the members' sets among `members` (replica ids,
        ascending, this one among them); each rank of the members calls it with its own shard.

        ids: per layer, int64 [m] sorted, the rows of this replica's set.
        flags: an int every member contributes; returns (per layer the union U int64
        sorted, the OR of the members' flags).
        """
        t0 = time.perf_counter()
        peer = self.layout.peer
        layers = self.network.layers
        head = np.array([flags] + [i.shape[0] for i in ids], dtype=np.int64)
        parts = [head] + ids
        got = peer.exchange(members, np.concatenate(parts), TAG, "replica_ids")
        L = len(layers)
        union = [[] for _ in range(L)]
        flags_all = 0
        for msg in got:
            flags_all |= int(msg[0])
            counts = msg[1:L + 1]
            off = L + 1
            for l in range(L):
                union[l].append(msg[off:off + counts[l]])
                off += int(counts[l])
        U = [np.unique(np.concatenate(u)) if u else np.empty(0, np.int64) for u in union]
        # the rows, then the whole arrays, of every layer in one vector
        vec = []
        for layer, u in zip(layers, U):
            rows, whole = layer.sync_arrays()
            vec += [a[u].reshape(-1) for a in rows] + [a.reshape(-1) for a in whole]
        dtype = self.network.dtype
        vec = np.concatenate(vec).astype(dtype, copy=False) if vec else np.empty(0, dtype)
        vals = peer.exchange(members, vec, TAG, "replica_sync")
        acc = np.zeros(vec.shape[0], dtype=np.float64)
        for v in vals:  # member order: every member adds the same numbers in the same order
            acc += v
        mean = (acc / len(members)).astype(dtype)
        off = 0
        for l, (layer, u) in enumerate(zip(layers, U)):
            rows, whole = layer.sync_arrays()
            for a in rows:
                size = u.shape[0] * int(np.prod(a.shape[1:], dtype=np.int64))
                a[u] = mean[off:off + size].reshape((u.shape[0],) + a.shape[1:])
                off += size
            for a in whole:
                a[...] = mean[off:off + a.size].reshape(a.shape)
                off += a.size
            if u.size:
                layer.rows_synced(u)
        self.syncs += 1
        self.group_sizes.append(len(members))
        self.timings.add("sync_wait", time.perf_counter() - t0)
        return U, flags_all

    def sync_all(self, flags: int = 0) -> int:
        """Average every replica on the rows touched since the last synchronisation
        (collective over the world). Returns the OR of the flags."""
        touched = [layer.take_touched() for layer in self.network.layers]
        _, out = self.average(list(range(self.layout.n_replicas)), touched, flags=flags)
        return out

    def reconcile(self, flags: int = 0) -> int:
        """A global point's averaging: every replica, every row changed since the last one
        (collective over the world); afterwards every replica holds the same parameters.
        Returns the OR of the flags."""
        if self.layout.n_replicas == 1:
            for layer in self.network.layers:
                layer.take_touched()
            return flags
        return self.sync_all(flags)

    def sync_bytes(self) -> int:
        """Bytes this rank received in synchronisations (ids and rows)."""
        peer = self.layout.peer
        return int(peer.bytes_sent.get("replica_sync", 0) + peer.bytes_sent.get("replica_ids", 0))

    def stats(self) -> dict:
        """Its counts: syncs, sync_bytes, bytes_per_sync, mean_group (and partial's, 0 here)."""
        return {"syncs": self.syncs, "sync_bytes": self.sync_bytes(),
                "bytes_per_sync": self.sync_bytes() / max(1, self.syncs),
                "mean_group": float(np.mean(self.group_sizes)) if self.group_sizes else 0.0,
                "stale_skips": 0, "torn": 0, "missed": 0}

    def close(self) -> None:
        """Release what it holds beyond the network (nothing here; partial: its mailbox)."""
