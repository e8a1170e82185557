"""Replicas of the sharded model: hybrid data x model parallelism on uneven machines.

Layout. A world of R x P ranks (R = `replicas`) forms R replicas of P model
shards: world rank w is shard p = w % P of replica g = w // P (in the code:
`n_replicas`, `n_shards`, `shard`, `replica`). Two communicators come from
the world (dslide.comm):

    model  the P ranks of replica g: the network's layers are split over them
           (every exchange of a training step stays inside a replica)
    peer   the R ranks holding shard p, one per replica (its rank g = replica g)

Shard p covers the same neurons in every replica (shard weights are per
position, see `speed_weights`), so averaging two replicas' rows is an
exchange between peers holding the same rows: no layer is ever gathered.

Data. The global steps t = 1 .. T of `train.batch_rows` (a function of seed
and step) are dealt to the replicas, so each batch of each epoch is trained
by exactly one replica. `sync = "allreduce"`: replica g takes t = base +
(s - 1) R + g + 1 at its local step s (deterministic). `sync = "partial"`:
each replica takes the next t from a shared counter when it starts a step,
so a faster replica takes more of them (the first R x AUTO_STEPS are dealt
as in allreduce when `shard_weights = "auto"` measures speeds). Batch.step
is the global t: learning-rate schedule, dropout and negative-sample streams
and LSH upkeep periods follow the progress of the whole model.

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
(partial averages one-sidedly instead, below.)

Adam's moments are not averaged: each replica keeps its own m and v. They
are per-coordinate statistics of the replica's own gradients (v a scale,
m a ~10-step running mean of its recent gradients at beta1 = 0.9), which
local-SGD methods keep local; averaging them would triple the bytes of
every synchronisation (W, m, v) for rows whose moments agree up to
sampling noise. A checkpoint (or a re-shard) takes replica 0's moments.

Masks. allreduce: every synchronisation includes every replica, so rows
no replica touched since the last one are equal everywhere (they were equal
after it): U = union of `touched` is exact (`take_touched` clears it).
partial: `recent` (uint8 per row) is D = DEPTH for a row this replica's own
updates changed since its last publication, and drops by one at each
publication; `changed` (uint8) marks every row whose value changed since the
last global point (own updates and averaging). A global point (checkpoint,
re-shard, end of training) averages the union of `changed` over all
replicas, after which every replica holds the same model and both masks are
clear.

Partial: asynchronous gossip (no replica ever waits for another). Ripples'
partial all-reduce (Luo et al., ASPLOS 2020) averages among the replicas
ready at the same moment; with two replicas its only group is both, so the
one that arrives first waits for the other's step. Here a replica never
waits: at its synchronisation point (every `sync_every` local steps) it

  1. publishes version s (its s-th) of its recent rows in its `Mailbox` on the
     peer communicator (each rank its shard; slot s % 2, so version s - 1 stays
     readable while s is written): per layer the ids with recent > 0 ordered
     newest first (D levels: rows last changed in this interval, the one
     before, ...), their current rows, the whole arrays. When every rank of the
     replica has written (a barrier on the model communicator) the leader sets
     the replica's board word PUB+g = (s << 40) | c, c = the global step
     counter at publication;
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

The board (int64 words on world rank 0, one-sided atomics, changed by the
leaders only) also runs the global points:

    STATE    FROZEN (a global point is under way) | STOP
    DONE     mask of the replicas that have no step left
    COUNTER  the last global step dealt (partial mode)
    PUB+g    replica g's latest complete version and the counter then

Global points (checkpoint, re-shard for "auto", end of the run) are world
collectives. A replica that wants one raises FROZEN; every replica sees it
at its next step boundary (the leader reads STATE after every step) and
enters. A replica with no step left sets its DONE bit and polls STATE
(sleeping 1 ms between reads) until FROZEN: the last one to finish raises
it, so the final point comes when every replica is done, and done replicas
still take part in checkpoints. Inside the point every replica marks every
published version as seen (they predate the averaging of everything). The
host clears FROZEN inside the point, before the barrier that ends it.

Every rank of a replica makes the same decisions in the same order (the
leader's, broadcast), so a replica's model-parallel collectives always
match.
"""

