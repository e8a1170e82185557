"""Top k over neurons split over ranks, and the one order of tied scores.

Everywhere in dslide (the ids of predict, the prediction files, dslide.metrics) a
ranking is by score descending and, on equal scores, by label id ascending:
`best_columns` is that order for a score block, `merge_topk` for candidates.

    best_columns   the k best columns of each row of a score block, in that order
    blocked_topk   exact: every neuron of a rank's slice scored, column block by block
    blocked_topk_biases
                   the same under several bias vectors, the products made once
    merge_topk     the ranks' candidates merged into the global top k
    order_keys, kth_largest
                   a k-th largest score agreed across ranks (bisection over integer
                   keys that order like the float32 scores), for a threshold every
                   rank applies to its own slice
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from dslide.comm import Comm
from dslide.lsh._topk import better, push_top

#: the most a tile of exact scoring may take, its scores. Evaluation runs with every weight
#: and moment resident, so the tile stays small whatever the batch
EXACT_BLOCK_BYTES = 32 << 20
#: the rows of blocked_topk's tiles
TILE_ROWS = 256


def blocked_topk(x, Wn, b, k, lo, block=8192):
    """Top k of x @ Wn^T + b per row, over tiles of rows and columns (`tile`); (scores float64
    [B, k], ids int64 [B, k]).

    x float [B, d] dense or a scipy CSR matrix; Wn float [n, d] neuron-major.
    Ties go to the lower id.
    """
    return blocked_topk_biases(x, Wn, [b], k, lo, block)[0]


def blocked_topk_biases(x, Wn, biases, k, lo, block=8192):
    """`blocked_topk` under each bias vector of `biases` (float [n] each), a tile's products made
    once for all of them: a list of (scores, ids), the j-th what blocked_topk(x, Wn, biases[j], k,
    lo, block) gives, bit for bit (the same products, the same additions)."""
    B = x.shape[0]
    n = Wn.shape[0]
    best = [_none(B, k) for _ in biases]
    rows, cols = tile(B, n, k, np.dtype(Wn.dtype).itemsize, block)
    for r0 in range(0, B, rows):
        r1 = min(B, r0 + rows)
        xr = x[r0:r1]
        parts = [(bs[0][r0:r1], bs[1][r0:r1]) for bs in best]
        for c0 in range(0, n, cols):
            c1 = min(n, c0 + cols)
            p = np.asarray(xr @ Wn[c0:c1].T)
            for j, b in enumerate(biases):
                s = p if j == len(biases) - 1 else p.copy()  # the last one takes the products' own
                s += b[c0:c1]
                parts[j] = _merge_block(parts[j], s, k, c0 + lo)
        for bs, part in zip(best, parts):
            bs[0][r0:r1], bs[1][r0:r1] = part
    return best


def tile(B: int, n: int, k: int, item: int, block: int = 8192) -> tuple[int, int]:
    """(rows, columns) of blocked_topk's tiles of B x n scores of `item` bytes. A top k of at
    least FLOOR_MIN_K goes through `_push_floor`, which wants long rows: tiles of TILE_ROWS rows
    (a block of the weights serves them all while it is in cache) by at most `block` columns.
    A smaller one through `_push_block`: every row by at most `block` columns, within
    EXACT_BLOCK_BYTES counted at 12 bytes an entry (the layout it was tuned on). At least k
    columns either way."""
    if k >= FLOOR_MIN_K:
        rows = max(1, min(B, TILE_ROWS))
        return rows, max(1, min(n, max(k, min(block, EXACT_BLOCK_BYTES // (rows * item)))))
    return max(1, B), max(1, min(n, max(k, min(block, EXACT_BLOCK_BYTES // (12 * max(1, B))))))


def scores_topk(s, k, lo):
    """Top k per row of the scores s float [B, m] of neurons lo..lo+m-1: (scores float64
    [B, k], ids int64 [B, k]), ties to the lower id, -inf and -1 past m."""
    return _merge_block(_none(s.shape[0], k), s, k, lo)


def _none(B: int, k: int):
    return np.full((B, k), -np.inf), np.full((B, k), -1, dtype=np.int64)


def best_columns(B: np.ndarray, k: int) -> np.ndarray:
    """Columns of the k largest entries of each row of B, by (value desc, column asc).

    B: float [c, m] without NaN, 1 <= k <= m. Returns int64 [c, k], best first.
    O(m) per row (a partition), plus O(m) extra only for rows whose k-th value is tied
    across the cut.
    """
    m = B.shape[1]
    # the k largest sit at the end after partitioning at m - k (no negated copy of B)
    cols = np.argpartition(B, m - k, axis=1)[:, m - k:]
    v = np.take_along_axis(B, cols, axis=1).min(axis=1)
    # argpartition picks the right multiset of values but an arbitrary subset of the
    # entries equal to the cut value v: redo the rows where the entries >= v overflow k
    # (a tie straddles the cut), keeping the lowest columns of the tie
    straddle = np.flatnonzero(np.count_nonzero(B >= v[:, None], axis=1) > k)
    if straddle.size:
        Bs, vs = B[straddle], v[straddle, None]
        above = Bs > vs
        at = Bs == vs
        need = k - np.count_nonzero(above, axis=1)
        take = above | (at & (np.cumsum(at, axis=1, dtype=np.int32) <= need[:, None]))
        cols[straddle] = np.nonzero(take)[1].reshape(straddle.size, k)
    cols = np.sort(cols, axis=1)
    # stable on columns already ascending: equal values keep the lower column first
    order = np.argsort(-np.take_along_axis(B, cols, axis=1), axis=1, kind="stable")
    return np.take_along_axis(cols, order, axis=1).astype(np.int64, copy=False)


def _merge_block(best, s, k, first):
    """The top k of `best` (scores, ids [B, k]) and of the block s [B, c] of neurons first..;
    ties to the lower id, also where a tie straddles the k-th place."""
    top_s = np.array(best[0], dtype=np.float64, order="C")
    top_i = np.array(best[1], dtype=np.int64, order="C")
    s = np.ascontiguousarray(s)
    g = min(FLOOR_GROUP, s.shape[1] // max(1, k))
    if k >= FLOOR_MIN_K and g >= FLOOR_MIN_GROUP:
        _push_floor(top_s, top_i, s, int(first), g)
    else:
        _push_block(top_s, top_i, s, int(first))
    return top_s, top_i


#: columns `_push_block` tests at once against a row's k-th score before it looks at them one by one
SCAN_RUN = 16
#: `_push_floor` splits a row's c columns into FLOOR_GROUP groups of every (c // FLOOR_GROUP)-th
#: column; it serves a top k of at least FLOOR_MIN_K over blocks of at least FLOOR_MIN_GROUP * k
#: columns (fewer groups than that hardly bound the k-th score), `_push_block` the rest: for a
#: small k its one-by-one offers are already few, and its pass over the scores cheaper
FLOOR_GROUP = 16
FLOOR_MIN_GROUP = 4
FLOOR_MIN_K = 32
#: the histogram of the group maxima that places the floor
FLOOR_BINS = 64
#: rows a thread takes at once (its scratch arrays made once for them)
FLOOR_ROWS = 16


@njit(cache=True)
def _floor(mx, k, cnt, bmin):
    """A score of mx [m] (group maxima, no NaN, m >= k) at most the k-th largest of them: the
    least maximum in the highest histogram bin where the bins from the top hold k maxima.
    The bins are monotone in the score, so every maximum of a higher bin is larger than it:
    k maxima, each the score of a distinct column, are at least as large. cnt int64, bmin
    float64 [FLOOR_BINS]: scratch."""
    m = mx.shape[0]
    lo = np.float64(mx[0])
    hi = lo
    for j in range(m):
        v = np.float64(mx[j])
        lo = v if v < lo else lo
        hi = v if v > hi else hi
    span = hi - lo
    if not (span < np.inf) or span == 0.0:  # an infinite maximum, or every maximum equal
        return lo
    scale = (FLOOR_BINS - 1) / span
    for b in range(FLOOR_BINS):
        cnt[b] = 0
        bmin[b] = np.inf
    for j in range(m):
        v = np.float64(mx[j])
        b = min(int((v - lo) * scale), FLOOR_BINS - 1)
        cnt[b] += 1
        bmin[b] = v if v < bmin[b] else bmin[b]
    total = 0
    for b in range(FLOOR_BINS - 1, -1, -1):
        total += cnt[b]
        if total >= k:
            return bmin[b]
    return lo


@njit(cache=True)
def _merge_sorted(top_s, top_i, r, cs, ci, n, out_s, out_i):
    """Row r of (top_s, top_i) [., k], sorted: the k best of itself and the n candidates
    (cs float64, ci int64; ids ascending, no NaN), in the buffer's order. out_s, out_i [k]: scratch."""
    k = top_s.shape[1]
    order = np.argsort(-cs[:n], kind="mergesort")  # stable: equal scores keep the lower id first
    a = 0
    b = 0
    for t in range(k):
        if b < n and (a == k or not better(top_s[r, a], top_i[r, a], cs[order[b]], ci[order[b]])):
            out_s[t] = cs[order[b]]
            out_i[t] = ci[order[b]]
            b += 1
        else:
            out_s[t] = top_s[r, a]
            out_i[t] = top_i[r, a]
            a += 1
    for t in range(k):
        top_s[r, t] = out_s[t]
        top_i[r, t] = out_i[t]


