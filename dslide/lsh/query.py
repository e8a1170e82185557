"""Queries of hash tables in the flat layouts: per query, what its L buckets hold.

A query's codes int32 [n, L] name one bucket per table; `run_query` returns
(indptr int64 [n + 1], ids int32, counts int32): query q's ids are
ids[indptr[q]:indptr[q + 1]], counts the number of its L buckets holding each.
By mode:

    union       every id found in any of the query's buckets, by id ascending
    topk        the m ids of highest count, by (count desc, id asc)
    threshold   the ids of count >= t, by (count desc, id asc)

The kernels read either layout through
`bucket_span`: fixed-capacity buckets (lsh.tables.HashTables) or compact ones
(lsh.compact.CompactTables). Queries run in parallel over chunks of queries,
each chunk with its own counter row, so results do not depend on the number
of threads.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from ._common import check_int

MODES = ("union", "topk", "threshold")
_UNION, _TOPK, _THRESHOLD = 0, 1, 2


@njit(cache=True, inline="always")
def bucket_span(flat_stride, offsets, fill, l, b):
    """(start in the flat id array, length) of bucket b of table l, in either layout:
    fixed capacity C (flat_stride = NB * C per table, bucket b at b * C, fill[l, b]
    entries) or compact (offsets int32 [L, NB + 1] per table, flat_stride = items per
    table; fill unused)."""
    if offsets.shape[1] > 1:
        o = offsets[l, b]
        return l * flat_stride + o, offsets[l, b + 1] - o
    C = flat_stride // fill.shape[1]
    return l * flat_stride + b * C, fill[l, b]


@njit(cache=True)
def query_bounds(codes, flat_stride, offsets, fill, n_items):
    """bound int64 [n+1]: prefix sums of min(n_items, ids in query q's L buckets),
    an upper bound of each query's output; and the largest single bound."""
    n, L = codes.shape
    bound = np.empty(n + 1, np.int64)
    bound[0] = 0
    max_len = 0
    for q in range(n):
        s = 0
        for l in range(L):
            s += bucket_span(flat_stride, offsets, fill, l, codes[q, l])[1]
        s = min(s, n_items)
        max_len = max(max_len, s)
        bound[q + 1] = bound[q] + s
    return bound, max_len


@njit(cache=True)
def radix_sort_ids(a, b, n, n_bits, digit_hist):
    """Sort the non-negative ids a[:n] ascending; returns the array (a or b) holding them.

    a, b: int32 scratch [>= n] (both overwritten); n_bits: bits of the largest id;
    digit_hist: int64 [2048]. LSD radix sort on 11-bit digits (2 passes for up
    to 2**22 items), insertion sort below 48 elements.
    """
    if n < 48:
        for j in range(1, n):
            v = a[j]
            k = j - 1
            while k >= 0 and a[k] > v:
                a[k + 1] = a[k]
                k -= 1
            a[k + 1] = v
        return a
    src = a
    dst = b
    shift = 0
    while shift < n_bits:
        digit_hist[:] = 0
        for j in range(n):
            digit_hist[(src[j] >> shift) & 2047] += 1
        acc = 0
        for d in range(2048):
            c = digit_hist[d]
            digit_hist[d] = acc
            acc += c
        for j in range(n):
            v = src[j]
            d = (v >> shift) & 2047
            dst[digit_hist[d]] = v
            digit_hist[d] += 1
        t = src
        src = dst
        dst = t
        shift += 11
    return src


@njit(cache=True)
def query_range(q_lo, q_hi, codes, flat, flat_stride, offsets, fill, cnt, id_bits, mode, top_m, t, bound,
                max_len, tmp_ids, tmp_cnt, sizes):
    """Serial work of `query_kernel` for queries q_lo..q_hi-1: writes query q's
    result to tmp_ids / tmp_cnt[bound[q]:bound[q] + sizes[q]].

    flat: every table's ids in one int32 array, read through `bucket_span`.
    cnt: all-zero counter [n_items] (uint8/uint16/int32, wide enough for L),
    left all-zero on return: only the ids a query touched are reset.
    """
    L = codes.shape[1]
    buf_a = np.empty(max_len, np.int32)
    buf_b = np.empty(max_len, np.int32)
    digit_hist = np.empty(2048, np.int64)
    pos = np.empty(L + 1, np.int64)
    for q in range(q_lo, q_hi):
        nt = 0
        for l in range(L):
            o, f = bucket_span(flat_stride, offsets, fill, l, codes[q, l])
            for s in range(f):
                i = flat[o + s]
                if cnt[i] == 0:
                    buf_a[nt] = i
                    nt += 1
                cnt[i] += 1
        start = bound[q]
        if mode == _UNION:
            srt = radix_sort_ids(buf_a, buf_b, nt, id_bits, digit_hist)
            for j in range(nt):
                i = srt[j]
                tmp_ids[start + j] = i
                tmp_cnt[start + j] = cnt[i]
                cnt[i] = 0
            sizes[q] = nt
            continue
        pos[:] = 0
        for j in range(nt):
            pos[cnt[buf_a[j]]] += 1
        if mode == _THRESHOLD:
            cmin = t
        else:
            # Smallest count c* such that at least top_m ids have count >= c*
            # (1 when fewer ids were found): only those can make the top top_m.
            cmin = 1
            acc = 0
            for cc in range(L, 0, -1):
                acc += pos[cc]
                if acc >= top_m:
                    cmin = cc
                    break
        # Drop (and reset) the ids below c* before sorting: fewer to sort.
        kept = 0
        for j in range(nt):
            i = buf_a[j]
            if cnt[i] >= cmin:
                buf_b[kept] = i
                kept += 1
            else:
                cnt[i] = 0
        srt = radix_sort_ids(buf_b, buf_a, kept, id_bits, digit_hist)
        # (count desc, id asc): a stable counting sort by count of the id-sorted list.
        acc = 0
        for cc in range(L, cmin - 1, -1):
            c = pos[cc]
            pos[cc] = acc
            acc += c
        k = min(acc, top_m) if mode == _TOPK else acc
        for j in range(kept):
            i = srt[j]
            c = cnt[i]
            cnt[i] = 0
            p = pos[c]
            pos[c] = p + 1
            if p < k:
                tmp_ids[start + p] = i
                tmp_cnt[start + p] = c
        sizes[q] = k


@njit(cache=True)
def compact_results(bound, sizes, tmp_ids, tmp_cnt):
    n = sizes.shape[0]
    indptr = np.empty(n + 1, np.int64)
    indptr[0] = 0
    for q in range(n):
        indptr[q + 1] = indptr[q] + sizes[q]
    ids = np.empty(indptr[n], np.int32)
    counts = np.empty(indptr[n], np.int32)
    for q in range(n):
        ids[indptr[q]:indptr[q + 1]] = tmp_ids[bound[q]:bound[q] + sizes[q]]
        counts[indptr[q]:indptr[q + 1]] = tmp_cnt[bound[q]:bound[q] + sizes[q]]
    return indptr, ids, counts


@njit(parallel=True, cache=True)
def query_kernel(codes, flat, flat_stride, offsets, fill, counters, id_bits, mode, top_m, t):
    """Candidates of each query from its L buckets.

    codes int32 [n, L] (query q looks at bucket codes[q, l] of table l); the
    buckets as `bucket_span` reads them: fixed capacity (flat = buckets
    int32 [L, NB, C] flattened, flat_stride = NB * C, fill int32 [L, NB],
    offsets [1, 1]) or compact (lsh.compact). For each query, count[id] =
    number of tables whose bucket holds id; keep
      union:     every id with count >= 1, sorted by id ascending;
      topk:      the top_m ids by (count desc, id asc), in that order;
      threshold: ids with count >= t, by (count desc, id asc).
    Returns (indptr int64 [n+1], ids int32 [nnz], counts int32 [nnz]).

    counters: all-zero [n_chunks, n_items] (uint8 when L < 256: a small
    counter array stays in cache); each of the n_chunks query ranges runs on
    one thread with its own row, reset only at the ids it touched (no
    O(n_items) work per query). id_bits: bit length of n_items - 1 (radix
    sort passes). Results do not depend on n_chunks or the thread count.
    """
    n = codes.shape[0]
    n_chunks, n_items = counters.shape
    bound, max_len = query_bounds(codes, flat_stride, offsets, fill, n_items)
    tmp_ids = np.empty(bound[n], np.int32)
    tmp_cnt = np.empty(bound[n], np.int32)
    sizes = np.zeros(n, np.int64)
    for c in prange(n_chunks):
        query_range(c * n // n_chunks, (c + 1) * n // n_chunks, codes, flat, flat_stride, offsets, fill,
                    counters[c], id_bits, mode, top_m, t, bound, max_len, tmp_ids, tmp_cnt, sizes)
    return compact_results(bound, sizes, tmp_ids, tmp_cnt)


def run_query(tables, codes, mode, m, t, flat, flat_stride, offsets, fill):
    """`query_codes` of either layout (tables: its checks and sizes; the rest: `bucket_span`)."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {', '.join(MODES)}")
    top_m, thr = 0, 0
    if mode == "topk":
        if m is None:
            raise ValueError("mode 'topk' needs m (how many ids to keep per query), m >= 1")
        top_m = check_int("m", m, 1, 2**31 - 1)
    elif m is not None:
        raise ValueError(f"m is only used by mode 'topk', not {mode!r}")
    if mode == "threshold":
        if t is None:
            raise ValueError(f"mode 'threshold' needs t (minimum count), 1 <= t <= L={tables.L}")
        thr = check_int("t", t, 1, tables.L)
    elif t is not None:
        raise ValueError(f"t is only used by mode 'threshold', not {mode!r}")
    codes = tables._check_codes(codes, "codes")
    if tables.n_items == 0:
        raise ValueError("the tables are empty: call build(W) before querying")
    n = codes.shape[0]
    # A few chunks per thread balance uneven queries; each chunk owns a counter row.
    n_chunks = max(1, min(n, 4 * numba.get_num_threads()))
    cdtype = np.uint8 if tables.L < 2**8 else np.uint16 if tables.L < 2**16 else np.int32
    counters = np.zeros((n_chunks, tables.n_items), cdtype)
    id_bits = max(1, (tables.n_items - 1).bit_length())
    with numba.parallel_chunksize(1):
        return query_kernel(codes, flat, flat_stride, offsets, fill, counters, id_bits,
                            MODES.index(mode), top_m, thr)
