"""Extreme-classification (XMC) data: the text format, a fast reader and writer.

The text format (Extreme Classification Repository)
===================================================
::

    n_points n_features n_labels
    l1,l2,... f:v f:v ...
    ...

* Line 1, the header: three non-negative decimal integers separated by blanks.
* Then one line per point. Indices are zero-based decimal integers (digits only,
  no sign); a feature value is a decimal number ``[+-]digits[.digits][(e|E)[+-]digits]``
  (``5.``, ``.5`` and ``1e-3`` are fine; ``nan``/``inf`` are not).
* The *label field* is everything before the first blank of the line. It may be
  empty: the line then starts with a blank, or its first token already is a
  ``feature:value`` pair (no labels), or the whole line is blank (a point with
  no labels and no features). Labels are a set: a label repeated in a line
  counts once.
* Blanks are spaces or tabs, any number of them. Lines end with ``\\n`` or
  ``\\r\\n``; a ``\\r`` anywhere else is an error. The last line may lack its
  newline.
* Blank lines at the end of the file are padding, not points, except that as
  many of them as the header still needs are taken as empty points (so a data
  set whose last points are empty survives ``write_xmc`` -> ``read_xmc``).
* A feature index repeated within one line is an error (it most likely means a
  broken writer; silently summing would change the data).
* Feature values must be finite float32 (|v| <= 3.4028235e38). Negative values
  are accepted (the format allows signed features). A non-zero value below the
  smallest normal float32 (1.1754944e-38) is flushed to 0.0, so that no
  denormals reach the training kernels; the entry is kept as an explicit zero.
* gzip-compressed files are recognised by their magic bytes, whatever their name.

In memory a data set is :class:`XMCData`: X csr float32 [n_points, n_features]
and Y csr float32 [n_points, n_labels] (ones), both with sorted, unique column
indices.

How it is done
==============
Reading: the file is read into one ``uint8`` array. A numba kernel counts the
``'\\n'``, ``':'`` and ``','`` bytes (upper bounds for points, non-zeros and
labels), then a second kernel parses, validates and fills the CSR arrays in one
pass, with its own decimal-to-float32 conversion (within 1 ulp of the nearest
float32, exact but for float64 landing on a float32 rounding midpoint). On the
first invalid byte the kernel stops and returns an error code and a byte
offset; Python turns those into ``file:line: what was expected, got 'token'``.
After a successful parse the arrays are saved beside the source, one ``.npy``
file each in the directory ``<path>.dslcache/``, and later memory-mapped from
there with ``np.load(mmap_mode=...)`` (see :func:`read_xmc`). The cache is as
private as its source (its files take the source's permission bits and group),
is keyed on the source's size, mtime, ctime and a SHA-256 of its first and last
MiB, and what it holds is checked before use (indices sorted, unique and in
range, values finite), so a stale or tampered cache is parsed over, never used.

Writing: a numba kernel formats rows into a byte buffer, ~16 MB at a time, each
value as the shortest decimal that this reader turns back into the same float32.

About 24 M non-zeros/s parsing and 9 M/s writing on one core, a cache hit in
~6 ms for 12.7 M non-zeros (scripts/bench_io.py, docs/benchmarks.md).
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import hashlib
import math
import os
import shutil
import tempfile
import warnings
import zlib
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from numba import njit

from dslide import _numba_cache  # noqa: F401  (before any kernel: the cache is keyed by module name)

__all__ = ["XMCData", "XMCFormatError", "XMCFormatWarning", "XMCCacheWarning", "read_xmc",
           "write_xmc", "cache_path", "CACHE_VERSION"]


@dataclass
class XMCData:
    """A multi-label data set.

    X: csr_matrix float32 [n_points, n_features], the features.
    Y: csr_matrix float32 [n_points, n_labels], ones where a label applies.
    """

    X: sp.csr_matrix
    Y: sp.csr_matrix

    @property
    def n_points(self) -> int:
        return self.X.shape[0]

    @property
    def n_features(self) -> int:
        return self.X.shape[1]

    @property
    def n_labels(self) -> int:
        return self.Y.shape[1]


class XMCFormatError(ValueError):
    """Malformed XMC text: the message names the file, the line and what was expected."""


class XMCFormatWarning(UserWarning):
    """An XMC file read with ``strict=False`` disagrees with its own header."""


class XMCCacheWarning(UserWarning):
    """The binary cache beside an XMC file could not be read or written (the text was used)."""


# Bump whenever the parse result for the same bytes could change (format rules,
# array layout), or the key does: every existing cache then misses.
CACHE_VERSION = 4  # 4: the key has the source's ctime and a digest of its head and tail

_GZIP_MAGIC = b"\x1f\x8b"
_FLT_MIN_NORMAL = 1.1754943508222875e-38
# Exact in float64 up to 1e22 (int -> float conversion is exact there).
_POW10 = np.array([float(10 ** k) for k in range(23)], dtype=np.float64)

# Error codes returned by the parse kernel.
_OK = 0
_E_FEATURE_TOKEN = 1   # a token after the label field is not 'feature:value'
_E_FIRST_TOKEN = 2     # the first token is neither a label list nor 'feature:value'
_E_LABEL_TOKEN = 3     # a label list with an empty or non-digit item
_E_FEATURE_RANGE = 4
_E_LABEL_RANGE = 5
_E_VALUE_RANGE = 6     # a well-formed value that is not a finite float32
_E_DUP_FEATURE = 7
_E_STRAY_CR = 8

# Upper bounds of the text written per item by the writer kernel (see _format_rows).
_MAX_FEATURE_CHARS = 20 + 1 + 16 + 1   # index, ':', value, ' '
_MAX_LABEL_CHARS = 20 + 1              # index, ','
_WRITE_CHUNK_BYTES = 16 << 20          # rows are formatted into buffers of about this size


# --------------------------------------------------------------------------- numba kernels


@njit(cache=True)
def _dec_to_f64(mant, exp10):
    """mant * 10**exp10 as float64 (mant: int64 >= 0 with <= 18 digits; exp10: int64).

    For |exp10| <= 22 this is one correctly rounded multiplication or division of
    exact operands, so the later cast to float32 is within 1 ulp (exact except when
    the float64 lands on a float32 rounding midpoint). Larger exponents take a few
    more roundings of 2**-53 each, far below float32 resolution.
    """
    if mant == 0:
        return 0.0
    v = float(mant)
    if exp10 >= 0:
        if exp10 > 400:
            return np.inf
        while exp10 > 22:
            v *= 1e22
            exp10 -= 22
        return v * _POW10[exp10]
    e = -exp10
    if e > 400:
        return 0.0
    while e > 22:
        v /= 1e22
        e -= 22
    return v / _POW10[e]


@njit(cache=True)
def _to_f32(v):
    """float64 -> float32 (nearest), flushing a float32 denormal result to 0."""
    f = np.float32(v)
    if abs(f) < np.float32(_FLT_MIN_NORMAL):
        return np.float32(0.0)
    return f


@njit(cache=True)
def _is_end(c):
    # Bytes that may follow a complete token: blank, tab, '\n', '\r'.
    return c == 32 or c == 9 or c == 10 or c == 13


@njit(cache=True)
def _parse_value(buf, pos, n):
    """Parse a decimal number at buf[pos:]; return (float64 value, end position, ok).

    Grammar: [+-] digits [. digits] [(e|E) [+-] digits], at least one mantissa
    digit. The first 18 significant digits are kept (they cannot overflow int64);
    later digits are dropped (only shifting the exponent), which changes the
    value by < 1e-17 relative, far below float32 resolution (6e-8).
    """
    neg = False
    if pos < n and (buf[pos] == 45 or buf[pos] == 43):
        neg = buf[pos] == 45
        pos += 1
    mant = 0
    nsig = 0
    exp10 = 0
    ndig = 0
    while pos < n:
        d = np.int64(buf[pos]) - 48
        if d < 0 or d > 9:
            break
        ndig += 1
        if nsig < 18:
            mant = mant * 10 + d
            if mant != 0:
                nsig += 1
        else:
            exp10 += 1
        pos += 1
    if pos < n and buf[pos] == 46:
        pos += 1
        while pos < n:
            d = np.int64(buf[pos]) - 48
            if d < 0 or d > 9:
                break
            ndig += 1
            if nsig < 18:
                mant = mant * 10 + d
                if mant != 0:
                    nsig += 1
                exp10 -= 1
            pos += 1
    if ndig == 0:
        return 0.0, pos, False
    if pos < n and (buf[pos] == 101 or buf[pos] == 69):
        pos += 1
        eneg = False
        if pos < n and (buf[pos] == 45 or buf[pos] == 43):
            eneg = buf[pos] == 45
            pos += 1
        e = 0
        nd = 0
        while pos < n:
            d = np.int64(buf[pos]) - 48
            if d < 0 or d > 9:
                break
            if e < 100000:  # saturate: anything this large is 0 or inf anyway
                e = e * 10 + d
            nd += 1
            pos += 1
        if nd == 0:
            return 0.0, pos, False
        exp10 += -e if eneg else e
    v = _dec_to_f64(mant, exp10)
    return (-v if neg else v), pos, True


@njit(cache=True)
def _count_bytes(buf, start):
    """Counts of '\\n', ':' and ',' in buf[start:] (upper bounds for lines, non-zeros, labels).

    Eight bytes at a time (SWAR): for a word w and byte pattern c, the high bit of
    each byte of ~(((x & 0x7f..) + 0x7f..) | x) with x = w ^ c is set exactly where
    that byte of w equals c; a multiply by 0x0101.. sums the eight flags into the
    top byte. About 3x faster than a byte loop, which LLVM does not vectorise.
    """
    n = buf.size
    head = min(n, start + (-start) % 8)
    n_nl = 0
    n_colon = 0
    n_comma = 0
    for i in range(start, head):
        c = buf[i]
        n_nl += c == 10
        n_colon += c == 58
        n_comma += c == 44
    n_words = (n - head) // 8
    words = buf[head:head + 8 * n_words].view(np.uint64)
    ones = np.uint64(0x0101010101010101)
    low7 = np.uint64(0x7F7F7F7F7F7F7F7F)
    high = np.uint64(0x8080808080808080)
    pat_nl = np.uint64(10) * ones
    pat_colon = np.uint64(58) * ones
    pat_comma = np.uint64(44) * ones
    s7 = np.uint64(7)
    s56 = np.uint64(56)
    for i in range(n_words):
        w = words[i]
        x = w ^ pat_nl
        n_nl += ((~(((x & low7) + low7) | x) & high) >> s7) * ones >> s56
        x = w ^ pat_colon
        n_colon += ((~(((x & low7) + low7) | x) & high) >> s7) * ones >> s56
        x = w ^ pat_comma
        n_comma += ((~(((x & low7) + low7) | x) & high) >> s7) * ones >> s56
    for i in range(head + 8 * n_words, n):
        c = buf[i]
        n_nl += c == 10
        n_colon += c == 58
        n_comma += c == 44
    return n_nl, n_colon, n_comma


@njit(cache=True)
def _parse_body(buf, pos, n_features, n_labels,
                x_indptr, x_indices, x_data, y_indptr, y_indices, err):
    """Parse the data lines of buf[pos:] into preallocated CSR arrays.

    buf: uint8 [n_bytes], the whole file; pos: offset of the first data line.
    x_indptr, y_indptr: int [>= n_lines + 1]; x_indices, x_data (float32),
    y_indices: int [>= number of ':' / ',' + n_lines], filled row by row with
    indices sorted within each row (labels also de-duplicated).
    err: int64 [3], set on failure to (code, byte offset, index or 0).
    Returns (code, n_rows, n_rows_through_last_nonblank, nnz_x, nnz_y).
    """
    n = buf.size
    row = 0
    last_nonblank = 0
    fp = 0
    lp = 0
    x_indptr[0] = 0
    y_indptr[0] = 0
    while pos < n:
        line_start = pos
        row_f0 = fp
        row_l0 = lp
        x_sorted = True
        y_sorted = True
        prev_f = -1
        nonblank = False
        while True:
            while pos < n and (buf[pos] == 32 or buf[pos] == 9):
                pos += 1
            if pos >= n:
                break
            c = buf[pos]
            if c == 10:
                pos += 1
                break
            if c == 13:
                if pos + 1 >= n:
                    pos += 1
                    break
                if buf[pos + 1] == 10:
                    pos += 2
                    break
                err[0] = _E_STRAY_CR
                err[1] = pos
                return _E_STRAY_CR, row, last_nonblank, fp, lp
            nonblank = True
            tok = pos
            v = 0
            nd = 0
            while pos < n:
                d = np.int64(buf[pos]) - 48
                if d < 0 or d > 9:
                    break
                if nd < 18:  # 18 digits cannot overflow int64; more is out of range anyway
                    v = v * 10 + d
                nd += 1
                pos += 1
            c = buf[pos] if pos < n else np.uint8(10)
            if nd > 0 and c == 58:
                if nd > 18 or v >= n_features:
                    err[0] = _E_FEATURE_RANGE
                    err[1] = tok
                    return _E_FEATURE_RANGE, row, last_nonblank, fp, lp
                val, pos, ok = _parse_value(buf, pos + 1, n)
                if not ok or (pos < n and not _is_end(buf[pos])):
                    err[0] = _E_FEATURE_TOKEN
                    err[1] = tok
                    return _E_FEATURE_TOKEN, row, last_nonblank, fp, lp
                f = _to_f32(val)
                if not np.isfinite(f):
                    err[0] = _E_VALUE_RANGE
                    err[1] = tok
                    return _E_VALUE_RANGE, row, last_nonblank, fp, lp
                x_indices[fp] = v
                x_data[fp] = f
                fp += 1
                if v <= prev_f:
                    x_sorted = False
                prev_f = v
            elif nd > 0 and tok == line_start and (c == 44 or _is_end(c)):
                # The label field: l1,l2,... starting at the very beginning of the line.
                prev_l = -1
                while True:
                    if nd > 18 or v >= n_labels:
                        err[0] = _E_LABEL_RANGE
                        err[1] = tok
                        return _E_LABEL_RANGE, row, last_nonblank, fp, lp
                    y_indices[lp] = v
                    lp += 1
                    if v <= prev_l:
                        y_sorted = False
                    prev_l = v
                    if pos < n and buf[pos] == 44:
                        pos += 1
                        tok = pos
                        v = 0
                        nd = 0
                        while pos < n:
                            d = np.int64(buf[pos]) - 48
                            if d < 0 or d > 9:
                                break
                            if nd < 18:
                                v = v * 10 + d
                            nd += 1
                            pos += 1
                        if nd == 0 or (pos < n and not (buf[pos] == 44 or _is_end(buf[pos]))):
                            err[0] = _E_LABEL_TOKEN
                            err[1] = line_start
                            return _E_LABEL_TOKEN, row, last_nonblank, fp, lp
                    else:
                        break
            else:
                code = _E_FIRST_TOKEN if tok == line_start else _E_FEATURE_TOKEN
                err[0] = code
                err[1] = tok
                return code, row, last_nonblank, fp, lp
        if not x_sorted:
            seg = x_indices[row_f0:fp]
            order = np.argsort(seg, kind="mergesort")
            idx = seg[order]
            dat = x_data[row_f0:fp][order]
            for i in range(1, idx.size):
                if idx[i] == idx[i - 1]:
                    err[0] = _E_DUP_FEATURE
                    err[1] = line_start
                    err[2] = idx[i]
                    return _E_DUP_FEATURE, row, last_nonblank, fp, lp
            x_indices[row_f0:fp] = idx
            x_data[row_f0:fp] = dat
        if not y_sorted:
            lab = np.sort(y_indices[row_l0:lp])
            k = row_l0
            for i in range(lab.size):
                if i == 0 or lab[i] != lab[i - 1]:
                    y_indices[k] = lab[i]
                    k += 1
            lp = k
        row += 1
        x_indptr[row] = fp
        y_indptr[row] = lp
        if nonblank:
            last_nonblank = row
    return _OK, row, last_nonblank, fp, lp


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


# --------------------------------------------------------------------------- reading


def cache_path(path) -> str:
    """The binary cache of XMC text file `path`: the directory ``<path>.dslcache``."""
    return os.fspath(path) + ".dslcache"


def _read_bytes(path: str) -> tuple[np.ndarray, os.stat_result]:
    """The file's content as uint8 [n_bytes] (gunzipped if it starts with the gzip magic)."""
    with open(path, "rb", buffering=0) as f:
        st = os.fstat(f.fileno())
        head = f.read(2)
        if head == _GZIP_MAGIC:
            f.seek(0)
            try:
                with gzip.GzipFile(fileobj=f, mode="rb") as g:
                    return np.frombuffer(g.read(), dtype=np.uint8), st
            except (EOFError, gzip.BadGzipFile, zlib.error) as e:
                raise XMCFormatError(f"{path}: corrupt or truncated gzip data ({e})") from e
        f.seek(0)
        buf = np.empty(st.st_size, dtype=np.uint8)
        view = memoryview(buf)
        got = 0
        while got < buf.size:  # one read() returns at most ~2 GiB on Linux
            k = f.readinto(view[got:])
            if not k:
                break
            got += k
        return buf[:got], st


