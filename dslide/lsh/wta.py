"""dslide.lsh family "wta": winner-take-all hashing (Yagnik et al. 2011).

Each of the N = K*L hashes h draws its own random permutation of range(dim)
and keeps its first `window` entries perm_h[0..window-1]:

    v_h(x) = argmax_{p < window} x[perm_h[p]]      (first p on ties).

Unlike DWTA there is no densification: an all-zero window gives 0, so plain
WTA suits dense inputs; prefer DWTA for sparse ReLU activations. Table l's
code is sum_k v[l*K+k] * window**k, code_bits = bit_length(window**K - 1).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ._common import HashFamily, check_int, hash_rows, values_rows


@njit(cache=True)
def wta_row_values(x, perm_dims, window, vals):
    """WTA values of one vector. x float32 [dim]; perm_dims int32 [N*window]; vals int32 [N]."""
    for h in range(vals.shape[0]):
        base = h * window
        best = x[perm_dims[base]]
        arg = 0
        for p in range(1, window):
            v = x[perm_dims[base + p]]
            if v > best:
                best = v
                arg = p
        vals[h] = arg


@njit(cache=True)
def _row(X, i, p, scratch, vals):
    """Row kernel of `hash_rows`: row i of X through p = (perm_dims, window)."""
    wta_row_values(X[i], p[0], p[1], vals)


@njit(cache=True)
def wta_values(X, perm_dims, window, n_hashes):
    """Serial: int32 [n, n_hashes] WTA values of X float32 [n, dim]."""
    return values_rows(_row, X, X.shape[0], (perm_dims, window), n_hashes, 0)


@njit(parallel=True, cache=True)
def wta_hash(X, perm_dims, window, K, L, range_pow, code_bits, red_a, red_b):
    """Bucket codes int32 [n, L] of X float32 [n, dim] (parallel over row blocks)."""
    return hash_rows(_row, X, X.shape[0], (perm_dims, window), K, L, window, 0, range_pow, code_bits,
                     red_a, red_b)


class WTA(HashFamily):
    """Winner-take-all family; parameter: window (default 8, 2 <= window <= dim).

    Arrays: perm_dims int32 [K*L*window] (hash h's window is
    perm_dims[h*window:(h+1)*window], distinct dims); red_a, red_b uint64 [L].
    """

    name = "wta"
    PARAMS = ("window",)

    def __init__(self, dim, K, L, seed, window=8):
        super().__init__(dim, K, L, seed)
        self.window = check_int("window", window, 2, self.dim)
        rng = np.random.default_rng(self.seed)
        rows = [rng.permutation(self.dim)[: self.window] for _ in range(self.n_hashes)]
        self.perm_dims = np.ascontiguousarray(np.concatenate(rows), dtype=np.int32)
        self._finish(rng, self.window)

    def _hash_dense(self, X, range_pow):
        return wta_hash(X, self.perm_dims, self.window, self.K, self.L, range_pow,
                        self.code_bits, self.red_a, self.red_b)

    def _values_dense(self, X):
        return wta_values(X, self.perm_dims, self.window, self.n_hashes)
