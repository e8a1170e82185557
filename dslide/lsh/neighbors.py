"""Nearest training points of a query: a k-NN graph over unit vectors, searched best first.

Why an output layer's index wants them. Anchor buckets (lsh.anchors) hold what
scores high at the centre of a query's cell; what they miss is what only the
query's own direction makes score high, typically a tail label. The training
points nearest to the query (by cosine of the hidden vectors) carry exactly
those labels: on the defaults' trained amazon-like layer most of the true
exact-top-5 labels that a 2% bucket misses are labels of the query's single
nearest training point. scripts/bench_lsh.py --eval measures what the index
gains from them (docs/lsh.md).

Graph. Each of the n points P (unit rows, float32 [n, d]) links to its M
nearest others by cosine, then to up to R of the points that link to it, the
most similar first. The M nearest are exact (`knn_rows`, BLAS blocks: O(n^2 d)
once) or approximate: the nearest among the points of the c cells (k-means
anchors) nearest the point's own (`cell_rows`, O(n c n/A d)), then the best of
those and their own neighbours' neighbours (`refine_rows`, one local join of
NN-descent, Dong et al. 2011). The reverse links
matter: a k-NN graph is dominated by hubs, and the points few others list
are the tail points the search is for; without reverse links the search
seldom reaches them.

Search. A best-first beam of width ef (the graph search of HNSW's bottom
layer): start from entry points (the training points of the query's anchor
cell), repeatedly expand the best point not yet expanded, keep the ef best
seen, stop when the best left to expand is worse than the beam's worst;
return the beam's k best. Each query costs a few thousand dot products of
length d (ef = lsh.index_search), fewer than its bucket's rows, but read at
random, where a bucket's rows are read once per anchor for all of its queries
(scripts/bench_lsh.py --eval times the whole against the buckets alone;
docs/lsh.md).

Storage: the points as int8 (`quantize`: unit rows x 127; the search's dot
products are int32), graph int32 [n, M + R] (-1 pads a row), entries as a CSR over cells
(cell_ptr int64 [A + 1], cell_ids int32), the points' labels as a CSR
(label_ptr int64 [n + 1], label_ids int32, global ids). Ties go to the lower
index everywhere, so the result depends only on the points' values.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ._common import check_int
from ._topk import better, push_top
from .kmeans import nearest


# ----------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------

#: rows scaled at a time by `unit_rows` (its float64 temporary)
UNIT_BLOCK = 4096


def unit_rows(X, inplace: bool = False) -> np.ndarray:
    """float32 [n, d], C order: the rows of X scaled to unit length (zero rows stay zero), each
    divided in float64 and rounded once. inplace: into X itself where it is float32 and C-ordered
    (else a copy); a float64 temporary of UNIT_BLOCK rows at a time, not of X."""
    X = np.asarray(X)
    out = X if inplace and X.dtype == np.float32 and X.flags.c_contiguous else np.array(X, np.float32, order="C")
    norms = np.maximum(np.sqrt(np.einsum("ij,ij->i", out, out, dtype=np.float64)), 1e-30)
    for s in range(0, out.shape[0], UNIT_BLOCK):
        out[s:s + UNIT_BLOCK] = out[s:s + UNIT_BLOCK] / norms[s:s + UNIT_BLOCK, None]
    return out


def quantize(X) -> np.ndarray:
    """int8 [n, d]: the unit rows of X times 127, rounded. The search compares int32 dot
    products of these: a row costs 2 cache lines instead of 8 (d = 128), which halves its
    time (memory-bound: most of a graph search's rows are not in cache), and the order
    they give is exact integers, the same on every machine and thread count."""
    return np.rint(unit_rows(X) * 127.0).astype(np.int8)


#: rows of the exact k-NN graph computed at a time: their similarities, float32 block x n
GRAPH_BLOCK = 256


@njit(parallel=True, fastmath=True, cache=True)
def top_of_rows(S, M, first, out):
    """out[r] := the j of the M largest S[r, j] (float32 [R, n]) other than j = first + r,
    best first, ties to the lower j; -1 past the row's n - 1 others."""
    R, n = S.shape
    for r in prange(R):
        ts = np.empty((1, M), np.float32)
        ti = np.empty((1, M), np.int32)
        cnt = 0
        me = first + r
        for j in range(n):
            if j != me:
                cnt = push_top(ts, ti, 0, cnt, M, S[r, j], j)
        for t in range(M):
            out[r, t] = ti[0, t] if t < cnt else -1


def knn_rows(P, lo: int, hi: int, M: int, block: int = GRAPH_BLOCK) -> np.ndarray:
    """int32 [hi - lo, M]: for each point lo <= i < hi of P (unit rows, float32 [n, d]), its
    M most similar other points by P[i] . P[j], best first, ties to the lower index.
    O((hi - lo) n d) through BLAS, `block` rows at a time, then one pass per row
    (top_of_rows, instead of numpy's argpartition and sort)."""
    n = P.shape[0]
    M = check_int("M (graph degree)", M, 1, max(1, n - 1))
    out = np.empty((hi - lo, M), np.int32)
    for s in range(lo, hi, block):
        e = min(hi, s + block)
        top_of_rows(P[s:e] @ P.T, M, s, out[s - lo:e - lo])
    return out


@njit(inline="always", fastmath=True)
def _dot(P, i, j, d):
    """P[i] . P[j] in float32 (rows of a float32 [n, d])."""
    acc = np.float32(0.0)
    for f in range(d):
        acc += P[i, f] * P[j, f]
    return acc


@njit(parallel=True, fastmath=True, cache=True)
def cell_rows(P, codes, cell_ptr, near, lo, hi, M, out):
    """out[i - lo] := for each point lo <= i < hi of P (unit rows, float32 [n, d], ordered by
    cell: codes int64 [n] sorted, cell_ptr int64 [A + 1]), its M most similar other points
    among those of the cells near[codes[i]] (int32 [A, c], -1 ignored), best first, ties to
    the lower index; -1 pads a row with fewer candidates. O((hi - lo) c n / A d)."""
    d = P.shape[1]
    for i in prange(lo, hi):
        ts = np.empty((1, M), np.float32)
        ti = np.empty((1, M), np.int32)
        cnt = 0
        a = codes[i]
        for t in range(near.shape[1]):
            c = near[a, t]
            if c < 0:
                continue
            for j in range(cell_ptr[c], cell_ptr[c + 1]):
                if j == i:
                    continue
                cnt = push_top(ts, ti, 0, cnt, M, _dot(P, i, j, d), j)
        for t in range(M):
            out[i - lo, t] = ti[0, t] if t < cnt else -1


@njit(parallel=True, fastmath=True, cache=True)
def refine_rows(P, G, lo, hi, out):
    """One round of neighbour-of-neighbour search (NN-descent's local join): out[i - lo] := the
    M best, by P[i] . P[j], of G[i] and the rows G[j] of its neighbours j (G int32 [n, M], -1
    ignored), i itself left out; best first, ties to the lower index. Never worse than G[i]."""
    M = G.shape[1]
    d = P.shape[1]
    for i in prange(lo, hi):
        cand = np.empty(M + M * M, np.int32)
        m = 0
        for t in range(M):
            j = G[i, t]
            if j < 0:
                continue
            cand[m] = j
            m += 1
            for u in range(M):
                v = G[j, u]
                if v >= 0 and v != i:
                    cand[m] = v
                    m += 1
        cand[:m].sort()
        ts = np.empty((1, M), np.float32)
        ti = np.empty((1, M), np.int32)
        cnt = 0
        prev = -1
        for t in range(m):
            j = cand[t]
            if j == prev:
                continue
            prev = j
            cnt = push_top(ts, ti, 0, cnt, M, _dot(P, i, j, d), j)
        for t in range(M):
            out[i - lo, t] = ti[0, t] if t < cnt else -1


def near_cells(C, c: int) -> np.ndarray:
    """int32 [A, min(c, A)]: each anchor's c nearest anchors of C [A, d] (itself first), by
    Euclidean distance, ties to the lower index: the cells whose points `cell_rows` offers."""
    C = np.ascontiguousarray(C, dtype=np.float32)
    return np.ascontiguousarray(nearest(C, C, min(int(c), C.shape[0])), dtype=np.int32)


def local_rows(n: int, width: int, rows) -> np.ndarray:
    """int32 [n, width]: rows(0, n), the whole of a row-range function in one process (the
    `share` of `NeighborIndex.build` without ranks)."""
    return np.ascontiguousarray(rows(0, n), dtype=np.int32)


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
        if R == 0 or rptr[i + 1] == rptr[i]:
            continue
        # the R best by (similarity desc, index asc); the candidates are distinct
        sims = np.empty((1, R), np.float32)
        cand = np.empty((1, R), np.int32)
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
            c = push_top(sims, cand, 0, c, R, _dot(P, i, v, d), v)
        for t in range(c):
            out[i, M + t] = cand[0, t]


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
def _dot8(Q, q, P, v, d):
    acc = np.int32(0)
    for f in range(d):
        acc += np.int32(Q[q, f]) * np.int32(P[v, f])
    return acc


@njit(inline="always")
def _push(hs, hi, size, s, v, best_on_top):
    """Add (s, v) to the binary heap hs/hi of `size` entries; returns the new size. The top
    is the best entry (best_on_top) or the worst."""
    t = size
    while t > 0:
        p = (t - 1) // 2
        if better(s, v, hs[p], hi[p]) != best_on_top:
            break
        hs[t] = hs[p]
        hi[t] = hi[p]
        t = p
    hs[t] = s
    hi[t] = v
    return size + 1


@njit(inline="always")
def _pop(hs, hi, size, best_on_top):
    """Remove the heap's top; returns the new size."""
    size -= 1
    s, v = hs[size], hi[size]
    t = 0
    while True:
        c = 2 * t + 1
        if c >= size:
            break
        if c + 1 < size and better(hs[c + 1], hi[c + 1], hs[c], hi[c]) == best_on_top:
            c += 1
        if better(hs[c], hi[c], s, v) != best_on_top:
            break
        hs[t] = hs[c]
        hi[t] = hi[c]
        t = c
    if size > 0:
        hs[t] = s
        hi[t] = v
    return size


@njit(inline="always")
def _visit(Q, q, P, v, d, stamp, tag, ef, ws, wi, nw, cs, ci, nc):
    """Consider point v for query q, once (stamp[v] == tag: seen): its dot product joins the
    beam ws/wi (nw entries, worst on top) and the points to expand cs/ci (nc, best on top)
    when the beam has room or it beats the beam's worst. Returns (nw, nc, dot products)."""
    if stamp[v] == tag:
        return nw, nc, 0
    stamp[v] = tag
    s = _dot8(Q, q, P, v, d)
    if nw < ef or better(s, v, ws[0], wi[0]):
        nc = _push(cs, ci, nc, s, v, True)
        nw = _push(ws, wi, nw, s, v, False)
        if nw > ef:
            nw = _pop(ws, wi, nw, False)
    return nw, nc, 1


@njit(parallel=True, fastmath=True, cache=True)
def beam_search(Q, P, G, cell_ptr, cell_ids, qcell, ef, k, n_chunks, out, n_visited):
    """Per query Q[q] (int8 [nq, d], `quantize`d), the k points of P (int8 [n, d], quantized)
    with the largest dot products with it found by a best-first beam of width ef
    over the graph G (int32 [n, D], -1 pads), entered at the points of cell qcell[q]
    (cell_ids[cell_ptr[a]:cell_ptr[a+1]]; an empty cell enters at points 0..7).
    The beam is the ef best points seen (a heap, worst on top) and the points still to
    expand are a heap, best on top; the search ends when the best point left to expand
    is worse than the beam's worst (HNSW's bottom-layer search).
    Writes out int32 [nq, k] (best first, ties to the lower index, -1 where fewer were
    found) and n_visited int64 [nq] (dot products computed). Queries are dealt to
    n_chunks parallel chunks."""
    nq, d = Q.shape
    n, D = G.shape
    for c in prange(n_chunks):
        stamp = np.zeros(n, np.int32)
        ws = np.empty(ef + 1, np.int32)  # the beam: worst on top
        wi = np.empty(ef + 1, np.int32)
        cs = np.empty(n + 8, np.int32)  # to expand: best on top (a point enters once)
        ci = np.empty(n + 8, np.int32)
        for q in range(c, nq, n_chunks):
            tag = q + 1
            nw = 0
            nc = 0
            vis = 0
            a = qcell[q]
            e0, e1 = cell_ptr[a], cell_ptr[a + 1]
            n_entry = e1 - e0 if e1 > e0 else min(n, 8)
            for e in range(n_entry):
                v = cell_ids[e0 + e] if e1 > e0 else e
                nw, nc, got = _visit(Q, q, P, v, d, stamp, tag, ef, ws, wi, nw, cs, ci, nc)
                vis += got
            while nc > 0:
                s0, x = cs[0], ci[0]
                if nw == ef and better(ws[0], wi[0], s0, x):
                    break  # the best left is worse than the beam's worst
                nc = _pop(cs, ci, nc, True)
                for t in range(D):
                    v = G[x, t]
                    if v < 0:
                        break
                    nw, nc, got = _visit(Q, q, P, v, d, stamp, tag, ef, ws, wi, nw, cs, ci, nc)
                    vis += got
            # the beam, best first: pop the worst into the back
            m = nw
            while nw > 0:
                ti = wi[0]
                nw = _pop(ws, wi, nw, False)
                if nw < k:
                    out[q, nw] = ti
            for t in range(m, k):
                out[q, t] = -1
            n_visited[q] = vis


@njit(cache=True)
def _labels_in_range(nn, label_ptr, label_ids, lo, hi, cap_ptr):
    """Kernel of `labels_in_range`; cap_ptr int64 [nq + 1]: room per query (its neighbours'
    label counts, an upper bound of what falls in [lo, hi))."""
    nq, k = nn.shape
    end = np.empty(nq, np.int64)
    raw = np.empty(cap_ptr[nq], np.int32)
    for q in range(nq):
        c = cap_ptr[q]
        for t in range(k):
            v = nn[q, t]
            if v < 0:
                continue
            for r in range(label_ptr[v], label_ptr[v + 1]):
                j = label_ids[r]
                if lo <= j < hi:
                    raw[c] = j - lo
                    c += 1
        end[q] = c
    # sort and drop repeats per query, compacting in place
    out_ptr = np.zeros(nq + 1, np.int64)
    w = 0
    for q in range(nq):
        seg = np.sort(raw[cap_ptr[q]:end[q]])
        for t in range(seg.shape[0]):
            if t == 0 or seg[t] != seg[t - 1]:
                raw[w] = seg[t]
                w += 1
        out_ptr[q + 1] = w
    return out_ptr, raw[:w].copy()


# ----------------------------------------------------------------------------
# The index
# ----------------------------------------------------------------------------

def _csr_rows(ptr, ids, rows):
    """The CSR (ptr int64 [n + 1], ids) with its rows taken in the order `rows`."""
    lengths = np.diff(ptr)[rows]
    new_ptr = np.zeros(rows.size + 1, np.int64)
    np.cumsum(lengths, out=new_ptr[1:])
    take = np.repeat(ptr[rows] - new_ptr[:-1], lengths) + np.arange(new_ptr[-1])
    return new_ptr, np.ascontiguousarray(ids[take], dtype=np.int32)


def labels_in_range(nn, label_ptr, label_ids, lo: int, hi: int):
    """The labels of each query's neighbours that fall in [lo, hi), as local ids (id - lo),
    sorted and distinct per query: (xptr int64 [nq + 1], xids int32). nn int32 [nq, k]
    (-1 entries skipped); label_ptr int64 [n + 1], label_ids int32 (global ids)."""
    nn = np.ascontiguousarray(nn, dtype=np.int32)
    counts = np.where(nn >= 0, np.diff(label_ptr)[np.maximum(nn, 0)], 0).sum(axis=1)
    cap_ptr = np.zeros(nn.shape[0] + 1, np.int64)
    np.cumsum(counts, out=cap_ptr[1:])
    return _labels_in_range(nn, label_ptr, label_ids, int(lo), int(hi), cap_ptr)


class NeighborIndex:
    """Training points (their unit hidden vectors and labels) and their k-NN graph.

    NeighborIndex(points, graph, cell_ptr, cell_ids, label_ptr, label_ids): see the module
    docstring for the arrays. `build(H, codes, A, label_ptr, label_ids, M, R, share=None,
    near=None)` makes one (share: how ranks split its row-range work; near: the cells of an
    approximate graph). `neighbors(Q, qcells, ef, k)` finds the k nearest training points of
    each query; `extras(nn, lo, hi)` their labels in [lo, hi) as local ids.
    """

    KEYS = ("points", "graph", "cell_ptr", "cell_ids", "label_ptr", "label_ids")

    def __init__(self, points, graph, cell_ptr, cell_ids, label_ptr, label_ids):
        self.points = np.ascontiguousarray(points, dtype=np.int8)
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
    def build(cls, H, codes, A: int, label_ptr, label_ids, M: int, R: int, share=None,
              near=None) -> "NeighborIndex":
        """H float [n, d] the training points' hidden vectors; codes int [n] their anchor cells
        (0 <= code < A); label_ptr/label_ids their labels (CSR, global ids); M nearest plus
        up to R reverse links per point. The index keeps the points ordered by cell (stable).
        near: None, the exact M nearest (`knn_rows`, O(n^2 d)); or int32 [A, c] each cell's
        nearest cells (`near_cells`), the approximate graph: each point's M nearest among the
        points of its cell's near cells (`cell_rows`), then one neighbour-of-neighbour round
        (`refine_rows`). share(n, width, rows) -> int32 [n, width]: the rows of a row-range
        function rows(lo, hi), so that ranks can share the work (default `local_rows`)."""
        # the points cell by cell: a search mostly moves between points of nearby cells, so
        # this keeps what it reads closer together in memory
        codes = np.asarray(codes, dtype=np.int64).ravel()
        perm = np.argsort(codes, kind="stable")
        codes = codes[perm]
        P = unit_rows(np.asarray(H)[perm], inplace=True)  # the gathered copy is its own
        label_ptr, label_ids = _csr_rows(np.asarray(label_ptr, dtype=np.int64), np.asarray(label_ids), perm)
        n = P.shape[0]
        M = check_int("M (graph degree)", M, 1)
        R = check_int("R (reverse links)", R, 0)
        M = min(M, max(1, n - 1))
        share = local_rows if share is None else share
        cell_ptr = np.zeros(A + 1, np.int64)
        np.cumsum(np.bincount(codes, minlength=A), out=cell_ptr[1:])
        if near is None:
            G = share(n, M, lambda lo, hi: knn_rows(P, lo, hi, M))
        else:
            near = np.ascontiguousarray(near, dtype=np.int32)
            if near.ndim != 2 or near.shape[0] != A or near.size == 0 or near.min() < -1 or near.max() >= A:
                raise ValueError(f"near: expected int32 [{A}, c] cells in [-1, {A}), got {near.shape}")

            def first(lo, hi):
                out = np.empty((hi - lo, M), np.int32)
                cell_rows(P, codes, cell_ptr, near, lo, hi, M, out)
                return out

            G0 = share(n, M, first)

            def second(lo, hi):
                out = np.empty((hi - lo, M), np.int32)
                refine_rows(P, G0, lo, hi, out)
                return out

            G = share(n, M, second)
        rptr, rids = reverse_lists(G, n)
        full = np.empty((n, M + R), np.int32)
        add_reverse(G, P, R, rptr, rids, full)
        cell_ids = np.arange(n, dtype=np.int32)  # sorted by cell already
        return cls(quantize(P), full, cell_ptr, cell_ids, label_ptr, label_ids)

    @property
    def memory_bytes(self) -> int:
        return int(sum(getattr(self, k).nbytes for k in self.KEYS))

    def neighbors(self, Q, qcells, ef: int, k: int):
        """(int32 [nq, k] the k nearest training points found per query, best first, -1 where
        fewer; int64 [nq] similarities computed per query)."""
        import numba

        Q = quantize(Q)
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
