"""The labels of a query's nearest training points in the network's last hidden layer.

The neighbour store (dslide.infer.fusion) finds a query's nearest training points
by the cosine of their input rows: the features the tree libraries split on.
The network's last hidden layer places points by what their labels share,
which the input rows do not know: two packages with unrelated names that
depend on the same libraries sit close in it. A network that has fitted its
training points (a narrow hidden layer memorises a wide output's head well
and its tail badly) still puts a query near the training points whose labels
it shares, so their labels vote:

    h(q)  = the query's last hidden vector, scaled to unit length
    w_i   = max(h(q) . h(x_i), 0)^power / sum_i' (same),  i over the query's k nearest
    v_j   = sum_i w_i y_ij
    score_j(q) = (1 - weight) b_j(q) + weight v_j(q)

where b is what the pipeline had before this stage: the fused scores where
the neighbours' labels are fused, else the network's softmax over its
`knn_candidates` best labels. Both sides are on the scale of a probability
(b sums to at most one plus the votes' label count, v to the neighbours'
mean label count). The top k of `score` are the predictions.

The store is the unit hidden vectors of the training points, float32 [N, h],
and their labels (CSR), every rank holding it whole. A query's k nearest are
found exactly, by matrix products with the store in column blocks
(dslide.model.topk.blocked_topk; ties to the lower point id): the query rows
go in fixed blocks of QUERY_BLOCK, the blocks shared out over the ranks and
the results all-gathered, so each block is the same product at any number of
ranks and every rank fuses the same numbers.

Under --lsh the search reads a bounded share of the store: its vectors are cut
into about sqrt(N) cells by k-means (`cells`, from a sample of at most
CELL_SAMPLE_PER_CELL points a cell, by a fixed seed: a function of the vectors
alone, derived on first use), and a query scores only the points of its
`probes` nearest cells (`cell_search`), about probes * sqrt(N) of the N. The
ids and cosines of what it finds are the exact search's; what it misses,
scripts/bench_lsh.py --fused measures against exact prediction.

What to take (the count, the power, the weight) is chosen at the end of
training on the validation split (dslide.train.validation.choose_hidden),
weight 0 (the stage off) always a candidate; `grid_hits` scores every weight
of a (count, power) in one pass, and `fuse` applies one.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from numba import njit, prange

from dslide import _numba_cache  # noqa: F401  (before any kernel: the cache is keyed by module name)
from dslide.infer.fusion import _holds, _offer_sum, _vote_contributions
from dslide.lsh._topk import push_top
from dslide.lsh.kmeans import kmeans, nearest
from dslide.lsh.neighbors import unit_rows
from dslide.model.topk import blocked_topk

#: the arrays of a store as saved in checkpoints (every rank holds them whole): the unit hidden
#: vectors H float32 [N, h], the labels y_ptr int64 [N + 1], y_idx int32, and what training
#: chose: k int64 [1], power float64 [1], weight float64 [1]
KEYS = ("H", "y_ptr", "y_idx", "k", "power", "weight")

#: query rows searched at a time: the blocks are the same products at any number of ranks
QUERY_BLOCK = 256
#: the cells of --lsh's search: k-means of at most this many points a cell (a sample), by this seed
CELL_SAMPLE_PER_CELL = 64
CELL_SEED = 0x41D

@njit(cache=True, inline="always")
def _weight_sum(nn_ids, nn_sims, power):
    """The sum of a query's neighbours' vote weights (similarity^power over the positive ones)."""
    wsum = 0.0
    for i in range(nn_ids.shape[0]):
        if nn_ids[i] >= 0 and nn_sims[i] > 0:
            wsum += float(nn_sims[i]) ** power
    return wsum


@njit(cache=True, inline="always")
def _contributions(b_ids, b_p, nn_ids, nn_sims, y_ptr, y_idx, power):
    """One query's contributions sorted by label (stable: the base score before the votes, the
    votes in neighbour order): (labels int64, sources uint8 (0 base, 1 vote), factors float64:
    the base score or the neighbour's similarity^power), their count."""
    n_lab = 0
    for i in range(nn_ids.shape[0]):
        p = nn_ids[i]
        if p >= 0 and nn_sims[i] > 0:
            n_lab += y_ptr[p + 1] - y_ptr[p]
    K = b_ids.shape[0]
    lab = np.empty(K + n_lab, np.int64)
    src = np.empty(K + n_lab, np.uint8)
    val = np.empty(K + n_lab, np.float64)
    c = 0
    for j in range(K):
        if b_ids[j] >= 0:
            lab[c] = b_ids[j]
            src[c] = 0
            val[c] = b_p[j]
            c += 1
    # each neighbour's labels vote; the weight sum is passed as 1 so that a neighbour whose
    # similarity ** power underflows to 0 still adds its labels
    c = _vote_contributions(nn_ids, nn_sims, y_ptr, y_idx, power, np.empty(0, np.int32), np.empty(0, np.float32), 1.0,
                            1.0, 0.0, lab, src, val, c)
    order = np.argsort(lab[:c], kind="mergesort")
    return lab[order], src[order], val[order], c


@njit(cache=True, inline="always")
def _rank(slab, ssrc, sval, c, weight, wsum, best_ids, best):
    """The top k (best_ids, best: [k], written) of the labels' summed scores
    (1 - weight) base + weight vote / wsum, larger first, ties to the lower label: each label's
    run of contributions summed in order, offered at its last."""
    best_ids[:] = -1
    best[:] = -np.inf
    s = 0.0
    for t in range(c):
        s += (1.0 - weight) * sval[t] if ssrc[t] == 0 else weight * sval[t] / wsum  # a vote: wsum > 0
        if t + 1 == c or slab[t + 1] != slab[t]:
            _offer_sum(best, best_ids, s, slab[t])
            s = 0.0


@njit(cache=True, parallel=True)
def fuse(b_ids, b_p, nn_ids, nn_sims, y_ptr, y_idx, power, weight, out_ids, out_scores):
    """Per query: the top k of (1 - weight) b + weight v (module docstring).

    b_ids int64 [n, K] (-1: none), b_p float64 [n, K]: the base scores; nn_ids int64 [n, kn]
    (-1: none), nn_sims float [n, kn]: the query's nearest training points, best first; y_ptr
    int64 / y_idx int32: their labels (CSR). out_ids int64 [n, k] (-1 where fewer than k labels
    have a score), out_scores float64 [n, k]."""
    for q in prange(b_ids.shape[0]):
        slab, ssrc, sval, c = _contributions(b_ids[q], b_p[q], nn_ids[q], nn_sims[q], y_ptr, y_idx, power)
        _rank(slab, ssrc, sval, c, weight, _weight_sum(nn_ids[q], nn_sims[q], power), out_ids[q], out_scores[q])


@njit(cache=True, parallel=True)
def grid_hits(b_ids, b_p, nn_ids, nn_sims, y_ptr, y_idx, power, weights, t_ptr, t_idx, out_hits):
    """`fuse`'s top k under each of `weights` (float64 [m]), looked up in the queries' true labels
    (t_ptr int64 [n + 1], t_idx int32, ascending within a row): out_hits uint8 [m, n, k] = 1 where
    the r-th label of query q is one of q's. The contributions are sorted once per query and each
    weight's scores are `fuse`'s expressions in `fuse`'s order, so each top k is `fuse`'s."""
    m = weights.shape[0]
    k = out_hits.shape[2]
    for q in prange(b_ids.shape[0]):
        slab, ssrc, sval, c = _contributions(b_ids[q], b_p[q], nn_ids[q], nn_sims[q], y_ptr, y_idx, power)
        wsum = _weight_sum(nn_ids[q], nn_sims[q], power)
        best_ids = np.empty(k, np.int64)
        best = np.empty(k, np.float64)
        for g in range(m):
            _rank(slab, ssrc, sval, c, weights[g], wsum, best_ids, best)
            for r in range(k):
                j = best_ids[r]
                out_hits[g, q, r] = 1 if j >= 0 and _holds(t_idx, t_ptr[q], t_ptr[q + 1], j) else 0


@njit(cache=True, parallel=True)
def push_rows(top_s, top_i, S, rows, ids):
    """Offer row r of the scores S [m, c] to query rows[r]'s top-k buffer (top_s float64, top_i
    int64 [n, k], prefilled -inf / -1), column c as id ids[c]; ties to the lower id, so the
    buffers hold the same whatever order the blocks come in. rows are distinct (one thread each)."""
    k = top_s.shape[1]
    for r in prange(S.shape[0]):
        q = rows[r]
        for c in range(S.shape[1]):
            v = np.float64(S[r, c])
            if v < top_s[q, k - 1]:
                continue
            push_top(top_s, top_i, q, k, k, v, ids[c])


def cell_search(Q, Hc, C, ptr, pts, probes: int, out_ids, out_sims) -> None:
    """Each query's (unit rows Q float32 [n, h]) k best stored points among those of its `probes`
    nearest cells (by squared distance to the centres C [A, h], as `cells` assigned the points;
    cell j holds the rows ptr[j]:ptr[j + 1] of Hc, the store's vectors in cell order, standing
    for the points pts[ptr[j]:ptr[j + 1]]), into out_ids int64 / out_sims float64 [n, k]
    (prefilled -1 / -inf), best first, ties to the lower id. The queries of a cell are scored
    together, one matrix product a cell."""
    qcells = nearest(Q, C, min(int(probes), C.shape[0]))  # as the points were assigned: by distance
    flat_c = qcells.ravel()
    order = np.argsort(flat_c, kind="stable")
    cells, queries = flat_c[order], (order // qcells.shape[1]).astype(np.int64)
    cuts = np.r_[0, np.flatnonzero(np.diff(cells)) + 1, cells.size]
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        j = cells[lo]
        if ptr[j + 1] == ptr[j]:
            continue
        qs = queries[lo:hi]
        S = Q[qs] @ Hc[ptr[j]:ptr[j + 1]].T
        push_rows(out_sims, out_ids, S, qs, pts[ptr[j]:ptr[j + 1]])


def softmax_rows(ids, logits) -> np.ndarray:
    """float64 [n, K]: the softmax of each row's logits over its candidates (ids >= 0), 0 elsewhere."""
    logits = np.asarray(logits, np.float64)
    held = np.asarray(ids) >= 0
    z = np.where(held, logits, -np.inf)
    mx = np.max(z, axis=1, keepdims=True)
    e = np.where(held, np.exp(z - np.where(np.isfinite(mx), mx, 0.0)), 0.0)
    s = e.sum(axis=1, keepdims=True)
    return e / np.where(s > 0, s, 1.0)


class HiddenNeighbours:
    """The training points' unit hidden vectors and labels, and what training chose for them.

    H float32 [N, h]; y_ptr int64 [N + 1], y_idx int32: the labels (CSR); k, power, weight:
    the neighbours a query takes, their similarity's power, the votes' weight (None: not chosen).
    """

    def __init__(self, arrays: dict, k: int | None = None, power: float | None = None, weight: float | None = None):
        self.arrays = {name: np.ascontiguousarray(arrays[name], dtype) for name, dtype in
                       zip(KEYS[:3], (np.float32, np.int64, np.int32))}
        saved = {name: np.asarray(arrays[name]).reshape(-1)[0] for name in KEYS[3:] if name in arrays}
        self.k = int(saved["k"]) if k is None and "k" in saved else k
        self.power = float(saved["power"]) if power is None and "power" in saved else power
        self.weight = float(saved["weight"]) if weight is None and "weight" in saved else weight
        self._cells = None  # `cells`

    @classmethod
    def build(cls, H, Y, inplace: bool = False) -> "HiddenNeighbours":
        """From the training points' hidden vectors H float [N, h] and labels Y csr [N, L];
        inplace: the store's vectors are H's own memory, scaled to unit length (`unit_rows`)."""
        Y = sp.csr_matrix(Y)
        Y.sort_indices()
        return cls({"H": unit_rows(H, inplace), "y_ptr": Y.indptr.astype(np.int64),
                    "y_idx": Y.indices.astype(np.int32)})

    @classmethod
    def from_state(cls, arrays: dict, n_labels: int, width: int,
                   where: str = "hidden neighbours") -> "HiddenNeighbours":
        """The store of `state_arrays()` output (a checkpoint's), checked first (dslide.validate)."""
        from dslide import validate

        validate.hidden_store(arrays, where, n_labels, width)
        return cls(arrays)

    def state_arrays(self) -> dict:
        out = dict(self.arrays)
        for name, value, dtype in (("k", self.k, np.int64), ("power", self.power, np.float64),
                                   ("weight", self.weight, np.float64)):
            if value is not None:
                out[name] = np.array([value], dtype)
        return out

    @property
    def n_points(self) -> int:
        return int(self.arrays["H"].shape[0])

    @property
    def width(self) -> int:
        return int(self.arrays["H"].shape[1])

    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())

    def cells(self):
        """The store cut into cells for --lsh's search (module docstring): (centres float32 [A, h],
        cell_ptr int64 [A + 1], cell_pts int32 [N], each cell's points ascending, the vectors
        float32 [N, h] in that order), A = ceil(sqrt(N)). Derived on first use from the vectors
        alone (the same on every rank)."""
        if self._cells is None:
            H = self.arrays["H"]
            N = H.shape[0]
            A = max(1, int(np.ceil(np.sqrt(N))))
            m = min(N, CELL_SAMPLE_PER_CELL * A)
            sample = np.sort(np.random.default_rng(CELL_SEED).choice(N, m, replace=False))
            C = kmeans(H[sample], A, CELL_SEED)
            codes = nearest(H, C)[:, 0]
            order = np.argsort(codes, kind="stable").astype(np.int32)
            ptr = np.zeros(A + 1, np.int64)
            np.cumsum(np.bincount(codes, minlength=A), out=ptr[1:])
            self._cells = (C, ptr, order, np.ascontiguousarray(H[order]))
        return self._cells

    def search(self, Hq, k: int, comm=None, probes: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Each query's k nearest stored points by the cosine of the hidden vectors Hq float [n, h]:
        (ids int64 [n, k] (-1 past the store), sims float64 [n, k]), best first, ties to the lower
        id. The query blocks (QUERY_BLOCK rows) are shared out over comm's ranks and all gathered.
        probes: the points of each query's `probes` nearest cells only (`cells`; --lsh), else all."""
        Hq = unit_rows(Hq)
        if Hq.shape[1] != self.width:
            raise ValueError(f"queries have {Hq.shape[1]} hidden units but the hidden neighbours hold {self.width}")
        n = Hq.shape[0]
        size, rank = (1, 0) if comm is None else (comm.size, comm.rank)
        blocks = -(-n // QUERY_BLOCK)
        per = -(-blocks // size) * QUERY_BLOCK if n else 0
        lo, hi = min(n, rank * per), min(n, (rank + 1) * per)
        ids = np.full((per if size > 1 else n, k), -1, np.int64)
        sims = np.full(ids.shape, -np.inf)
        H = self.arrays["H"]
        if probes is not None and hi > lo:
            C, ptr, pts, Hc = self.cells()
            for s in range(lo, hi, QUERY_BLOCK):
                e = min(hi, s + QUERY_BLOCK)
                cell_search(Hq[s:e], Hc, C, ptr, pts, probes, ids[s - lo:e - lo], sims[s - lo:e - lo])
        else:
            zero = np.zeros(H.shape[0], np.float32)
            for s in range(lo, hi, QUERY_BLOCK):
                e = min(hi, s + QUERY_BLOCK)
                sims[s - lo:e - lo], ids[s - lo:e - lo] = blocked_topk(Hq[s:e], H, zero, k, 0)
        if size == 1:
            return ids, sims
        all_ids = comm.allgather_rows(ids, kind="evaluation").reshape(size * per, k)[:n]
        all_sims = comm.allgather_rows(sims, kind="evaluation").reshape(size * per, k)[:n]
        return np.ascontiguousarray(all_ids), np.ascontiguousarray(all_sims)

    def fuse(self, b_ids, b_p, nn_ids, nn_sims, power: float, weight: float, k: int) -> tuple[np.ndarray, np.ndarray]:
        """`fuse` of the base scores (b_ids int64 [n, K], b_p float64 [n, K]) with the neighbours'
        votes: (ids int64 [n, k], scores float64 [n, k])."""
        n = b_ids.shape[0]
        out_ids = np.empty((n, k), np.int64)
        out_scores = np.empty((n, k), np.float64)
        fuse(np.ascontiguousarray(b_ids, np.int64), np.ascontiguousarray(b_p, np.float64),
             np.ascontiguousarray(nn_ids, np.int64), np.ascontiguousarray(nn_sims, np.float64),
             self.arrays["y_ptr"], self.arrays["y_idx"], float(power), float(weight), out_ids, out_scores)
        return out_ids, out_scores

    def grid_hits(self, b_ids, b_p, nn_ids, nn_sims, power: float, weights, truth: sp.csr_matrix, k: int) -> np.ndarray:
        """`grid_hits` for the weights: uint8 [len(weights), n, k]."""
        n = b_ids.shape[0]
        out = np.zeros((len(weights), n, k), np.uint8)
        grid_hits(np.ascontiguousarray(b_ids, np.int64), np.ascontiguousarray(b_p, np.float64),
                  np.ascontiguousarray(nn_ids, np.int64), np.ascontiguousarray(nn_sims, np.float64),
                  self.arrays["y_ptr"], self.arrays["y_idx"], float(power), np.asarray(weights, np.float64),
                  truth.indptr.astype(np.int64), truth.indices.astype(np.int32), out)
        return out
