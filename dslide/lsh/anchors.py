"""Anchor tables: a data-dependent, asymmetric hash for maximum inner product search with biases.

Why not random projections here. An output layer ranks neuron j for an input
x by s_j(x) = w_j . x + b_j. After training, the biases (label priors) carry
much of the ranking and the inner products that decide the top of the list
are small next to |w_j| |x|, which leaves signed random projections, even
after the asymmetric MIPS transforms, with a low recall of the exact top-10 at
a small candidate budget (scripts/bench_lsh.py, "trained layer" section;
docs/lsh.md). Inputs, on the other hand, cluster well: points of one topic
have close hidden vectors and close top lists.

So the hash is on the query side. Each of L tables has A anchors c_{l,a}
(k-means centres of the layer's inputs). A query's code in table l is its
nearest anchor,

    code_l(x) = argmin_a |x - c_{l,a}|^2,

and bucket (l, a) holds the T items that score highest at the anchor,

    bucket(l, a) = top_T over j of  s_j(c_{l,a}) = w_j . c_{l,a} + b_j

(ties to the lower id), sorted best first. Items close to the top at a query
are close to the top at its anchor: s_j(x) - s_j(c) = w_j . (x - c) is small
when x is near c. The bias enters the ranking exactly, and large-norm items
are not penalised as they are by angular hashing. A query retrieves the
buckets of its `probes` nearest anchors in each table.

Storage is the flat layout of `HashTables` (buckets int32 [L, A, T], fill
int32 [L, A]), so a bucket's content is plain data, like any hash table's.
The anchors come from lsh.kmeans; the exact re-ranking of what the buckets
retrieve (`AnchorTables.topk`) is lsh.rerank.

Determinism: anchors derive from (seed, data); distances and scores use BLAS
products (reproducible for a given thread count); selections break ties by
the lower index.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ._common import check_int, check_seed
from .kmeans import SCORE_BLOCK_BYTES, blocks_here, kmeans, minibatch_kmeans_step, nearest
from .rerank import topk_by_anchor, topk_of_buckets


# ----------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------

@njit(cache=True)
def _top_of_row(row, T, ids_out, scores_out):
    """The T largest entries of row [n] (T <= n), best first, ties to the lower index.

    A threshold below the T-th largest comes from a regular sample of the row
    (about 2T expected survivors); one pass keeps what reaches it, and a
    stable sort of the survivors by score finishes. When the sample misjudges
    (fewer than T survive) the whole row is sorted instead: the result is
    exact either way.
    """
    n = row.shape[0]
    step = max(1, n // 8192)
    ns = n // step
    q = min(ns, (2 * T * ns) // n + 16)
    samp = np.empty(ns, row.dtype)
    for t in range(ns):
        samp[t] = row[t * step]
    v = np.partition(samp, ns - q)[ns - q]
    c = 0
    for j in range(n):
        if row[j] >= v:
            c += 1
    if c < T:  # (one branch for both cases: two ways to build `keep` made numba's loops far slower)
        v = row.dtype.type(-np.inf)
        c = n
    keep = np.empty(c, np.int64)
    c = 0
    for j in range(n):
        if row[j] >= v:
            keep[c] = j
            c += 1
    keep = keep[:c]
    vals = np.empty(keep.shape[0], np.float64)
    for t in range(keep.shape[0]):
        vals[t] = -row[keep[t]]
    order = np.argsort(vals, kind="mergesort")  # stable: equal scores keep index order
    for t in range(min(T, c)):
        ids_out[t] = keep[order[t]]
        scores_out[t] = -vals[order[t]]


@njit(parallel=True, cache=True)
def top_rows(S, T, out_ids, out_scores):
    """Per row of S [m, n]: the T largest entries, best first (ties to the lower column):
    column indices into out_ids int32 [m, T], values into out_scores float32 [m, T]."""
    for r in prange(S.shape[0]):
        _top_of_row(S[r], T, out_ids[r], out_scores[r])


def score_block(m: int, itemsize: int = 4, block: int = 64) -> int:
    """Anchors scored at a time against m items: at most `block`, and at most
    SCORE_BLOCK_BYTES of scores (at least 1)."""
    return int(max(1, min(block, SCORE_BLOCK_BYTES // max(1, m * itemsize))))


def score_top(C, W, b, T: int, block: int = 64):
    """The T best items at each anchor: (ids int32 [A, T], scores float32 [A, T]), best first.

    scores = C @ W^T + b for C float [A, d], W float [m, d] (neuron-major), b [m];
    products in blocks of at most `block` anchors and SCORE_BLOCK_BYTES, written into one
    reused [block, m] buffer (the only transient besides the outputs).
    """
    A = C.shape[0]
    m = W.shape[0]
    T = min(T, m)
    ids = np.empty((A, T), np.int32)
    scores = np.empty((A, T), np.float32)
    block = score_block(m, np.dtype(W.dtype).itemsize, block)
    buf = np.empty((min(block, A), m), np.result_type(C.dtype, W.dtype))
    for s in range(0, A, block):
        S = buf[:min(block, A - s)]
        np.matmul(C[s:s + block], W.T, out=S)
        S += b
        top_rows(S, T, ids[s:s + block], scores[s:s + block])
    return ids, scores


@njit(inline="always")
def _take_by_rank(codes, lo, hi, buckets, fill, limit, cap, mark, out):
    """Walk the buckets named by rows lo..hi-1 of codes int32 [n, L] rank by rank (every
    bucket's best, then every bucket's second, ...; within a rank, row by row, then table by
    table), each bucket cut to its first `limit` entries, and append to out the ids with
    mark[j] == 0, marking them (mark[j] = 1), until `cap` are taken. Returns how many;
    their marks stay set (the caller clears them)."""
    L = codes.shape[1]
    depth = 0
    for i in range(lo, hi):
        for l in range(L):
            depth = max(depth, min(limit, fill[l, codes[i, l]]))
    c = 0
    for t in range(depth):
        if c >= cap:
            break
        for i in range(lo, hi):
            if c >= cap:
                break
            for l in range(L):
                a = codes[i, l]
                if t < min(limit, fill[l, a]):
                    j = buckets[l, a, t]
                    if mark[j] == 0:
                        mark[j] = 1
                        out[c] = j
                        c += 1
                        if c >= cap:
                            break
    return c


@njit(cache=True)
def union_of_buckets(codes, buckets, fill, limit, total, mark):
    """The union of the first `limit` entries of the buckets named by codes int32 [n, L]
    (table l's bucket codes[i, l]), at most `total` ids (0: no cap), as sorted int32 ids.

    Entries are taken rank by rank (every named bucket's best, then every
    bucket's second, ...), so a cap keeps the best ranks of all the buckets.
    buckets int32 [L, A, T], fill int32 [L, A]; mark uint8 [n_items] all zero
    on entry and on return.
    """
    n, L = codes.shape
    cap = 0
    for i in range(n):
        for l in range(L):
            cap += min(limit, fill[l, codes[i, l]])
    if total > 0:
        cap = min(cap, total)
    out = np.empty(cap, np.int32)
    c = _take_by_rank(codes, 0, n, buckets, fill, limit, cap, mark, out)
    res = np.sort(out[:c])
    for t in range(c):
        mark[res[t]] = 0
    return res


@njit(cache=True)
def union_per_query(codes, buckets, fill, k, mark, out):
    """`union_of_buckets` of each query alone, in rank order: per query i, into out int32
    [n, k] (-1 past its count), the first k distinct entries of its buckets (table l's
    bucket codes[i, l] of buckets int32 [L, A, T], rank by rank across the tables) that
    are not marked (mark uint8 [n_items] != 0: taken elsewhere already). Returns the
    counts int64 [n]; mark comes back as it went in."""
    n = codes.shape[0]
    cnt = np.zeros(n, np.int64)
    for i in range(n):
        c = _take_by_rank(codes, i, i + 1, buckets, fill, buckets.shape[2], k, mark, out[i])
        for t in range(c):
            mark[out[i, t]] = 0
        for t in range(c, k):
            out[i, t] = -1
        cnt[i] = c
    return cnt


# ----------------------------------------------------------------------------
# The class
# ----------------------------------------------------------------------------

class AnchorTables:
    """L tables of A anchors each; bucket (l, a) holds the T best items at anchor c_{l,a}.

    AnchorTables(dim, L, A, T, seed)

    fit_anchors(X) draws the anchors from inputs X [n, dim] (k-means, table l
    from seed (seed, l)); observe(X) moves them online towards new inputs;
    fill(W, b) refills every bucket from the items' current weights W [m, dim]
    and biases b [m]; codes(X, probes) hashes queries; candidates(codes) is the
    sorted union of a batch's buckets (training); topk(X, W, b, k, probes)
    re-ranks each query's retrieved items exactly (inference).
    """

    def __init__(self, dim: int, L: int, A: int, T: int, seed: int = 0):
        self.dim = check_int("dim", dim, 1)
        self.L = check_int("L", L, 1)
        self.A = check_int("A (anchors)", A, 1)
        self.T = check_int("T (bucket size)", T, 1)
        self.seed = check_seed(seed)
        self.anchors = np.zeros((self.L, self.A, self.dim), np.float32)
        self.counts = np.zeros((self.L, self.A), np.float64)
        self.buckets = np.zeros((self.L, self.A, 0), np.int32)
        self.fill_count = np.zeros((self.L, self.A), np.int32)
        self.ready = False  # anchors set
        self._pending = []  # inputs seen before there were enough for the anchors

    @property
    def memory_bytes(self) -> int:
        return int(self.anchors.nbytes + self.counts.nbytes + self.buckets.nbytes + self.fill_count.nbytes)

    # -- anchors -----------------------------------------------------------
    def fit_anchors(self, X, iters: int = 8, share=blocks_here) -> None:
        """k-means anchors of the inputs X [n, dim] (n >= A), table l seeded by (seed, l);
        share: how its iterations' nearest anchors are computed (`kmeans`)."""
        X = self._check_inputs(X)
        for l in range(self.L):
            self.anchors[l] = kmeans(X, self.A, _table_seed(self.seed, l), iters, share=share)
        self.counts[:] = 0.0
        self.ready = True

    def observe(self, X, codes=None, max_count: float = 100.0) -> bool:
        """Learn from training inputs X [B, dim]: the first A inputs seen become the anchors
        (each table a different seeded arrangement of them), later ones move their nearest
        anchor (online k-means, count capped at max_count; codes: their `codes(X)` when
        known). Returns True once the anchors exist."""
        X = self._check_inputs(X)
        if not self.ready:
            self._pending.append(X.copy())
            seen = sum(x.shape[0] for x in self._pending)
            if seen < self.A:
                return False
            first = np.concatenate(self._pending)
            self._pending = []
            for l in range(self.L):
                pick = np.random.default_rng(_table_seed(self.seed, l)).choice(first.shape[0], self.A, replace=False)
                self.anchors[l] = first[np.sort(pick)]
            self.counts[:] = 1.0
            self.ready = True
            return True
        if codes is None:
            codes = self.codes(X)
        for l in range(self.L):
            minibatch_kmeans_step(self.anchors[l], self.counts[l], X, np.ascontiguousarray(codes[:, l]),
                                  float(max_count))
        return True

    # -- buckets -----------------------------------------------------------
    def fill(self, W, b, T: int | None = None) -> None:
        """Every bucket := the min(T, m) best items at its anchor (W float [m, dim], b [m])."""
        self._need_anchors()
        T = self.T if T is None else check_int("T", T, 1)
        m = W.shape[0]
        T = min(T, m)
        self.buckets = np.empty((self.L, self.A, T), np.int32)
        for l in range(self.L):
            self.buckets[l] = score_top(self.anchors[l], W, b.astype(W.dtype, copy=False), T)[0]
        self.fill_count = np.full((self.L, self.A), T, np.int32)

    def set_buckets(self, buckets, fill) -> None:
        """Buckets chosen elsewhere (e.g. by a threshold agreed across ranks): int32 [L, A, T], fill [L, A]."""
        self.buckets = np.ascontiguousarray(buckets, dtype=np.int32)
        self.fill_count = np.ascontiguousarray(fill, dtype=np.int32)

    # -- reading -----------------------------------------------------------
    def codes(self, X, probes: int = 1) -> np.ndarray:
        """int32 [n, L * probes]: each query's `probes` nearest anchors in every table (table-major)."""
        self._need_anchors()
        X = self._check_inputs(X)
        probes = check_int("probes", probes, 1, self.A)
        return np.concatenate([nearest(X, self.anchors[l], probes) for l in range(self.L)], axis=1)

    def candidates(self, codes, limit: int | None = None, total: int = 0, mark=None) -> np.ndarray:
        """Sorted int32 ids: the union over a batch of each input's bucket in every table
        (codes int32 [B, L] from `codes(X)`), each bucket cut to its `limit` best (default: all),
        at most `total` ids (0: no cap; taken rank by rank across the buckets).
        mark: uint8 scratch [>= items], all zero."""
        if mark is None:
            mark = np.zeros(max(1, int(self.buckets.max()) + 1 if self.buckets.size else 1), np.uint8)
        return union_of_buckets(np.ascontiguousarray(codes, dtype=np.int32), self.buckets, self.fill_count,
                                self.T if limit is None else limit, total, mark)

    def topk(self, X, W, b, k: int, probes: int = 1, marks=None, extras=None, codes=None):
        """Per query X [n, dim], the k best of its retrieved items by exact score W[j] . x + b[j]:
        (scores float64 [n, k], ids int64 [n, k], n_scored int64 [n]); -inf / -1 where fewer than k.
        extras: (xptr int64 [n + 1], xids int32) more items per query, scored too when their
        buckets lack them (distinct within a query). codes: `codes(X, probes)` when known."""
        import numba

        if codes is None:
            codes = self.codes(X, probes)
        n = X.shape[0]
        if extras is None:
            xptr, xids = np.zeros(n + 1, np.int64), np.zeros(0, np.int32)
        else:
            xptr, xids = (np.ascontiguousarray(extras[0], dtype=np.int64),
                          np.ascontiguousarray(extras[1], dtype=np.int32))
        X = np.ascontiguousarray(X, dtype=W.dtype)
        scores = np.empty((n, k), np.float64)
        ids = np.empty((n, k), np.int64)
        n_scored = np.empty(n, np.int64)
        if codes.shape[1] == 1 and W.dtype == np.float32 and n > 0:
            # one bucket per query: score each anchor's queries together, largest groups first
            ganchor, group, sizes = np.unique(codes[:, 0], return_inverse=True, return_counts=True)
            big_first = np.argsort(-sizes, kind="stable")
            rank = np.empty_like(big_first)
            rank[big_first] = np.arange(big_first.size)
            order = np.argsort(rank[group], kind="stable").astype(np.int64)  # queries of a group by index
            gptr = np.concatenate([[0], np.cumsum(sizes[big_first])]).astype(np.int64)
            n_chunks = max(1, min(ganchor.size, 4 * numba.get_num_threads()))
            topk_by_anchor(X, W, b.astype(W.dtype, copy=False), order, gptr,
                           ganchor[big_first].astype(np.int64), self._id_sorted_buckets(), self.fill_count, k,
                           n_chunks, xptr, xids, scores, ids, n_scored)
            return scores, ids, n_scored
        if marks is None:
            marks = np.zeros((max(1, min(n, 4 * numba.get_num_threads())), W.shape[0]), np.uint8)
        topk_of_buckets(X, W, b.astype(W.dtype, copy=False), codes, self.buckets, self.fill_count, k,
                        marks, xptr, xids, scores, ids, n_scored)
        return scores, ids, n_scored

    def _id_sorted_buckets(self) -> np.ndarray:
        """The buckets with each one's filled part in increasing id order (what topk_by_anchor
        needs): the buckets themselves when so (the inference index keeps them so), else a copy."""
        cached = getattr(self, "_sorted", None)
        if cached is not None and cached[0] is self.buckets and cached[1] is self.fill_count:
            return cached[2]
        B = self.buckets
        if self.L == 1 and B.shape[2] > 1:
            filled = np.arange(B.shape[2])[None, :] < self.fill_count[0][:, None]
            pairs = filled[:, 1:] & filled[:, :-1]
            if np.any((np.diff(B[0], axis=1) < 0) & pairs):
                B = B.copy()
                for a in range(self.A):
                    B[0, a, :self.fill_count[0, a]].sort()
        self._sorted = (self.buckets, self.fill_count, B)
        return B

    # -- state ----------------------------------------------------------------
    def state_arrays(self) -> dict:
        return {"anchors": self.anchors, "counts": self.counts, "buckets": self.buckets, "fill": self.fill_count,
                "ready": np.array([self.ready])}

    def load_state_arrays(self, arrays) -> None:
        anchors = np.asarray(arrays["anchors"], dtype=np.float32)
        if anchors.shape != self.anchors.shape:
            raise ValueError(f"anchor state has shape {anchors.shape}, these tables need {self.anchors.shape}")
        self.anchors = anchors.copy()
        self.counts = np.asarray(arrays["counts"], dtype=np.float64).copy()
        self.set_buckets(arrays["buckets"], arrays["fill"])
        self.ready = bool(np.asarray(arrays["ready"])[0])
        self._pending = []

    # -- checks -----------------------------------------------------------------
    def _check_inputs(self, X) -> np.ndarray:
        X = np.asarray(X)
        if X.ndim != 2 or X.shape[1] != self.dim:
            raise ValueError(f"inputs must have shape [n, {self.dim}], got {X.shape}")
        return np.ascontiguousarray(X, dtype=np.float32)

    def _need_anchors(self) -> None:
        if not self.ready:
            raise ValueError("the anchor tables have no anchors yet: call fit_anchors(X) or observe(X) first")

    def __repr__(self) -> str:
        return (f"AnchorTables(dim={self.dim}, L={self.L}, A={self.A}, T={self.T}, seed={self.seed}; "
                f"{self.memory_bytes / 2**20:.1f} MiB)")


def _table_seed(seed: int, l: int) -> int:
    return int(np.random.SeedSequence([seed, l]).generate_state(1, np.uint64)[0] >> np.uint64(1))
