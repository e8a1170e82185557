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

Determinism: anchors derive from (seed, data); distances and scores use BLAS
products (reproducible for a given thread count); selections break ties by
the lower index.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ._common import check_int, check_seed
from ._topk import push_top


# ----------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------

def nearest(X, C, probes: int = 1, block: int = 8192) -> np.ndarray:
    """int32 [n, probes]: the indices of the `probes` nearest rows of C [A, d] to each row of X [n, d]
    (squared Euclidean distance, nearest first, ties to the lower index)."""
    n = X.shape[0]
    A = C.shape[0]
    probes = min(probes, A)
    out = np.empty((n, probes), np.int32)
    c2 = np.einsum("ij,ij->i", C, C)
    for s in range(0, n, block):
        d = X[s:s + block] @ C.T
        d *= -2.0
        d += c2  # |x|^2 is the same for every anchor: left out
        if probes == 1:
            out[s:s + block, 0] = np.argmin(d, axis=1)
        else:
            out[s:s + block] = _smallest_sorted(d, probes)
    return out


def _smallest_sorted(d, k):
    """Column indices of the k smallest values of each row of d, ascending (ties: lower index)."""
    part = np.argpartition(d, k - 1, axis=1)[:, :k]
    vals = np.take_along_axis(d, part, axis=1)
    order = np.lexsort((part, vals), axis=1)
    return np.take_along_axis(part, order, axis=1).astype(np.int32)


@njit(cache=True)
def minibatch_kmeans_step(C, counts, X, codes, max_count):
    """One online k-means step (Sculley 2010): each row x of X moves its anchor codes[i]
    towards it, c += (x - c) / min(counts + 1, max_count).

    C float [A, d] (updated in place); counts float64 [A] (points seen per anchor,
    updated); X float [B, d]; codes int32 [B] (each row's nearest anchor).
    Capping the count keeps the anchors following inputs that drift as the
    layers below them train. Serial, in row order: the result is reproducible.
    """
    d = C.shape[1]
    for i in range(X.shape[0]):
        a = codes[i]
        counts[a] += 1.0
        eta = 1.0 / min(counts[a], max_count)
        for k in range(d):
            C[a, k] += eta * (X[i, k] - C[a, k])


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


#: the most a block of anchor scores (score_top) or of distances to the anchors (kmeans)
#: may take: both run with every weight and moment resident (table refills, the
#: inference index), so their transient must stay small next to them whatever the
#: layer's width; smaller blocks only mean more, smaller matrix products
SCORE_BLOCK_BYTES = 32 << 20


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


