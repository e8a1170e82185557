"""The files of a checkpoint: one array <-> one .npy file in bounded memory, names that
stay inside the checkpoint directory, and the fields a manifest holds.

`write_npy` writes an array under a temporary name CHUNK bytes at a time, its
SHA-256 computed on the way, then fsyncs and renames it. `NpyFile` reads one
back straight into a given array, whole or a slice along one axis, hashing as
it reads; `Digest` checks a file's SHA-256 in a second thread while slices of
it are read. A header may claim any shape: what a reader allocates is bounded
by the file's size. `plain_name` and `inside` refuse a name from a manifest or
LATEST that is not one plain path component resolving inside its directory;
`check_manifest` refuses a manifest that is not the object a save writes.
Every failure is a CheckpointError naming the file.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import threading
from pathlib import Path

import numpy as np

from dslide.io import rundir

CHUNK = 64 << 20  # bytes per read/write call: the extra memory a save or load needs


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: missing, incomplete, corrupt or of another network."""


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


#: the names a manifest and LATEST may hold: one plain path component ("rank-0000",
#: "layer0.W.m.npy", "step-000001200.1"), never "..", "/x" or "a/b"
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,254}")


def plain_name(name, what: str, where) -> str:
    if not isinstance(name, str) or not _PLAIN_NAME.fullmatch(name):
        raise CheckpointError(f"{where}: {what} {name!r} is not a plain name inside the checkpoint directory "
                              f"(no '/', no '..', not absolute); refusing to read or write outside it")
    return name


