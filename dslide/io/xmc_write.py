"""The XMC text writer: a numba kernel formats rows into a byte buffer, about
16 MB at a time, each value as the shortest decimal that dslide's reader
(dslide.io.xmc_parse) turns back into the same float32."""

from __future__ import annotations

import gzip
import math
import os
import tempfile

import numpy as np
import scipy.sparse as sp
from numba import njit

from dslide import _numba_cache  # noqa: F401  (before any kernel: the cache is keyed by module name)
from dslide.io.xmc_cache import _umask
from dslide.io.xmc_parse import _POW10, _dec_to_f64, _to_f32

_MAX_FEATURE_CHARS = 20 + 1 + 16 + 1   # index, ':', value, ' '
_MAX_LABEL_CHARS = 20 + 1              # index, ','
_WRITE_CHUNK_BYTES = 16 << 20          # rows are formatted into buffers of about this size

@njit(cache=True)
def _write_uint(out, p, v):
    """Write the decimal digits of v >= 0 at out[p:]; return the new position."""
    if v == 0:
        out[p] = 48
        return p + 1
    k = 0
    t = v
    while t > 0:
        k += 1
        t //= 10
    q = p + k
    while v > 0:
        q -= 1
        out[q] = 48 + v % 10
        v //= 10
    return p + k


@njit(cache=True)
def _scale10(a, k):
    """a * 10**k in float64 (k of either sign)."""
    if k >= 0:
        while k > 22:
            a *= 1e22
            k -= 22
        return a * _POW10[k]
    k = -k
    while k > 22:
        a /= 1e22
        k -= 22
    return a / _POW10[k]


@njit(cache=True)
def _write_f32(out, p, x):
    """Write float32 x (finite) at out[p:] in the shortest decimal that reads back as x.

    Tries 6, 7, 8 and 9 significant digits (9 always round-trips a float32) and
    keeps the first decimal m * 10**e with _to_f32(_dec_to_f64(m, e)) == x: that is
    exactly the arithmetic of the reader, so the round trip is exact. With at most
    6 digits only one decimal can lie within half an ulp of x (1e-6 relative
    spacing > float32 ulp), so starting at 6 and stripping zeros is still shortest.
    Fixed notation for decimal exponents -5..10, otherwise d.ddde[+-]XX.
    Returns the new position (at most 16 bytes written).
    """
    if x == 0:
        out[p] = 48
        return p + 1
    a = abs(float(x))
    if x < 0:
        out[p] = 45
        p += 1
    e10 = int(math.floor(math.log10(a)))
    # log10 may be off by one next to powers of ten: fix it with the 9-digit mantissa.
    m9 = math.floor(_scale10(a, 8 - e10) + 0.5)
    if m9 >= 1e9:
        e10 += 1
    elif m9 < 1e8:
        e10 -= 1
    m = np.int64(0)
    k = 0
    for nd in range(6, 10):
        k = nd - 1 - e10
        m = np.int64(math.floor(_scale10(a, k) + 0.5))
        while m % 10 == 0:
            m //= 10
            k -= 1
        if _to_f32(_dec_to_f64(m, -k)) == abs(x):
            break
    # digits of m, most significant first, in a small scratch area
    nd = 0
    t = m
    while t > 0:
        nd += 1
        t //= 10
    lead = nd - 1 - k   # decimal exponent of the leading digit
    if -5 <= lead <= 10:
        if k <= 0:
            p = _write_uint(out, p, m)
            for _ in range(-k):
                out[p] = 48
                p += 1
        elif lead >= 0:
            p2 = _write_uint(out, p, m)
            # shift the last k digits right by one to make room for '.'
            for i in range(p2 - 1, p2 - 1 - k, -1):
                out[i + 1] = out[i]
            out[p2 - k] = 46
            p = p2 + 1
        else:
            out[p] = 48
            out[p + 1] = 46
            p += 2
            for _ in range(-lead - 1):
                out[p] = 48
                p += 1
            p = _write_uint(out, p, m)
    else:
        p2 = _write_uint(out, p, m)
        if nd > 1:
            for i in range(p2 - 1, p, -1):
                out[i + 1] = out[i]
            out[p + 1] = 46
            p2 += 1
        p = p2
        out[p] = 101
        p += 1
        if lead < 0:
            out[p] = 45
            p += 1
            lead = -lead
        else:
            out[p] = 43
            p += 1
        if lead < 10:
            out[p] = 48
            p += 1
        p = _write_uint(out, p, lead)
    return p