@njit(parallel=True, cache=True)
def _push_floor(top_s, top_i, s, first, g):
    """`_push_block`'s result (every score of the block s [B, c] offered to row r's sorted top-k
    buffer) from fewer looks: the c columns fall in g groups of every (c // g)-th column (the
    last c % g columns in none); the k-th largest group maximum is at most the k-th score, so
    only groups whose maximum reaches it can hold a top-k score, and only their scores that
    reach it are sorted and merged with the buffer. The top k of a set in the buffer's order
    does not depend on the order its scores come in; a row with a NaN (in the block or the
    buffer), whose place does, is offered score by score as push_top takes them. Rows split
    over threads: the result does not depend on the thread count. g * k <= c."""
    B, k = top_s.shape
    c_end = s.shape[1]
    m = c_end // g
    body = g * m
    chunks = (B + FLOOR_ROWS - 1) // FLOOR_ROWS
    for q in prange(chunks):
        mx = np.empty(m, s.dtype)
        pick = np.empty(m, np.int64)
        cs = np.empty(c_end)
        ci = np.empty(c_end, np.int64)
        out_s = np.empty(k)
        out_i = np.empty(k, np.int64)
        cnt = np.empty(FLOOR_BINS, np.int64)
        bmin = np.empty(FLOOR_BINS)
        for r in range(q * FLOOR_ROWS, min(B, (q + 1) * FLOOR_ROWS)):
            row = s[r]
            mx[:] = row[:m]
            for i in range(1, g):
                seg = row[i * m:(i + 1) * m]
                for j in range(m):
                    # np.maximum keeps a NaN and stores every entry: a conditional store (`a if a >
                    # v else v`) compiles to masked stores, microcoded on some CPUs (several times
                    # slower on AMD's)
                    mx[j] = np.maximum(seg[j], mx[j])
            nan = False
            for t in range(k):
                nan |= top_s[r, t] != top_s[r, t]
            for j in range(m):
                nan |= mx[j] != mx[j]
            for c in range(body, c_end):
                nan |= row[c] != row[c]
            if nan:
                _offer_row(top_s, top_i, r, row, first)
                continue
            floor = _floor(mx, k, cnt, bmin)
            tk = top_s[r, k - 1]
            last = floor if tk < floor else tk
            n_pick = 0
            for j in range(m):
                if not (np.float64(mx[j]) < last):
                    pick[n_pick] = j
                    n_pick += 1
            n = 0
            for i in range(g):  # ids ascending: column i * m + j
                base = i * m
                for t in range(n_pick):
                    # written whether it is taken or not (n < c_end), no branch to mispredict
                    c = base + pick[t]
                    v = np.float64(row[c])
                    cs[n] = v
                    ci[n] = first + c
                    n += 0 if v < last else 1
            for c in range(body, c_end):
                v = np.float64(row[c])
                if not (v < last):
                    cs[n] = v
                    ci[n] = first + c
                    n += 1
            if n:
                _merge_sorted(top_s, top_i, r, cs, ci, n, out_s, out_i)


