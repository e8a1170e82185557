"""sync = "partial": asynchronous gossip through one-sided mailboxes (no replica ever waits for another).

Ripples' partial all-reduce (Luo et al., ASPLOS 2020) averages among the
replicas ready at the same moment; with two replicas its only group is both,
so the one that arrives first waits for the other's step. Here a replica
never waits: at its synchronisation point (every `sync_every` local steps) it

  1. publishes version s (its s-th) of its recent rows in its `Mailbox` on the
     peer communicator (each rank its shard; slot s % 2, so version s - 1 stays
     readable while s is written): per layer the ids with recent > 0 ordered
     newest first (D levels: rows last changed in this interval, the one
     before, ...), their current rows, the whole arrays. When every rank of the
     replica has written (a barrier on the model communicator) the leader sets
     the replica's board word PUB+g = (s << 40) | c, c = the global step
     counter at publication (dslide.train.replicas.board);
  2. pulls: the leader reads every other replica's PUB word; a partner h is
     fresh when its version v is newer than the last one this replica used
     (seen[h]) and c_h >= counter - STALE (STALE = stale_limit(R, sync_every)
     global steps); every fresh partner is used, each version at most once.
     The leader broadcasts [(h, v, gap = v - seen[h])] to its ranks, so every
     shard reads the same versions; each rank copies from its peer h the rows
     of the first min(gap, D) levels of version v (the rows h changed in the
     intervals this replica has not seen), then checks that the slot still
     holds v; an allreduce of that check on the model communicator drops the
     partner for every shard if one shard's copy was torn;
  3. averages: for each received row r, with C_r the partners that sent it,

         w[r] <- (w[r] + sum_{h in C_r} w_h[r]) / (1 + |C_r|)

     and whole arrays over all used partners (a running mean, one partner folded
     in at a time); rows nobody sent are left alone.

If no partner published a fresh version, the replica goes on alone (a group
of one). Guarantees: no replica waits for another's computation (only for
its own P ranks, which are in the same step); a used state is its author's
latest complete version, at most STALE global steps old, and never used
twice; rows an author changed in the intervals a reader missed arrive with
it, up to D intervals back (further ones wait for the row's next change or
the next global point: counted in `missed`). The averaging is one-sided: a
member's mean is exact for the rows it receives, and the replicas' mean of a
row is kept when every replica sends and receives it (identical states stay
identical bit for bit), not in general; global points make all replicas
equal. Bound on drift: a replica that reads a fresh version of every other
is pulled halfway (or further) toward them on every row they changed; a
replica whose versions are too stale for the others still pulls theirs, so
it follows them, and its own changes reach them at the next global point.

Masks. `recent` (uint8 per row) is D = DEPTH for a row this replica's own
updates changed since its last publication, and drops by one at each
publication; `changed` (uint8) marks every row whose value changed since the
last global point (own updates and averaging). A global point (checkpoint,
re-shard, end of training) averages the union of `changed` over all
replicas exactly (`ExactMean.average`), after which every replica holds the
same model and both masks are clear.
"""

from __future__ import annotations

import time

import numpy as np

from dslide.comm import Board, Mailbox
from dslide.timings import Timings

from .allreduce import ExactMean
from .board import COUNTER, PUB, STEP_BITS, pub_word
from .layout import Layout

DEPTH = 4  # intervals of own changes a version carries (levels of `recent`)
MERGE_ROWS = 1 << 14  # rows averaged at a time (float64 temporaries of this many rows)


def stale_limit(R: int, sync_every: int) -> int:
    """The most global steps dealt since a version's publication for it to be used
    (4 intervals of every replica's steps at equal speeds)."""
    return 4 * R * sync_every


def fresh_partners(words, me: int, seen, counter: int, limit: int) -> tuple[list, list]:
    """Which published versions replica `me` uses now.

    words: per replica its PUB word; seen: per replica the last version used (or
    skipped); counter: global steps dealt. Returns ([(h, v, gap)] the fresh partners,
    [(h, v)] the versions skipped as older than `limit` global steps)."""
    use, stale = [], []
    for h, w in enumerate(words):
        v, c = int(w) >> STEP_BITS, int(w) & ((1 << STEP_BITS) - 1)
        if h == me or v <= seen[h]:
            continue
        if counter - c > limit:
            stale.append((h, v))
        else:
            use.append((h, v, v - int(seen[h])))
    return use, stale