@njit(cache=True)
def _format_rows(r0, r1, x_indptr, x_indices, x_data, y_indptr, y_indices, out):
    """Write the data lines of rows r0..r1-1 into out (uint8); return the byte count.

    out must hold sum over rows of (_MAX_LABEL_CHARS * labels + _MAX_FEATURE_CHARS
    * non-zeros + 1) bytes. A row with no labels starts with a blank.
    """
    p = 0
    for r in range(r0, r1):
        for j in range(y_indptr[r], y_indptr[r + 1]):
            if j > y_indptr[r]:
                out[p] = 44
                p += 1
            p = _write_uint(out, p, y_indices[j])
        for j in range(x_indptr[r], x_indptr[r + 1]):
            out[p] = 32
            p += 1
            p = _write_uint(out, p, x_indices[j])
            out[p] = 58
            p += 1
            p = _write_f32(out, p, x_data[j])
        out[p] = 10
        p += 1
    return p

def _as_csr(M, what: str) -> sp.csr_matrix:
    if not sp.issparse(M):
        raise ValueError(f"{what} must be a scipy.sparse matrix (csr preferred), "
                         f"got {type(M).__name__}")
    M = sp.csr_matrix(M)
    if not M.has_canonical_format:
        M = M.copy()
        M.sum_duplicates()  # also sorts the indices
    return M


def write_xmc(path, X, Y) -> None:
    """Write X [n_points, n_features] and Y [n_points, n_labels] as XMC text.

    X, Y: scipy.sparse matrices (csr preferred; others are converted). X is
    written as float32: each value in the shortest decimal that reads back as
    the same float32 (so read_xmc returns X.astype(float32) exactly, explicit
    zeros included; duplicates are summed first). Y's stored non-zero entries are
    the labels (its values are otherwise ignored). A point without labels gets a
    line starting with a blank.

    The file is written under a temporary name in the same directory and moved
    into place with os.replace, so readers never see a partial file. A path
    ending in ``.gz`` is gzip-compressed.

    Raises ValueError if X or Y is not sparse, if their row counts differ, or if
    X holds a value that is not a finite float32.
    """
    path = os.fspath(path)
    X = _as_csr(X, "X")
    Y = _as_csr(Y, "Y")
    if X.shape[0] != Y.shape[0]:
        raise ValueError(f"X has {X.shape[0]} rows but Y has {Y.shape[0]}: they must match")
    with np.errstate(over="ignore"):  # an overflow becomes inf and is reported just below
        x_data = X.data.astype(np.float32, copy=False)
    if not np.all(np.isfinite(x_data)):
        bad = x_data[~np.isfinite(x_data)][0]
        raise ValueError(f"X holds {bad} (after conversion to float32): "
                         "values must be finite float32")
    if Y.nnz and not np.all(Y.data != 0):
        Y = Y.copy()
        Y.eliminate_zeros()
    n, n_features = X.shape
    n_labels = Y.shape[1]
    x_indptr = X.indptr.astype(np.int64, copy=False)
    y_indptr = Y.indptr.astype(np.int64, copy=False)
    # Bytes each row can take at most; rows are formatted in chunks of about 16 MB.
    bound = (np.diff(x_indptr) * _MAX_FEATURE_CHARS + np.diff(y_indptr) * _MAX_LABEL_CHARS + 1)
    ends = np.cumsum(bound)
    chunk = _WRITE_CHUNK_BYTES
    cuts = np.unique(np.searchsorted(ends, np.arange(chunk, int(ends[-1]) if n else 0, chunk),
                                     side="right"))
    cuts = [0] + [int(c) for c in cuts if 0 < c < n] + [n]
    if n == 0:
        cuts = [0, 0]

    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=os.path.basename(path) + ".", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the usual mode
        with os.fdopen(fd, "wb") as raw:
            out = gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6, mtime=0) \
                if path.endswith(".gz") else raw
            try:
                out.write(f"{n} {n_features} {n_labels}\n".encode())
                buf = np.empty(0, dtype=np.uint8)
                for r0, r1 in zip(cuts[:-1], cuts[1:]):
                    need = int(ends[r1 - 1] - (ends[r0 - 1] if r0 else 0)) if r1 > r0 else 0
                    if buf.size < need:
                        buf = np.empty(need, dtype=np.uint8)
                    k = _format_rows(r0, r1, x_indptr, X.indices, x_data, y_indptr, Y.indices, buf)
                    out.write(memoryview(buf)[:k])
            finally:
                if out is not raw:
                    out.close()
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