@njit(parallel=True, fastmath=True, cache=True)
def topk_by_anchor(X, W, b, order, gptr, ganchor, buckets, fill, k, n_chunks, xptr, xids,
                   out_scores, out_ids, n_scored):
    """Exact re-ranking with one bucket per query (1 table, 1 probe), the queries of one anchor together,
    plus each query's extra items xids[xptr[q]:xptr[q+1]] (int64 [n + 1], int32) that its bucket lacks.

    The queries order[gptr[g]:gptr[g+1]] all have anchor ganchor[g]; each item row
    W[j] of that bucket is read once for the whole group and scored against every
    query of the group while it sits in cache, so a bucket's rows cross memory
    once per anchor rather than once per query (many queries share an anchor).
    Scores are computed 4 items x 2 queries at a time: eight independent sums,
    where one dot product at a time waits on its own additions (same ids either
    way).
    Groups are dealt round-robin to n_chunks parallel chunks (pass them largest
    first for even work).

    X float32 [n, d], W float32 [m, d], b float32 [m]; buckets int32 [1, A, T],
    fill int32 [1, A], each bucket's first fill ids in increasing order (extras are
    looked up in it by bisection). Writes out_scores float64 [n, k] (-inf where fewer than k),
    out_ids int64 [n, k] (-1 there), n_scored int64 [n]. Ties go to the lower id.
    Dot products accumulate in float32 (vector width; the re-ranked scores agree
    with a float64 product to ~1e-6 relative).
    """
    n, d = X.shape
    G = ganchor.shape[0]
    big = 0
    for g in range(G):
        big = max(big, gptr[g + 1] - gptr[g])
    for c in prange(n_chunks):
        Q = np.empty((big, d), np.float32)
        top_s = np.empty((big, k), np.float32)
        top_i = np.empty((big, k), np.int64)
        for g in range(c, G, n_chunks):
            a = ganchor[g]
            g0 = gptr[g]
            ng = gptr[g + 1] - g0
            for qi in range(ng):
                q = order[g0 + qi]
                for f in range(d):
                    Q[qi, f] = X[q, f]
                for t in range(k):
                    top_s[qi, t] = -np.inf
                    top_i[qi, t] = -1
            F = fill[0, a]
            F4 = F - F % 4
            for s in range(0, F4, 4):
                j0 = buckets[0, a, s]
                j1 = buckets[0, a, s + 1]
                j2 = buckets[0, a, s + 2]
                j3 = buckets[0, a, s + 3]
                w0 = W[j0]
                w1 = W[j1]
                w2 = W[j2]
                w3 = W[j3]
                for qi in range(0, ng - 1, 2):
                    x = Q[qi]
                    y = Q[qi + 1]
                    c0 = np.float32(0.0)
                    c1 = np.float32(0.0)
                    c2 = np.float32(0.0)
                    c3 = np.float32(0.0)
                    e0 = np.float32(0.0)
                    e1 = np.float32(0.0)
                    e2 = np.float32(0.0)
                    e3 = np.float32(0.0)
                    for f in range(d):
                        xf = x[f]
                        yf = y[f]
                        c0 += w0[f] * xf
                        c1 += w1[f] * xf
                        c2 += w2[f] * xf
                        c3 += w3[f] * xf
                        e0 += w0[f] * yf
                        e1 += w1[f] * yf
                        e2 += w2[f] * yf
                        e3 += w3[f] * yf
                    push_top(top_s, top_i, qi, k, k, c0 + b[j0], j0)
                    push_top(top_s, top_i, qi, k, k, c1 + b[j1], j1)
                    push_top(top_s, top_i, qi, k, k, c2 + b[j2], j2)
                    push_top(top_s, top_i, qi, k, k, c3 + b[j3], j3)
                    push_top(top_s, top_i, qi + 1, k, k, e0 + b[j0], j0)
                    push_top(top_s, top_i, qi + 1, k, k, e1 + b[j1], j1)
                    push_top(top_s, top_i, qi + 1, k, k, e2 + b[j2], j2)
                    push_top(top_s, top_i, qi + 1, k, k, e3 + b[j3], j3)
                if ng % 2:  # the odd query out: 4 items at a time
                    qi = ng - 1
                    x = Q[qi]
                    c0 = np.float32(0.0)
                    c1 = np.float32(0.0)
                    c2 = np.float32(0.0)
                    c3 = np.float32(0.0)
                    for f in range(d):
                        xf = x[f]
                        c0 += w0[f] * xf
                        c1 += w1[f] * xf
                        c2 += w2[f] * xf
                        c3 += w3[f] * xf
                    push_top(top_s, top_i, qi, k, k, c0 + b[j0], j0)
                    push_top(top_s, top_i, qi, k, k, c1 + b[j1], j1)
                    push_top(top_s, top_i, qi, k, k, c2 + b[j2], j2)
                    push_top(top_s, top_i, qi, k, k, c3 + b[j3], j3)
            for s in range(F4, F):  # the last F % 4 items one at a time
                j = buckets[0, a, s]
                for qi in range(ng):
                    acc = np.float32(0.0)
                    for f in range(d):
                        acc += W[j, f] * Q[qi, f]
                    push_top(top_s, top_i, qi, k, k, acc + b[j], j)
            for qi in range(ng):
                q = order[g0 + qi]
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
                    acc = np.float32(0.0)
                    for f in range(d):
                        acc += W[j, f] * Q[qi, f]
                    push_top(top_s, top_i, qi, k, k, acc + b[j], j)
                    extra += 1
                for t in range(k):
                    out_scores[q, t] = top_s[qi, t]
                    out_ids[q, t] = top_i[qi, t]
                n_scored[q] = F + extra