class Gossip(ExactMean):
    """Partial synchronisation between global points (`publish`, then `pull`), and the exact
    mean of every row changed since the last one at a global point (`reconcile`).

    board: the replicas' board (its PUB words and COUNTER); sync_every: local steps between
    synchronisations (for the staleness bound). Reports, beside ExactMean's counts,
    stale_skips (versions skipped as too stale), torn (versions dropped because a copy was
    overwritten meanwhile) and missed (versions used with more than DEPTH intervals unseen).
    """

    def __init__(self, layout: Layout, timings: Timings, board: Board, sync_every: int):
        super().__init__(layout, timings)
        self.board = board
        self.sync_every = sync_every
        self.box = None  # this rank's mailbox on the peer communicator
        self.version = 0  # versions this replica published
        self.seen = [0] * layout.n_replicas  # per replica the last version used or skipped
        self.stale_skips = 0
        self.torn = 0
        self.missed = 0
        self.recent: list[np.ndarray] = []  # per layer, intervals of own changes (DEPTH .. 0)
        self.changed: list[np.ndarray] = []  # per layer, rows changed since the last global point

    def attach(self, net) -> None:
        """Average `net` from now on: fresh masks, and a mailbox sized for it (collective over
        the peer communicator)."""
        super().attach(net)
        rows = [layer.touched.shape[0] for layer in net.layers]
        self.recent = [np.zeros(n, dtype=np.uint8) for n in rows]
        self.changed = [np.zeros(n, dtype=np.uint8) for n in rows]
        if self.box is not None:
            self.box.free()
        self.box = Mailbox(self.layout.peer, self._capacity(net))

    def _capacity(self, net) -> int:
        """Bytes of a version holding every row of every layer (the most it can hold)."""
        total = 8 * len(net.layers) * DEPTH + 8 * 4 * len(net.layers) * 4
        for layer in net.layers:
            rows, whole = layer.sync_arrays()
            n = layer.touched.shape[0]
            total += 8 * n + sum(a.nbytes + 8 for a in rows) + sum(a.nbytes + 8 for a in whole)
        return total

    def stats(self) -> dict:
        return {**super().stats(), "stale_skips": self.stale_skips, "torn": self.torn, "missed": self.missed}

    def close(self) -> None:
        """Release the mailbox (collective over the peer communicator)."""
        if self.box is not None:
            self.box.free()
            self.box = None

    def _absorb(self) -> None:
        """Move the rows the layers' updates changed (`take_touched`) into `recent` and
        `changed`."""
        for layer, recent, changed in zip(self.network.layers, self.recent, self.changed):
            ids = layer.take_touched()
            recent[ids] = DEPTH
            changed[ids] = 1

    def publish(self) -> None:
        """Write this replica's next version (every rank its shard), then the leader
        announces it on the board. Collective over the model communicator only."""
        t0 = time.perf_counter()
        lay = self.layout
        self._absorb()
        counter = self.board.read(COUNTER) if lay.leader else 0
        counts, ids, vals = [], [], []
        for layer, recent in zip(self.network.layers, self.recent):
            levels = [np.flatnonzero(recent == DEPTH - j) for j in range(DEPTH)]  # newest first
            counts.append([lv.shape[0] for lv in levels])
            i = np.concatenate(levels).astype(np.int64)
            rows, whole = layer.sync_arrays()
            ids.append(i)
            vals += [(a, i) for a in rows] + list(whole)  # gathered straight into the window
            np.subtract(recent, 1, out=recent, where=recent > 0)
        self.version += 1
        self.box.publish(self.version, [np.array(counts, dtype=np.int64).reshape(-1)] + ids + vals)
        if lay.n_shards > 1:
            lay.model.barrier()  # every shard of this version is written
        if lay.leader:
            self.board.swap(PUB + lay.replica, pub_word(self.version, counter))
        self.timings.add("sync_wait", time.perf_counter() - t0)

    def choose_partners(self) -> list:
        """Leader: the fresh partners [(h, v, gap)] (fresh_partners), marked seen."""
        lay = self.layout
        words = [self.board.read(PUB + h) if h != lay.replica else 0 for h in range(lay.n_replicas)]
        use, stale = fresh_partners(words, lay.replica, self.seen, self.board.read(COUNTER),
                                    stale_limit(lay.n_replicas, self.sync_every))
        for h, v, _ in use:
            self.seen[h] = v
        for h, v in stale:
            self.seen[h] = v
        self.stale_skips += len(stale)
        return use

    def mark_seen(self) -> None:
        """Leader, inside a global point (nobody publishes then): every version published so
        far predates its averaging of everything, so none is to be used after it."""
        lay = self.layout
        self.seen = [int(self.board.read(PUB + h)) >> STEP_BITS for h in range(lay.n_replicas)]

    def pull(self, partners: list | None = None) -> int:
        """Average with the fresh partners' latest versions (the leader's choice, broadcast
        when `partners` is None), one partner after the other. Collective over the model
        communicator only; returns the number of partners used (0: this replica went on
        alone)."""
        t0 = time.perf_counter()
        lay = self.layout
        if partners is None:
            partners = self.choose_partners() if lay.leader else None
            if lay.n_shards > 1:
                partners = lay.model.bcast_object(partners)
        counts = None  # per layer, per row: values averaged so far (this replica's own: 1)
        used = 0
        for h, v, gap in partners:
            got = self._read(h, v, gap)
            ok = got is not None
            if lay.n_shards > 1:  # a copy torn on one shard drops the partner on every shard
                ok = lay.model.allreduce_sum(np.array([float(ok)]), kind="replica_ids")[0] == lay.n_shards
            if not ok:
                self.torn += 1
                continue
            if counts is None:
                counts = [np.ones(r.shape[0], dtype=np.int32) for r in self.recent]
            self._merge(got, counts, used)
            used += 1
            self.missed += gap > DEPTH
        self.syncs += 1
        self.group_sizes.append(1 + used)
        self.timings.add("sync_wait", time.perf_counter() - t0)
        return used

    def _read(self, h: int, v: int, gap: int):
        """Partner h's version v from its peer on this shard: per layer (ids int64 [n],
        row arrays, whole arrays) with the rows of its newest min(gap, DEPTH) levels;
        None when the slot no longer holds v."""
        layers = self.network.layers
        L = len(layers)
        shapes = [layer.sync_arrays() for layer in layers]
        n_parts = 1 + L + sum(len(r) + len(w) for r, w in shapes)
        lengths = self.box.lengths(h, v, n_parts)
        if lengths is None:
            return None
        first = self.box.get(h, v, lengths, [(0, int(lengths[0]))], "replica_ids")
        if first is None:
            return None
        counts = first[0].view(np.int64).reshape(L, DEPTH)
        n = counts[:, :min(gap, DEPTH)].sum(axis=1)
        want, part = [], 1 + L
        for l in range(L):
            want.append((1 + l, 8 * int(n[l])))
        for l, (rows, whole) in enumerate(shapes):
            for a in rows:
                want.append((part, int(n[l]) * (a.nbytes // max(1, a.shape[0]))))
                part += 1
            for a in whole:
                want.append((part, a.nbytes))
                part += 1
        got = self.box.get(h, v, lengths, want, "replica_sync")
        if got is None:
            return None
        out, i = [], L
        for l, (rows, whole) in enumerate(shapes):
            ids = got[l].view(np.int64)
            r = [got[i + j].view(a.dtype).reshape((int(n[l]),) + a.shape[1:]) for j, a in enumerate(rows)]
            i += len(rows)
            w = [got[i + j].view(a.dtype).reshape(a.shape) for j, a in enumerate(whole)]
            i += len(whole)
            out.append((ids, r, w))
        return out

    def _merge(self, part: list, counts: list, merged: int) -> None:
        """Fold one partner's version into the running mean: on each row r it sent,
        w[r] <- (c_r w[r] + w_h[r]) / (c_r + 1) with c_r the values averaged into w[r]
        so far (counts, updated); whole arrays likewise with c = merged + 1. Each step
        in float64, rounded to the parameters' dtype; rows in chunks (bounded memory)."""
        for layer, (ids, r, w), cnt, changed in zip(self.network.layers, part, counts, self.changed):
            rows, whole = layer.sync_arrays()
            if ids.size:
                for j, a in enumerate(rows):
                    for lo in range(0, ids.shape[0], MERGE_ROWS):
                        i = ids[lo:lo + MERGE_ROWS]  # distinct rows: one version lists a row once
                        c = cnt[i].astype(np.float64).reshape((-1,) + (1,) * (a.ndim - 1))
                        a[i] = ((a[i] * c + r[j][lo:lo + MERGE_ROWS]) / (c + 1.0)).astype(a.dtype)
                cnt[ids] += 1
                layer.rows_synced(ids)
                changed[ids] = 1
            for j, a in enumerate(whole):
                a[...] = ((a * float(merged + 1) + w[j].astype(np.float64)) / (merged + 2.0)).astype(a.dtype)

    def reconcile(self, flags: int = 0) -> int:
        """A global point's averaging: every replica, every row changed since the last one
        (collective over the world); afterwards every replica holds the same parameters
        and both masks are clear. Returns the OR of the flags."""
        self._absorb()
        changed = [np.flatnonzero(c).astype(np.int64) for c in self.changed]
        _, out = self.average(list(range(self.layout.n_replicas)), changed, flags=flags)
        for recent, changed in zip(self.recent, self.changed):
            recent[:] = 0
            changed[:] = 0
        return out
