"""Densified one-permutation MinHash (Li, Owen & Zhang 2012; Shrivastava 2017)
for sparse non-negative inputs: the set of a vector is its non-zero features.

One seeded permutation pi of range(dim) places feature f at position pi[f];
the positions are cut into N = K*L contiguous bins, bin b holding positions
[start_b, start_{b+1}) with start_b = ceil(b * dim / N) (widths differ by at
most one). For a set S,

    v_b(S) = min { pi[f] - start_b : f in S, pi[f] in bin b },

empty bins are filled by the seeded densification of `dslide.lsh._common.densify`
(so P(v_b(S) == v_b(T)) = Jaccard(S, T) for every b), and the empty set gets a
fixed code. `value_bits` (optional) keeps only the low bits of each value
(b-bit minwise hashing) to shorten codes; collisions then rise to about
J + (1 - J) / 2**value_bits. Table l's code is sum_k v[l*K+k] << (k * value_bits),
code_bits = K * value_bits. Requires dim >= 2 * K * L so bins hold >= 2 positions.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit

from ._common import HashFamily, check_int, densify, draw_u64, hash_rows, values_rows


@njit(cache=True, inline="always")
def _keep_min(vals, b, o):
    """Bin b keeps the smallest offset o it sees (-1: empty so far)."""
    if vals[b] < 0 or o < vals[b]:
        vals[b] = o


@njit(cache=True, inline="always")
def _finish(vals, mask, probe_a, probe_b):
    """Mask the filled bins' values, then fill the empty bins (densification)."""
    for b in range(vals.shape[0]):
        if vals[b] >= 0:
            vals[b] &= mask
    densify(vals, probe_a, probe_b)


@njit(cache=True)
def minhash_row_values_dense(x, feat_bin, feat_off, mask, probe_a, probe_b, vals):
    """MinHash values of the non-zeros of x float32 [dim]. feat_bin, feat_off int32 [dim];
    mask: keep value & mask; vals int32 [N] output."""
    vals[:] = -1
    for f in range(x.shape[0]):
        if x[f] != 0:
            _keep_min(vals, feat_bin[f], feat_off[f])
    _finish(vals, mask, probe_a, probe_b)


@njit(cache=True)
def minhash_row_values_csr(indices, present, lo, hi, feat_bin, feat_off, mask, probe_a, probe_b, vals):
    """MinHash values of the set {indices[p] : lo <= p < hi, present[p]} (one CSR row)."""
    vals[:] = -1
    for p in range(lo, hi):
        if present[p]:
            _keep_min(vals, feat_bin[indices[p]], feat_off[indices[p]])
    _finish(vals, mask, probe_a, probe_b)


@njit(cache=True)
def _dense_row(X, i, p, scratch, vals):
    """Row kernel of `hash_rows`: the non-zeros of row i of X; p = (feat_bin, feat_off, mask, probe_a, probe_b)."""
    minhash_row_values_dense(X[i], p[0], p[1], p[2], p[3], p[4], vals)


@njit(cache=True)
def _csr_row(rows, i, p, scratch, vals):
    """Row kernel of `hash_rows`: CSR row i of rows = (indptr, indices, present); p as `_dense_row`'s."""
    indptr, indices, present = rows
    minhash_row_values_csr(indices, present, indptr[i], indptr[i + 1], p[0], p[1], p[2], p[3], p[4], vals)


@njit(cache=True)
def minhash_values(X, feat_bin, feat_off, mask, n_bins, probe_a, probe_b):
    """Serial: int32 [n, n_bins] MinHash values of the non-zeros of X float32 [n, dim]."""
    return values_rows(_dense_row, X, X.shape[0], (feat_bin, feat_off, mask, probe_a, probe_b), n_bins, 0)


@njit(parallel=True, cache=True)
def minhash_hash(X, feat_bin, feat_off, mask, value_bits, K, L, probe_a, probe_b,
                 range_pow, code_bits, red_a, red_b):
    """Bucket codes int32 [n, L] of dense X float32 [n, dim] (parallel over row blocks)."""
    return hash_rows(_dense_row, X, X.shape[0], (feat_bin, feat_off, mask, probe_a, probe_b), K, L,
                     np.int64(1) << value_bits, 0, range_pow, code_bits, red_a, red_b)