@njit(parallel=True, cache=True)
def _push_block(top_s, top_i, s, first):
    """Offer every score of the block s [B, c] (neuron first + column) to row r's sorted top-k
    buffer (top_s, top_i) [B, k] (dslide.lsh._topk order: larger first, ties to the lower id).
    One row per thread (`_offer_row`), columns in order: the result does not depend on the
    thread count."""
    for r in prange(top_s.shape[0]):
        _offer_row(top_s, top_i, r, s[r], first)


@njit(cache=True, inline="always")
def _offer_row(top_s, top_i, r, row, first):
    """Offer every score of row [c] (neuron first + column), in column order, to row r of the
    sorted top-k buffer (top_s, top_i). The common case is a score below the k-th, which push_top
    refuses: runs of SCAN_RUN columns all below it are passed over after one vectorised test (a
    NaN fails it, and is offered as always); a run with any other score is offered column by
    column, as a lone column would be."""
    k = top_s.shape[1]
    c_end = row.shape[0]
    body = c_end - c_end % SCAN_RUN
    size = k
    last = top_s[r, k - 1]
    for c0 in range(0, c_end, SCAN_RUN):
        c1 = c0 + SCAN_RUN
        if c1 <= body:
            below = True
            for c in range(c0, c1):
                below &= np.float64(row[c]) < last
            if below:
                continue
        else:
            c1 = c_end
        for c in range(c0, c1):
            v = np.float64(row[c])
            # one comparison (a tie with the k-th at a higher id is refused by push_top too)
            if v < last:
                continue
            size = push_top(top_s, top_i, r, size, k, v, first + c)
            last = top_s[r, k - 1]


