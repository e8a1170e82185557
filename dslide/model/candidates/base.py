"""The protocol every candidate source speaks (`CandidateSource`), and `Schedule`, the
periods of its upkeep; the sources themselves are the other modules of this package."""

from __future__ import annotations

import numpy as np

from dslide.config import LSHConfig


class Schedule:
    """Steps at which a periodic job runs: period p0, then p0 * g, p0 * g^2, ..."""

    def __init__(self, period: float, growth: float, first: int):
        self.period, self.growth, self.next = float(period), float(growth), int(first)

    def due(self, step: int) -> bool:
        return step >= self.next

    def done(self, step: int) -> None:
        self.next = step + max(1, int(round(self.period)))
        self.period *= self.growth

    def state(self) -> np.ndarray:
        return np.array([self.period, self.growth, self.next], dtype=np.float64)

    def load(self, arr) -> None:
        p, g, nxt = np.asarray(arr, dtype=np.float64)
        self.period, self.growth, self.next = float(p), float(g), int(nxt)


class CandidateSource:
    """The protocol of a candidate source over one rank's n_local neurons of a layer.

        __init__(d_in, n_local, per_sample, lc, seeds)
                                   seeds: (family seed, table seed), from the seed and the
                                   layer only, never the rank
        batch(x) -> int32 [m]      sorted local ids: the union of the batch's candidates
                                   (x float [B, d_in]); may learn from x
        own(x, skip, out)          each sample's own candidates (lsh.scope "sample"), if
                                   the source has them (`per_sample_candidates`)
        maintain(step, W, b) -> str | None
                                   upkeep from the current weights W float [n_local, d_in]
                                   and biases, using and clearing the rows of `dirty` it
                                   consumed
        state() -> {name: array}   its arrays for a checkpoint ("dirty", the others
                                   prefixed by its kind)
        shard_axes() -> {name: None}
                                   the arrays of `state` that survive a new layout (every
                                   rank holds them alike); the others are rebuilt
        load_state(arrays, same_layout, W, b)
        estimate(d_in, n_local, per_sample, lc, batch_size, itemsize) -> dict
                                   classmethod: bytes it will hold (tables, scratch), its
                                   largest transient (step) and the expected candidates
                                   of a batch, from the configuration alone (dslide.memory)

    `dirty` uint8 [n_local] is the source's own: the rows whose weights changed since its
    tables last saw them. Others mark rows through `stale_mask()` (the array an update
    kernel marks in place: dslide.model.kernels.adam_rows) and `mark_stale(ids)` (rows a replica
    synchronisation rewrote); only the source clears it. Its upkeep is timed by its layer
    (the run's `upkeep[l]`, dslide.timings).
    """

    kind = "?"
    #: whether `own` gives each sample its own candidates (lsh.scope = "sample")
    per_sample_candidates = False

    def __init__(self, d_in: int, n_local: int, per_sample: int, lc: LSHConfig, seeds: tuple):
        self.per_sample = per_sample
        self.dirty = np.zeros(n_local, dtype=np.uint8)

    def stale_mask(self) -> np.ndarray:
        """`dirty` itself, for an update kernel to mark the rows it changed (nonzero: stale)."""
        return self.dirty

    def mark_stale(self, ids: np.ndarray) -> None:
        """Rows `ids` changed outside an update (a replica synchronisation): stale."""
        self.dirty[ids] = 1

    def _load_dirty(self, arrays: dict, same_layout: bool) -> None:
        """`dirty` from a checkpoint (same layout), else all clear (the tables are rebuilt)."""
        self.dirty[...] = np.asarray(arrays["dirty"]) if same_layout else 0

    def own(self, x, skip, out):
        raise ValueError(f"candidate source {self.kind!r} gives no per-sample candidates (lsh.scope = 'sample')")

    def shard_axes(self) -> dict:
        return {}
