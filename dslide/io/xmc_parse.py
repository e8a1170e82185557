"""The XMC text parser: numba kernels from the bytes of a file to CSR arrays.

A kernel counts the ``'\\n'``, ``':'`` and ``','`` bytes (upper bounds for
points, non-zeros and labels); `parse_body` then parses, validates and fills the
CSR arrays in one pass over the file, a block of lines at a time (so that a
caller can show progress), with its own decimal-to-float32 conversion (within 1
ulp of the nearest float32, exact but for float64 landing on a float32 rounding
midpoint). On the first invalid byte the kernel stops and returns an error code
and a byte offset; `parse_error` turns those into ``file:line: what was
expected, got 'token'``. The format's rules are in dslide.io.data's docstring.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from dslide import _numba_cache  # noqa: F401  (before any kernel: the cache is keyed by module name)

class XMCFormatError(ValueError):
    """Malformed XMC text: the message names the file, the line and what was expected."""



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
def _parse_body(buf, pos, end, n_features, n_labels, x_indptr, x_indices, x_data, y_indptr, y_indices, err,
                row, last_nonblank, fp, lp):
    """Parse the data lines of buf that start in [pos, end) into preallocated CSR arrays.

    buf: uint8 [n_bytes], the whole file; pos: offset of a line's start; a line
    that starts before `end` is parsed to its end, so a call ends at a line's start.
    x_indptr, y_indptr: int [>= n_lines + 1]; x_indices, x_data (float32),
    y_indices: int [>= number of ':' / ',' + n_lines], filled row by row with
    indices sorted within each row (labels also de-duplicated).
    row, last_nonblank, fp, lp: where the previous call left off (0 at first):
    rows parsed, rows through the last non-blank one, x and y entries written.
    err: int64 [3], set on failure to (code, byte offset, index or 0).
    Returns (code, pos, row, last_nonblank, fp, lp): the new position and state.
    """
    n = buf.size
    if row == 0:
        x_indptr[0] = 0
        y_indptr[0] = 0
    while pos < end:
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
                return _E_STRAY_CR, pos, row, last_nonblank, fp, lp
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
                    return _E_FEATURE_RANGE, pos, row, last_nonblank, fp, lp
                val, pos, ok = _parse_value(buf, pos + 1, n)
                if not ok or (pos < n and not _is_end(buf[pos])):
                    err[0] = _E_FEATURE_TOKEN
                    err[1] = tok
                    return _E_FEATURE_TOKEN, pos, row, last_nonblank, fp, lp
                f = _to_f32(val)
                if not np.isfinite(f):
                    err[0] = _E_VALUE_RANGE
                    err[1] = tok
                    return _E_VALUE_RANGE, pos, row, last_nonblank, fp, lp
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
                        return _E_LABEL_RANGE, pos, row, last_nonblank, fp, lp
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
                            return _E_LABEL_TOKEN, pos, row, last_nonblank, fp, lp
                    else:
                        break
            else:
                code = _E_FIRST_TOKEN if tok == line_start else _E_FEATURE_TOKEN
                err[0] = code
                err[1] = tok
                return code, pos, row, last_nonblank, fp, lp
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
                    return _E_DUP_FEATURE, pos, row, last_nonblank, fp, lp
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
    return _OK, pos, row, last_nonblank, fp, lp


#: bytes of the file parsed per kernel call (between two progress reports)
PARSE_BLOCK_BYTES = 32 << 20


def parse_body(buf, pos, n_features, n_labels, x_indptr, x_indices, x_data, y_indptr, y_indices, err,
               progress=None):
    """_parse_body over all of buf[pos:], a block of PARSE_BLOCK_BYTES at a time; progress(bytes)
    (optional) is called after each block with the bytes parsed in it. The same arrays and the
    same result as one call over the whole file. Returns (code, rows, rows through the last
    non-blank one, nnz_x, nnz_y)."""
    n = buf.size
    row = last = fp = lp = 0
    while True:
        end = n if progress is None else min(n, pos + PARSE_BLOCK_BYTES)
        code, new, row, last, fp, lp = _parse_body(buf, pos, end, n_features, n_labels, x_indptr, x_indices,
                                                   x_data, y_indptr, y_indices, err, row, last, fp, lp)
        if progress is not None:
            progress(new - pos)
        pos = new
        if code != _OK or pos >= n:
            return code, row, last, fp, lp


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


def parse_error(name: str, buf: np.ndarray, code: int, pos: int, aux: int,
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

