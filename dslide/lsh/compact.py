"""LSH tables sized to what they hold: each table's buckets in one compressed array.

Storage (L tables, NB = 2**range_pow buckets, m items):

    offsets     int32 [L, NB + 1]  bucket b of table l holds ids[l, offsets[l, b]:offsets[l, b + 1]]
    ids         int32 [L, m]       every item once per table, grouped by bucket, by id within one
    item_codes  int32 [m, L]       bucket of each item per table (stored table-major [L, m])

A table holds exactly its m items: (NB + 1 + 2 m) * 4 bytes, against
NB * (capacity + 2) * 4 for fixed-capacity tables (lsh.tables), whose slots
must outnumber the items several times over for few buckets to overflow
(most slots stay empty while some buckets fill). Nothing is ever evicted, so there
is no policy; a query reads whole buckets.

Updates change item codes and then regroup each table's ids by a counting
sort over its codes (O(m + NB) per table, one thread per table): a rehash
hashes only the changed items, then regroups.

Queries are lsh.query's kernels (`bucket_span` reads either layout): the
same modes, results and determinism as HashTables with buckets that never fill.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from ._common import HashFamily
from .query import run_query
from .tables import HashTables, _fmt_bytes, check_family_range


@njit(parallel=True)
def group_by_bucket(codes_lm, offsets, ids):
    """Per table (one thread each): offsets[l] = bucket starts, ids[l] = item ids grouped by
    bucket, ascending within a bucket (a stable counting sort of codes_lm[l] int32 [m])."""
    L, m = codes_lm.shape
    NB = offsets.shape[1] - 1
    for l in prange(L):
        off = offsets[l]
        c = codes_lm[l]
        out = ids[l]
        off[:] = 0
        for i in range(m):
            off[c[i] + 1] += 1
        for b in range(NB):
            off[b + 1] += off[b]
        cur = off[:NB].copy()
        for i in range(m):
            b = c[i]
            out[cur[b]] = i
            cur[b] += 1


class CompactTables:
    """L hash tables over item vectors whose buckets hold exactly their items.

    CompactTables(family, range_pow): family from lsh.make_family; range_pow:
    bucket index bits, 1..24 and <= family.code_bits.

    The interface of HashTables (build, build_codes, update, update_codes,
    query, query_codes, state_arrays, load_state_arrays, memory_bytes,
    bucket_sizes); see the module docstring for the layout.
    """

    policy = "all"

    def __init__(self, family: HashFamily, range_pow: int):
        self.family = family
        self.L = family.L
        self.range_pow = check_family_range(family, range_pow)
        self.n_buckets = 1 << self.range_pow
        self.offsets = np.zeros((self.L, self.n_buckets + 1), np.int32)
        self.ids = np.zeros((self.L, 0), np.int32)
        self._item_codes_lm = np.full((self.L, 0), -1, np.int32)

    # the checks and the hashing are HashTables'
    hash = HashTables.hash
    build = HashTables.build
    update = HashTables.update
    query = HashTables.query
    _check_ids = HashTables._check_ids
    _check_codes = HashTables._check_codes
    n_items = HashTables.n_items
    item_codes = HashTables.item_codes

    @property
    def memory_bytes(self) -> int:
        return int(self.offsets.nbytes + self.ids.nbytes + self._item_codes_lm.nbytes)

    def bucket_sizes(self) -> dict:
        """Fill statistics over all L * 2**range_pow buckets: mean, std, max, empty fraction,
        histogram (int64 [max + 1], buckets per fill)."""
        fill = np.diff(self.offsets, axis=1)
        hist = np.bincount(fill.ravel())
        f = fill.astype(np.float64)
        return {"mean": float(f.mean()), "std": float(f.std()), "max": int(fill.max()),
                "empty_fraction": hist[0] / fill.size, "full_fraction": 0.0, "histogram": hist}

    def build_codes(self, codes) -> None:
        """`build` from precomputed codes int32 [m, L] in [0, 2**range_pow)."""
        codes = self._check_codes(codes, "codes")
        if codes.shape[0] >= 2**31:
            raise ValueError(f"{codes.shape[0]} items: ids must fit in int32")
        self._item_codes_lm = np.ascontiguousarray(codes.T)
        self.ids = np.empty(self._item_codes_lm.shape, np.int32)
        self._regroup()

    def update_codes(self, ids, codes) -> None:
        """`update` from precomputed codes int32 [r, L] (repeated ids: the last row wins)."""
        ids = self._check_ids(ids)
        codes = self._check_codes(codes, "codes")
        if codes.shape[0] != ids.shape[0]:
            raise ValueError(f"{ids.shape[0]} ids but {codes.shape[0]} rows of codes/vectors")
        if ids.size:
            self._item_codes_lm[:, ids] = codes.T
            self._regroup()

    def _regroup(self) -> None:
        with numba.parallel_chunksize(1):
            group_by_bucket(self._item_codes_lm, self.offsets, self.ids)

    def query_codes(self, codes, mode: str = "union", m: int | None = None, t: int | None = None):
        """Candidates from precomputed codes int32 [n, L]: see HashTables.query_codes."""
        return run_query(self, codes, mode, m, t, self.ids.reshape(-1), self.ids.shape[1], self.offsets,
                         np.zeros((self.L, 1), np.int32))

    _STATE = ("offsets", "ids", "_item_codes_lm")

    def state_arrays(self) -> dict:
        """Every array of the tables' state (for checkpoints): name -> array."""
        return {name.lstrip("_"): getattr(self, name) for name in self._STATE}

    def load_state_arrays(self, arrays) -> None:
        """Restore `state_arrays()` output (offsets must match range_pow and L)."""
        for name in self._STATE:
            if name.lstrip("_") not in arrays:
                raise ValueError(f"hash table state lacks {name.lstrip('_')!r}")
        offsets = np.asarray(arrays["offsets"])
        if offsets.shape != self.offsets.shape:
            raise ValueError(f"hash table state 'offsets' has shape {offsets.shape}, these tables need "
                             f"{self.offsets.shape}")
        codes = np.ascontiguousarray(arrays["item_codes_lm"], dtype=np.int32)
        ids = np.ascontiguousarray(arrays["ids"], dtype=np.int32)
        if codes.shape[0] != self.L or ids.shape != codes.shape:
            raise ValueError(f"hash table state: ids {ids.shape} and item codes {codes.shape} must both be "
                             f"[L={self.L}, items]")
        self.offsets = np.ascontiguousarray(offsets, dtype=np.int32)
        self.ids, self._item_codes_lm = ids, codes

    def __repr__(self) -> str:
        return (f"CompactTables({self.family!r}, range_pow={self.range_pow}, n_items={self.n_items}, "
                f"{_fmt_bytes(self.memory_bytes)})")