def _line_of(buf: np.ndarray, pos: int) -> int:
    return int(np.count_nonzero(buf[:pos] == 10)) + 1


def _token_at(buf: np.ndarray, pos: int, stop=b" \t\r\n") -> str:
    """The text from pos to the next byte in `stop` (or the end), shortened if long."""
    chunk = bytes(buf[pos:pos + 81])
    end = len(chunk)
    for i, c in enumerate(chunk):
        if c in stop:
            end = i
            break
    text = chunk[:end].decode("latin-1")
    return text[:77] + "..." if len(text) > 80 else text


def _parse_header(buf: np.ndarray, name: str) -> tuple[tuple[int, int, int], int]:
    """((n_points, n_features, n_labels), offset of line 2) from the first line of buf."""
    nl = np.flatnonzero(buf[:4096] == 10)
    if nl.size:
        end, body = int(nl[0]), int(nl[0]) + 1
    elif buf.size <= 4096:
        end = body = buf.size  # a header without newline and no data lines
    else:
        raise XMCFormatError(f"{name}:1: expected header 'n_points n_features n_labels', "
                             f"got a first line longer than 4096 bytes")
    text = bytes(buf[:end]).decode("latin-1").rstrip("\r")
    fields = text.split()
    if len(fields) != 3 or not all(f.isascii() and f.isdigit() for f in fields):
        got = repr(text[:80]) if text or buf.size else "an empty file"
        raise XMCFormatError(f"{name}:1: expected header 'n_points n_features n_labels' "
                             f"(three non-negative integers), got {got}")
    counts = tuple(int(f) for f in fields)
    if max(counts) >= 2 ** 62:  # the kernels take int64; no real data set comes near
        raise XMCFormatError(f"{name}:1: header counts must be < 2**62, got {text!r}")
    return counts, body


