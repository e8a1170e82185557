"""Approximate nearest training points (and label prototypes) of a sparse query: pruned posting lists, re-ranked exactly.

The exact search (dslide.infer.fusion.search) reads, for each feature of a
query, every training point holding it: a common feature's posting list
grows with the training set, and so does the search. This one bounds what a
query reads, whatever the number of training points (the static pruning of
Seismic, Bruch et al. 2024, over L2-normalised rows):

    candidates(q) = the `candidates` points of largest
                    sum_{f in top_f(q)} q_f x_f   over the pruned lists,
    neighbours(q) = the k of candidates(q) of largest q . x (exact cosine),

where top_f(q) is the query's `query_features` largest features and a
pruned list keeps, for each feature, the `postings` points of largest value
of it. A query reads at most query_features x postings posting entries and
`candidates` training rows: a bound in the settings, not in the training
points. The similarities it returns are the exact ones (summed in the same
order as the exact kernel's, so bit for bit the same float32); what it may
miss is a point whose overlap with the query lies in the pruned-away tail.
scripts/bench_lsh.py --fused measures the recall against the exact search.

The pruned lists and the training rows (CSR, the store's transpose) are
derived from the store's posting lists when first needed (`ApproxPostings.of`),
not saved: a model of any age gets them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import get_num_threads, njit, prange

from dslide import _numba_cache  # noqa: F401  (before any kernel: the cache is keyed by module name)
from dslide.config.rules import APPROX_CANDIDATES, APPROX_FEATURES, APPROX_POSTINGS
from dslide.infer.lists import row_dot, transpose_lists
from dslide.lsh._topk import better, push_top
from dslide.lsh.neighbors import _pop, _push

#: the defaults of a fused `--lsh` prediction's search: points kept per feature, the query's
#: features searched, the candidates re-ranked exactly (the settings approx_postings,
#: approx_features, approx_candidates; scripts/bench_lsh.py --fused)
POSTINGS = APPROX_POSTINGS
QUERY_FEATURES = APPROX_FEATURES
CANDIDATES = APPROX_CANDIDATES


@dataclass(frozen=True)
class Bound:
    """What one query of the pruned search reads: `postings` points kept per feature (the
    pruned lists), its `query_features` largest features, `candidates` re-ranked exactly."""

    postings: int = POSTINGS
    query_features: int = QUERY_FEATURES
    candidates: int = CANDIDATES

    @classmethod
    def of(cls, config) -> "Bound":
        """The bound of a configuration's approx_* settings."""
        return cls(config.approx_postings, config.approx_features, config.approx_candidates)


@njit(cache=True, parallel=True)
def search_pruned(q_ptr, q_idx, q_val, pp_ptr, pp_pt, pp_val, r_ptr, r_idx, r_val, n_points, k, n_cand, n_feat,
                  n_chunks, perm, out_ids, out_sims, out_read):
    """The k points of largest q . x among each query's candidates (module docstring).

    q_*: CSR of the queries (int64 ptr [n + 1], int32 idx sorted per row, float32 val:
    L2-normalised rows); pp_*: the pruned posting lists (int64 ptr [F + 1], int32 point ids,
    float32 values); r_*: the points' rows (CSR: int64 ptr [n_points + 1], int32 feature ids
    sorted per row, float32 values); n_cand candidates from the query's n_feat largest
    features; perm int32 [n_points]: the id each point stands for (empty: its own).
    out_ids int32 [n, k] (-1 where fewer), out_sims float32 [n, k], best first, ties to the
    lower id; out_read int64 [n]: posting entries and row entries read per query.
    """
    n = q_ptr.shape[0] - 1
    mapped = perm.shape[0] > 0
    for c in prange(n_chunks):
        acc = np.zeros(n_points, np.float32)
        seen = np.zeros(n_points, np.uint8)
        touched = np.empty(n_points, np.int32)
        cid = np.empty(n_cand, np.int32)
        csim = np.empty(n_cand, np.float32)
        lo = c * n // n_chunks
        hi = (c + 1) * n // n_chunks
        for q in range(lo, hi):
            a0, a1 = q_ptr[q], q_ptr[q + 1]
            # the query's n_feat largest features (ties: lower feature first)
            order = np.argsort(-q_val[a0:a1], kind="mergesort")[:n_feat]
            m = 0
            read = 0
            for t in range(order.shape[0]):
                a = a0 + order[t]
                f = q_idx[a]
                v = q_val[a]
                read += pp_ptr[f + 1] - pp_ptr[f]
                for b in range(pp_ptr[f], pp_ptr[f + 1]):
                    p = pp_pt[b]
                    if seen[p] == 0:
                        seen[p] = 1
                        touched[m] = p
                        m += 1
                    acc[p] += v * pp_val[b]
            # the n_cand best by the pruned sums: a heap, worst on top (their order does not matter)
            nc = 0
            for t in range(m):
                p = touched[t]
                s = acc[p]
                acc[p] = 0.0
                seen[p] = 0
                if nc < n_cand:
                    nc = _push(csim, cid, nc, s, p, False)
                elif better(s, p, csim[0], cid[0]):
                    nc = _pop(csim, cid, nc, False)
                    nc = _push(csim, cid, nc, s, p, False)
            out_ids[q, :] = -1
            out_sims[q, :] = -np.inf
            size = 0
            for t in range(nc):
                p = cid[t]
                # q . x_p over the features both hold, in the query's feature order: the same
                # float32 sum as the exact kernel's accumulator
                read += r_ptr[p + 1] - r_ptr[p]
                s = row_dot(q_idx, q_val, a0, a1, r_idx, r_val, r_ptr[p], r_ptr[p + 1])
                size = push_top(out_sims, out_ids, q, size, k, s, perm[p] if mapped else p)
            out_read[q] = read


