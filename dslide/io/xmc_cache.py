"""The binary cache of a parsed XMC text file.

After a successful parse the arrays are saved beside the source, one ``.npy``
file each in the directory ``<path>.dslcache/``, and later memory-mapped from
there with ``np.load(mmap_mode=...)`` (see dslide.io.data.read_xmc). The cache is
as private as its source (its files take the source's permission bits and
group), is keyed on the source's size, mtime, ctime and a SHA-256 of its first
and last MiB, and what it holds is checked before use (indices sorted, unique
and in range, values finite), so a stale or tampered cache is parsed over,
never used. A cache is written into a temporary directory and renamed into
place: a reader sees a complete cache or none.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import tempfile
import warnings

import numpy as np
from numba import njit

from dslide import _numba_cache  # noqa: F401  (before any kernel: the cache is keyed by module name)

class XMCCacheWarning(UserWarning):
    """The binary cache beside an XMC file could not be read or written (the text was used)."""


# Bump whenever the parse result for the same bytes could change (format rules,
# array layout), or the key does: every existing cache then misses.
CACHE_VERSION = 4  # 4: the key has the source's ctime and a digest of its head and tail


def cache_path(path) -> str:
    """The binary cache of XMC text file `path`: the directory ``<path>.dslcache``."""
    return os.fspath(path) + ".dslcache"


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


def _save_cache(cdir: str, st: os.stat_result, arrays) -> bool:
    """Write the cache directory atomically; skip silently where the directory is not writable.
    True when this call wrote cdir.

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
            return False
        tmp = tempfile.mkdtemp(dir=directory, prefix=os.path.basename(cdir) + ".", suffix=".tmp")
    except OSError:
        return False  # read-only directory or file system: no cache, by design
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
                return False
            old = old or tempfile.mkdtemp(dir=directory, prefix=os.path.basename(cdir) + ".", suffix=".old")
            try:
                os.rename(cdir, os.path.join(old, str(attempt)))
            except FileNotFoundError:
                pass  # another writer moved it away first
        legacy = cdir + ".npz"  # the single-file cache of CACHE_VERSION <= 2: replaced by this one
        if os.path.isfile(legacy):
            os.unlink(legacy)
        return True
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        warnings.warn(f"could not write the cache {cdir}: {e}", XMCCacheWarning, stacklevel=3)
        return False
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


def write_caches(held: list) -> list:
    """Write the caches `caches_held` kept (and forget them); returns the cache directories
    written, for `remove_caches` should the command fail before it has begun."""
    written = [cdir for cdir, st, arrays in held if _save_cache(cdir, st, arrays)]
    held.clear()
    return written


def remove_caches(written: list) -> None:
    """Remove cache directories that write_caches wrote (a refused command leaves none)."""
    for cdir in written:
        if os.path.isdir(cdir) and not os.path.islink(cdir):
            shutil.rmtree(cdir, ignore_errors=True)
