"""Fixed-capacity LSH tables as flat arrays, with build and update kernels (queries: lsh.query).

Storage (L tables, NB = 2**range_pow buckets, capacity C):

    buckets     int32 [L, NB, C]  item ids; bucket (l, b) holds buckets[l, b, :fill[l, b]]
    fill        int32 [L, NB]     entries held, <= C
    item_codes  int32 [m, L]      bucket each item was last offered to in table l, -1 if never
                                  (stored table-major [L, m]; `item_codes` is its transposed view)
    FIFO:       head     int32 [L, NB]  slot of the oldest entry of a full bucket
    reservoir:  offered  int32 [L, NB]  live items offered to the bucket (offers - removals)
                c1, c2   int32 [L, NB]  uncompensated removals from inside / outside the sample
                rng      uint64 [L]     per-table splitmix64 state, from (seed, table)

An id appears at most once per table, so the count of an id over a query's L
buckets is <= L.

Policies for a bucket that is full when an item is offered:
- "fifo": the oldest entry is overwritten. A full bucket is a ring (entries in
  age order from slot `head`); a bucket that is not full always has head == 0
  and its entries in age order in slots [0, fill). So at any time a bucket
  holds the last C items offered to it that have not been removed, and a
  removal keeps the others' relative age.
- "reservoir": random pairing (Gemulla, Lehner & Haas 2006), which is
  Vitter's algorithm R when nothing was removed: the n-th live item offered to
  a full bucket replaces a uniform slot with probability C/n. A removal of a
  sampled item frees its slot (c1 += 1), of an unsampled one just counts
  (c2 += 1); the next offers pay those back (kept with probability
  c1/(c1+c2)). The bucket then stays a uniform sample of min(C, n) of its n
  live items through any mix of offers and removals.

Determinism: codes are computed per row, tables are filled one table per
thread in id order, and each table draws from its own random stream, so
every array - and every query result - is the same for any thread count.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from dslide.rng import splitmix_next, unit

from ._common import HashFamily, check_int, check_seed
from .query import run_query

#: Refuse tables whose arrays would exceed this many bytes (override with max_bytes=).
MAX_TABLE_BYTES = 8 << 30

POLICIES = ("fifo", "reservoir")
_FIFO, _RESERVOIR = 0, 1


# ----------------------------------------------------------------------------
# Serial per-bucket kernels (one table's 2-D slices)
# ----------------------------------------------------------------------------

@njit(cache=True)
def _rand_below(rng, l, n):
    """Uniform int in [0, n) from table l's splitmix64 stream rng[l] (advanced in place)."""
    r = np.int64(unit(splitmix_next(rng, l)) * n)
    return min(r, n - 1)


@njit(cache=True)
def _reverse(row, lo, hi):
    hi -= 1
    while lo < hi:
        t = row[lo]
        row[lo] = row[hi]
        row[hi] = t
        lo += 1
        hi -= 1


@njit(cache=True)
def fifo_insert(bk, fill, head, b, item):
    """Offer `item` to bucket b of one table (bk int32 [NB, C]; fill, head int32 [NB]).
    Returns the evicted id or -1."""
    C = bk.shape[1]
    f = fill[b]
    if f < C:
        bk[b, f] = item
        fill[b] = f + 1
        return -1
    h = head[b]
    old = bk[b, h]
    bk[b, h] = item
    head[b] = h + 1 if h + 1 < C else 0
    return old


@njit(cache=True)
def fifo_remove(bk, fill, head, b, item):
    """Remove `item` from bucket b if present (True then), keeping the others' age order."""
    C = bk.shape[1]
    f = fill[b]
    row = bk[b]
    i = -1
    for s in range(f):
        if row[s] == item:
            i = s
            break
    if i < 0:
        return False
    h = head[b]
    if h != 0:
        # Full ring: rotate left by h (three reversals) so age order starts at slot 0,
        # restoring the "not full => head == 0" invariant after the removal.
        _reverse(row, 0, h)
        _reverse(row, h, C)
        _reverse(row, 0, C)
        head[b] = 0
        i = i - h if i >= h else i + C - h
    for s in range(i, f - 1):
        row[s] = row[s + 1]
    fill[b] = f - 1
    return True


@njit(cache=True)
def reservoir_insert(bk, fill, offered, c1, c2, rng, l, b, item):
    """Offer `item` to bucket b of table l (random pairing / algorithm R). Returns the evicted id or -1
    (or `item` itself when it is not kept)."""
    C = bk.shape[1]
    n = offered[b] + 1
    offered[b] = n
    d = c1[b] + c2[b]
    if d == 0:
        f = fill[b]
        if f < C:
            bk[b, f] = item
            fill[b] = f + 1
            return -1
        r = _rand_below(rng, l, n)
        if r < C:
            old = bk[b, r]
            bk[b, r] = item
            return old
        return item
    if _rand_below(rng, l, d) < c1[b]:
        f = fill[b]
        bk[b, f] = item
        fill[b] = f + 1
        c1[b] -= 1
        return -1
    c2[b] -= 1
    return item