def _parse_error(name: str, buf: np.ndarray, code: int, pos: int, aux: int,
                 n_features: int, n_labels: int) -> XMCFormatError:
    line = _line_of(buf, pos)
    tok = _token_at(buf, pos)
    if code == _E_FEATURE_TOKEN:
        what = f"expected 'feature:value', got {tok!r}"
    elif code == _E_FIRST_TOKEN:
        what = f"expected labels 'l1,l2,...' or 'feature:value', got {tok!r}"
    elif code == _E_LABEL_TOKEN:
        what = f"expected labels 'l1,l2,...' (comma-separated indices), got {tok!r}"
    elif code == _E_FEATURE_RANGE:
        idx = _token_at(buf, pos, stop=b":")
        what = f"feature index {idx} out of range [0, {n_features}) in {tok!r}"
    elif code == _E_LABEL_RANGE:
        idx = _token_at(buf, pos, stop=b", \t\r\n")
        what = f"label index {idx} out of range [0, {n_labels})"
    elif code == _E_VALUE_RANGE:
        what = f"value in {tok!r} is not a finite float32 (|value| <= 3.4028235e38)"
    elif code == _E_DUP_FEATURE:
        what = f"feature index {aux} appears more than once in the line (duplicates are rejected)"
    elif code == _E_STRAY_CR:
        what = "expected '\\r' only right before '\\n' (line end), got a lone '\\r'"
    else:  # pragma: no cover - kernel and Python out of sync
        what = f"unknown parse error code {code}"
    if buf.size and buf[-1] != 10 and _line_of(buf, buf.size) == line:
        what += " (the last line has no newline: is the file truncated?)"
    return XMCFormatError(f"{name}:{line}: {what}")


