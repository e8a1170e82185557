"""Posting lists moved between their two orders: by row (a CSR matrix's) and by column.

A store's posting lists (dslide.infer.fusion) are by feature, its label
prototypes are summed by label, and the bounded search (dslide.infer.approx)
re-ranks candidates by their rows: `transpose_lists` moves entries from one
order to the other, in parallel, the values untouched; `work_cuts` cuts items
into contiguous ranges of about equal work, for threads and for ranks;
`row_dot` is a query's float32 dot product with one row, in the order of the
exact search's accumulator (inlined into the kernels that re-rank by rows,
whose cache entries do not see an edit here: touch them after changing it).
"""

from __future__ import annotations

import numpy as np
from numba import get_num_threads, njit, prange

from dslide import _numba_cache  # noqa: F401  (before any kernel: the cache is keyed by module name)


@njit(cache=True, inline="always")
def row_dot(q_idx, q_val, a, a1, r_idx, r_val, r, r1):
    """The query entries a..a1 (features ascending) dot the row entries r..r1 (features
    ascending) over the features both hold, summed in float32 in the query's feature order:
    the exact search's accumulator for that point, bit for bit."""
    s = np.float32(0.0)
    while a < a1 and r < r1:
        if q_idx[a] == r_idx[r]:
            s += q_val[a] * r_val[r]
            a += 1
            r += 1
        elif q_idx[a] < r_idx[r]:
            a += 1
        else:
            r += 1
    return s


def work_cuts(work: np.ndarray, parts: int) -> np.ndarray:
    """int64 [parts + 1]: contiguous ranges of the items (work float/int [n], each item's work)
    of about equal work, from 0 to n (a range may be empty)."""
    total = np.concatenate(([0], np.cumsum(work, dtype=np.float64)))
    cuts = np.searchsorted(total, np.arange(parts + 1) * (total[-1] / max(1, parts)), side="left")
    cuts = cuts.clip(0, work.shape[0]).astype(np.int64)
    cuts[0], cuts[-1] = 0, work.shape[0]
    return np.maximum.accumulate(cuts)


@njit(cache=True, parallel=True)
def _chunk_counts(ptr, idx, cuts, counts):
    """counts[c, j] += the entries of column j in rows cuts[c] <= r < cuts[c + 1]."""
    for c in prange(cuts.shape[0] - 1):
        for a in range(ptr[cuts[c]], ptr[cuts[c + 1]]):
            counts[c, idx[a]] += 1


@njit(cache=True, parallel=True)
def _scatter(ptr, idx, val, cuts, offsets, out_rows, out_val):
    """Each chunk's entries to their columns, from offsets[c, j] on, rows ascending."""
    for c in prange(cuts.shape[0] - 1):
        nxt = offsets[c].copy()
        for r in range(cuts[c], cuts[c + 1]):
            for a in range(ptr[r], ptr[r + 1]):
                j = idx[a]
                o = nxt[j]
                out_rows[o] = r
                out_val[o] = val[a]
                nxt[j] = o + 1


def transpose_lists(ptr, idx, val, n_cols: int):
    """The lists by column of lists by row (ptr int64 [n + 1], idx int < n_cols, val [nnz]):
    (ptr int64 [n_cols + 1], rows int32 ascending per column, val alike), the values moved,
    never summed (a CSR matrix's CSC, without duplicates merged). Each thread takes a
    contiguous row range of about equal entries and its own slots of every column (a count
    per thread and column: one range per thread, not more)."""
    n = ptr.shape[0] - 1
    cuts = work_cuts(np.diff(ptr), max(1, min(n, get_num_threads())))
    counts = np.zeros((cuts.shape[0] - 1, int(n_cols)), np.int64)
    _chunk_counts(ptr, idx, cuts, counts)
    new_ptr = np.zeros(int(n_cols) + 1, np.int64)
    np.cumsum(counts.sum(axis=0), out=new_ptr[1:])
    offsets = new_ptr[:-1][None, :] + np.cumsum(counts, axis=0) - counts
    out_rows = np.empty(ptr[-1], np.int32)
    out_val = np.empty(ptr[-1], val.dtype)
    _scatter(ptr, idx, val, cuts, offsets, out_rows, out_val)
    return new_ptr, out_rows, out_val