from __future__ import annotations

import time

import numpy as np

from dslide.comm import Board, Comm, Mailbox
from dslide.sharding import check_layout, speed_weights
from dslide.timings import Timings

AUTO_STEPS = 20  # local steps whose times measure each rank's speed (the first, which compiles, left out)
TAG = 0x5C  # message tag of the exchanges on the peer communicator

# board words
STATE, DONE, COUNTER, PUB = 0, 1, 2, 3
FROZEN = 1 << 62
STOP = 1 << 61
STEP_BITS = 40  # PUB word: version << STEP_BITS | counter
DEPTH = 4  # partial: intervals of own changes a version carries (levels of `recent`)
MERGE_ROWS = 1 << 14  # partial: rows averaged at a time (float64 temporaries of this many rows)

# intents at a global point
I_CKPT, I_DONE, I_STOP, I_AUTO = 1, 2, 4, 8

MAX_REPLICAS = 60


def stale_limit(R: int, sync_every: int) -> int:
    """Partial: the most global steps dealt since a version's publication for it to be
    used (4 intervals of every replica's steps at equal speeds)."""
    return 4 * R * sync_every


def pub_word(version: int, counter: int) -> int:
    return (int(version) << STEP_BITS) | int(counter)


def fresh_partners(words, me: int, seen, counter: int, limit: int) -> tuple[list, list]:
    """Partial: which published versions replica `me` uses now.

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


class Replicas:
    """This rank's place in R replicas x P shards, and the synchronisation of its replica.

    Built collectively on the world communicator; `attach(net)` gives it the replica's
    network. It is a synchronisation schedule of the training loop (the protocol of
    `dslide.train.Alone`): `start(...)` gives this replica's first global step,
    `after_step(step, stop)` synchronises when due and gives the next one, or None when
    the run is over (after the final global point: every replica then holds the same
    parameters). At a checkpoint's global point it calls the loop's
    `at_checkpoint(network, step)`.
    """

    def __init__(self, config, world: Comm, timings: Timings | None = None):
        R = config.replicas
        check_layout(world.size, R)
        self.config = config
        self.world = world
        self.n_replicas, self.n_shards = R, world.size // R
        self.replica, self.shard = divmod(world.rank, self.n_shards)
        self.model = world.split(self.replica, self.shard) if R > 1 else world
        self.peer = world.split(self.shard, self.replica) if R > 1 else Comm()
        self.leader = self.shard == 0
        self.partial = config.sync == "partial" and R > 1
        self.board = Board(world, PUB + R) if self.partial else None
        self.box = None  # partial: this rank's mailbox on the peer communicator
        self.version = 0  # partial: versions this replica published
        self.seen = [0] * R  # partial: per replica the last version used or skipped
        self.stale_skips = 0  # partial: versions skipped as too stale
        self.torn = 0  # partial: versions dropped because a copy was overwritten meanwhile
        self.missed = 0  # partial: versions used with more than DEPTH intervals unseen
        self.auto = config.shard_weights == "auto"
        self.weights = None  # measured shard weights (float [P]) once "auto" has re-sharded
        self.measured = None  # "auto": the measured compute seconds and the weights from them
        self.network = None
        self.recent: list[np.ndarray] = []  # partial: per layer, intervals of own changes (DEPTH .. 0)
        self.changed: list[np.ndarray] = []  # per layer, rows changed since the last global point
        self.syncs = 0  # synchronisations this replica took part in (global points included)
        self.global_points = 0
        self.group_sizes: list[int] = []
        self.timings = timings if timings is not None else Timings()  # adds "sync_wait"
        self._done_set = False  # partial: this replica's bit is set in the board's DONE word
        # the run (`start`): global steps base + 1 .. last are dealt
        self.base = self.last = 0
        self.checkpoints: list[int] = []  # global steps still to checkpoint at
        self.at_checkpoint = None  # the loop's at_checkpoint(network, step)
        self.local_steps = 0  # local steps this replica trained
        self.trained = 0  # the last global step this replica trained
        self.last_sync_step = 0  # partial: the local step of the last synchronisation
        self.stop_wanted = False  # this replica asked to stop
        self.stop_agreed = False  # allreduce: every replica stopped at a synchronisation
        self.auto_pending = False  # "auto": the measuring re-shard is still to come
        self.static_until = 0  # partial: steps up to this one are dealt in turn (while measuring)
        self.steps_each = 0  # allreduce: the local steps of every replica
        self._measure: list[tuple[float, float]] = []  # "auto": per local step (seconds, comm seconds)
        self._t_return = 0.0
        self._comm_s0 = 0.0

    # -- the network ---------------------------------------------------------------------

    def attach(self, net) -> None:
        self.network = net
        rows = [layer.touched.shape[0] for layer in net.layers]
        self.recent = [np.zeros(n, dtype=np.uint8) for n in rows]
        self.changed = [np.zeros(n, dtype=np.uint8) for n in rows]
        if self.partial:  # collective over the peer communicator, as attach is over the world
            if self.box is not None:
                self.box.free()
            self.box = Mailbox(self.peer, self._capacity(net))

    def _capacity(self, net) -> int:
        """Bytes of a version holding every row of every layer (the most it can hold)."""
        total = 8 * len(net.layers) * DEPTH + 8 * 4 * len(net.layers) * 4
        for layer in net.layers:
            rows, whole = layer.sync_arrays()
            n = layer.touched.shape[0]
            total += 8 * n + sum(a.nbytes + 8 for a in rows) + sum(a.nbytes + 8 for a in whole)
        return total

    def sync_bytes(self) -> int:
        """Bytes this rank received in synchronisations (ids and rows)."""
        return int(self.peer.bytes_sent.get("replica_sync", 0) + self.peer.bytes_sent.get("replica_ids", 0))

    def stats(self) -> dict:
        return {"replicas": self.n_replicas, "shards": self.n_shards, "sync": self.config.sync, "sync_every": self.config.sync_every,
                "syncs": self.syncs, "global_points": self.global_points,
                "sync_bytes": self.sync_bytes(), "bytes_per_sync": self.sync_bytes() / max(1, self.syncs),
                "mean_group": float(np.mean(self.group_sizes)) if self.group_sizes else 0.0,
                "sync_wait_s": self.timings["sync_wait"], "local_steps": self.local_steps, "trained": self.trained,
                "stale_skips": self.stale_skips, "torn": self.torn, "missed": self.missed,
                "shard_weights": None if self.network.shard_weights is None else list(self.network.shard_weights)}

    def close(self) -> None:
        """Release the board and mailbox (collective over the world; after the run's final point)."""
        if self.box is not None:
            self.box.free()
            self.box = None
        if self.board is not None:
            self.board.free()
            self.board = None

    # -- averaging --------------------------------------------------------------------------

    def _absorb(self) -> None:
        """Move the rows the layers' updates changed (`take_touched`) into `recent` and
        `changed` (partial)."""
        for layer, recent, changed in zip(self.network.layers, self.recent, self.changed):
            ids = layer.take_touched()
            recent[ids] = DEPTH
            changed[ids] = 1

    def average(self, members: list[int], ids: list[np.ndarray], flags: int = 0) -> tuple[list[np.ndarray], int]:
        """Average the rows in the union of the members' sets among `members` (replica ids,
        ascending, this one among them); each rank of the members calls it with its own shard.

        ids: per layer, int64 [m] sorted, the rows of this replica's set.
        flags: an int every member contributes; returns (per layer the union U int64
        sorted, the OR of the members' flags).
        """
        t0 = time.perf_counter()
        layers = self.network.layers
        head = np.array([flags] + [i.shape[0] for i in ids], dtype=np.int64)
        parts = [head] + ids
        got = self.peer.exchange(members, np.concatenate(parts), TAG, "replica_ids")
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
        vals = self.peer.exchange(members, vec, TAG, "replica_sync")
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
        (allreduce mode; collective over the world). Returns the OR of the flags."""
        touched = [layer.take_touched() for layer in self.network.layers]
        _, out = self.average(list(range(self.n_replicas)), touched, flags=flags)
        return out

    # -- partial: gossip through the mailboxes ---------------------------------------------

    def publish(self) -> None:
        """Partial: write this replica's next version (every rank its shard), then the
        leader announces it on the board. Collective over the model communicator only."""
        t0 = time.perf_counter()
        self._absorb()
        counter = self.board.read(COUNTER) if self.leader else 0
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
        if self.n_shards > 1:
            self.model.barrier()  # every shard of this version is written
        if self.leader:
            self.board.swap(PUB + self.replica, pub_word(self.version, counter))
        self.timings.add("sync_wait", time.perf_counter() - t0)

    def choose_partners(self) -> list:
        """Partial, leader: the fresh partners [(h, v, gap)] (fresh_partners), marked seen."""
        words = [self.board.read(PUB + h) if h != self.replica else 0 for h in range(self.n_replicas)]
        use, stale = fresh_partners(words, self.replica, self.seen, self.board.read(COUNTER),
                                    stale_limit(self.n_replicas, self.config.sync_every))
        for h, v, _ in use:
            self.seen[h] = v
        for h, v in stale:
            self.seen[h] = v
        self.stale_skips += len(stale)
        return use

    def pull(self, partners: list | None = None) -> int:
        """Partial: average with the fresh partners' latest versions (the leader's choice,
        broadcast when `partners` is None), one partner after the other. Collective over
        the model communicator only; returns the number of partners used (0: this replica
        went on alone)."""
        t0 = time.perf_counter()
        if partners is None:
            partners = self.choose_partners() if self.leader else None
            if self.n_shards > 1:
                partners = self.model.bcast_object(partners)
        counts = None  # per layer, per row: values averaged so far (this replica's own: 1)
        used = 0
        for h, v, gap in partners:
            got = self._read(h, v, gap)
            ok = got is not None
            if self.n_shards > 1:  # a copy torn on one shard drops the partner on every shard
                ok = self.model.allreduce_sum(np.array([float(ok)]), kind="replica_ids")[0] == self.n_shards
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
        (collective over the world); afterwards every replica holds the same parameters."""
        if self.n_replicas == 1:
            for layer in self.network.layers:
                layer.take_touched()
            return flags
        if not self.partial:
            return self.sync_all(flags)
        self._absorb()
        changed = [np.flatnonzero(c).astype(np.int64) for c in self.changed]
        _, out = self.average(list(range(self.n_replicas)), changed, flags=flags)
        for recent, changed in zip(self.recent, self.changed):
            recent[:] = 0
            changed[:] = 0
        return out

    # -- the schedule ---------------------------------------------------------------------

    def start(self, net, base: int, last: int, checkpoints=(), at_checkpoint=None) -> int | None:
        """Start dealing steps base + 1 .. last; returns this replica's first global step.
        checkpoints: the global steps the loop wants checkpoints at (those before `last`
        get a global point, whether or not at_checkpoint writes anything)."""
        self.attach(net)
        self.base, self.last = int(base), int(last)
        self.at_checkpoint = at_checkpoint
        self.checkpoints = [int(c) for c in checkpoints if c < self.last]
        self.local_steps = 0
        self.trained = 0
        self.last_sync_step = 0
        self.stop_wanted = False
        self.stop_agreed = False
        self.auto_pending = self.auto and (self.last - self.base) >= self.n_replicas * (AUTO_STEPS + 1)
        self.static_until = self.base + (self.n_replicas * AUTO_STEPS if self.auto_pending and self.partial else 0)
        if self.partial:  # a checkpoint among the steps dealt in turn could not be exact
            self.checkpoints = [c for c in self.checkpoints if c >= self.static_until]
        self.steps_each = -(-(self.last - self.base) // self.n_replicas)
        self._measure = []
        self._t_return = time.perf_counter()
        self._comm_s0 = self._comm_seconds()
        if self.partial:
            if self.world.rank == 0:
                self.board.swap(COUNTER, max(self.base, self.static_until))
            self.world.barrier()
        if self.last <= self.base:
            return self._end()
        return self._next()

    def _dealt(self, local_step: int) -> int:
        """The global step of local step `local_step` (1-based) when steps are dealt in turn."""
        return self.base + (local_step - 1) * self.n_replicas + self.replica + 1

    def _next(self) -> int | None:
        """The next global step of this replica (allreduce: dealt in turn)."""
        if not self.partial:
            if self.local_steps + 1 > self.steps_each or self._dealt(self.local_steps + 1) > self.last:
                return self._end()
            return self._dealt(self.local_steps + 1)
        if self._dealt(self.local_steps + 1) <= self.static_until:
            return self._dealt(self.local_steps + 1)
        return self._fetch()

    def agree_stop(self, stop: bool) -> bool:
        """A stop asked by the loop's callback, the same on every rank of this replica."""
        return self.model.allreduce_max(float(stop)) > 0 if self.model.size > 1 else stop

    def stop_at_log(self) -> bool:
        """A stop asked at a logging point takes effect at the next step's `after_step`."""
        return False

    def record(self) -> dict:
        """What a logging record of the loop adds: sync_bytes, syncs."""
        return {"sync_bytes": self.sync_bytes(), "syncs": self.syncs}

    def after_step(self, step: int, stop: bool = False) -> int | None:
        """After training global step `step`: synchronise when due, take part in global
        points; returns the next global step to train, or None (the run is over)."""
        if self.auto_pending:
            self._measure.append((time.perf_counter() - self._t_return, self._comm_seconds() - self._comm_s0))
        self.local_steps += 1
        self.trained = max(self.trained, step)
        self.stop_wanted |= bool(stop)
        out = self._advance_partial() if self.partial else self._advance_allreduce()
        self._t_return = time.perf_counter()
        self._comm_s0 = self._comm_seconds()
        return out

    def _comm_seconds(self) -> float:
        return float(sum(self.model.seconds.values()))

    def _auto_due(self) -> bool:
        return self.auto_pending and self.local_steps == AUTO_STEPS

    def _advance_allreduce(self) -> int | None:
        local_step = self.local_steps
        if self._auto_due():
            self._auto_point()
        if self.n_replicas > 1 and local_step < self.steps_each and local_step % self.config.sync_every == 0:
            flags = self.sync_all(I_STOP if self.stop_wanted else 0)
            if flags & I_STOP:
                self.stop_agreed = True
                return self._end(synced=True)
            done = self.base + self.n_replicas * local_step
            due = [c for c in self.checkpoints if c <= done]
            if due and done < self.last:
                self.checkpoints = [c for c in self.checkpoints if c > done]
                self._checkpoint(done)
        elif self.n_replicas == 1 and self.stop_wanted:
            return self._end()
        elif self.n_replicas == 1:
            done = self.base + local_step
            if self.checkpoints and self.checkpoints[0] <= done < self.last:
                self.checkpoints = [c for c in self.checkpoints if c > done]
                self._checkpoint(done)
        return self._next()

    def _end(self, synced: bool = False) -> None:
        """Allreduce mode (and one replica): the final averaging; the run is over."""
        if self.partial:
            raise AssertionError("partial mode ends through a global point")
        if not synced:
            self.reconcile()
        if self.n_replicas > 1:
            self.global_points += 1
        # every replica trained the steps dealt up to here
        self.network.step = self._final_step()
        return None

    def _final_step(self) -> int:
        if self.n_replicas == 1:
            return self.trained or self.base
        if self.partial:
            return int(self.world.allreduce_max(float(self.trained or self.base)))
        if self.stop_agreed:  # stopped at a synchronisation: every replica at the same local step
            return min(self.last, self.base + self.n_replicas * self.local_steps)
        return self.last  # the schedule ran out: every step dealt was trained (the last replicas had one fewer)

    def _checkpoint(self, step: int) -> None:
        """A global point where every replica holds the same model and every global step up to
        `step` is trained: the loop's at_checkpoint (collective over the world)."""
        if self.at_checkpoint is not None:
            self.at_checkpoint(self.network, step)

    # -- partial mode -------------------------------------------------------------------

    def _fetch(self) -> int | None:
        """The next global step from the counter (leader), shared with the replica."""
        t = self.board.add(COUNTER, 1) + 1 if self.leader else 0
        if self.n_shards > 1:
            t = int(self.model.bcast_object(t))
        if self.checkpoints and t > self.checkpoints[0]:
            # every step up to the checkpoint is dealt: hold t, checkpoint first
            if self._global(I_CKPT, t) == "end":
                return None
        if t > self.last:
            return self._done()
        return t

    def _advance_partial(self) -> int | None:
        if self._auto_due():
            self._auto_point()
        if self._dealt(self.local_steps + 1) <= self.static_until:
            return self._dealt(self.local_steps + 1)
        if self.stop_wanted:
            return None if self._global(I_STOP) == "end" else self._fetch()
        due = self.local_steps - self.last_sync_step >= self.config.sync_every
        action, partners = self._decide(due) if self.leader else (0, None)
        if self.n_shards > 1:
            action, partners = self.model.bcast_object((action, partners))
        if action == 2:
            if self._global(0) == "end":
                return None
        elif action == 1:
            self.publish()
            self.pull(partners)
            self.last_sync_step = self.local_steps
        return self._fetch()

    def _decide(self, due: bool) -> tuple[int, list | None]:
        """Leader, after each step: (2, None) a global point is under way; (1, partners)
        synchronise (publish, then pull from the fresh partners); (0, None) go on."""
        if self.board.read(STATE) & FROZEN:
            return 2, None
        if due:
            return 1, self.choose_partners()
        return 0, None

    def _raise(self, bits: int) -> None:
        b = self.board
        while True:
            s = b.read(STATE)
            if s & bits == bits or b.cas(STATE, s, s | bits) == s:
                return

    def _done(self) -> None:
        """No step left for this replica: wait for global points until the run ends."""
        out = self._global(I_DONE)
        while out != "end":
            out = self._global(I_DONE)
        return None

    def _global(self, intent: int, held: int = 0) -> str:
        """Enter the next global point with `intent` (I_CKPT, I_DONE, I_STOP or 0; held: the
        step a checkpoint made this replica hold back); returns "end" when the run is over,
        else "continue"."""
        t0 = time.perf_counter()
        if self.leader:
            if intent & I_STOP:
                self._raise(STOP | FROZEN)
            elif intent & I_CKPT:
                self._raise(FROZEN)
            elif intent & I_DONE:
                old = self.board.add(DONE, 0) if self._done_set else self.board.add(DONE, 1 << self.replica)
                self._done_set = True
                if (old | 1 << self.replica) == (1 << self.n_replicas) - 1:
                    self._raise(FROZEN)
            # wait (idle replicas sleep) until the point is on
            while not self.board.read(STATE) & FROZEN:
                time.sleep(0.001)
        got = self.world.allgather_rows(np.array([intent, held], dtype=np.int64))
        # everyone is here, so nobody publishes: every version so far predates the averaging
        if self.leader:
            self.seen = [int(self.board.read(PUB + h)) >> STEP_BITS for h in range(self.n_replicas)]
        intents = got[:, 0]
        self.reconcile()
        self.global_points += 1
        if np.any(intents & I_CKPT) and not np.any(intents & I_STOP):
            self._checkpoint(self.checkpoints[0])
            # a step held back beyond the next checkpoints makes them inexact: skip them
            self.checkpoints = [c for c in self.checkpoints if c >= int(got[:, 1].max())]
        done_all = bool(np.all(intents[:: self.n_shards] & I_DONE))
        end = done_all or bool(np.any(intents & I_STOP))
        if end:
            self.network.step = self._final_step()
        if self.world.rank == 0:
            self.board.swap(STATE, 0)
        self.world.barrier()
        self.timings.add("sync_wait", time.perf_counter() - t0)
        return "end" if end else "continue"

    # -- shard weights = "auto" -------------------------------------------------------------

    def _auto_point(self) -> None:
        """Measure every rank's speed over its first AUTO_STEPS steps (the first left out), then
        re-shard every replica with shares proportional to speed (a world collective)."""
        from dslide.network import Network

        t0 = time.perf_counter()
        self.auto_pending = False
        meas = np.array(self._measure[1:AUTO_STEPS], dtype=np.float64)
        compute = float(np.sum(np.maximum(meas[:, 0] - meas[:, 1], 1e-9)))
        net = self.network
        share = np.diff(net.layers[-1].bounds) / net.layers[-1].bounds[-1]  # (rows of a row-split output)
        secs = self.world.allgather_rows(np.array([compute]))[:, 0].reshape(self.n_replicas, self.n_shards)
        sizes = np.tile(share, (self.n_replicas, 1))
        weights = speed_weights(secs, sizes)
        self.reconcile()
        self.global_points += 1
        new = reshard(net, weights)
        self.weights = weights
        self.attach(new)  # the loop trains `network` from the next step on
        self.measured = {"compute_s": secs.tolist(), "weights": weights.tolist()}
        self.timings.add("sync_wait", time.perf_counter() - t0)


def reshard(net, weights):
    """The network `net` re-split over its communicator with shares `weights` (float [P]):
    a new Network holding the same parameters, moments and step, each rank's new columns
    received from their old owners (one all-to-all per array: only the moving slices
    travel). Derived state (hash tables) is rebuilt as when a checkpoint is loaded on
    another layout."""
    from dslide.network import Network

    comm = net.comm
    new = Network(net.config, net.n_features, net.n_labels, comm, total_steps=net.total_steps,
                  shard_weights=weights, timings=net.timings)
    for old_layer, new_layer in zip(net.layers, new.layers):
        state = old_layer.state()
        arrays = {}
        for key, axis in old_layer.shard_axes().items():
            if key not in state:
                continue
            arr = np.asarray(state[key])
            if axis is None:
                arrays[key] = arr.copy()
                continue
            arrays[key] = redistribute(comm, arr, axis, old_layer.bounds, new_layer.bounds)
        new_layer.load_state(arrays, same_layout=False)
    new.step = net.step
    return new


def redistribute(comm: Comm, arr: np.ndarray, axis: int, old_bounds, new_bounds) -> np.ndarray:
    """This rank's slice [new_lo, new_hi) along `axis` of an array split by old_bounds
    (each rank holding its old slice `arr`), gathered from the old owners."""
    r = comm.rank
    a = np.moveaxis(arr, axis, 0)
    rest = a.shape[1:]
    per = int(np.prod(rest, dtype=np.int64))
    olo, ohi = int(old_bounds[r]), int(old_bounds[r + 1])
    nlo, nhi = int(new_bounds[r]), int(new_bounds[r + 1])
    send, sc, rc = [], [], []
    for q in range(comm.size):
        lo, hi = max(olo, int(new_bounds[q])), min(ohi, int(new_bounds[q + 1]))
        n = max(0, hi - lo)
        send.append(np.ascontiguousarray(a[lo - olo:lo - olo + n]).reshape(-1))
        sc.append(n * per)
        lo, hi = max(nlo, int(old_bounds[q])), min(nhi, int(old_bounds[q + 1]))
        rc.append(max(0, hi - lo) * per)
    got = comm.alltoallv(np.concatenate(send) if send else np.empty(0, arr.dtype), sc, rc)
    out = got.reshape((nhi - nlo,) + rest)
    return np.ascontiguousarray(np.moveaxis(out, 0, axis))
