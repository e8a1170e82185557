"""Exact re-ranking of what hash tables retrieve: each query's k best items by their exact
score w_j . x + b_j, among the union of its buckets and its extra items.

`topk_of_buckets` serves any tables in the flat layout (buckets int32 [L, A, T],
fill int32 [L, A]: `HashTables`, `AnchorTables`), each query on its own;
`topk_by_anchor` serves one table probed once (the inference index's anchor
tables), scoring the queries of one bucket together so that its items' rows
cross memory once per bucket. Both break ties by the lower id.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from . import _common  # noqa: F401  (dslide._numba_cache, before any kernel: the cache is keyed by module name)
from ._topk import push_top


@njit(inline="always")
def _score_once(X, W, b, q, j, mark, k, out_scores, out_ids):
    """Score item j for query q into its top k unless marked (then 0); returns 1 if scored."""
    if mark[j]:
        return 0
    mark[j] = 1
    acc = 0.0
    for f in range(X.shape[1]):
        acc += W[j, f] * X[q, f]
    push_top(out_scores, out_ids, q, k, k, acc + b[j], j)
    return 1


@njit(parallel=True, fastmath=True, cache=True)
def topk_of_buckets(X, W, b, codes, buckets, fill, k, marks, xptr, xids, out_scores, out_ids, n_scored):
    """Exact re-ranking of what the buckets retrieve: per query, the k best of the union of its buckets
    and its extra items xids[xptr[q]:xptr[q+1]] (int64 [n + 1], int32; pass xptr all zero for none).

    X float [n, d] queries; W float [m, d], b [m] the items; codes int32 [n, L*p]
    (the buckets of each query: L tables x p probes, flattened; bucket (l, a)
    of column c is table c // p); buckets int32 [L, A, T], fill int32 [L, A];
    marks uint8 [n_chunks, m] all zero (one row per chunk of queries, reset on
    return). Writes out_scores float64 [n, k] (-inf where fewer than k were
    retrieved), out_ids int64 [n, k] (-1 there), n_scored int64 [n] (distinct
    items scored). Ties go to the lower id.
    """
    n, d = X.shape
    n_chunks = marks.shape[0]
    cols = codes.shape[1]
    L = buckets.shape[0]
    p = cols // L
    for c in prange(n_chunks):
        mark = marks[c]
        for q in range((c * n) // n_chunks, ((c + 1) * n) // n_chunks):
            for t in range(k):
                out_scores[q, t] = -np.inf
                out_ids[q, t] = -1
            got = 0
            for col in range(cols):
                l = col // p
                a = codes[q, col]
                for s in range(fill[l, a]):
                    got += _score_once(X, W, b, q, buckets[l, a, s], mark, k, out_scores, out_ids)
            for r in range(xptr[q], xptr[q + 1]):
                got += _score_once(X, W, b, q, xids[r], mark, k, out_scores, out_ids)
            n_scored[q] = got
            for col in range(cols):  # reset the marks of what this query touched
                l = col // p
                a = codes[q, col]
                for s in range(fill[l, a]):
                    mark[buckets[l, a, s]] = 0
            for r in range(xptr[q], xptr[q + 1]):
                mark[xids[r]] = 0


#: the floating-point liberties of `topk_by_anchor`: fused multiply-adds, but no reassociation,
#: so that every score is summed in the order written, feature 0 to d - 1
EXACT_ORDER = {"contract", "nsz", "arcp"}


@njit(inline="always")
def _dot(w, x, d):
    """w[:d] . x[:d] summed feature 0 to d - 1 (under EXACT_ORDER: the same bits as `topk_by_anchor`'s
    grouped sums, which vectorise over queries instead of features)."""
    acc = np.float32(0.0)
    for f in range(d):
        acc += w[f] * x[f]
    return acc


@njit(parallel=True, fastmath=EXACT_ORDER, cache=True)
def topk_by_anchor(X, W, b, order, gptr, ganchor, buckets, fill, k, n_chunks, xptr, xids,
                   out_scores, out_ids, n_scored):
    """Exact re-ranking with one bucket per query (1 table, 1 probe), the queries of one anchor together,
    plus each query's extra items xids[xptr[q]:xptr[q+1]] (int64 [n + 1], int32) that its bucket lacks.

    The queries order[gptr[g]:gptr[g+1]] all have anchor ganchor[g]; each item row
    W[j] of that bucket is read once for the whole group and scored against every
    query of the group while it sits in cache, so a bucket's rows cross memory
    once per anchor rather than once per query (many queries share an anchor).
    The group's queries are held transposed and four items are scored at a time
    against all of them, the vector lanes running over queries and four features
    added a pass (one load and store of a partial sum per four); each score is
    summed feature 0 to d - 1 without reassociation (EXACT_ORDER), as `_dot`
    sums the extras: an item's score is the same bits whatever its place in a
    bucket or path, the machine's vector width, or the number of ranks that
    share the layer.
    Groups are dealt round-robin to n_chunks parallel chunks (pass them largest
    first for even work).

    X float32 [n, d], W float32 [m, d], b float32 [m]; buckets int32 [1, A, T],
    fill int32 [1, A], each bucket's first fill ids in increasing order (extras are
    looked up in it by bisection). Writes out_scores float64 [n, k] (-inf where fewer than k),
    out_ids int64 [n, k] (-1 there), n_scored int64 [n]. Ties go to the lower id.
    Dot products accumulate in float32 (the re-ranked scores agree with a float64
    product to ~1e-6 relative).
    """
    n, d = X.shape
    G = ganchor.shape[0]
    big = 0
    for g in range(G):
        big = max(big, gptr[g + 1] - gptr[g])
    for c in prange(n_chunks):
        QT = np.empty((d, big), np.float32)
        acc = np.empty((4, big), np.float32)
        top_s = np.empty((big, k), np.float32)
        top_i = np.empty((big, k), np.int64)
        for g in range(c, G, n_chunks):
            a = ganchor[g]
            g0 = gptr[g]
            ng = gptr[g + 1] - g0
            for qi in range(ng):
                q = order[g0 + qi]
                for f in range(d):
                    QT[f, qi] = X[q, f]
                for t in range(k):
                    top_s[qi, t] = -np.inf
                    top_i[qi, t] = -1
            F = fill[0, a]
            for s in range(0, F, 4):
                m = min(4, F - s)
                j0 = buckets[0, a, s]
                j1 = buckets[0, a, s + min(1, m - 1)]
                j2 = buckets[0, a, s + min(2, m - 1)]
                j3 = buckets[0, a, s + min(3, m - 1)]
                for qi in range(ng):
                    acc[0, qi] = 0.0
                    acc[1, qi] = 0.0
                    acc[2, qi] = 0.0
                    acc[3, qi] = 0.0
                d2 = d - d % 4
                for f in range(0, d2, 4):  # four features a pass, still added in feature order
                    v0 = W[j0, f]
                    v1 = W[j1, f]
                    v2 = W[j2, f]
                    v3 = W[j3, f]
                    u0 = W[j0, f + 1]
                    u1 = W[j1, f + 1]
                    u2 = W[j2, f + 1]
                    u3 = W[j3, f + 1]
                    t0 = W[j0, f + 2]
                    t1 = W[j1, f + 2]
                    t2 = W[j2, f + 2]
                    t3 = W[j3, f + 2]
                    r0 = W[j0, f + 3]
                    r1 = W[j1, f + 3]
                    r2 = W[j2, f + 3]
                    r3 = W[j3, f + 3]
                    for qi in range(ng):
                        x = QT[f, qi]
                        y = QT[f + 1, qi]
                        z = QT[f + 2, qi]
                        w = QT[f + 3, qi]
                        acc[0, qi] = (((acc[0, qi] + v0 * x) + u0 * y) + t0 * z) + r0 * w
                        acc[1, qi] = (((acc[1, qi] + v1 * x) + u1 * y) + t1 * z) + r1 * w
                        acc[2, qi] = (((acc[2, qi] + v2 * x) + u2 * y) + t2 * z) + r2 * w
                        acc[3, qi] = (((acc[3, qi] + v3 * x) + u3 * y) + t3 * z) + r3 * w
                for f in range(d2, d):
                    v0 = W[j0, f]
                    v1 = W[j1, f]
                    v2 = W[j2, f]
                    v3 = W[j3, f]
                    for qi in range(ng):
                        x = QT[f, qi]
                        acc[0, qi] += v0 * x
                        acc[1, qi] += v1 * x
                        acc[2, qi] += v2 * x
                        acc[3, qi] += v3 * x
                for qi in range(ng):
                    push_top(top_s, top_i, qi, k, k, acc[0, qi] + b[j0], j0)
                    if m > 1:
                        push_top(top_s, top_i, qi, k, k, acc[1, qi] + b[j1], j1)
                    if m > 2:
                        push_top(top_s, top_i, qi, k, k, acc[2, qi] + b[j2], j2)
                    if m > 3:
                        push_top(top_s, top_i, qi, k, k, acc[3, qi] + b[j3], j3)
            for qi in range(ng):
                q = order[g0 + qi]
                x = X[q]
                extra = 0
                for r in range(xptr[q], xptr[q + 1]):
                    j = xids[r]
                    lo = 0
                    hi = F
                    while lo < hi:  # is j in the bucket already?
                        mid = (lo + hi) // 2
                        if buckets[0, a, mid] < j:
                            lo = mid + 1
                        else:
                            hi = mid
                    if lo < F and buckets[0, a, lo] == j:
                        continue
                    push_top(top_s, top_i, qi, k, k, _dot(W[j], x, d) + b[j], j)
                    extra += 1
                for t in range(k):
                    out_scores[q, t] = top_s[qi, t]
                    out_ids[q, t] = top_i[qi, t]
                n_scored[q] = F + extra
