"""dslide.lsh family "srp": signed random projections (SimHash; Charikar 2002) with sparse +-1 projections, as in SLIDE.

Each of the N = K*L bits h looks at a fixed random subset S_h of
n_nz = max(1, round(sparsity * dim)) dimensions with random signs s:

    bit_h(x) = [ sum_{p < n_nz} s[h*n_nz + p] * x[dims[h*n_nz + p]] >= 0 ].

With sparsity 1 and x, y rotated at random, P(bit_h(x) == bit_h(y)) =
1 - angle(x, y) / pi. Table l's code is the K bits v[l*K + k] read as a binary
number (bit k has weight 2**k), so code_bits = K. Sums run in float32 in index
order (no fastmath), so codes do not depend on the machine or thread count.
A zero vector has all bits 1.
"""

from __future__ import annotations

import numbers

import numpy as np
from numba import njit

from ._common import HashFamily, hash_rows, values_rows


#: Inputs below float32's smallest normal count as zero: denormal products
#: would take slow microcode paths in the accumulation loops.
TINY = np.float32(1.1754944e-38)


@njit(cache=True)
def srp_row_values(x, dims, signs, n_nz, vals):
    """SRP bits of one vector. x float32 [dim]; dims int32, signs float32 [N*n_nz]; vals int32 [N]."""
    for h in range(vals.shape[0]):
        base = h * n_nz
        s = np.float32(0.0)
        for p in range(n_nz):
            v = x[dims[base + p]]
            if abs(v) >= TINY:
                s += signs[base + p] * v
        vals[h] = 1 if s >= 0 else 0


@njit(cache=True)
def _gather_row(X, i, p, scratch, vals):
    """Row kernel of `hash_rows`: row i of X through p = (dims, signs, n_nz)."""
    srp_row_values(X[i], p[0], p[1], p[2], vals)


@njit(cache=True)
def srp_values(X, dims, signs, n_nz, n_bits):
    """Serial: int32 [n, n_bits] SRP bits of X float32 [n, dim]."""
    return values_rows(_gather_row, X, X.shape[0], (dims, signs, n_nz), n_bits, 0)


@njit(parallel=True, cache=True)
def srp_hash(X, dims, signs, n_nz, K, L, range_pow, code_bits, red_a, red_b):
    """Bucket codes int32 [n, L] of X float32 [n, dim] (parallel over row blocks; gathers)."""
    return hash_rows(_gather_row, X, X.shape[0], (dims, signs, n_nz), K, L, 2, 0, range_pow, code_bits,
                     red_a, red_b)


@njit(cache=True)
def srp_dense_row_values(x, proj_t, acc, vals):
    """SRP bits of one vector through the dense transposed projection proj_t float32 [dim, N].

    acc[h] = sum_d proj_t[d, h] * x[d] adds the same non-zero terms in the same
    (ascending dim) order as `srp_row_values` with sorted subsets, plus exact
    zeros, so the bits are identical; the inner loop over h has no reduction and
    vectorises without fastmath. Zero (and denormal) inputs, most of a ReLU
    vector, are skipped.
    """
    acc[:] = 0.0
    for d in range(x.shape[0]):
        xd = x[d]
        if abs(xd) >= TINY:
            row = proj_t[d]
            for h in range(acc.shape[0]):
                acc[h] += row[h] * xd
    for h in range(acc.shape[0]):
        vals[h] = 1 if acc[h] >= 0 else 0


@njit(cache=True)
def _dense_row(X, i, p, scratch, vals):
    """Row kernel of `hash_rows`: row i of X through p = (proj_t,), scratch float32 [K*L] its sums."""
    srp_dense_row_values(X[i], p[0], scratch, vals)


@njit(parallel=True, cache=True)
def srp_hash_dense(X, proj_t, K, L, range_pow, code_bits, red_a, red_b):
    """Bucket codes int32 [n, L] of X float32 [n, dim] via proj_t float32 [dim, K*L]
    (parallel over row blocks); same codes as `srp_hash`."""
    return hash_rows(_dense_row, X, X.shape[0], (proj_t,), K, L, 2, K * L, range_pow, code_bits, red_a, red_b)


class SRP(HashFamily):
    """Sparse signed random projections; parameter: sparsity in (0, 1] (default 1/3).

    Arrays: dims int32 [K*L*n_nz] (each bit's subset, sorted), signs float32
    [K*L*n_nz] of +-1; red_a, red_b uint64 [L] for range reduction. `hash`
    uses the same projections scattered into a dense proj_t float32 [dim, K*L]
    when that holds at most DENSE_LIMIT entries (several times faster: the
    inner loop vectorises), else gathers through dims/signs; codes are identical.
    """

    #: Largest dim * K * L for which `hash` uses the dense transposed projection.
    DENSE_LIMIT = 1 << 24

    name = "srp"
    PARAMS = ("sparsity",)

    def __init__(self, dim, K, L, seed, sparsity=1.0 / 3.0):
        super().__init__(dim, K, L, seed)
        if isinstance(sparsity, bool) or not isinstance(sparsity, numbers.Real) \
                or not (0.0 < float(sparsity) <= 1.0):
            raise ValueError(f"sparsity ({sparsity!r}) must be a fraction in (0, 1]")
        self.sparsity = float(sparsity)
        self.n_nz = max(1, int(round(self.sparsity * self.dim)))
        rng = np.random.default_rng(self.seed)
        n_bits = self.n_hashes
        if self.n_nz == self.dim:
            dims = np.tile(np.arange(self.dim), n_bits)
        else:
            dims = np.concatenate([np.sort(rng.choice(self.dim, self.n_nz, replace=False))
                                   for _ in range(n_bits)])
        self.dims = np.ascontiguousarray(dims, dtype=np.int32)
        self.signs = np.where(rng.random(n_bits * self.n_nz) < 0.5, -1.0, 1.0).astype(np.float32)
        self._finish(rng, 2)

    @property
    def proj_t(self) -> np.ndarray:
        """float32 [dim, K*L]: proj_t[d, h] = sign of dim d in bit h's subset, 0 outside it."""
        if getattr(self, "_proj_t", None) is None:
            pt = np.zeros((self.dim, self.n_hashes), np.float32)
            bit = np.repeat(np.arange(self.n_hashes), self.n_nz)
            pt[self.dims, bit] = self.signs
            self._proj_t = pt
        return self._proj_t

    def _hash_dense(self, X, range_pow):
        if self.dim * self.n_hashes <= self.DENSE_LIMIT:
            return srp_hash_dense(X, self.proj_t, self.K, self.L, range_pow, self.code_bits,
                                  self.red_a, self.red_b)
        return srp_hash(X, self.dims, self.signs, self.n_nz, self.K, self.L, range_pow,
                        self.code_bits, self.red_a, self.red_b)

    def _values_dense(self, X):
        return srp_values(X, self.dims, self.signs, self.n_nz, self.n_hashes)
