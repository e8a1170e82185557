"""The data formats of the field besides the XMC text file, and the prediction files.

Read (:func:`read_data`), chosen by `fmt` or else by the file name and its first line:

    "xmc"     the Extreme Classification Repository's single file
              (header `n_points n_features n_labels`; dslide.io.data.read_xmc)
    "split"   the repository's split files, as pyxclib's `read_sparse_file`
              reads them: a features file (`trn_X_Xf.txt`: header
              `n_points n_features`, then `f:v f:v ...` per point) and a labels
              file (`trn_X_Y.txt`: header `n_points n_labels`, then `l:1 l:1 ...`)
    "libsvm"  multilabel libsvm without a header (napkinXC's `load_libsvm_file`,
              scikit-learn's `load_svmlight_file(multilabel=True)` with
              zero-based indices): `l1,l2 f:v f:v ...` per point; the widths are
              the largest index + 1, or the `n_features` / `n_labels` given
    "npz"     a pair of scipy CSR matrices saved with `scipy.sparse.save_npz`
              (PECOS: `X.trn.npz`, `Y.trn.npz`)

A pair of files is named either explicitly, `FEATURES,LABELS`, or by the
features file alone, its labels file found beside it by name: `X_Xf` -> `X_Y`
(`trn_X_Xf.txt` -> `trn_X_Y.txt`), or a leading `X` -> `Y` (`X.trn.npz` ->
`Y.trn.npz`), or else `_Y` before the extension (`mydata.npz` -> `mydata_Y.npz`):
the names :func:`write_data` gives, so that what it writes reads back as the same
pair. Without a labels file (what `predict` needs) Y has no entries.

By name: `.npz` is "npz"; `.svm`, `.libsvm`, `.svmlight` are "libsvm"; a
name with `X_Xf` or a pair of text files is "split". Otherwise the first line
decides: three integers "xmc", two "split", anything else "libsvm".

Predictions (:func:`write_predictions`): "text" writes a header line
`n_points n_labels` and then per point its top-k `label:score` pairs in label
order (the sparse-matrix text that pyxclib's `read_sparse_file` reads with its
defaults: header=True, safe_read=True wants sorted, unique indices); "npz" a CSR
float64 [n_points, n_labels] of the top-k scores (`scipy.sparse.load_npz`).
Both hold the top k as a set: the ranking is by score, ties to the lower label
id (dslide.model.topk), which :func:`read_predictions` restores. Scores are written
to full float64 precision, so that ranking is the one `predict` returned.
"""

from __future__ import annotations

import os

import numpy as np
import scipy.sparse as sp

from dslide import validate
from dslide.io import data as D
from dslide.io import xmc_parse as P
from dslide.io.data import XMCData, XMCFormatError

FORMATS = ("xmc", "split", "libsvm", "npz")
PREDICTION_FORMATS = ("text", "npz")
LIBSVM_SUFFIXES = (".svm", ".libsvm", ".svmlight")
#: index bound for headerless files: the kernels then check only that indices fit int32
_NO_BOUND = np.iinfo(np.int32).max - 1


def _check_format(fmt, valid=FORMATS, what="--format") -> None:
    if fmt is not None and fmt not in valid:
        raise ValueError(f"{what} {fmt!r} is not valid; choose one of {', '.join(map(repr, valid))}")


def partner(path: str) -> str | None:
    """The labels file beside features file `path` (see the module docstring), or None."""
    head, base = os.path.split(path)
    cands = []
    if "X_Xf" in base:
        cands.append(base.replace("X_Xf", "X_Y"))
    if base.startswith("X"):
        cands.append("Y" + base[1:])
    stem, ext = os.path.splitext(base)
    cands.append(stem + "_Y" + ext)  # the name write_data gives otherwise
    for c in cands:
        p = os.path.join(head, c)
        if c != base and os.path.exists(p):
            return p
    return None


def split_pair(path: str) -> tuple[str, str | None]:
    """(features file, labels file or None) of a data argument `FEATURES[,LABELS]`."""
    if "," in path and not os.path.exists(path):
        a, b = path.split(",", 1)
        return a, b
    return path, partner(path)


def detect(path: str) -> str:
    """The format of data argument `path` by its name and else its first line (one of FORMATS)."""
    first, _ = split_pair(path)
    name = first.lower().removesuffix(".gz")
    if name.endswith(".npz"):
        return "npz"
    if name.endswith(LIBSVM_SUFFIXES):
        return "libsvm"
    if "x_xf" in os.path.basename(name) or ("," in path and not os.path.exists(path)):
        return "split"
    buf, _ = D._read_bytes(first)
    nl = np.flatnonzero(buf[:4096] == 10)
    line = bytes(buf[:int(nl[0]) if nl.size else min(buf.size, 4096)]).decode("latin-1").split()
    if line and all(f.isascii() and f.isdigit() for f in line):
        if len(line) == 3:
            return "xmc"
        if len(line) == 2:
            return "split"
    return "libsvm"