@njit(parallel=True, cache=True)
def minhash_hash_csr(indptr, indices, present, feat_bin, feat_off, mask, value_bits, K, L,
                     probe_a, probe_b, range_pow, code_bits, red_a, red_b):
    """Bucket codes int32 [n, L] of CSR rows (indptr int64 [n+1], indices int32 [nnz],
    present bool [nnz]); parallel over row blocks."""
    return hash_rows(_csr_row, (indptr, indices, present), indptr.shape[0] - 1,
                     (feat_bin, feat_off, mask, probe_a, probe_b), K, L, np.int64(1) << value_bits, 0,
                     range_pow, code_bits, red_a, red_b)


class MinHash(HashFamily):
    """Densified one-permutation MinHash; parameter: value_bits (default None = all
    bits of a bin offset). Inputs: dense (`hash`, non-zeros form the set) or CSR (`hash_csr`).

    Arrays: perm int32 [dim] (pi), feat_bin / feat_off int32 [dim] (bin of
    feature f and its offset in the bin), probe_a, probe_b uint64 scalars,
    red_a, red_b uint64 [L].
    """

    name = "minhash"
    PARAMS = ("value_bits",)

    def __init__(self, dim, K, L, seed, value_bits=None):
        super().__init__(dim, K, L, seed)
        n_bins = self.n_hashes
        if self.dim < 2 * n_bins:
            raise ValueError(f"minhash needs dim >= 2*K*L so each bin holds >= 2 positions; "
                             f"dim={self.dim}, K*L={n_bins}: lower K or L")
        rng = np.random.default_rng(self.seed)
        self.perm = rng.permutation(self.dim).astype(np.int32)
        pos = self.perm.astype(np.int64)
        b = pos * n_bins // self.dim
        # b = floor(pos*N/dim) gives ceil(b*dim/N) <= pos < ceil((b+1)*dim/N).
        start = (b * self.dim + n_bins - 1) // n_bins
        self.feat_bin = b.astype(np.int32)
        self.feat_off = (pos - start).astype(np.int32)
        full_bits = max(1, int(self.feat_off.max()).bit_length())
        if value_bits is None:
            self.value_bits = full_bits
        else:
            self.value_bits = check_int("value_bits", value_bits, 1, full_bits)
        self.mask = (1 << self.value_bits) - 1
        self.probe_a = draw_u64(rng, 1, odd=True)[0]
        self.probe_b = draw_u64(rng, 1)[0]
        self._finish(rng, 1 << self.value_bits)

    def _hash_dense(self, X, range_pow):
        return minhash_hash(X, self.feat_bin, self.feat_off, self.mask, self.value_bits, self.K,
                            self.L, self.probe_a, self.probe_b, range_pow, self.code_bits,
                            self.red_a, self.red_b)

    def _values_dense(self, X):
        return minhash_values(X, self.feat_bin, self.feat_off, self.mask, self.n_hashes,
                              self.probe_a, self.probe_b)

    def hash_csr(self, indptr, indices, data=None, range_pow=None) -> np.ndarray:
        """Bucket codes int32 [n, L] of CSR rows; data (any numeric dtype, or None
        for all present) only decides presence: non-zero = in the set."""
        rp = self.check_range_pow(range_pow)
        indptr = np.ascontiguousarray(indptr, dtype=np.int64)
        indices = np.ascontiguousarray(indices, dtype=np.int32)
        if indptr.ndim != 1 or indptr.shape[0] < 1 or indptr[0] != 0 or indptr[-1] != indices.shape[0]:
            raise ValueError(f"indptr must be 1-D, start at 0 and end at len(indices)={indices.shape[0]}; "
                             f"got shape {indptr.shape}, first/last "
                             f"{indptr[:1].tolist()}/{indptr[-1:].tolist()}")
        if np.any(np.diff(indptr) < 0):
            raise ValueError("indptr must be non-decreasing")
        if indices.shape[0] and (indices.min() < 0 or indices.max() >= self.dim):
            raise ValueError(f"feature indices must lie in [0, {self.dim}), got "
                             f"[{indices.min()}, {indices.max()}]")
        if data is None:
            present = np.ones(indices.shape[0], np.bool_)
        else:
            present = np.asarray(data) != 0
            if present.shape != indices.shape:
                raise ValueError(f"data has shape {present.shape}, indices {indices.shape}: they must match")
        with numba.parallel_chunksize(1):
            return minhash_hash_csr(indptr, indices, present, self.feat_bin, self.feat_off,
                                    self.mask, self.value_bits, self.K, self.L, self.probe_a,
                                    self.probe_b, rp, self.code_bits, self.red_a, self.red_b)
