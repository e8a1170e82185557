"""Where an LSH layer's candidate neurons come from, and their upkeep.

A candidate source gives, for a training batch, the sorted union of the
neurons its tables retrieve for the batch's inputs (at most `per_sample` per
input); the layer scores that union for the whole batch as one shared block,
so candidates cost what random neurons cost (one BLAS product).

    AnchorCandidates   family "anchor" (default): query-side k-means anchors
                       over the layer's inputs, each bucket the neurons scoring
                       highest at its anchor (lsh.anchors). The anchors learn
                       online from every training batch; the buckets are
                       refilled from the current weights on a schedule.
    HashCandidates     families "dwta", "srp", "wta": SLIDE's item hashing,
                       neurons hashed into tables whose buckets hold exactly
                       their neurons (lsh.CompactTables; lsh.capacity = 0, the
                       default) or fixed-capacity ones (lsh.HashTables),
                       re-hashed and rebuilt on a schedule.

Schedules: a period starts at `lsh.rehash_every` steps and grows by
`lsh.growth` after each use (weights settle as training goes on; SLIDE,
Chen et al. 2020). Item hashing also rebuilds every `lsh.rebuild_every` steps
(growing likewise).
"""

from __future__ import annotations

import time

import numpy as np

from dslide import kernels as K
from dslide import lsh
from dslide.config import LSHConfig


class _Schedule:
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


class AnchorCandidates:
    """Candidates from anchor tables over the layer's inputs (see lsh.anchors)."""

    kind = "anchor"

    def __init__(self, d_in: int, n_local: int, per_sample: int, lc: LSHConfig, seed: int, per_step: int = 0):
        self.per_sample, self.per_step = per_sample, per_step
        self.tables = lsh.AnchorTables(d_in, lc.L, lc.anchors, max(1, per_sample), seed)
        self.refill = _Schedule(lc.rehash_every, lc.growth, 0)
        self.filled = False
        self.upkeep_s = 0.0
        self._mark = np.zeros(n_local, np.uint8)

    def batch(self, x) -> np.ndarray:
        """Sorted local ids: the union of the training batch's buckets (empty before the first
        fill); the batch x float [B, d_in] then moves the anchors (the first ones place them)."""
        out = self._query(x, lambda codes: self.tables.candidates(codes, self.per_sample, self.per_step, self._mark))
        return np.empty(0, np.int32) if out is None else out

    def own(self, x, mark, out):
        """Each sample's own candidates into out int32 [B, k] (-1 past its count), skipping
        the neurons mark (uint8 [n_local]) flags; returns the counts int64 [B], or None before
        the first fill. The batch x then moves the anchors, as in `batch`."""
        return self._query(x, lambda codes: K.own_candidates(codes, self.tables.buckets, self.tables.fill_count,
                                                             out.shape[1], mark, out))

    def _query(self, x, pick):
        """pick(codes of x) once the buckets are filled (else None); then x moves the anchors."""
        if not self.tables.ready:
            self.tables.observe(x)
            return None
        codes = self.tables.codes(x)
        got = pick(codes) if self.filled and self.per_sample else None
        self.tables.observe(x, codes)
        return got

    def maintain(self, step: int, W, b, dirty) -> str | None:
        """Refill the buckets from the current weights when due (and as soon as anchors exist)."""
        if not self.tables.ready or self.per_sample == 0:
            return None
        if self.filled and not self.refill.due(step):
            return None
        t0 = time.perf_counter()
        self.tables.fill(W, b)
        self.filled = True
        self.refill.done(step)
        dirty[:] = 0
        self.upkeep_s += time.perf_counter() - t0
        return "refill"

    def state(self) -> dict:
        out = {f"anchor.{k}": v for k, v in self.tables.state_arrays().items()}
        out["anchor.schedule"] = self.refill.state()
        out["anchor.filled"] = np.array([self.filled])
        return out

    def load_state(self, arrays: dict) -> None:
        self.tables.load_state_arrays({k[len("anchor."):]: v for k, v in arrays.items()
                                       if k.startswith("anchor.") and k not in ("anchor.schedule", "anchor.filled")})
        self.refill.load(arrays["anchor.schedule"])
        self.filled = bool(np.asarray(arrays["anchor.filled"])[0])