@njit(cache=True)
def reservoir_remove(bk, fill, offered, c1, c2, b, item):
    """Remove live `item` (previously offered to bucket b) from the bucket's population."""
    f = fill[b]
    row = bk[b]
    offered[b] -= 1
    for s in range(f):
        if row[s] == item:
            row[s] = row[f - 1]
            fill[b] = f - 1
            c1[b] += 1
            return True
    c2[b] += 1
    return False


# ----------------------------------------------------------------------------
# Parallel kernels (over tables for writes, over queries for reads)
# ----------------------------------------------------------------------------

@njit(parallel=True, cache=True)
def insert_all(codes_lm, buckets, fill, head, offered, c1, c2, rng, policy):
    """Clear and fill every table with items 0..m-1 in id order.

    codes_lm int32 [L, m]: item i's bucket in table l. buckets int32 [L, NB, C];
    fill, head / offered, c1, c2 int32 [L, NB] (the arrays of the other policy
    may be [L, 1] placeholders); rng uint64 [L]; policy 0 = FIFO, 1 = reservoir.
    One thread per table: no races, and the result is thread-count independent.
    """
    L, m = codes_lm.shape
    for l in prange(L):
        bk = buckets[l]
        fl = fill[l]
        cl = codes_lm[l]
        fl[:] = 0
        if policy == _FIFO:
            hd = head[l]
            hd[:] = 0
            for i in range(m):
                fifo_insert(bk, fl, hd, cl[i], i)
        else:
            of = offered[l]
            d1 = c1[l]
            d2 = c2[l]
            of[:] = 0
            d1[:] = 0
            d2[:] = 0
            for i in range(m):
                reservoir_insert(bk, fl, of, d1, d2, rng, l, cl[i], i)


@njit(parallel=True, cache=True)
def update_items(ids, new_codes, item_codes_lm, buckets, fill, head, offered, c1, c2, rng, policy):
    """Re-insert items `ids` (int64 [r]) at their new codes new_codes int32 [r, L].

    Per table, in the order of `ids`: an item whose code is unchanged is left
    alone (it has already been offered to that bucket); otherwise it leaves its
    old bucket (FIFO: removed if still there; reservoir: removed from the
    bucket's population) and is offered to the new one as a fresh arrival.
    item_codes_lm int32 [L, m] is updated. One thread per table.
    """
    L = item_codes_lm.shape[0]
    r = ids.shape[0]
    for l in prange(L):
        for j in range(r):
            i = ids[j]
            new = new_codes[j, l]
            old = item_codes_lm[l, i]
            if old == new:
                continue
            if policy == _FIFO:
                if old >= 0:
                    fifo_remove(buckets[l], fill[l], head[l], old, i)
                fifo_insert(buckets[l], fill[l], head[l], new, i)
            else:
                if old >= 0:
                    reservoir_remove(buckets[l], fill[l], offered[l], c1[l], c2[l], old, i)
                reservoir_insert(buckets[l], fill[l], offered[l], c1[l], c2[l], rng, l, new, i)
            item_codes_lm[l, i] = new


# ----------------------------------------------------------------------------
# The class
# ----------------------------------------------------------------------------

