"""The replicas' synchronisation schedule: which global step each replica trains, when it
synchronises, and the global points where every replica holds the same model.

Data. The global steps t = 1 .. T of `train.batch_rows` (a function of seed
and step) are dealt to the replicas, so each batch of each epoch is trained
by exactly one replica. `sync = "allreduce"`: replica g takes t = base +
(s - 1) R + g + 1 at its local step s (deterministic), and every replica
averages (dslide.train.replicas.allreduce) every `sync_every` local steps.
`sync = "partial"`: each replica takes the next t from a shared counter (the
board's COUNTER) when it starts a step, so a faster replica takes more of
them (the first R x AUTO_STEPS are dealt as in allreduce when `shard_weights
= "auto"` measures speeds), and synchronises by gossip
(dslide.train.replicas.partial). Batch.step is the global t: learning-rate
schedule, dropout and negative-sample streams and LSH upkeep periods follow
the progress of the whole model.

Global points (checkpoint, re-shard for "auto", end of the run) are world
collectives, through the board (dslide.train.replicas.board) in partial mode. A
replica that wants one raises FROZEN; every replica sees it at its next step
boundary (the leader reads STATE after every step) and enters. A replica
with no step left sets its DONE bit and polls STATE (sleeping 1 ms between
reads) until FROZEN: the last one to finish raises it, so the final point
comes when every replica is done, and done replicas still take part in
checkpoints. Inside the point every replica marks every published version as
seen (they predate the averaging of everything). The host clears FROZEN
inside the point, before the barrier that ends it.

Every rank of a replica makes the same decisions in the same order (the
leader's, broadcast), so a replica's model-parallel collectives always
match.
"""

from __future__ import annotations

import time

import numpy as np

from dslide.comm import Board, Comm
from dslide.model.sharding import speed_weights
from dslide.timings import Timings

from .allreduce import ExactMean
from .board import COUNTER, DONE, FROZEN, PUB, STATE, STOP
from .layout import Layout
from .partial import Gossip
from .reshard import reshard

AUTO_STEPS = 20  # local steps whose times measure each rank's speed (the first, which compiles, left out)

# intents at a global point
I_CKPT, I_DONE, I_STOP, I_AUTO = 1, 2, 4, 8

MAX_REPLICAS = 60


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
        self.config = config
        self.world = world
        self.layout = Layout.split(world, R)
        lay = self.layout
        self.n_replicas, self.n_shards = lay.n_replicas, lay.n_shards
        self.replica, self.shard, self.leader = lay.replica, lay.shard, lay.leader
        self.model, self.peer = lay.model, lay.peer
        self.partial = config.sync == "partial" and R > 1
        self.board = Board(world, PUB + R) if self.partial else None
        self.timings = timings if timings is not None else Timings()  # adds "sync_wait"
        #: the averaging strategy: its synchronisations and their counts
        self.averaging = Gossip(lay, self.timings, self.board, config.sync_every) if self.partial \
            else ExactMean(lay, self.timings)
        self.auto = config.shard_weights == "auto"
        self.weights = None  # measured shard weights (float [P]) once "auto" has re-sharded
        self.measured = None  # "auto": the measured compute seconds and the weights from them
        self.network = None
        self.global_points = 0
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

    # -- the network and its averaging ----------------------------------------------------

    def attach(self, net) -> None:
        """Train and average `net` from now on (in partial mode collective over the peer
        communicator, as attach is over the world)."""
        self.network = net
        self.averaging.attach(net)

    def sync_all(self, flags: int = 0) -> int:
        """allreduce: average every replica now (ExactMean.sync_all)."""
        return self.averaging.sync_all(flags)

    def publish(self) -> None:
        """partial: publish this replica's next version (Gossip.publish)."""
        self.averaging.publish()

    def pull(self, partners: list | None = None) -> int:
        """partial: average with the fresh partners' versions (Gossip.pull)."""
        return self.averaging.pull(partners)

    def reconcile(self, flags: int = 0) -> int:
        """A global point's averaging (the strategy's `reconcile`)."""
        return self.averaging.reconcile(flags)

    def sync_bytes(self) -> int:
        """Bytes this rank received in synchronisations (ids and rows)."""
        return self.averaging.sync_bytes()

    @property
    def syncs(self) -> int:
        """Synchronisations this replica took part in (global points included)."""
        return self.averaging.syncs

    @property
    def group_sizes(self) -> list[int]:
        return self.averaging.group_sizes

    @property
    def stale_skips(self) -> int:
        return self.averaging.stats()["stale_skips"]

    @property
    def missed(self) -> int:
        return self.averaging.stats()["missed"]

    def stats(self) -> dict:
        a = self.averaging.stats()
        return {"replicas": self.n_replicas, "shards": self.n_shards, "sync": self.config.sync,
                "sync_every": self.config.sync_every, "syncs": a["syncs"], "global_points": self.global_points,
                "sync_bytes": a["sync_bytes"], "bytes_per_sync": a["bytes_per_sync"], "mean_group": a["mean_group"],
                "sync_wait_s": self.timings["sync_wait"], "local_steps": self.local_steps, "trained": self.trained,
                "stale_skips": a["stale_skips"], "torn": a["torn"], "missed": a["missed"],
                "shard_weights": None if self.network.shard_weights is None else list(self.network.shard_weights)}

    def close(self) -> None:
        """Release the board and mailbox (collective over the world; after the run's final point)."""
        self.averaging.close()
        if self.board is not None:
            self.board.free()
            self.board = None

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
            return 1, self.averaging.choose_partners()
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
            self.averaging.mark_seen()
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