class HashCandidates:
    """Candidates from item-hashing tables (SLIDE's DWTA, SimHash or WTA)."""

    kind = "hash"

    def __init__(self, d_in: int, n_local: int, per_sample: int, lc: LSHConfig, family_seed: int, table_seed: int,
                 per_step: int = 0):
        self.per_sample, self.per_step = per_sample, per_step
        self.lc = lc
        params = {"bin_size": lc.bin_size} if lc.family == "dwta" else {}
        self.family = lsh.make_family(lc.family, d_in, lc.K, lc.L, family_seed, **params)
        range_pow = lc.range_pow or auto_range_pow(n_local, lc.capacity, self.family.code_bits)
        if lc.capacity:
            self.tables = lsh.HashTables(self.family, range_pow, lc.capacity, policy=lc.policy, seed=table_seed)
        else:
            self.tables = lsh.CompactTables(self.family, range_pow)
        self.rehash = _Schedule(lc.rehash_every, lc.growth, lc.rehash_every)
        self.rebuild = _Schedule(lc.rebuild_every, lc.growth, lc.rebuild_every)
        self.built = False
        self.upkeep_s = 0.0

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
        return _rank_major_union(ptr, ids, self.per_step)

    def maintain(self, step: int, W, b, dirty) -> str | None:
        t0 = time.perf_counter()
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
        self.upkeep_s += time.perf_counter() - t0
        return what

    def state(self) -> dict:
        out = {f"tables.{k}": v for k, v in self.tables.state_arrays().items()}
        out["tables.schedule"] = np.concatenate([self.rehash.state(), self.rebuild.state()])
        out["tables.built"] = np.array([self.built])
        return out

    def load_state(self, arrays: dict) -> None:
        self.tables.load_state_arrays({k[len("tables."):]: v for k, v in arrays.items()
                                       if k.startswith("tables.") and k not in ("tables.schedule", "tables.built")})
        s = np.asarray(arrays["tables.schedule"])
        self.rehash.load(s[:3])
        self.rebuild.load(s[3:])
        self.built = bool(np.asarray(arrays["tables.built"])[0])


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


def _rank_major_union(ptr, ids, total: int) -> np.ndarray:
    """Sorted unique ids of CSR rows (each row best first), at most `total` (0: all): the
    cap takes every row's first id, then every row's second, and so on."""
    if total <= 0:
        return np.unique(ids).astype(np.int32)
    rank = np.arange(ids.size, dtype=np.int64) - np.repeat(ptr[:-1], np.diff(ptr))
    order = np.argsort(rank, kind="stable")
    uniq, first = np.unique(ids[order], return_index=True)
    keep = uniq[np.argsort(first, kind="stable")[:total]]
    return np.sort(keep).astype(np.int32)


def auto_range_pow(n_local: int, capacity: int, code_bits: int) -> int:
    """Buckets for about `capacity / 4` neurons each on average (fixed capacity: few buckets
    overflow), or 8 to 16 (capacity 0, compact tables: fewer, larger buckets lose recall,
    measured by scripts/bench_lsh.py), within the code's bits."""
    load = capacity / 4.0 if capacity else 16.0
    want = int(np.ceil(np.log2(max(n_local / load, 2.0))))
    return int(min(max(want, 1), code_bits, 24))


def make_candidates(family: str, d_in: int, n_local: int, per_sample: int, lc: LSHConfig, seeds: tuple,
                    per_step: int = 0):
    """The candidate source of an LSH layer; seeds = (family/anchor seed, table seed);
    per_step caps the candidates of a step (0: no cap)."""
    if family == "anchor":
        return AnchorCandidates(d_in, n_local, per_sample, lc, seeds[0], per_step)
    return HashCandidates(d_in, n_local, per_sample, lc, seeds[0], seeds[1], per_step)