def _fmt_bytes(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def check_family_range(family, range_pow) -> int:
    """range_pow checked against `family` (a HashFamily): 1..24 and at most its code bits."""
    if not isinstance(family, HashFamily):
        raise ValueError(f"family must be a hash family from dslide.lsh.make_family, got {type(family).__name__}")
    range_pow = check_int("range_pow", range_pow, 1, 24)
    if range_pow > family.code_bits:
        raise ValueError(f"range_pow ({range_pow}) exceeds the {family.code_bits} bits of a "
                         f"full {family.name} code (K={family.K}); valid: 1..{family.code_bits}")
    return range_pow


class HashTables:
    """L fixed-capacity hash tables over item vectors (rows of W, neuron-major).

    HashTables(family, range_pow, capacity, policy="fifo" | "reservoir", seed=0,
               max_bytes=MAX_TABLE_BYTES)

    family: a hash family (dslide.lsh.make_family(...)); range_pow: bucket index bits,
    1..24 and <= family.code_bits; capacity: slots per bucket (>= 1); seed: the
    reservoir's random streams (table l's stream derives from (seed, l)).

    build(W [m, dim]) inserts ids 0..m-1; update(ids, W[ids]) moves changed items;
    query(Q [n, dim], mode, m, t) -> (indptr, ids, counts) finds candidates.
    See the module docstring for the storage layout and the policies.
    """

    def __init__(self, family: HashFamily, range_pow: int, capacity: int, policy: str = "fifo",
                 seed: int = 0, max_bytes: int = MAX_TABLE_BYTES):
        self.family = family
        self.L = family.L
        self.range_pow = check_family_range(family, range_pow)
        self.capacity = check_int("capacity", capacity, 1, 2**31 - 1)
        if policy not in POLICIES:
            raise ValueError(f"policy {policy!r} is not one of {', '.join(POLICIES)}")
        self.policy = policy
        self.seed = check_seed(seed)
        self.max_bytes = check_int("max_bytes", max_bytes, 1)
        self.n_buckets = 1 << self.range_pow
        L, NB, C = self.L, self.n_buckets, self.capacity
        extra = 1 if policy == "fifo" else 3
        need = L * NB * (4 * C + 4 + 4 * extra)
        if need > self.max_bytes:
            raise ValueError(
                f"hash tables would take {_fmt_bytes(need)} (L={L} x 2**{self.range_pow} buckets x "
                f"(capacity {C} + {1 + extra} counters) x 4 B), above the limit of {_fmt_bytes(self.max_bytes)}; "
                f"lower range_pow or capacity, use fewer tables, or raise max_bytes")
        # np.zeros maps zero pages lazily: untouched buckets cost no RAM.
        self.buckets = np.zeros((L, NB, C), np.int32)
        self.fill = np.zeros((L, NB), np.int32)
        placeholder = np.zeros((L, 1), np.int32)
        if policy == "fifo":
            self.head = np.zeros((L, NB), np.int32)
            self.offered = self.c1 = self.c2 = placeholder
        else:
            self.head = placeholder
            self.offered = np.zeros((L, NB), np.int32)
            self.c1 = np.zeros((L, NB), np.int32)
            self.c2 = np.zeros((L, NB), np.int32)
        self.rng = np.array([np.random.SeedSequence([self.seed, l]).generate_state(1, np.uint64)[0]
                             for l in range(L)], dtype=np.uint64)
        self._item_codes_lm = np.full((L, 0), -1, np.int32)

    # -- properties --------------------------------------------------------
    @property
    def n_items(self) -> int:
        return self._item_codes_lm.shape[1]

    @property
    def item_codes(self) -> np.ndarray:
        """int32 [m, L]: bucket each item was last offered to per table, -1 if never.
        A transposed view: each table's thread writes its own contiguous row."""
        return self._item_codes_lm.T

    @property
    def memory_bytes(self) -> int:
        arrays = {id(a): a for a in (self.buckets, self.fill, self.head, self.offered, self.c1,
                                     self.c2, self.rng, self._item_codes_lm)}
        return int(sum(a.nbytes for a in arrays.values()))

    def bucket_sizes(self) -> dict:
        """Fill statistics over all L * 2**range_pow buckets: mean, std, max,
        empty / full fractions, histogram (int64 [capacity+1], buckets per fill)."""
        hist = np.bincount(self.fill.ravel(), minlength=self.capacity + 1)
        total = self.fill.size
        f = self.fill.astype(np.float64)
        return {"mean": float(f.mean()), "std": float(f.std()), "max": int(self.fill.max()),
                "empty_fraction": hist[0] / total, "full_fraction": hist[self.capacity] / total,
                "histogram": hist}

    _STATE = ("buckets", "fill", "head", "offered", "c1", "c2", "rng", "_item_codes_lm")

    def state_arrays(self) -> dict:
        """Every array of the tables' state (for checkpoints): name -> array."""
        return {name.lstrip("_"): getattr(self, name) for name in self._STATE}

    def load_state_arrays(self, arrays) -> None:
        """Restore `state_arrays()` output; shapes must match these tables' settings."""
        for name in self._STATE:
            key = name.lstrip("_")
            if key not in arrays:
                raise ValueError(f"hash table state lacks {key!r}")
            new = np.asarray(arrays[key])
            old = getattr(self, name)
            if name != "_item_codes_lm" and new.shape != old.shape:
                raise ValueError(f"hash table state {key!r} has shape {new.shape}, these tables need {old.shape}")
            setattr(self, name, np.ascontiguousarray(new, dtype=old.dtype))

    def __repr__(self) -> str:
        return (f"HashTables({self.family!r}, range_pow={self.range_pow}, capacity={self.capacity}, "
                f"policy={self.policy!r}, n_items={self.n_items}, {_fmt_bytes(self.memory_bytes)})")

    # -- writing -----------------------------------------------------------
    def hash(self, vectors) -> np.ndarray:
        """Bucket codes int32 [n, L] of vectors [n, dim] at this table's range_pow."""
        return self.family.hash(vectors, self.range_pow)

    def build(self, vectors) -> None:
        """Clear the tables, hash the m rows of `vectors` [m, dim] and insert ids 0..m-1
        (parallel over rows for hashing, over tables for inserting). Reservoir
        streams continue from where they were (not reset): a fresh HashTables
        with the same seed repeats a build exactly."""
        self.build_codes(self.hash(vectors))

    def build_codes(self, codes) -> None:
        """`build` from precomputed codes int32 [m, L] in [0, 2**range_pow)."""
        codes = self._check_codes(codes, "codes")
        m = codes.shape[0]
        if m >= 2**31:
            raise ValueError(f"{m} items: ids must fit in int32")
        need = self.memory_bytes - self._item_codes_lm.nbytes + 4 * m * self.L
        if need > self.max_bytes:
            raise ValueError(f"{m} items would bring the tables to {_fmt_bytes(need)}, above "
                             f"{_fmt_bytes(self.max_bytes)}; lower range_pow or capacity or L")
        self._item_codes_lm = np.ascontiguousarray(codes.T)
        with numba.parallel_chunksize(1):  # dynamic: a slow (shared) core does not stall the rest
            insert_all(self._item_codes_lm, self.buckets, self.fill, self.head, self.offered,
                       self.c1, self.c2, self.rng, POLICIES.index(self.policy))

    def update(self, ids, vectors) -> None:
        """Move items `ids` (int [r], each < n_items) to the buckets of their new
        vectors [r, dim]. Per table: an item whose code is unchanged is left
        alone (evicted or not); otherwise it leaves its old bucket and is
        offered to the new one as the newest arrival. FIFO: removal keeps the
        other entries' age order and frees a slot. Reservoir: see the module
        docstring (random pairing keeps a uniform sample of the bucket's live
        items). Repeated ids are processed in order (the last vector wins).
        Parallel over tables."""
        ids = self._check_ids(ids)
        self.update_codes(ids, self.hash(vectors))

    def update_codes(self, ids, codes) -> None:
        """`update` from precomputed codes int32 [r, L]."""
        ids = self._check_ids(ids)
        codes = self._check_codes(codes, "codes")
        if codes.shape[0] != ids.shape[0]:
            raise ValueError(f"{ids.shape[0]} ids but {codes.shape[0]} rows of codes/vectors")
        with numba.parallel_chunksize(1):
            update_items(ids, codes, self._item_codes_lm, self.buckets, self.fill, self.head,
                         self.offered, self.c1, self.c2, self.rng, POLICIES.index(self.policy))

    def _check_ids(self, ids) -> np.ndarray:
        ids = np.asarray(ids)
        if ids.ndim != 1 or not (np.issubdtype(ids.dtype, np.integer) or ids.size == 0):
            raise ValueError(f"ids must be a 1-D integer array, got shape {ids.shape} dtype {ids.dtype}")
        ids = ids.astype(np.int64)
        if ids.shape[0] and (ids.min() < 0 or ids.max() >= self.n_items):
            raise ValueError(f"ids must lie in [0, n_items={self.n_items}), got "
                             f"[{ids.min()}, {ids.max()}]; call build() to add items")
        return ids

    def _check_codes(self, codes, what: str) -> np.ndarray:
        codes = np.asarray(codes)
        if codes.ndim != 2 or codes.shape[1] != self.L or not (
                np.issubdtype(codes.dtype, np.integer) or codes.size == 0):
            raise ValueError(f"{what} must be an integer array [n, L={self.L}], got shape "
                             f"{codes.shape} dtype {codes.dtype}")
        codes = np.ascontiguousarray(codes, dtype=np.int32)
        if codes.size and (codes.min() < 0 or codes.max() >= self.n_buckets):
            raise ValueError(f"{what} must lie in [0, 2**range_pow={self.n_buckets}), got "
                             f"[{codes.min()}, {codes.max()}]")
        return codes

    # -- reading -----------------------------------------------------------
    def query(self, queries, mode: str = "union", m: int | None = None, t: int | None = None):
        """Candidate items of each query [n, dim]: see `query_codes`."""
        return self.query_codes(self.hash(queries), mode=mode, m=m, t=t)

    def query_codes(self, codes, mode: str = "union", m: int | None = None, t: int | None = None):
        """Candidates from precomputed codes int32 [n, L] (values in [0, 2**range_pow)).

        Returns (indptr int64 [n+1], ids int32, counts int32): query q's ids are
        ids[indptr[q]:indptr[q+1]], counts = number of its L buckets holding the id.
        mode "union": all ids, by id ascending; "topk": the m ids of highest
        count (ties: lower id), by (count desc, id asc); "threshold": ids with
        count >= t, by (count desc, id asc). Deterministic and independent of
        the thread count.
        """
        L, NB, C = self.buckets.shape
        return run_query(self, codes, mode, m, t, self.buckets.reshape(-1), NB * C,
                         np.zeros((1, 1), np.int32), self.fill)
