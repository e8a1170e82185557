"""Nearest training points of a query: a k-NN graph over unit vectors, searched best first.

Why an output layer's index wants them. Anchor buckets (lsh.anchors) hold what
scores high at the centre of a query's cell; what they miss is what only the
query's own direction makes score high, typically a tail label. The training
points nearest to the query (by cosine of the hidden vectors) carry exactly
those labels: on the defaults' trained amazon-like layer (670,091 labels, 5,000
test points), 87% of the true exact-top-5 labels that a 2% bucket misses are
labels of the query's single nearest training point, and adding the labels of
the 5 nearest (found exactly) brings P@5 from 0.3028 to 0.3289 against exact
scoring's 0.3293 (/work-era analysis, reproduced by scripts/bench_lsh.py --eval,
which measures what this module finds).

Graph. Each of the n points P (unit rows, float32 [n, d]) links to its M
nearest others by cosine (exact, BLAS blocks: O(n^2 d) once), then to up to R
of the points that link to it, the most similar first. The reverse links
matter: a k-NN graph is dominated by hubs, and the points few others list
(in-degree 8 against 51 for the median point, on that layer) are the tail
points the search is for; without them the beam search found the exact
nearest point for 38% of the queries a bucket fails, with them for 67-78%.

Search. A best-first beam of width ef (the classic graph search of HNSW's
bottom layer and NSG): start from entry points (the training points of the
query's anchor cell), repeatedly expand the best unexpanded point of the beam,
stop when every point in it is expanded; return its k best. Each query costs
a few hundred to a thousand dot products of length d, next to the bucket's
~13,000 at 2% of 670,091 labels.

Storage: graph int32 [n, M + R] (-1 pads a row), entries as a CSR over cells
(cell_ptr int64 [A + 1], cell_ids int32), the points' labels as a CSR
(label_ptr int64 [n + 1], label_ids int32, global ids). Ties go to the lower
index everywhere, so the result depends only on the points' values.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ._common import check_int


# ----------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------

def unit_rows(X) -> np.ndarray:
    """float32 [n, d]: the rows of X scaled to unit length (zero rows stay zero)."""
    X = np.asarray(X, dtype=np.float32)
    norms = np.sqrt(np.einsum("ij,ij->i", X, X, dtype=np.float64))
    return np.ascontiguousarray(X / np.maximum(norms, 1e-30)[:, None], dtype=np.float32)


#: rows of the exact k-NN graph computed at a time: their similarities (float32), negated
#: copy and argpartition (int64) are 16 bytes x block x n (205 MB at n = 50,000)
GRAPH_BLOCK = 256


def knn_rows(P, lo: int, hi: int, M: int, block: int = GRAPH_BLOCK) -> np.ndarray:
    """int32 [hi - lo, M]: for each point lo <= i < hi of P (unit rows, float32 [n, d]), its
    M most similar other points by P[i] . P[j], best first, ties to the lower index.
    O((hi - lo) n d) through BLAS, block rows at a time (GRAPH_BLOCK: the transient)."""
    n = P.shape[0]
    M = check_int("M (graph degree)", M, 1, max(1, n - 1))
    out = np.empty((hi - lo, M), np.int32)
    ids = np.arange(n)
    for s in range(lo, hi, block):
        e = min(hi, s + block)
        S = P[s:e] @ P.T
        S[np.arange(e - s), np.arange(s, e)] = -np.inf  # not its own neighbour
        part = np.argpartition(-S, M - 1, axis=1)[:, :M]
        # exact order among the M (score desc, id asc); the partition may cut a tie either way
        key_s = -np.take_along_axis(S, part, 1)
        order = np.lexsort((ids[part], key_s), axis=1)
        out[s - lo:e - lo] = np.take_along_axis(part, order, 1)
    return out


@njit(parallel=True, fastmath=True, cache=True)
def add_reverse(G, P, R, rptr, rids, out):
    """out int32 [n, M + R]: row i is G[i] (its M nearest) then up to R points that list i
    but are not in G[i], most similar to i first (ties: lower index); -1 pads the row.
    rptr int64 [n + 1], rids int32: the reverse lists (who lists i), from `reverse_lists`."""
    n, M = G.shape
    d = P.shape[1]
    for i in prange(n):
        for t in range(M):
            out[i, t] = G[i, t]
        for t in range(M, M + R):
            out[i, t] = -1
        cnt = rptr[i + 1] - rptr[i]
        if cnt == 0:
            continue
        sims = np.empty(cnt, np.float32)
        cand = np.empty(cnt, np.int32)
        c = 0
        for r in range(rptr[i], rptr[i + 1]):
            v = rids[r]
            dup = False
            for t in range(M):
                if G[i, t] == v:
                    dup = True
                    break
            if dup:
                continue
            acc = np.float32(0.0)
            for f in range(d):
                acc += P[i, f] * P[v, f]
            sims[c] = acc
            cand[c] = v
            c += 1
        # the R best by (similarity desc, index asc): selection, R and c are small
        for t in range(min(R, c)):
            best = t
            for u in range(t + 1, c):
                if sims[u] > sims[best] or (sims[u] == sims[best] and cand[u] < cand[best]):
                    best = u
            sims[t], sims[best] = sims[best], sims[t]
            cand[t], cand[best] = cand[best], cand[t]
            out[i, M + t] = cand[t]


def reverse_lists(G, n: int):
    """(rptr int64 [n + 1], rids int32): for each point, the points whose rows of G list it,
    in increasing order."""
    src = np.repeat(np.arange(G.shape[0], dtype=np.int32), G.shape[1])
    dst = G.ravel()
    keep = dst >= 0
    src, dst = src[keep], dst[keep]
    order = np.lexsort((src, dst))
    rptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=rptr[1:])
    return rptr, np.ascontiguousarray(src[order], dtype=np.int32)


@njit(inline="always")
def _offer(rs, ri, rx, cnt, ef, s, v):
    """Insert point v of similarity s into the beam (rs desc, ri asc on ties); returns the new count."""
    if cnt == ef and (s < rs[ef - 1] or (s == rs[ef - 1] and v > ri[ef - 1])):
        return cnt
    pos = cnt if cnt < ef else ef - 1
    while pos > 0 and (rs[pos - 1] < s or (rs[pos - 1] == s and ri[pos - 1] > v)):
        rs[pos] = rs[pos - 1]
        ri[pos] = ri[pos - 1]
        rx[pos] = rx[pos - 1]
        pos -= 1
    rs[pos] = s
    ri[pos] = v
    rx[pos] = False
    return cnt + 1 if cnt < ef else cnt


@njit(parallel=True, fastmath=True, cache=True)
def beam_search(Q, P, G, cell_ptr, cell_ids, qcell, ef, k, n_chunks, out, n_visited):
    """Per query Q[q] (float32 [nq, d], unit or not: only the order matters), the k points of
    P (unit rows, float32 [n, d]) most similar to it found by a best-first beam of width ef
    over the graph G (int32 [n, D], -1 pads), entered at the points of cell qcell[q]
    (cell_ids[cell_ptr[a]:cell_ptr[a+1]]; an empty cell enters at points 0..7).
    Writes out int32 [nq, k] (best first, -1 where fewer were found) and n_visited int64
    [nq] (similarities computed). Queries are dealt to n_chunks parallel chunks."""
    nq, d = Q.shape
    n, D = G.shape
    for c in prange(n_chunks):
        stamp = np.zeros(n, np.int64)
        rs = np.empty(ef, np.float32)
        ri = np.empty(ef, np.int32)
        rx = np.zeros(ef, np.bool_)
        for q in range(c, nq, n_chunks):
            tag = q + 1
            cnt = 0
            vis = 0
            a = qcell[q]
            e0, e1 = cell_ptr[a], cell_ptr[a + 1]
            n_entry = e1 - e0 if e1 > e0 else min(n, 8)
            for e in range(n_entry):
                v = cell_ids[e0 + e] if e1 > e0 else e
                if stamp[v] == tag:
                    continue
                stamp[v] = tag
                acc = np.float32(0.0)
                for f in range(d):
                    acc += Q[q, f] * P[v, f]
                vis += 1
                cnt = _offer(rs, ri, rx, cnt, ef, acc, v)
            while True:
                u = -1
                for t in range(cnt):
                    if not rx[t]:
                        u = t
                        break
                if u < 0:
                    break
                rx[u] = True
                x = ri[u]
                for t in range(D):
                    v = G[x, t]
                    if v < 0:
                        break
                    if stamp[v] == tag:
                        continue
                    stamp[v] = tag
                    acc = np.float32(0.0)
                    for f in range(d):
                        acc += Q[q, f] * P[v, f]
                    vis += 1
                    cnt = _offer(rs, ri, rx, cnt, ef, acc, v)
            for t in range(k):
                out[q, t] = ri[t] if t < cnt else -1
            n_visited[q] = vis


@njit(cache=True)
def labels_in_range(nn, label_ptr, label_ids, lo, hi):
    """The labels of each query's neighbours that fall in [lo, hi), as local ids (id - lo),
    sorted and distinct per query: (xptr int64 [nq + 1], xids int32). nn int32 [nq, k]
    (-1 entries skipped); label_ptr int64 [n + 1], label_ids int32 (global ids)."""
    nq, k = nn.shape
    xptr = np.zeros(nq + 1, np.int64)
    for q in range(nq):
        c = 0
        for t in range(k):
            v = nn[q, t]
            if v < 0:
                continue
            for r in range(label_ptr[v], label_ptr[v + 1]):
                j = label_ids[r]
                if lo <= j < hi:
                    c += 1
        xptr[q + 1] = xptr[q] + c
    raw = np.empty(xptr[nq], np.int32)
    for q in range(nq):
        c = xptr[q]
        for t in range(k):
            v = nn[q, t]
            if v < 0:
                continue
            for r in range(label_ptr[v], label_ptr[v + 1]):
                j = label_ids[r]
                if lo <= j < hi:
                    raw[c] = j - lo
                    c += 1
    # sort and drop repeats per query, compacting in place
    out_ptr = np.zeros(nq + 1, np.int64)
    w = 0
    for q in range(nq):
        seg = np.sort(raw[xptr[q]:xptr[q + 1]])
        for t in range(seg.shape[0]):
            if t == 0 or seg[t] != seg[t - 1]:
                raw[w] = seg[t]
                w += 1
        out_ptr[q + 1] = w
    return out_ptr, raw[:w].copy()


# ----------------------------------------------------------------------------
# The index
# ----------------------------------------------------------------------------

class NeighborIndex:
    """Training points (their unit hidden vectors and labels) and their k-NN graph.

    NeighborIndex(points, graph, cell_ptr, cell_ids, label_ptr, label_ids): see the module
    docstring for the arrays. `build(H, codes, A, label_ptr, label_ids, M, R, rows=None)`
    makes one (rows: a function (lo, hi) -> knn_rows of those points, so that ranks can
    share the O(n^2 d) work). `neighbors(Q, qcells, ef, k)` finds the k nearest training
    points of each query; `extras(nn, lo, hi)` their labels in [lo, hi) as local ids.
    """

    KEYS = ("points", "graph", "cell_ptr", "cell_ids", "label_ptr", "label_ids")

    def __init__(self, points, graph, cell_ptr, cell_ids, label_ptr, label_ids):
        self.points = np.ascontiguousarray(points, dtype=np.float32)
        self.graph = np.ascontiguousarray(graph, dtype=np.int32)
        self.cell_ptr = np.ascontiguousarray(cell_ptr, dtype=np.int64)
        self.cell_ids = np.ascontiguousarray(cell_ids, dtype=np.int32)
        self.label_ptr = np.ascontiguousarray(label_ptr, dtype=np.int64)
        self.label_ids = np.ascontiguousarray(label_ids, dtype=np.int32)
        n = self.points.shape[0]
        if self.graph.shape[0] != n or self.label_ptr.shape[0] != n + 1:
            raise ValueError(f"neighbour index: {n} points but a graph of {self.graph.shape[0]} rows and "
                             f"labels for {self.label_ptr.shape[0] - 1}")

    @classmethod
    def build(cls, H, codes, A: int, label_ptr, label_ids, M: int, R: int, rows=None) -> "NeighborIndex":
        """H float [n, d] the training points' hidden vectors; codes int [n] their anchor cells
        (0 <= code < A); label_ptr/label_ids their labels (CSR, global ids); M nearest plus
        up to R reverse links per point."""
        P = unit_rows(H)
        n = P.shape[0]
        M = check_int("M (graph degree)", M, 1)
        R = check_int("R (reverse links)", R, 0)
        M = min(M, max(1, n - 1))
        G = knn_rows(P, 0, n, M) if rows is None else rows(P, M)
        rptr, rids = reverse_lists(G, n)
        full = np.empty((n, M + R), np.int32)
        add_reverse(G, P, R, rptr, rids, full)
        codes = np.asarray(codes, dtype=np.int64).ravel()
        cell_ids = np.argsort(codes, kind="stable").astype(np.int32)
        cell_ptr = np.zeros(A + 1, np.int64)
        np.cumsum(np.bincount(codes, minlength=A), out=cell_ptr[1:])
        return cls(P, full, cell_ptr, cell_ids, label_ptr, label_ids)

    @property
    def memory_bytes(self) -> int:
        return int(sum(getattr(self, k).nbytes for k in self.KEYS))

    def neighbors(self, Q, qcells, ef: int, k: int):
        """(int32 [nq, k] the k nearest training points found per query, best first, -1 where
        fewer; int64 [nq] similarities computed per query)."""
        import numba

        Q = np.ascontiguousarray(Q, dtype=np.float32)
        nq = Q.shape[0]
        k = check_int("k (neighbours)", k, 1)
        ef = max(check_int("ef (search width)", ef, 1), k)
        out = np.empty((nq, k), np.int32)
        visited = np.zeros(nq, np.int64)
        if nq:
            n_chunks = max(1, min(nq, 4 * numba.get_num_threads()))
            beam_search(Q, self.points, self.graph, self.cell_ptr, self.cell_ids,
                        np.ascontiguousarray(qcells, dtype=np.int64), ef, k, n_chunks, out, visited)
        return out, visited

    def extras(self, nn, lo: int, hi: int):
        """(xptr int64 [nq + 1], xids int32): each query's neighbours' labels in [lo, hi), local ids."""
        return labels_in_range(np.ascontiguousarray(nn, dtype=np.int32), self.label_ptr, self.label_ids,
                               int(lo), int(hi))

    def state_arrays(self) -> dict:
        return {k: getattr(self, k) for k in self.KEYS}

    @classmethod
    def from_state(cls, arrays) -> "NeighborIndex":
        return cls(*(np.asarray(arrays[k]) for k in cls.KEYS))

    def __repr__(self) -> str:
        return (f"NeighborIndex({self.points.shape[0]} points, degree {self.graph.shape[1]}; "
                f"{self.memory_bytes / 2**20:.1f} MiB)")