def inside(base: Path, name: str, what: str, where) -> Path:
    """base / name, refused unless it resolves inside base (a symlink pointing out of it)."""
    path = Path(base) / plain_name(name, what, where)
    try:
        within = path.resolve().is_relative_to(Path(base).resolve())
    except (OSError, RuntimeError):  # a symlink loop
        within = False
    if not within:
        raise CheckpointError(f"{where}: {what} {name!r} leads outside {base} (a symbolic link); refusing it")
    return path


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _npy_header(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    d = {"descr": np.lib.format.dtype_to_descr(arr.dtype), "fortran_order": False, "shape": arr.shape}
    try:
        np.lib.format.write_array_header_1_0(buf, d)
    except ValueError:  # a header over 64 KiB (never for our shapes)
        buf = io.BytesIO()
        np.lib.format.write_array_header_2_0(buf, d)
    return buf.getvalue()


def write_npy(path: Path, arr: np.ndarray) -> str:
    """Write `arr` as a .npy file atomically (temporary name, fsync, rename), CHUNK bytes at a
    time; returns the file's SHA-256."""
    arr = np.asarray(arr)
    h = hashlib.sha256()
    # a fresh temporary name, created exclusively (a symlink planted at any name is never
    # written through), fsynced and renamed; removed if the write fails
    with rundir.replacing(path) as f:
        head = _npy_header(arr)
        h.update(head)
        f.write(head)
        rows = arr.reshape(-1) if arr.flags.c_contiguous else None
        if rows is not None:
            raw = memoryview(rows.view(np.uint8)) if arr.size else memoryview(b"")
            for a in range(0, len(raw), CHUNK):
                h.update(raw[a:a + CHUNK])
                f.write(raw[a:a + CHUNK])
        else:  # a strided view: contiguous copies of a few rows at a time
            lead = arr.reshape(arr.shape[0], -1) if arr.ndim > 1 else arr.reshape(-1, 1)
            step = max(1, CHUNK // max(1, lead[0].nbytes))
            for a in range(0, lead.shape[0], step):
                block = np.ascontiguousarray(lead[a:a + step]).view(np.uint8).reshape(-1)
                h.update(block)
                f.write(block)
    return h.hexdigest()


class NpyFile:
    """An open .npy file: its shape, dtype and where the data starts."""

    def __init__(self, path: Path):
        self.path = path
        self.f = open(path, "rb")
        try:
            version = np.lib.format.read_magic(self.f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(self.f)
            else:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(self.f)
        except ValueError as e:
            self.f.close()
            raise CheckpointError(f"{path} is not a valid .npy file: {e}") from None
        if fortran or dtype.hasobject:
            self.f.close()
            raise CheckpointError(f"{path} holds a {'Fortran-ordered' if fortran else 'object'} array; "
                                  f"checkpoints hold C-ordered plain arrays")
        self.shape, self.dtype, self.offset = tuple(shape), dtype, self.f.tell()
        # a header may claim any shape: what a reader allocates is bounded by the file's size
        want = self.offset + int(np.prod(self.shape, dtype=object)) * dtype.itemsize
        size = os.fstat(self.f.fileno()).st_size
        if size < want:
            self.f.close()
            raise CheckpointError(f"{path} is truncated: {size} bytes where its header describes {dtype} "
                                  f"values of shape {self.shape} ({want} bytes)")

    def close(self):
        self.f.close()

    def _readinto(self, out_bytes: memoryview, h=None) -> None:
        pos = 0
        while pos < len(out_bytes):
            n = self.f.readinto(out_bytes[pos:pos + CHUNK])
            if not n:
                raise CheckpointError(f"{self.path} is truncated: expected {np.prod(self.shape)} "
                                      f"{self.dtype} values of shape {self.shape}")
            if h is not None:
                h.update(out_bytes[pos:pos + n])
            pos += n

    def read_all(self, out: np.ndarray, h=None) -> None:
        """The whole array into `out` (C-contiguous, its shape and dtype); h: a hash object
        fed the file's bytes from the start (header included)."""
        if out.shape != self.shape or out.dtype != self.dtype:
            raise CheckpointError(f"{self.path} holds {self.dtype} {self.shape}, expected {out.dtype} {out.shape}")
        self.f.seek(0)
        head = self.f.read(self.offset)
        if h is not None:
            h.update(head)
        if out.size:
            self._readinto(memoryview(out.reshape(-1).view(np.uint8)), h)
        if h is not None and self.f.read(1):
            raise CheckpointError(f"{self.path} has bytes after its array")

    def read_slice(self, axis: int, a: int, b: int, out: np.ndarray) -> None:
        """Entries [a, b) along `axis` into out (the slice's shape; a view into a larger
        array is fine): a contiguous byte range read directly when nothing precedes the
        axis, otherwise blocks of leading rows through a buffer of about CHUNK bytes."""
        shape = self.shape
        outer = int(np.prod(shape[:axis], dtype=np.int64))
        n = shape[axis]
        inner = int(np.prod(shape[axis + 1:], dtype=np.int64))
        item = self.dtype.itemsize
        want = shape[:axis] + (b - a,) + shape[axis + 1:]
        if out.shape != want or out.dtype != self.dtype:
            raise CheckpointError(f"{self.path}: slice [{a}, {b}) of axis {axis} needs a "
                                  f"{self.dtype} {want} target, got {out.dtype} {out.shape}")
        if out.size == 0:
            return
        if outer == 1 and out.flags.c_contiguous:
            self.f.seek(self.offset + a * inner * item)
            self._readinto(memoryview(out.reshape(-1).view(np.uint8)))
            return
        row = n * inner * item
        step = max(1, CHUNK // row)
        buf = np.empty((step, n, inner), self.dtype)
        if out.flags.c_contiguous:
            dst = out.reshape(outer, b - a, inner)
        elif out.ndim == 2 and axis == 1:  # columns of a larger matrix: a strided view
            dst = out[:, :, None]
        else:
            raise CheckpointError(f"{self.path}: cannot read axis {axis} of {shape} into a strided target")
        for o in range(0, outer, step):
            k = min(step, outer - o)
            self.f.seek(self.offset + o * row)
            self._readinto(memoryview(buf[:k].reshape(-1).view(np.uint8)))
            dst[o:o + k] = buf[:k, a:b]


class Digest(threading.Thread):
    """The SHA-256 of a file computed in a second thread (hashlib and file reads release the
    GIL) while the main thread reads slices of it; `check` waits for it and compares."""

    def __init__(self, f: Path, want: str, manifest: Path):
        super().__init__(daemon=True)
        self.f, self.want, self.manifest = f, want, manifest
        self.got, self.error = None, None
        self.start()

    def run(self):
        try:
            self.got = sha256(self.f)
        except OSError as e:
            self.error = e

    def check(self) -> None:
        self.join()
        if self.error is not None:
            raise CheckpointError(f"{self.f} could not be read to verify it: {self.error}")
        if self.got != self.want:
            raise mismatch(self.f, self.manifest)


def mismatch(f: Path, manifest: Path) -> CheckpointError:
    return CheckpointError(f"{f} does not match the checksum in {manifest}: the file is corrupt "
                           f"or from another checkpoint")


#: the fields of a manifest and their types (int: not bool); older manifests may lack the optional ones
_FIELDS = {"step": int, "world_size": int, "parallel": str, "n_features": int, "n_labels": int,
           "layers": list, "config": dict, "ranks": list}
_OPTIONAL = {"contents": str, "n_params": int, "extra": dict, "bounds": list, "prior_shift": float}


def check_manifest(m: dict, where: Path) -> None:
    """A manifest `m` (read from `where`) is the object dslide.io.checkpoint.save writes: every
    field of its type, every name in it a plain one (CheckpointError naming the field otherwise)."""

    def bad(field, value, want):
        return CheckpointError(f"{where}: {field} = {json.dumps(value)[:80]} is not valid; expected {want}")

    def is_int(v, lo=0):
        return isinstance(v, int) and not isinstance(v, bool) and v >= lo

    for key, kind in {**_FIELDS, **_OPTIONAL}.items():
        if key not in m:
            if key in _OPTIONAL:
                continue
            raise CheckpointError(f"{where} lacks {key!r}: not a complete dslide checkpoint manifest")
        ok = is_int(m[key]) if kind is int else isinstance(m[key], kind)
        if not ok:
            raise bad(key, m[key], "a non-negative integer" if kind is int else f"a JSON {kind.__name__}")
    if not 0.0 <= m.get("prior_shift", 0.0) <= 2.0:  # NaN fails too
        raise bad("prior_shift", m["prior_shift"], "a number in [0, 2]")
    if m.get("contents", "full") not in ("full", "weights"):
        raise bad("contents", m["contents"], "'full' or 'weights'")
    if m["world_size"] < 1 or len(m["ranks"]) != m["world_size"]:
        raise CheckpointError(f"{where} says {m['world_size']} ranks but lists {len(m['ranks'])}")
    for i, layer in enumerate(m["layers"]):
        if not isinstance(layer, dict) or not isinstance(layer.get("kind"), str) \
                or not all(is_int(layer.get(k)) for k in ("index", "d_in", "n")):
            raise bad(f"layers[{i}]", layer, "{index, kind, d_in, n}")
    if not all(isinstance(b, list) and all(is_int(x) for x in b) for b in m.get("bounds", [])):
        raise bad("bounds", m["bounds"], "one list of integers per layer")
    for r, entry in enumerate(m["ranks"]):
        if not isinstance(entry, dict) or not isinstance(entry.get("arrays"), dict):
            raise bad(f"ranks[{r}]", entry, "{dir, arrays}")
        plain_name(entry.get("dir"), f"ranks[{r}].dir", where)
        for key, a in entry["arrays"].items():
            if not isinstance(a, dict):
                raise bad(f"ranks[{r}].arrays[{key!r}]", a, "{file, sha256, shape, dtype, inference}")
            plain_name(a.get("file"), f"ranks[{r}].arrays[{key!r}].file", where)
            if not isinstance(a.get("sha256"), str) or not isinstance(a.get("inference"), bool) \
                    or not isinstance(a.get("shape"), list) or not all(is_int(x) for x in a["shape"]):
                raise bad(f"ranks[{r}].arrays[{key!r}]", a, "{file, sha256, shape, dtype, inference}")
            try:
                dtype = np.dtype(np.lib.format.descr_to_dtype(a.get("dtype")))
            except (TypeError, ValueError):
                dtype = None
            if dtype is None or dtype.hasobject:
                raise bad(f"ranks[{r}].arrays[{key!r}].dtype", a.get("dtype"), "a plain numpy dtype")