def _csr(indptr, indices, data, shape) -> sp.csr_matrix:
    m = sp.csr_matrix((data, indices, indptr), shape=shape, copy=False)
    m.has_sorted_indices = True  # guaranteed by the parser / the cache it came from
    return m


def _parse(path: str, name: str):
    """Parse the file: (dict of the arrays a cache holds, os.stat of the file as read)."""
    buf, st = _read_bytes(path)
    (h_points, n_features, n_labels), body = _parse_header(buf, name)
    n_nl, n_colon, n_comma = _count_bytes(buf, body)
    max_lines = int(n_nl) + 1
    max_nnz = int(n_colon)
    max_lab = int(n_comma) + max_lines
    big = max(n_features, n_labels, max_nnz, max_lab) > np.iinfo(np.int32).max
    itype = np.int64 if big else np.int32
    x_indptr = np.empty(max_lines + 1, dtype=itype)
    y_indptr = np.empty(max_lines + 1, dtype=itype)
    x_indices = np.empty(max_nnz, dtype=itype)
    x_data = np.empty(max_nnz, dtype=np.float32)
    y_indices = np.empty(max_lab, dtype=itype)
    err = np.zeros(3, dtype=np.int64)
    code, rows, nonblank, nnz_x, nnz_y = _parse_body(
        buf, body, n_features, n_labels, x_indptr, x_indices, x_data, y_indptr, y_indices, err)
    if code != _OK:
        raise _parse_error(name, buf, int(err[0]), int(err[1]), int(err[2]), n_features, n_labels)
    # Trailing blank lines are padding, except as many as the header still needs.
    n_points = nonblank + min(rows - nonblank, max(0, h_points - nonblank))
    arrays = {
        "x_indptr": x_indptr[:n_points + 1],
        "x_indices": _trim(x_indices, nnz_x),
        "x_data": _trim(x_data, nnz_x),
        "y_indptr": y_indptr[:n_points + 1],
        "y_indices": _trim(y_indices, nnz_y),
        "shape": np.array([n_points, n_features, n_labels], dtype=np.int64),
        "header_points": np.array(h_points, dtype=np.int64),
    }
    return arrays, st