@njit(cache=True, parallel=True)
def _prune(ptr, ids, val, cap, new_ptr, out_ids, out_val):
    """Kernel of `prune`: new_ptr int64 [F + 1] (its cumulated min(length, cap)) given."""
    F = ptr.shape[0] - 1
    for f in prange(F):
        a, b, o = ptr[f], ptr[f + 1], new_ptr[f]
        if b - a <= cap:
            out_ids[o:o + b - a] = ids[a:b]
            out_val[o:o + b - a] = val[a:b]
            continue
        # the cap largest values, ties to the lower id (the list is in id order), in id order:
        # every value above the cap-th largest, then as many equal to it as are left, first first
        neg = -val[a:b]
        cut = np.partition(neg, cap - 1)[cap - 1]
        ties = cap - np.count_nonzero(neg < cut)  # the entries equal to the cut that fit
        for i in range(b - a):
            if neg[i] < cut or (neg[i] == cut and ties > 0):
                ties -= neg[i] == cut
                out_ids[o] = ids[a + i]
                out_val[o] = val[a + i]
                o += 1


def prune(ptr, ids, val, cap: int):
    """Posting lists (ptr int64 [F + 1], ids int32 ascending per list, val float32) keeping, per
    feature, the cap entries of largest value (ties: lower id), in id order: (ptr, ids, val) alike."""
    new_ptr = np.zeros(ptr.shape[0], np.int64)
    np.cumsum(np.minimum(np.diff(ptr), cap), out=new_ptr[1:])
    out_ids = np.empty(new_ptr[-1], np.int32)
    out_val = np.empty(new_ptr[-1], np.float32)
    _prune(ptr, ids, val, int(cap), new_ptr, out_ids, out_val)
    return new_ptr, out_ids, out_val


def transpose(ptr, ids, val, n_items: int):
    """The rows of posting lists (ptr int64 [F + 1], ids int32 < n_items, val float32): CSR
    (ptr int64 [n_items + 1], feature ids int32 ascending per row, values float32)."""
    return transpose_lists(ptr, ids, np.ascontiguousarray(val, np.float32), n_items)


class ApproxPostings:
    """One set of posting lists (the store's points, or its label prototypes) ready for
    `search_pruned`: the pruned lists and the rows. n_items: the items the ids run over;
    perm int32 [n_items]: the id each stands for (empty: its own); rows: the lists' transpose
    where already derived (NeighbourLabels.rows), else derived here."""

    def __init__(self, ptr, ids, val, n_items: int, perm, postings: int = POSTINGS, rows=None):
        self.n_items = int(n_items)
        self.pruned = prune(ptr, ids, val, postings)
        self.rows = transpose(ptr, ids, val, self.n_items) if rows is None else rows
        self.perm = perm
        self.postings = postings

    def search(self, Xq, k: int, query_features: int = QUERY_FEATURES, candidates: int = CANDIDATES):
        """(ids int32 [n, k], sims float32 [n, k], entries read int64 [n]) of the L2-normalised
        query rows Xq (CSR, sorted indices): `search_pruned`."""
        n = Xq.shape[0]
        ids = np.full((n, k), -1, np.int32)
        sims = np.full((n, k), -np.inf, np.float32)
        read = np.zeros(n, np.int64)
        if n:
            search_pruned(Xq.indptr.astype(np.int64), Xq.indices.astype(np.int32), Xq.data, *self.pruned,
                          *self.rows, self.n_items, int(k), max(int(k), int(candidates)), max(1, int(query_features)),
                          min(n, 4 * get_num_threads()), self.perm, ids, sims, read)
        return ids, sims, read
