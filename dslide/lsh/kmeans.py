"""k-means for anchors: Lloyd's iterations seeded by k-means++, online (mini-batch) steps, and
the nearest anchors of each query.

Anchors are centres of a layer's inputs (lsh.anchors: a query's code in a table is its
nearest anchor; the inference index: dslide.index). `nearest` and `kmeans` take the
distances in blocks of rows so that the transient stays small next to a layer's
weights (`kmeans_block`).

Determinism: the seeding draws from `seed` only; distances use BLAS products
(reproducible for a given thread count); ties go to the lower index.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from . import _common  # noqa: F401  (dslide._numba_cache, before any kernel: the cache is keyed by module name)


#: the most a block of anchor scores (lsh.anchors.score_top) or of distances to the anchors (kmeans)
#: may take: both run with every weight and moment resident (table refills, the
#: inference index), so their transient must stay small next to them whatever the
#: layer's width; smaller blocks only mean more, smaller matrix products
SCORE_BLOCK_BYTES = 32 << 20


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


def blocks_here(n: int, block: int, rows) -> np.ndarray:
    """The rows' nearest anchors computed block by block in this process: rows(lo, hi) for
    each block [lo, hi) of `block` rows, concatenated (`kmeans`'s default `share`)."""
    return np.concatenate([rows(lo, min(n, lo + block)) for lo in range(0, n, block)])


def kmeans(X, A: int, seed: int, iters: int = 6, block: int = 8192, seed_points: int = 4,
           share=blocks_here) -> np.ndarray:
    """A anchors [A, d] (float32) for the rows of X [n, d] by Lloyd's k-means.

    Seeded by k-means++ on a random subset of min(n, seed_points * A) rows (the
    subset and the draws from `seed`); an anchor left without points restarts
    at the point farthest from its own anchor. Needs n >= A. Distances are taken
    `kmeans_block(A, block)` rows at a time. share(n, block, rows) -> int32 [n]: each
    iteration's nearest anchors, rows(lo, hi) for every block [lo, hi) of `block` rows; a
    share that has processes compute some blocks each (dslide.infer.index) gives the same
    anchors, every block being the same product wherever it runs.
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
        codes = np.asarray(share(n, block, lambda lo, hi: nearest(X[lo:hi], C, 1, block)[:, 0]), dtype=np.int32)
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