def _trim(a: np.ndarray, n: int) -> np.ndarray:
    # Copy only when the over-allocation is worth giving back.
    return a[:n] if n >= 0.9 * a.size else a[:n].copy()


def _to_data(arrays, name: str, strict: bool) -> XMCData:
    n_points, n_features, n_labels = (int(v) for v in arrays["shape"])
    h_points = int(arrays["header_points"])
    if h_points != n_points:
        msg = (f"{name}:1: the header says {h_points} points but the file has "
               f"{n_points} data lines")
        if strict:
            raise XMCFormatError(msg + " (read_xmc(..., strict=False) accepts the body's count)")
        warnings.warn(msg + f"; using the body's count, {n_points}", XMCFormatWarning, stacklevel=3)
    X = _csr(arrays["x_indptr"], arrays["x_indices"], arrays["x_data"], (n_points, n_features))
    y_indices = arrays["y_indices"]
    Y = _csr(arrays["y_indptr"], y_indices, np.ones(y_indices.size, dtype=np.float32),
             (n_points, n_labels))
    return XMCData(X, Y)


_CACHE_KEYS = ("x_indptr", "x_indices", "x_data", "y_indptr", "y_indices", "shape",
               "header_points")


#: bytes of the source's head and of its tail that the key's digest covers
_DIGEST_BYTES = 1 << 20


