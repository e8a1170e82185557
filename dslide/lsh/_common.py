"""Pieces shared by the hash families of dslide.lsh: argument checks, code assembly, range
reduction, densification, and the `HashFamily` base class.

Codes. A family computes N = K * L hash values per vector, value h = l*K + k
belonging to table l. Table l's full code is the mixed-radix number

    code_l = sum_k v[l*K + k] * radix**k,      0 <= v < radix,

so code_l < radix**K <= 2**code_bits with code_bits = bit_length(radix**K - 1).
When a table has fewer bits (range_pow < code_bits) the code is reduced by the
multiply-add-shift hash (Dietzfelbinger 1996), seeded per table:

    bucket_l = ((a_l * code_l + b_l) mod 2**64) >> (64 - range_pow),   a_l odd.

It is 2-universal for codes of up to 32 bits and spreads longer codes well.
"""

from __future__ import annotations

import numbers

import numba
import numpy as np
from numba import njit, prange

from dslide import _numba_cache  # noqa: F401  (before any kernel: the cache is keyed by module name)

# 64-bit constants as numba-friendly unsigned scalars: mixing int64 and uint64
# in numba promotes to float64, so every constant in a uint64 expression is cast.
_U0 = np.uint64(0)
_U1 = np.uint64(1)
_U32 = np.uint64(32)

#: Largest full code the families build (codes are assembled in uint64).
MAX_CODE_BITS = 62
#: Largest bucket index width a family hands out as int32.
MAX_RANGE_POW = 31

#: Rows per parallel work item: large enough to amortise per-block scratch
#: allocation, small enough to balance 670k rows over a few threads.
ROW_BLOCK = 256


# ----------------------------------------------------------------------------
# Python-side checks
# ----------------------------------------------------------------------------