def read_data(path: str, fmt: str | None = None, *, n_features: int | None = None,
              n_labels: int | None = None, cache: bool = True, progress=None) -> XMCData:
    """Read data argument `path` (a file, or `FEATURES,LABELS`) in format `fmt` (None: `detect`).

    Returns XMCData: X csr float32 [n, n_features], Y csr float32 [n, n_labels] (ones).
    n_features, n_labels: the widths of a headerless format (libsvm), at least the largest
    index + 1; files that state their widths keep them (the caller compares).
    Raises XMCFormatError (a ValueError) naming the file and line, ValueError for a
    pair whose row counts differ, OSError when a file cannot be read.
    progress: progress(n_bytes) while text is parsed, the bytes done since the last call
    (npz files report nothing).
    """
    path = os.fspath(path)
    _check_format(fmt)
    fmt = fmt or detect(path)
    if fmt == "xmc":
        return D.read_xmc(path, cache=cache, progress=progress)
    if fmt == "libsvm":
        return read_libsvm(path, n_features=n_features, n_labels=n_labels, progress=progress)
    xpath, ypath = split_pair(path)
    if fmt == "npz":
        for p in (xpath, ypath) if ypath else (xpath,):
            _check_zip(p)
    if fmt == "split":
        X = read_sparse_file(xpath, progress)
        Y = read_sparse_file(ypath, progress) if ypath else None
    else:
        # checked before any kernel sees them (dslide.validate): a data file may come from anyone
        X = validate.load_npz(xpath)
        Y = validate.load_npz(ypath, index_name="label id") if ypath else None
    if Y is None:
        Y = sp.csr_matrix((X.shape[0], n_labels or 0), dtype=np.float32)
    if X.shape[0] != Y.shape[0]:
        raise ValueError(f"{xpath} has {X.shape[0]} points but {ypath} has {Y.shape[0]}: a features "
                         f"file and its labels file must have one row per point each")
    # stored zeros dropped before the ones: an entry of value 0 is no label
    return XMCData(X, validate.labels(Y, ypath or xpath))


def _check_zip(path: str) -> None:
    """A one-line ValueError unless `path` begins as a zip archive (what save_npz writes), so
    that a text file read as npz is named as such, not by numpy's message about pickles."""
    with open(path, "rb") as f:
        head = f.read(64)
    if not head.startswith(b"PK"):
        begin = head.split(b"\n", 1)[0][:40].decode("latin-1")
        raise XMCFormatError(f"{path} was read as format 'npz' but is not a scipy sparse .npz file (save_npz "
                             f"writes a zip archive); it begins {begin!r}: give its format (xmc, split or "
                             f"libsvm) or none, to detect it")


def _parse_lines(path: str, body_from_header: int, n_features: int, n_labels: int, progress=None):
    """The XMC body parser over buf[body:] -> (buf, arrays of CSR parts, rows)."""
    buf, _ = D._read_bytes(path)
    body = body_from_header
    n_nl, n_colon, n_comma = P._count_bytes(buf, body)
    max_lines = int(n_nl) + 1
    big = max(int(n_colon), int(n_comma) + max_lines) >= np.iinfo(np.int32).max
    itype = np.int64 if big else np.int32  # the types read_xmc parses with: its compiled kernel
    x_indptr = np.empty(max_lines + 1, itype)
    y_indptr = np.empty(max_lines + 1, itype)
    x_indices = np.empty(int(n_colon), itype)
    x_data = np.empty(int(n_colon), np.float32)
    y_indices = np.empty(int(n_comma) + max_lines, itype)
    err = np.zeros(3, np.int64)
    if progress is not None:
        progress(body)
    code, rows, nonblank, nnz_x, nnz_y = P.parse_body(buf, body, n_features, n_labels, x_indptr, x_indices,
                                                     x_data, y_indptr, y_indices, err, progress)
    if code != P._OK:
        raise P.parse_error(path, buf, int(err[0]), int(err[1]), int(err[2]), n_features, n_labels)
    return buf, (x_indptr, x_indices[:nnz_x], x_data[:nnz_x], y_indptr, y_indices[:nnz_y]), rows, nonblank


def _small_index(a: np.ndarray) -> np.ndarray:
    return a.astype(np.int32) if a.size == 0 or a.max() < np.iinfo(np.int32).max else a