def _source_digest(path: str, size: int) -> np.ndarray:
    """SHA-256 of the first and last _DIGEST_BYTES of the file (all of it when smaller), as
    four int64 words."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(_DIGEST_BYTES))
        if size > 2 * _DIGEST_BYTES:
            f.seek(size - _DIGEST_BYTES)
        h.update(f.read(_DIGEST_BYTES if size > 2 * _DIGEST_BYTES else -1))
    return np.frombuffer(h.digest(), dtype=np.int64)


def _cache_key(st: os.stat_result, path: str | None = None) -> np.ndarray:
    """The key a cache of the source (stat `st`) must hold: CACHE_VERSION, size, mtime_ns,
    ctime_ns (which no one can set back: `cp -p` and `touch -r` restore the mtime of a
    rewritten file, not its ctime) and the digest of the source's head and tail (path
    given; zeros when not, for the quick first comparison)."""
    head = np.array([CACHE_VERSION, st.st_size, st.st_mtime_ns, st.st_ctime_ns], dtype=np.int64)
    digest = _source_digest(path, st.st_size) if path is not None else np.zeros(4, dtype=np.int64)
    return np.concatenate([head, digest])


def _source_of(cdir: str) -> str:
    return cdir[: -len(".dslcache")] if cdir.endswith(".dslcache") else cdir


@njit(cache=True)
def _check_rows(indptr, indices, n_cols):
    """0 when the indices of every row are strictly increasing (sorted, unique) and in
    [0, n_cols); else 1 + the first row where they are not. indptr must be valid."""
    for r in range(indptr.size - 1):
        prev = -1
        for e in range(indptr[r], indptr[r + 1]):
            v = indices[e]
            if v <= prev or v >= n_cols:
                return r + 1
            prev = v
    return 0


@njit(cache=True)
def _first_non_finite(x):
    for i in range(x.size):
        if not np.isfinite(x[i]):
            return i
    return -1


def _load_cache(cdir: str, st: os.stat_result, source: str | None = None):
    """The cached arrays if the cache directory cdir exists and matches the source (stat st,
    path `source`, by default cdir without ".dslcache"); None if absent or stale.

    Every array is memory-mapped copy-on-write (np.load(mmap_mode="c")): an
    ordinary writable array whose pages come from the page cache on first
    touch, shared by the ranks of a node until one writes to it.
    Raises (OSError, ValueError, EOFError) if unreadable or if what it holds is not what a
    parse gives (indices unsorted, repeated or out of range; values not finite).
    """
    if not os.path.isdir(cdir):
        if os.path.lexists(cdir):
            raise ValueError("not a directory")
        return None
    key = np.load(os.path.join(cdir, "key.npy"), allow_pickle=False)
    want = _cache_key(st)
    if key.shape != want.shape or not np.array_equal(key[:4], want[:4]):
        return None
    if not np.array_equal(key, _cache_key(st, source or _source_of(cdir))):  # same stat, other bytes
        return None
    arrays = {}
    for k in _CACHE_KEYS:
        # np.asarray: a plain ndarray view of the np.memmap; it keeps the mapping alive
        arrays[k] = np.asarray(np.load(os.path.join(cdir, k + ".npy"), mmap_mode="c", allow_pickle=False))
    # A well-formed file of the wrong shape, or indices that would let a kernel
    # (numba checks no bounds) read out of bounds, must not get through.
    if arrays["shape"].shape != (3,) or arrays["header_points"].shape != ():
        raise ValueError("bad shape / header_points")
    n_points, n_features, n_labels = (int(v) for v in arrays["shape"])
    for p, i, n_cols in (("x_indptr", "x_indices", n_features),
                         ("y_indptr", "y_indices", n_labels)):
        ptr, idx = arrays[p], arrays[i]
        if (ptr.ndim != 1 or idx.ndim != 1 or ptr.size != n_points + 1 or ptr.dtype != idx.dtype
                or idx.dtype.kind != "i" or ptr[0] != 0 or ptr[-1] != idx.size):
            raise ValueError(f"inconsistent arrays {p}/{i}")
        if n_points and np.any(ptr[1:] < ptr[:-1]):
            raise ValueError(f"{p} decreases")
        bad_row = _check_rows(ptr, idx, n_cols)
        if bad_row:
            raise ValueError(f"{i} of row {bad_row - 1} are not sorted, unique and in [0, {n_cols})")
    x_data = arrays["x_data"]
    if x_data.dtype != np.float32 or x_data.shape != arrays["x_indices"].shape:
        raise ValueError("inconsistent array x_data")
    bad = _first_non_finite(x_data)
    if bad >= 0:
        raise ValueError(f"x_data holds {x_data[bad]} (values must be finite)")
    return arrays


def _is_valid_cache(cdir: str, st: os.stat_result, source: str | None = None) -> bool:
    """Whether cdir holds a good cache of the source as `st` describes it."""
    try:
        return _load_cache(cdir, st, source) is not None
    except (OSError, ValueError, EOFError):
        return False


def _cache_modes(st: os.stat_result, gid: int) -> tuple[int, int]:
    """(file mode, directory mode) of a cache of a source with stat `st`: the source's read and
    write bits less the umask (a private source gets a private cache), a directory's search
    bit wherever it can be read; no group bits when the cache's group `gid` is not the
    source's (another group must not read it)."""
    mode = st.st_mode & 0o666 & ~_umask()
    if gid != st.st_gid:
        mode &= ~0o070
    return mode, mode | (mode & 0o444) >> 2