@njit(cache=True, fastmath=True)
def kmeanspp_seed(X, A, u):
    """k-means++ seeding (Arthur & Vassilvitskii 2007): indices int64 [A] of rows of X [n, d].

    The first centre is row floor(u[0] n); centre t is drawn with probability
    proportional to the squared distance to the nearest centre so far, by the
    uniform u[t] in [0, 1). Serial (a parallel loop inside the loop over
    centres ran far slower): the result depends only on X and u.
    """
    n, d = X.shape
    out = np.empty(A, np.int64)
    out[0] = min(n - 1, int(u[0] * n))
    best = np.empty(n, np.float64)
    for i in range(n):
        acc = 0.0
        for k in range(d):
            diff = X[i, k] - X[out[0], k]
            acc += diff * diff
        best[i] = acc
    for t in range(1, A):
        total = 0.0
        for i in range(n):
            total += best[i]
        target = u[t] * total
        pick = n - 1
        acc = 0.0
        for i in range(n):
            acc += best[i]
            if acc > target:
                pick = i
                break
        out[t] = pick
        c = pick
        for i in range(n):
            dist = 0.0
            for k in range(d):
                diff = X[i, k] - X[c, k]
                dist += diff * diff
            if dist < best[i]:
                best[i] = dist
    return out


@njit(cache=True)
def _add_rows(sums, codes, X):
    """sums[codes[i]] += X[i] for every row i (serial, in row order)."""
    for i in range(X.shape[0]):
        a = codes[i]
        for k in range(X.shape[1]):
            sums[a, k] += X[i, k]


def kmeans_block(A: int, block: int = 8192) -> int:
    """Rows whose distances to A anchors k-means takes at a time: at most `block`, and at
    most SCORE_BLOCK_BYTES of float32 distances (at least 1)."""
    return int(max(1, min(block, SCORE_BLOCK_BYTES // (4 * A))))


def kmeans(X, A: int, seed: int, iters: int = 6, block: int = 8192, seed_points: int = 4) -> np.ndarray:
    """A anchors [A, d] (float32) for the rows of X [n, d] by Lloyd's k-means.

    Seeded by k-means++ on a random subset of min(n, seed_points * A) rows (the
    subset and the draws from `seed`); an anchor left without points restarts
    at the point farthest from its own anchor. Needs n >= A. Distances are taken
    `kmeans_block(A, block)` rows at a time.
    """
    X = np.ascontiguousarray(X, dtype=np.float32)
    n = X.shape[0]
    if n < A:
        raise ValueError(f"k-means of {A} anchors needs at least {A} points, got {n}")
    block = kmeans_block(A, block)
    rng = np.random.default_rng(seed)
    sub = np.sort(rng.choice(n, min(n, seed_points * A), replace=False))
    C = X[sub[kmeanspp_seed(X[sub], A, rng.random(A))]].copy()
    for _ in range(iters):
        codes = nearest(X, C, 1, block)[:, 0]
        counts = np.bincount(codes, minlength=A)
        sums = np.zeros((A, X.shape[1]), np.float64)
        _add_rows(sums, codes, X)
        live = counts > 0
        C[live] = (sums[live] / counts[live, None]).astype(np.float32)
        dead = np.flatnonzero(~live)
        if dead.size:
            own = np.empty(n, np.float32)
            for s in range(0, n, block):  # in blocks: [n, d] temporaries would double X
                diff = X[s:s + block] - C[codes[s:s + block]]
                own[s:s + block] = np.einsum("ij,ij->i", diff, diff)
            far = np.argsort(-own, kind="stable")[:dead.size]
            C[dead] = X[far]
    return C


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
    def fit_anchors(self, X, iters: int = 8) -> None:
        """k-means anchors of the inputs X [n, dim] (n >= A), table l seeded by (seed, l)."""
        X = self._check_inputs(X)
        for l in range(self.L):
            self.anchors[l] = kmeans(X, self.A, _table_seed(self.seed, l), iters)
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