def check_int(name: str, value, lo: int, hi: int | None = None) -> int:
    """`value` as a Python int in [lo, hi]; ValueError naming it otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if value < lo or (hi is not None and value > hi):
        valid = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{name} ({value}) must be {valid}")
    return value


def check_seed(seed) -> int:
    return check_int("seed", seed, 0, 2**63 - 1)


def code_bits_of(radix: int, K: int) -> int:
    """Bits of the largest code radix**K - 1 (exact integer arithmetic)."""
    return max(1, (radix**K - 1).bit_length())


def as_batch(vectors, dim: int) -> np.ndarray:
    """A float32 C-contiguous [n, dim] view or copy of `vectors`."""
    arr = np.asarray(vectors)
    if arr.ndim != 2 or arr.shape[1] != dim:
        raise ValueError(f"vectors must have shape [n, {dim}] (dim={dim}), got {arr.shape}")
    return np.ascontiguousarray(arr, dtype=np.float32)


def draw_u64(rng: np.random.Generator, size: int, odd: bool = False) -> np.ndarray:
    x = rng.integers(0, np.iinfo(np.uint64).max, size=size, dtype=np.uint64, endpoint=True)
    if odd:
        x |= np.uint64(1)
    return x


# ----------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------

@njit(cache=True)
def assemble_code(vals, l, K, radix, range_pow, code_bits, red_a, red_b):
    """Table l's bucket from its K hash values (see the module docstring).

    vals: int32 [K*L] hash values in [0, radix); red_a, red_b: uint64 [L].
    Returns the bucket index as int64 in [0, 2**range_pow).
    """
    code = _U0
    mult = _U1
    r = np.uint64(radix)
    base = l * K
    for k in range(K):
        code += np.uint64(vals[base + k]) * mult
        mult *= r
    if range_pow >= code_bits:
        return np.int64(code)
    x = red_a[l] * code + red_b[l]
    return np.int64(x >> np.uint64(64 - range_pow))


@njit(inline="always")
def hash_rows(row_values, rows, n, params, K, L, radix, n_scratch, range_pow, code_bits, red_a, red_b):
    """The row-block driver of every family: bucket codes int32 [n, L] of n rows.

    For each row i, row_values(rows, i, params, scratch, vals) writes the row's
    K*L hash values into vals int32 [K*L] (scratch float32 [n_scratch] is its
    own to use), and table l's bucket is `assemble_code(vals, l, ...)` with
    values in [0, radix). `rows` is what the family reads rows from (a dense
    float32 [n, dim], or a tuple of CSR arrays), `params` a tuple of its
    parameter arrays and scalars. Blocks of ROW_BLOCK rows are the parallel
    work items; each allocates its own vals and scratch. A row's codes depend
    on that row alone, so they do not depend on the thread count.

    Inlined (numba IR) into each family's `@njit(parallel=True, cache=True)`
    kernel, which passes its own row kernel as a global: the cached kernels
    take arrays and scalars only (a cached kernel taking a jitted function as
    an argument misses the cache on every run), and the prange below is the
    caller's own parallel loop.
    """
    out = np.empty((n, L), np.int32)
    n_blocks = (n + ROW_BLOCK - 1) // ROW_BLOCK
    for blk in prange(n_blocks):
        vals = np.empty(K * L, np.int32)
        scratch = np.empty(n_scratch, np.float32)
        for i in range(blk * ROW_BLOCK, min(n, (blk + 1) * ROW_BLOCK)):
            row_values(rows, i, params, scratch, vals)
            for l in range(L):
                out[i, l] = assemble_code(vals, l, K, radix, range_pow, code_bits, red_a, red_b)
    return out


@njit(inline="always")
def values_rows(row_values, rows, n, params, n_hashes, n_scratch):
    """Serial twin of `hash_rows`: the hash values int32 [n, n_hashes] themselves, row by row."""
    out = np.empty((n, n_hashes), np.int32)
    scratch = np.empty(n_scratch, np.float32)
    for i in range(n):
        row_values(rows, i, params, scratch, out[i])
    return out


@njit(cache=True)
def probe_bin(h, attempt, n_bins, probe_a, probe_b):
    """Densification probe: the bin that empty bin h looks at on `attempt` (>= 1).

    j = (hi32((a * key + b) mod 2**64) * n_bins) >> 32,  key = (h + 1) * 2**32 + attempt.
    """
    key = ((np.uint64(h) + _U1) << _U32) | np.uint64(attempt)
    x = probe_a * key + probe_b
    return np.int64(((x >> _U32) * np.uint64(n_bins)) >> _U32)


@njit(cache=True)
def densify(vals, probe_a, probe_b):
    """Fill empty bins (vals[h] == -1) in place with the value of a non-empty bin.

    Empty bin h probes j = probe_bin(h, t) for t = 1, 2, ..., 4*n_bins and
    copies the first originally non-empty bin's value; should all probes miss,
    it scans h+1, h+2, ... (mod n_bins). The probe sequence depends only on
    (h, t) and the seed, never on the vector, which keeps the collision
    probability of two vectors' densified values tied to their similarity
    (Shrivastava's optimal densification). A vector with no non-empty bin gets
    all zeros: a fixed code.

    vals: int32 [n_bins], values >= 0 or -1 for empty; modified in place.
    """
    n = vals.shape[0]
    n_empty = 0
    for h in range(n):
        if vals[h] < 0:
            n_empty += 1
    if n_empty == 0:
        return
    if n_empty == n:
        vals[:] = 0
        return
    # Borrowed values are stored as -(v + 2) until the end, so that later
    # empty bins still see them as originally empty (and never chain).
    max_probes = 4 * n
    for h in range(n):
        if vals[h] != -1:
            continue
        got = -1
        for t in range(1, max_probes + 1):
            j = probe_bin(h, t, n, probe_a, probe_b)
            if vals[j] >= 0:
                got = vals[j]
                break
        if got < 0:
            for s in range(1, n):
                j = (h + s) % n
                if vals[j] >= 0:
                    got = vals[j]
                    break
        vals[h] = -(got + 2)
    for h in range(n):
        if vals[h] < 0:
            vals[h] = -vals[h] - 2


# ----------------------------------------------------------------------------
# Base class
# ----------------------------------------------------------------------------

class HashFamily:
    """Common interface of the families (see lsh/__init__.py).

    Subclasses set `name`, `PARAMS` (names of their keyword parameters),
    `radix` (values lie in [0, radix)) and implement `_hash_dense(X, range_pow)`
    and `_values_dense(X)`.
    """

    name = "?"
    PARAMS: tuple[str, ...] = ()

    def __init__(self, dim: int, K: int, L: int, seed: int):
        self.dim = check_int("dim", dim, 1)
        self.K = check_int("K", K, 1)
        self.L = check_int("L", L, 1)
        self.seed = check_seed(seed)

    def _finish(self, rng: np.random.Generator, radix: int) -> None:
        """Set radix/code_bits and draw the per-table range-reduction hash (last, from `rng`)."""
        self.radix = int(radix)
        self.code_bits = code_bits_of(self.radix, self.K)
        if self.code_bits > MAX_CODE_BITS:
            raise ValueError(
                f"{self.name}: a code of K={self.K} values in [0, {self.radix}) needs "
                f"{self.code_bits} bits, above the {MAX_CODE_BITS} supported; lower K"
                + (" or set value_bits" if "value_bits" in self.PARAMS else ""))
        self.red_a = draw_u64(rng, self.L, odd=True)
        self.red_b = draw_u64(rng, self.L)

    @property
    def n_hashes(self) -> int:
        return self.K * self.L

    def check_range_pow(self, range_pow) -> int:
        """The bucket width in bits that `hash` will use (code_bits when None)."""
        if range_pow is None:
            if self.code_bits > MAX_RANGE_POW:
                raise ValueError(
                    f"{self.name}: full codes have {self.code_bits} bits, too many for int32 "
                    f"buckets; pass range_pow in [1, {MAX_RANGE_POW}]")
            return self.code_bits
        rp = check_int("range_pow", range_pow, 1, MAX_RANGE_POW)
        if rp > self.code_bits:
            raise ValueError(f"range_pow ({rp}) exceeds the {self.code_bits} bits of a full "
                             f"{self.name} code (K={self.K}); valid: 1..{self.code_bits}, or raise K")
        return rp

    def hash(self, vectors, range_pow=None) -> np.ndarray:
        """Bucket codes int32 [n, L] in [0, 2**range_pow) of a dense batch [n, dim].

        range_pow=None keeps the full code (code_bits bits); range_pow < code_bits
        reduces it with the seeded multiply-add-shift hash; range_pow > code_bits
        is a ValueError. Parallel over rows; the result does not depend on the
        thread count.
        """
        rp = self.check_range_pow(range_pow)
        X = as_batch(vectors, self.dim)
        # Dynamic scheduling of row blocks: a core shared with other work does not stall the rest.
        with numba.parallel_chunksize(1):
            return self._hash_dense(X, rp)

    def hash_values(self, vectors) -> np.ndarray:
        """The K*L individual hash values int32 [n, K*L] (after densification),
        value l*K + k belonging to table l. Serial; meant for tests and analysis."""
        X = as_batch(vectors, self.dim)
        return self._values_dense(X)

    def params(self) -> dict:
        return {p: getattr(self, p) for p in self.PARAMS}

    def __repr__(self) -> str:
        extra = "".join(f", {k}={v!r}" for k, v in self.params().items())
        return (f"{type(self).__name__}(dim={self.dim}, K={self.K}, L={self.L}, "
                f"seed={self.seed}{extra}; code_bits={self.code_bits})")