def merge_topk(all_scores, all_ids, k):
    """Merge per-rank candidates [P, B, k] into the global top k per sample (ties: lower id,
    missing candidates, id -1, last). Each rank's rows come best first (blocked_topk,
    scores_topk, an index's top k): a merge of the sorted rows, O(P k) a row; a row out of
    that order or holding a NaN score goes through one full sort instead, to the same result."""
    P, B, kk = all_scores.shape
    if k > P * kk:
        return _sorted_merge(all_scores, all_ids, k)
    s, i = np.ascontiguousarray(all_scores), np.ascontiguousarray(all_ids, dtype=np.int64)
    out_s = np.empty((B, k), dtype=s.dtype)
    out_i = np.empty((B, k), dtype=np.int64)
    ok = np.empty(B, dtype=np.uint8)
    _merge_rows(s, i, out_s, out_i, ok)
    redo = np.flatnonzero(ok == 0)
    if redo.size:
        out_s[redo], out_i[redo] = _sorted_merge(s[:, redo], i[:, redo], k)
    return out_s, out_i


def _sorted_merge(all_scores, all_ids, k):
    """merge_topk by one lexsort of every row's P * k candidates."""
    P, B, kk = all_scores.shape
    s = all_scores.transpose(1, 0, 2).reshape(B, P * kk)
    i = all_ids.transpose(1, 0, 2).reshape(B, P * kk)
    # -inf candidates (missing) sort last; lexsort's last key is primary
    order = np.lexsort((np.where(i < 0, np.iinfo(np.int64).max, i), -s), axis=1)[:, :k]
    return np.take_along_axis(s, order, axis=1), np.take_along_axis(i, order, axis=1)


@njit(cache=True, inline="always")
def _id_key(i):
    """The id's place among equal scores: missing candidates (id < 0) after every label."""
    return np.iinfo(np.int64).max if i < 0 else i


@njit(parallel=True, cache=True)
def _merge_rows(s, ids, out_s, out_i, ok):
    """Per row r: the first k of the P sorted lists (s[p, r], ids[p, r]) merged in merge_topk's
    order into (out_s[r], out_i[r]), k <= P * kk, and ok[r] = 1; ok[r] = 0 (the row left
    unwritten) where a list is out of that order or holds a NaN."""
    P, B, kk = s.shape
    k = out_s.shape[1]
    for r in prange(B):
        good = True
        for p in range(P):
            for j in range(kk):
                v = s[p, r, j]
                if v != v:
                    good = False
                elif j > 0:
                    a = s[p, r, j - 1]
                    if a < v or (a == v and _id_key(ids[p, r, j - 1]) > _id_key(ids[p, r, j])):
                        good = False
        ok[r] = 1 if good else 0
        if not good:
            continue
        head = np.zeros(P, np.int64)
        for t in range(k):
            best = -1
            for p in range(P):
                h = head[p]
                if h == kk:
                    continue
                if best < 0:
                    best = p
                    continue
                v, b = s[p, r, h], s[best, r, head[best]]
                # an equal (score, id) in a later list stays behind: the earlier rank first
                if v > b or (v == b and _id_key(ids[p, r, h]) < _id_key(ids[best, r, head[best]])):
                    best = p
            out_s[r, t] = s[best, r, head[best]]
            out_i[r, t] = ids[best, r, head[best]]
            head[best] += 1


def order_keys(scores, in_place: bool = False) -> np.ndarray:
    """Integer keys that order like the float32 scores (the IEEE bit pattern, sign-folded):
    int64, or with in_place int32 written over the scores' own memory (float32, C-contiguous)."""
    if not in_place:
        i = np.ascontiguousarray(scores, dtype=np.float32).view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF) - 1, i)
    keys = scores.view(np.int32)
    mag = keys & 0x7FFFFFFF
    np.negative(mag, out=mag)
    mag -= 1
    np.copyto(keys, mag, where=keys < 0)
    return keys


def kth_largest(keys, k: int, comm: Comm) -> np.ndarray:
    """Per row, the k-th largest key over every rank's rows keys int64 [A, T_r]:
    the largest t with sum_r |{keys >= t}| >= k (bisection; -2^31 - 1 when fewer
    than k keys exist). Every rank gets the same thresholds."""
    A = keys.shape[0]
    lo = np.full(A, -(2**31) - 1, dtype=np.int64)
    hi = np.full(A, 2**31 - 1, dtype=np.int64)
    if comm.size == 1:
        if keys.shape[1] >= k:
            return np.sort(keys, axis=1)[:, keys.shape[1] - k]
        return lo
    while (lo < hi).any():
        mid = (lo + hi + 1) // 2
        cnt = comm.allreduce_sum((keys >= mid[:, None]).sum(axis=1).astype(np.int64), kind="index")
        ok = cnt >= k
        lo = np.where(ok, mid, lo)
        hi = np.where(ok, hi, mid - 1)
    return lo
