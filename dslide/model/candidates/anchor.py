"""Candidates from anchor tables over the layer's inputs (lsh.anchors)."""

from __future__ import annotations

import numpy as np

from dslide import lsh
from dslide.config import LSHConfig
from dslide.model import kernels
from dslide.model.candidates.base import CandidateSource, Schedule


class AnchorCandidates(CandidateSource):
    """Query-side k-means anchors over the layer's inputs, learnt online from every batch;
    each bucket the `per_sample` neurons scoring highest (w.x + b) at its anchor, refilled
    from the current weights when the refill schedule is due."""

    kind = "anchor"
    per_sample_candidates = True

    def __init__(self, d_in: int, n_local: int, per_sample: int, lc: LSHConfig, seeds: tuple):
        super().__init__(d_in, n_local, per_sample, lc, seeds)
        self.lc = lc
        self.tables = lsh.AnchorTables(d_in, lc.L, lc.anchors, max(1, per_sample), seeds[0])
        self.refill = Schedule(lc.rehash_every, lc.growth, 0)
        self.filled = False
        self._mark = np.zeros(n_local, np.uint8)

    def batch(self, x) -> np.ndarray:
        """Sorted local ids: the union of the training batch's buckets (empty before the first
        fill); the batch x float [B, d_in] then moves the anchors (the first ones place them)."""
        out = self._query(x, lambda codes: self.tables.candidates(codes, self.per_sample, 0, self._mark))
        return np.empty(0, np.int32) if out is None else out

    def own(self, x, skip, out):
        """Each sample's own candidates into out int32 [B, k] (-1 past its count), leaving out
        the local ids `skip` (int32, scored for every sample already); returns the counts
        int64 [B], or None before the first fill. The batch x then moves the anchors, as in
        `batch`."""
        self._mark[skip] = 1
        try:
            return self._query(x, lambda codes: kernels.own_candidates(codes, self.tables.buckets,
                                                                       self.tables.fill_count, out.shape[1],
                                                                       self._mark, out))
        finally:
            self._mark[skip] = 0

    def _query(self, x, pick):
        """pick(codes of x) once the buckets are filled (else None); then x moves the anchors.
        A source of no candidates per sample (uniform negatives alone) never places them."""
        if self.per_sample == 0:
            return None
        if not self.tables.ready:
            self.tables.observe(x)
            return None
        codes = self.tables.codes(x)
        got = pick(codes) if self.filled and self.per_sample else None
        self.tables.observe(x, codes)
        return got

    def maintain(self, step: int, W, b) -> str | None:
        """Refill the buckets from the current weights when due (and as soon as anchors exist)."""
        if not self.tables.ready or self.per_sample == 0:
            return None
        if self.filled and not self.refill.due(step):
            return None
        self.tables.fill(W, b)
        self.filled = True
        self.refill.done(step)
        self.dirty[:] = 0
        return "refill"

    # -- state ------------------------------------------------------------------------------

    def state(self) -> dict:
        out = {"dirty": self.dirty}
        out.update({f"anchor.{k}": v for k, v in self.tables.state_arrays().items()})
        out["anchor.schedule"] = self.refill.state()
        out["anchor.filled"] = np.array([self.filled])
        return out

    def shard_axes(self) -> dict:
        # the anchors and the schedule are the same on every rank; the buckets are refilled
        return {"anchor.anchors": None, "anchor.counts": None, "anchor.ready": None, "anchor.schedule": None}

    def load_state(self, arrays: dict, same_layout: bool, W, b) -> None:
        """Restore `state()`; for a new layout (this source fresh) keep the anchors and the
        schedule and refill the buckets from this rank's weights."""
        self._load_dirty(arrays, same_layout)
        if same_layout:
            from dslide import validate

            validate.anchor_tables({k[len("anchor."):]: v for k, v in arrays.items() if k.startswith("anchor.")},
                                   "the training hash tables: anchor", W.shape[0], self.tables.anchors.shape)
            self.tables.load_state_arrays({k[len("anchor."):]: v for k, v in arrays.items()
                                           if k.startswith("anchor.") and k not in ("anchor.schedule",
                                                                                     "anchor.filled")})
            self.refill.load(arrays["anchor.schedule"])
            self.filled = bool(np.asarray(arrays["anchor.filled"])[0])
            return
        anchor = {k: v for k, v in arrays.items() if k.startswith("anchor.")}
        if anchor and bool(np.asarray(anchor["anchor.ready"])[0]):
            lc = self.lc
            self.tables.load_state_arrays({
                "anchors": anchor["anchor.anchors"], "counts": anchor["anchor.counts"],
                "buckets": np.zeros((lc.L, lc.anchors, 0), np.int32),
                "fill": np.zeros((lc.L, lc.anchors), np.int32), "ready": np.array([True])})
        self.maintain(0, W, b)
        if "anchor.schedule" in anchor:
            self.refill.load(anchor["anchor.schedule"])

    # -- memory -----------------------------------------------------------------------------

    @classmethod
    def estimate(cls, d_in: int, n_local: int, per_sample: int, lc: LSHConfig, batch_size: int,
                 itemsize: int) -> dict:
        """Bytes it will hold (tables: anchors, counts, buckets of per_sample ids; scratch: its
        mark), the transient of a refill between steps (step: one block of scores and a
        table's [A, T] ids and scores) and the expected size of a batch's union (candidates)."""
        T = max(1, min(per_sample, n_local))
        return {"tables": lc.L * lc.anchors * (d_in * 4 + 8 + 4 + T * 4), "scratch": n_local,
                "step": lsh.anchors.score_block(n_local) * n_local * itemsize + lc.anchors * T * 8,
                "candidates": _union_size(batch_size, lc.anchors, per_sample, n_local) if per_sample else 0}


def _union_size(B: int, A: int, T: int, n_local: int) -> int:
    """Expected size of the union of a batch's buckets: B queries over A anchors hit
    A (1 - (1 - 1/A)^B) distinct ones (uniformly, an upper estimate of distinct-ness
    for clustered data), each bucket T ids, at most n_local."""
    distinct = A * (1.0 - (1.0 - 1.0 / A) ** B)
    return int(min(n_local, distinct * T))