def _save_cache(cdir: str, st: os.stat_result, arrays) -> None:
    """Write the cache directory atomically; skip silently where the directory is not writable.

    The arrays go, one plain .npy each, into a fresh temporary directory that is
    then renamed to cdir, so a reader sees a complete cache or none. A cache
    already there for the same source (another rank or process wrote it
    meanwhile) is kept; a stale or broken one is moved aside first and deleted
    after the rename (readers that mapped its files keep them until they let go).
    """
    directory = os.path.dirname(cdir) or "."
    try:
        # A directory without any write bit is meant to be read-only even where
        # root could write to it (e.g. a shared data directory): leave it alone.
        if not os.access(directory, os.W_OK) or not os.stat(directory).st_mode & 0o222:
            return
        tmp = tempfile.mkdtemp(dir=directory, prefix=os.path.basename(cdir) + ".", suffix=".tmp")
    except OSError:
        return  # read-only directory or file system: no cache, by design
    source = _source_of(cdir)
    old = None
    try:
        key = _cache_key(st, source)
        for name, a in {**arrays, "key": key}.items():
            np.save(os.path.join(tmp, name + ".npy"), np.asanyarray(a), allow_pickle=False)
        gid = os.stat(tmp).st_gid
        if gid != st.st_gid:  # the source's group, where we may give it (we belong to it)
            try:
                os.chown(tmp, -1, st.st_gid)
                gid = st.st_gid
            except OSError:
                pass
        file_mode, dir_mode = _cache_modes(st, gid)
        for name in os.listdir(tmp):  # the directory is still mkdtemp's 0700: no one else has looked in
            if gid == st.st_gid:
                os.chown(os.path.join(tmp, name), -1, gid)
            os.chmod(os.path.join(tmp, name), file_mode)
        os.chmod(tmp, dir_mode)
        for attempt in range(3):
            try:
                os.rename(tmp, cdir)
                break
            except OSError as e:
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR) or attempt == 2:
                    raise
            if _is_valid_cache(cdir, st, source):  # another process wrote the same cache meanwhile
                shutil.rmtree(tmp, ignore_errors=True)
                return
            old = old or tempfile.mkdtemp(dir=directory, prefix=os.path.basename(cdir) + ".", suffix=".old")
            try:
                os.rename(cdir, os.path.join(old, str(attempt)))
            except FileNotFoundError:
                pass  # another writer moved it away first
        legacy = cdir + ".npz"  # the single-file cache of CACHE_VERSION <= 2: replaced by this one
        if os.path.isfile(legacy):
            os.unlink(legacy)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        warnings.warn(f"could not write the cache {cdir}: {e}", XMCCacheWarning, stacklevel=3)
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def _umask() -> int:
    umask = os.umask(0)  # the only way to read it; restored at once (not thread-safe)
    os.umask(umask)
    return umask


