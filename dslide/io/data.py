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
How it is done
==============
Three modules do the work; this one is their public face (XMCData, read_xmc,
write_xmc):

* dslide.io.xmc_parse: the numba kernels from the file's bytes to CSR arrays,
  and the ``file:line`` messages of what they reject;
* dslide.io.xmc_cache: the binary cache beside the source, ``<path>.dslcache/``,
  written atomically and checked before use;
* dslide.io.xmc_write: the numba formatter behind write_xmc.

Reading: the file is read into one ``uint8`` array, its header checked, and
the body parsed a block of lines at a time (a progress callback sees the bytes
done); the arrays are then cached and later memory-mapped from the cache.
Throughput is measured by scripts/bench_io.py (docs/benchmarks.md).
"""

from __future__ import annotations

import gzip
import hashlib
import os
import warnings
import zlib
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from dslide.io import xmc_cache
from dslide.io.xmc_cache import (CACHE_VERSION, XMCCacheWarning, _load_cache, _save_cache, cache_path,
                              caches_held, write_caches)
from dslide.io.xmc_parse import _OK, XMCFormatError, _count_bytes, _parse_header, parse_body, parse_error
from dslide.io.xmc_write import write_xmc

__all__ = ["XMCData", "XMCFormatError", "XMCFormatWarning", "XMCCacheWarning", "read_xmc",
           "write_xmc", "cache_path", "caches_held", "write_caches", "CACHE_VERSION"]


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


def checksum(data: XMCData) -> str:
    """SHA-256 (hex) of what a data set holds: its shape, X's rows of (feature, value) and Y's
    labels, whatever the file format or index dtype it was read from. A run stores it with
    its checkpoints; a resume compares it with the data it is given."""
    h = hashlib.sha256(np.asarray([*data.X.shape, data.Y.shape[1]], np.int64).tobytes())
    for a, dtype in ((data.X.indptr, np.int64), (data.X.indices, np.int64), (data.X.data, np.float32),
                     (data.Y.indptr, np.int64), (data.Y.indices, np.int64)):
        for s in range(0, a.size, 1 << 22):  # converted a block at a time: no copy of a whole array
            h.update(np.ascontiguousarray(a[s:s + (1 << 22)], dtype))
    return h.hexdigest()


class XMCFormatWarning(UserWarning):
    """An XMC file read with ``strict=False`` disagrees with its own header."""


_GZIP_MAGIC = b"\x1f\x8b"


# --------------------------------------------------------------------------- reading

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


def _csr(indptr, indices, data, shape) -> sp.csr_matrix:
    m = sp.csr_matrix((data, indices, indptr), shape=shape, copy=False)
    m.has_sorted_indices = True  # guaranteed by the parser / the cache it came from
    return m


def _parse(path: str, name: str, progress=None):
    """Parse the file: (dict of the arrays a cache holds, os.stat of the file as read);
    progress(bytes) as in xmc_parse.parse_body."""
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
    if progress is not None:
        progress(body)
    code, rows, nonblank, nnz_x, nnz_y = parse_body(
        buf, body, n_features, n_labels, x_indptr, x_indices, x_data, y_indptr, y_indices, err, progress)
    if code != _OK:
        raise parse_error(name, buf, int(err[0]), int(err[1]), int(err[2]), n_features, n_labels)
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

def read_xmc(path, *, strict: bool = True, cache: bool = True, progress=None) -> XMCData:
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
    progress: called as progress(n_bytes) while the text is parsed (not on a cache hit),
        the bytes of the file done since the last call: e.g. a tqdm bar's `update`.

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
    arrays, st_read = _parse(path, name, progress)
    data = _to_data(arrays, name, strict)
    if cache:
        st_after = os.stat(path)
        # Only cache what we know matches the file: it must not have changed while being read.
        if (st_read.st_size, st_read.st_mtime_ns, st_read.st_ctime_ns) == \
                (st_after.st_size, st_after.st_mtime_ns, st_after.st_ctime_ns):
            if xmc_cache._held is not None:
                xmc_cache._held.append((cpath, st_after, arrays))
            else:
                _save_cache(cpath, st_after, arrays)
    return data
