"""Densified winner-take-all hashing (DWTA; Chen & Shrivastava 2018), as SLIDE uses it.

Bins. The N = K*L hashes each look at a bin of `bin_size` dimensions. The
bins are consecutive chunks of concatenated random permutations of
range(dim), so every dimension lands in about N*bin_size/dim bins (a chunk
that straddles two permutations may repeat a dimension; it is harmless).

Value. For x float32 [dim], bin h with dimensions d_0..d_{b-1}:

    v_h = argmax_p x[d_p]   over the p with x[d_p] > 0   (first p on ties),

and the bin is EMPTY when no entry of the bin is strictly positive. This is the
natural reading for ReLU activations, where zeros carry no ranking
information; taking the arg-max of an all-zero bin would give every sparse
vector the same value 0 and pile them into a few buckets. For signed vectors
(weights) a bin with only non-positive entries is also empty (probability
2**-bin_size for symmetric weights), which keeps queries and items under one rule.

Densification. Empty bins copy the value of a non-empty bin found by the
seeded probe sequence of `dslide.lsh._common.densify`; a vector with no positive
entry gets a fixed code. Table l's code is sum_k v[l*K+k] * bin_size**k, so
code_bits = bit_length(bin_size**K - 1) (= K * log2(bin_size) for powers of two).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ._common import HashFamily, check_int, densify, draw_u64, hash_rows, values_rows


@njit(cache=True)
def dwta_row_values(x, bin_dims, bin_size, probe_a, probe_b, vals):
    """DWTA values of one vector.

    x: float32 [dim]; bin_dims: int32 [N*bin_size] (bin h = bin_dims[h*bin_size:(h+1)*bin_size]);
    vals: int32 [N] output, each in [0, bin_size).
    """
    n_bins = vals.shape[0]
    for h in range(n_bins):
        base = h * bin_size
        best = np.float32(0.0)
        arg = -1
        for p in range(bin_size):
            v = x[bin_dims[base + p]]
            if v > best:
                best = v
                arg = p
        vals[h] = arg
    densify(vals, probe_a, probe_b)


@njit(cache=True)
def _row(X, i, p, scratch, vals):
    """Row kernel of `hash_rows`: row i of X through p = (bin_dims, bin_size, probe_a, probe_b)."""
    dwta_row_values(X[i], p[0], p[1], p[2], p[3], vals)


@njit(cache=True)
def dwta_values(X, bin_dims, bin_size, n_bins, probe_a, probe_b):
    """Serial: int32 [n, n_bins] DWTA values of X float32 [n, dim]."""
    return values_rows(_row, X, X.shape[0], (bin_dims, bin_size, probe_a, probe_b), n_bins, 0)


@njit(parallel=True, cache=True)
def dwta_hash(X, bin_dims, bin_size, K, L, probe_a, probe_b, range_pow, code_bits, red_a, red_b):
    """Bucket codes int32 [n, L] of X float32 [n, dim] (parallel over row blocks)."""
    return hash_rows(_row, X, X.shape[0], (bin_dims, bin_size, probe_a, probe_b), K, L, bin_size, 0,
                     range_pow, code_bits, red_a, red_b)


class DWTA(HashFamily):
    """Densified WTA family; parameters: bin_size (default 8, SLIDE's choice).

    Arrays: bin_dims int32 [K*L*bin_size]; probe_a (odd), probe_b uint64
    scalars for densification; red_a, red_b uint64 [L] for range reduction.
    """

    name = "dwta"
    PARAMS = ("bin_size",)

    def __init__(self, dim, K, L, seed, bin_size=8):
        super().__init__(dim, K, L, seed)
        self.bin_size = check_int("bin_size", bin_size, 2, self.dim)
        rng = np.random.default_rng(self.seed)
        slots = self.n_hashes * self.bin_size
        n_perm = -(-slots // self.dim)
        perms = [rng.permutation(self.dim) for _ in range(n_perm)]
        self.bin_dims = np.ascontiguousarray(np.concatenate(perms)[:slots], dtype=np.int32)
        self.probe_a = draw_u64(rng, 1, odd=True)[0]
        self.probe_b = draw_u64(rng, 1)[0]
        self._finish(rng, self.bin_size)

    def _hash_dense(self, X, range_pow):
        return dwta_hash(X, self.bin_dims, self.bin_size, self.K, self.L, self.probe_a,
                         self.probe_b, range_pow, self.code_bits, self.red_a, self.red_b)

    def _values_dense(self, X):
        return dwta_values(X, self.bin_dims, self.bin_size, self.n_hashes, self.probe_a, self.probe_b)