#: caches parsed inside `caches_held()`, not yet written: (cache dir, source stat, arrays)
_held: list | None = None


@contextlib.contextmanager
def caches_held():
    """Within the block, read_xmc writes no cache: it keeps what it would write in the list
    this yields, for `write_caches` once the caller has accepted its inputs (a command that
    refuses them then leaves nothing behind). Caches never written are dropped."""
    global _held
    outer, _held = _held, []
    try:
        yield _held
    finally:
        _held = outer


def write_caches(held: list) -> None:
    """Write the caches `caches_held` kept (and forget them)."""
    for cdir, st, arrays in held:
        _save_cache(cdir, st, arrays)
    held.clear()


def read_xmc(path, *, strict: bool = True, cache: bool = True) -> XMCData:
    """Read an XMC text file (plain or gzip) into XMCData.

    Returns X csr_matrix float32 [n_points, n_features] and Y csr_matrix float32
    [n_points, n_labels] (ones), both with sorted unique indices; index arrays are
    int32 (int64 only beyond 2**31 - 1). The format and its edge cases are in the
    module docstring; in short X[i, f] = v for each token ``f:v`` of data line i,
    Y[i, l] = 1 for each l of its label field, a repeated feature index in a line
    is an error and a repeated label counts once.

    strict: when the header's point count differs from the number of data lines,
        raise XMCFormatError (True) or warn (XMCFormatWarning) and use the body's
        count (False). Everything else is checked the same either way.
    cache: keep a binary copy of the parsed arrays in the directory
        ``<path>.dslcache/`` (one plain ``.npy`` per array and ``key.npy``,
        written into a temporary directory and renamed into place) and load it
        instead of parsing while the source keeps its size, modification and
        change times (mtime_ns, ctime_ns) and the SHA-256 of its first and last MiB,
        and CACHE_VERSION is unchanged; what a cache holds is checked before use
        (CSR indices sorted, unique, in range; values finite). The cache's files take
        the source's permission bits (less the umask) and group. The arrays are memory-mapped
        copy-on-write (``np.load(mmap_mode="c")``): ordinary writable arrays
        whose pages come from the page cache on first touch (shared by the ranks
        of a node until written). So never modify a cache file in place (delete
        the directory, or let read_xmc replace it): truncating a mapped file
        crashes its readers with SIGBUS. An unreadable cache is reported with a
        warning and rewritten. Where the
        directory is not writable, or has no write bit in its mode (read-only by
        intent, even for root), no cache is kept, silently. A read that raises
        leaves no cache behind.

    Raises XMCFormatError (a ValueError) naming ``file:line``, what was expected
    and the offending token; OSError if the file cannot be read.
    """
    path = os.fspath(path)
    name = path
    st = os.stat(path)
    cpath = cache_path(path)
    if cache:
        try:
            arrays = _load_cache(cpath, st)
        except (OSError, ValueError, EOFError) as e:
            warnings.warn(f"ignoring the unreadable cache {cpath} ({type(e).__name__}: {e}); "
                          "parsing the text and rewriting it", XMCCacheWarning, stacklevel=2)
            arrays = None
        if arrays is not None:
            return _to_data(arrays, name, strict)
    arrays, st_read = _parse(path, name)
    data = _to_data(arrays, name, strict)
    if cache:
        st_after = os.stat(path)
        # Only cache what we know matches the file: it must not have changed while being read.
        if (st_read.st_size, st_read.st_mtime_ns, st_read.st_ctime_ns) == \
                (st_after.st_size, st_after.st_mtime_ns, st_after.st_ctime_ns):
            if _held is not None:
                _held.append((cpath, st_after, arrays))
            else:
                _save_cache(cpath, st_after, arrays)
    return data


# --------------------------------------------------------------------------- writing


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