def read_libsvm(path: str, n_features: int | None = None, n_labels: int | None = None,
                progress=None) -> XMCData:
    """Headerless multilabel libsvm (zero-based): `l1,l2 f:v f:v ...` per line.

    The rules of a data line are the XMC text's (dslide.io.data); blank lines at the end
    are padding. Widths: the largest index + 1, or n_features / n_labels when larger.
    """
    _, (xp, xi, xd, yp, yi), rows, nonblank = _parse_lines(path, 0, _NO_BOUND, _NO_BOUND, progress)
    n = nonblank
    nf = int(xi.max()) + 1 if xi.size else 0
    nl = int(yi.max()) + 1 if yi.size else 0
    nf, nl = max(nf, n_features or 0), max(nl, n_labels or 0)
    X = sp.csr_matrix((xd, _small_index(xi), _small_index(xp[:n + 1])), shape=(n, nf))
    Y = sp.csr_matrix((np.ones(yi.size, np.float32), _small_index(yi), _small_index(yp[:n + 1])), shape=(n, nl))
    return XMCData(X, Y)


def read_sparse_file(path: str, progress=None) -> sp.csr_matrix:
    """pyxclib's sparse text (`read_sparse_file` with header=True): header `n_rows n_cols`,
    then per row `i:v i:v ...` (an empty line is an empty row). csr float32 [n_rows, n_cols]."""
    buf, _ = D._read_bytes(path)
    nl = np.flatnonzero(buf[:4096] == 10)
    end = int(nl[0]) if nl.size else buf.size
    fields = bytes(buf[:end]).decode("latin-1").split()
    if len(fields) != 2 or not all(f.isascii() and f.isdigit() for f in fields):
        raise XMCFormatError(f"{path}:1: expected header 'n_rows n_cols' (two non-negative integers, as "
                             f"pyxclib's write_sparse_file writes), got {bytes(buf[:min(end, 80)]).decode('latin-1')!r}")
    n_rows, n_cols = int(fields[0]), int(fields[1])
    _, (xp, xi, xd, yp, yi), rows, nonblank = _parse_lines(path, min(end + 1, buf.size), n_cols, 1, progress)
    if yi.size:
        raise XMCFormatError(f"{path}: a row starts with a bare index; each entry must be 'index:value'")
    n = nonblank + min(rows - nonblank, max(0, n_rows - nonblank))
    if n != n_rows:
        raise XMCFormatError(f"{path}:1: the header says {n_rows} rows but the file has {n}")
    return sp.csr_matrix((xd, _small_index(xi), _small_index(xp[:n + 1])), shape=(n, n_cols))


# ---------------------------------------------------------------------------- writing


def write_data(path: str, data: XMCData, fmt: str | None = None) -> list[str]:
    """Write `data` to data argument `path` in `fmt` (None: by name as in `detect`, else "xmc").

    Pair formats write FEATURES,LABELS; given one name, the labels file's name is derived
    (X_Xf -> X_Y, a leading X -> Y; otherwise LABELS = the name with `_Y` before its
    extension). Returns the paths written."""
    _check_format(fmt)
    if fmt is None:
        name = path.split(",", 1)[0].lower()
        fmt = ("npz" if name.endswith(".npz") else "libsvm" if name.endswith(LIBSVM_SUFFIXES)
               else "split" if ("x_xf" in os.path.basename(name) or "," in path) else "xmc")
    if fmt == "xmc":
        D.write_xmc(path, data.X, data.Y)
        return [path]
    if fmt == "libsvm":
        _write_text(path, data.X, data.Y, header=None)
        return [path]
    xpath, ypath = _pair_names(path)
    if fmt == "npz":
        from dslide.io.rundir import replacing

        for p, M in ((xpath, data.X), (ypath, data.Y)):
            with replacing(p, binary=True) as f:  # atomic, never through a planted link
                sp.save_npz(f, sp.csr_matrix(M, dtype=np.float32))
    else:
        _write_text(xpath, data.X, None, header=f"{data.X.shape[0]} {data.X.shape[1]}")
        _write_text(ypath, data.Y, None, header=f"{data.Y.shape[0]} {data.Y.shape[1]}", ones=True)
    return [xpath, ypath]


def _pair_names(path: str) -> tuple[str, str]:
    if "," in path:
        a, b = path.split(",", 1)
        return a, b
    head, base = os.path.split(path)
    if "X_Xf" in base:
        return path, os.path.join(head, base.replace("X_Xf", "X_Y"))
    if base.startswith("X") and len(base) > 1:
        return path, os.path.join(head, "Y" + base[1:])
    stem, ext = os.path.splitext(path)
    return path, stem + "_Y" + ext


