"""Candidates from item-hashing tables (SLIDE's DWTA, SimHash or WTA)."""

from __future__ import annotations

import numpy as np

from dslide import lsh
from dslide.config import LSHConfig
from dslide.model.candidates.base import CandidateSource, Schedule


class HashCandidates(CandidateSource):
    """Neurons hashed with K hashes per table into L tables; a sample's candidates are the
    neurons that collide with it (`lsh.select`). Changed neurons are re-hashed when the
    rehash schedule is due, the tables rebuilt when the rebuild schedule is."""

    kind = "hash"

    def __init__(self, d_in: int, n_local: int, per_sample: int, lc: LSHConfig, seeds: tuple):
        super().__init__(d_in, n_local, per_sample, lc, seeds)
        self.lc = lc
        self.family = _family(lc, d_in, seeds[0])
        range_pow = lc.range_pow or auto_range_pow(n_local, lc.capacity, self.family.code_bits)
        if lc.capacity:
            self.tables = lsh.HashTables(self.family, range_pow, lc.capacity, policy=lc.policy, seed=seeds[1])
        else:
            self.tables = lsh.CompactTables(self.family, range_pow)
        self.rehash = Schedule(lc.rehash_every, lc.growth, lc.rehash_every)
        self.rebuild = Schedule(lc.rebuild_every, lc.growth, lc.rebuild_every)
        self.built = False

    def batch(self, x) -> np.ndarray:
        if not self.built or self.per_sample == 0:
            return np.empty(0, np.int32)
        lc = self.lc
        if lc.select == "topk":
            ptr, ids, _ = self.tables.query(x, mode="topk", m=self.per_sample)
        elif lc.select == "threshold":
            ptr, ids, _ = self.tables.query(x, mode="threshold", t=lc.threshold)
            ptr, ids = _cut_rows(ptr, ids, self.per_sample)
        else:
            ptr, ids, _ = self.tables.query(x, mode="union")
            ptr, ids = _cut_rows(ptr, ids, self.per_sample, spread=True)
        return np.unique(ids).astype(np.int32)

    def maintain(self, step: int, W, b) -> str | None:
        dirty = self.dirty
        what = None
        if not self.built or self.rebuild.due(step):
            self.tables.build(W)
            self.built = True
            dirty[:] = 0
            if step:
                self.rebuild.done(step)
                self.rehash.done(step)
            what = "rebuild"
        elif self.rehash.due(step):
            changed = np.flatnonzero(dirty).astype(np.int32)
            if changed.size:
                self.tables.update(changed, W[changed])
            dirty[:] = 0
            self.rehash.done(step)
            what = "rehash"
        return what

    def state(self) -> dict:
        out = {"dirty": self.dirty}
        out.update({f"tables.{k}": v for k, v in self.tables.state_arrays().items()})
        out["tables.schedule"] = np.concatenate([self.rehash.state(), self.rebuild.state()])
        out["tables.built"] = np.array([self.built])
        return out

    def load_state(self, arrays: dict, same_layout: bool, W, b) -> None:
        """Restore `state()`; for a new layout (this source fresh) build the tables from this
        rank's weights."""
        self._load_dirty(arrays, same_layout)
        if not same_layout:
            self.maintain(0, W, b)
            return
        self.tables.load_state_arrays({k[len("tables."):]: v for k, v in arrays.items()
                                       if k.startswith("tables.") and k not in ("tables.schedule", "tables.built")})
        s = np.asarray(arrays["tables.schedule"])
        self.rehash.load(s[:3])
        self.rebuild.load(s[3:])
        self.built = bool(np.asarray(arrays["tables.built"])[0])

    # -- memory -----------------------------------------------------------------------------

    @classmethod
    def estimate(cls, d_in: int, n_local: int, per_sample: int, lc: LSHConfig, batch_size: int,
                 itemsize: int) -> dict:
        """Bytes its tables will hold (compact: bucket offsets, ids and item codes; fixed
        capacity: L x 2^range_pow x capacity slots, fill and policy counters, item codes) and
        the most candidates a batch can have."""
        rp = lc.range_pow or auto_range_pow(n_local, lc.capacity, _family(lc, d_in, 0).code_bits)
        if lc.capacity:
            counters = 1 if lc.policy == "fifo" else 3
            tables = lc.L * (1 << rp) * (lc.capacity + 1 + counters) * 4 + lc.L * n_local * 4
        else:
            tables = lc.L * ((1 << rp) + 1) * 4 + 2 * lc.L * n_local * 4
        return {"tables": tables, "scratch": 0, "step": 0, "candidates": min(n_local, batch_size * per_sample)}


def _cut_rows(ptr, ids, limit: int, spread: bool = False):
    """The first `limit` ids of each CSR row, as (ptr, ids) (rows sorted by id in union
    mode: cutting them would favour low ids, so `spread` takes evenly spaced ids instead)."""
    lens = np.diff(ptr)
    if lens.size == 0 or lens.max() <= limit:
        return ptr, ids
    out = []
    for i in range(lens.size):
        row = ids[ptr[i]:ptr[i + 1]]
        if row.size > limit:
            row = row[np.linspace(0, row.size - 1, limit).astype(np.int64)] if spread else row[:limit]
        out.append(row)
    new_ptr = np.zeros(lens.size + 1, np.int64)
    np.cumsum([r.size for r in out], out=new_ptr[1:])
    return new_ptr, np.concatenate(out)


def _family(lc: LSHConfig, d_in: int, seed: int):
    """The layer's hash family (lsh.FAMILIES) over inputs of d_in, from the seed alone."""
    params = {"bin_size": lc.bin_size} if lc.family == "dwta" else {}
    return lsh.make_family(lc.family, d_in, lc.K, lc.L, seed, **params)


def auto_range_pow(n_local: int, capacity: int, code_bits: int) -> int:
    """Buckets for about `capacity / 4` neurons each on average (fixed capacity: few buckets
    overflow), or 8 to 16 (capacity 0, compact tables: fewer, larger buckets lose recall,
    measured by scripts/bench_lsh.py), within the code's bits."""
    load = capacity / 4.0 if capacity else 16.0
    want = int(np.ceil(np.log2(max(n_local / load, 2.0))))
    return int(min(max(want, 1), code_bits, 24))

