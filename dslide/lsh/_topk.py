"""The fixed-size top-k buffer that the re-ranking and graph kernels keep per query.

A buffer is row r of two arrays, scores top_s [., k] and ids top_i [., k],
holding `size` entries (size <= k) sorted best first in the order

    (s1, i1) before (s2, i2)  <=>  s1 > s2  or  (s1 == s2 and i1 < i2),

larger score first, ties to the lower id. `push_top` inserts one candidate
by shifting the entries it beats one slot down; a full buffer drops its last
entry, or the candidate when that ranks after the last (a tie with the last
entry keeps the lower id). A buffer prefilled with (-inf, -1) and pushed with
size = k always keeps the k best of what it was offered, padding included.

The helpers are inlined (numba IR) into the kernels that call them
(lsh.rerank, lsh.neighbors), whose cache entries do not see an edit here:
touch those files after changing this one.
"""

from __future__ import annotations

from numba import njit


@njit(inline="always")
def better(s1, i1, s2, i2):
    """Score s1 of id i1 ranks before s2 of i2: larger first, ties to the lower id."""
    return s1 > s2 or (s1 == s2 and i1 < i2)


@njit(inline="always")
def push_top(top_s, top_i, r, size, k, v, j):
    """Insert score v of id j into row r of the sorted top-k buffer (top_s, top_i) that holds
    `size` entries; returns the new size (min(size + 1, k)). Needs k >= 1."""
    if size == k:
        t = k - 1
        # (spelt out rather than `not better(...)`: a NaN score is let in, as it always was)
        if v < top_s[r, t] or (v == top_s[r, t] and j > top_i[r, t]):
            return size
    else:
        t = size
        size += 1
    while t > 0 and better(v, j, top_s[r, t - 1], top_i[r, t - 1]):
        top_s[r, t] = top_s[r, t - 1]
        top_i[r, t] = top_i[r, t - 1]
        t -= 1
    top_s[r, t] = v
    top_i[r, t] = j
    return size