def _write_text(path: str, M, Y, header: str | None, ones: bool = False) -> None:
    """Rows of M as `i:v ...` (with `l1,l2 ` first when Y is given), under a header line if any."""
    M = sp.csr_matrix(M)
    M.sort_indices()
    Yc = sp.csr_matrix(Y) if Y is not None else None
    from dslide.io.rundir import replacing

    with replacing(path, binary=False) as f:  # atomic, never through a planted link
        if header is not None:
            f.write(header + "\n")
        for r in range(M.shape[0]):
            a, b = M.indptr[r], M.indptr[r + 1]
            parts = [f"{i}:1" if ones else f"{i}:{float(v):.9g}" for i, v in zip(M.indices[a:b], M.data[a:b])]
            line = " ".join(parts)
            if Yc is not None:
                labels = ",".join(str(i) for i in np.sort(Yc.indices[Yc.indptr[r]:Yc.indptr[r + 1]]))
                line = labels + " " + line if line else labels
            f.write(line + "\n")


def predictions_csr(ids: np.ndarray, scores: np.ndarray, n_labels: int) -> sp.csr_matrix:
    """The top-k predictions as csr float64 [n, n_labels]: row i holds scores[i, j] at column
    ids[i, j] (entries with id -1, fewer than k scored, left out), columns sorted. float64, as
    predict's scores: a float32 copy could make two scores equal and so change the ranking."""
    keep = ids >= 0
    indptr = np.concatenate([[0], np.cumsum(keep.sum(axis=1))]).astype(np.int64)
    M = sp.csr_matrix((np.asarray(scores, np.float64)[keep], ids[keep], indptr), shape=(ids.shape[0], n_labels))
    M.sort_indices()
    return M


def ranked(P: sp.csr_matrix, k: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The top k entries of each row of the score matrix P (csr [n, n_labels]), ranked by
    score and ties to the lower label id: (ids int64 [n, k], scores float64 [n, k]), -1 and
    -inf past a row's entries. k None: the longest row's length."""
    from dslide.metrics import topk_of_sparse

    P = sp.csr_matrix(P)
    if k is None:
        k = int(np.diff(P.indptr).max()) if P.shape[0] else 0
    ids = topk_of_sparse(P, max(k, 1))[:, :k]
    rows = np.broadcast_to(np.arange(P.shape[0])[:, None], ids.shape)
    found = np.asarray(P[rows.ravel(), np.maximum(ids, 0).ravel()], dtype=np.float64).reshape(ids.shape)
    return ids, np.where(ids >= 0, found, -np.inf)


def read_predictions(path: str, k: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A prediction file of :func:`write_predictions` (text or npz, by its first bytes) as
    (ids int64 [n, k], scores float64 [n, k]), each row best first, ties to the lower label
    id: what `predict` returned. k None: the k written."""
    path = os.fspath(path)
    with open(path, "rb") as f:
        is_zip = f.read(4) == b"PK\x03\x04"
    if is_zip:
        return ranked(sp.load_npz(path), k)
    with open(path, encoding="latin-1") as f:
        head = f.readline().split()
        if len(head) != 2 or not all(t.isdigit() for t in head):
            raise XMCFormatError(f"{path}:1: expected the header 'n_points n_labels' of a prediction file")
        n, n_labels = int(head[0]), int(head[1])
        rows, cols, vals = [], [], []
        for r, line in enumerate(f):
            for tok in line.split():
                i, v = tok.split(":")
                rows.append(r), cols.append(int(i)), vals.append(float(v))
    P = sp.csr_matrix((np.array(vals, np.float64), (np.array(rows, np.int64), np.array(cols, np.int64))),
                      shape=(n, n_labels))
    return ranked(P, k)


def write_predictions(path: str, ids: np.ndarray, scores: np.ndarray, n_labels: int, fmt: str = "text") -> None:
    """Write top-k predictions (ids int64 [n, k], -1 for none; scores float [n, k]) to `path`:
    "text" (a header `n n_labels`, then per line the `label:score` pairs in label order, the
    scores to full precision) or "npz" (:func:`predictions_csr` saved with
    scipy.sparse.save_npz). :func:`read_predictions` gives back ids and scores best first.
    Written atomically (dslide.io.rundir.replacing): a reader sees the old file or the new one."""
    from dslide.io.rundir import replacing

    _check_format(fmt, PREDICTION_FORMATS)
    # a fresh temporary file (mkstemp: exclusive, so never through a symlink planted at any
    # name), fsynced and renamed over `path` (which replaces a link there, never follows it)
    P = predictions_csr(ids, scores, n_labels)
    if fmt == "npz":
        with replacing(path, binary=True) as f:  # a file object: save_npz would append ".npz" to a bare name
            sp.save_npz(f, P)
    else:
        with replacing(path, binary=False) as f:
            f.write(f"{ids.shape[0]} {n_labels}\n")
            for r in range(P.shape[0]):
                a, b = P.indptr[r], P.indptr[r + 1]
                # repr: the shortest text that reads back as the same float64
                f.write(" ".join(f"{i}:{float(v)!r}" for i, v in zip(P.indices[a:b], P.data[a:b])) + "\n")
