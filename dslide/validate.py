"""The one gate every array passes before a kernel sees it: data files, API inputs, model directories.

The numba kernels index with what they are given and do not check bounds (that
is what makes them fast), so an index out of range, a pointer array that runs
backwards or past its data, or a count of zero is a crash or a write past an
array, not an error. Everything that comes from outside the process is checked
here first, whatever its source, and either refused with a ValueError naming
the file or argument and what was expected, or returned in the one form the
kernels assume:

    features   csr float32 [n, n_features]: indptr int [n + 1] from 0, non-decreasing, ending
               at nnz; indices in [0, n_features), sorted and unique per row (duplicates
               summed, as scipy means them: `sum_duplicates`); values finite and within
               float32's range (a float64 beyond it is refused, not turned into inf)
    labels     csr float32 [n, n_labels] of ones: the same structure; stored zeros dropped
               (an entry of value 0 is no label), duplicates counted once
    pointers   int [n + 1], ids in a range, finite values: the arrays of a model directory
               (dslide.infer.fusion's neighbour store, lsh.NeighborIndex), whatever their hash says

The XMC text reader checks the same while it parses (dslide.io.xmc_parse) and is not
checked twice. Every check is one vectorised pass over an array (min, max, diff):
linear, with no Python loop over rows or entries.
"""

from __future__ import annotations

import numbers

import numpy as np
import scipy.sparse as sp

FLOAT32_MAX = float(np.finfo(np.float32).max)
#: the largest index a kernel's int32 index arrays hold
INDEX_MAX = int(np.iinfo(np.int32).max) - 1


def _row_of(indptr: np.ndarray, pos: int) -> int:
    """The row of entry `pos` of a valid CSR pointer array."""
    return int(np.searchsorted(indptr, pos, side="right")) - 1


def integer_array(a, what: str, ndim: int | None = 1) -> np.ndarray:
    """`a` as a numpy integer array (booleans, floats and objects refused)."""
    a = np.asarray(a)
    if a.dtype.kind not in "iu":
        raise ValueError(f"{what} has dtype {a.dtype}; expected integers")
    if ndim is not None and a.ndim != ndim:
        raise ValueError(f"{what} has shape {a.shape}; expected {ndim} dimension(s)")
    return a


def pointer(ptr, what: str, n: int | None = None, total: int | None = None) -> np.ndarray:
    """A CSR-style pointer array int [n + 1]: starts at 0, never decreases, ends at `total`
    (when given: the length of the array it points into). Returns it as int64 when it was
    unsigned, else unchanged."""
    ptr = integer_array(ptr, what)
    if ptr.dtype.kind == "u":
        ptr = ptr.astype(np.int64)
    if n is not None and ptr.shape[0] != n + 1:
        raise ValueError(f"{what} has {ptr.shape[0]} entries; expected {n + 1} (one more than its {n} rows)")
    if ptr.shape[0] == 0:
        raise ValueError(f"{what} is empty; expected at least one entry (0)")
    if ptr[0] != 0:
        raise ValueError(f"{what} starts at {int(ptr[0])}; expected 0")
    if ptr.shape[0] > 1:
        step = np.diff(ptr)
        if step.min() < 0:
            i = int(np.argmax(step < 0))
            raise ValueError(f"{what} decreases at row {i} ({int(ptr[i])} -> {int(ptr[i + 1])}); "
                             f"expected non-decreasing offsets")
    if total is not None and ptr[-1] != total:
        raise ValueError(f"{what} ends at {int(ptr[-1])}; expected {total} (the number of entries)")
    return ptr


def ids(a, what: str, hi: int, lo: int = 0, name: str = "index", ptr: np.ndarray | None = None) -> np.ndarray:
    """Integer ids, each in [lo, hi) (negative ones refused, not wrapped). ptr: the CSR pointer
    over `a`, to name the row of the first bad id."""
    a = integer_array(a, what, ndim=None)
    if a.size == 0:
        return a
    low, high = a.min(), a.max()
    if low < lo or high >= hi:
        pos = int(np.argmax(a < lo)) if low < lo else int(np.argmax(a >= hi))
        bad = int(a.flat[pos])
        where = f" (row {_row_of(ptr, pos)})" if ptr is not None else f" (entry {pos})"
        raise ValueError(f"{what}: {name} {bad}{where} is not in [{lo}, {hi})")
    return a


def finite(a, what: str, float32: bool = True) -> np.ndarray:
    """Real values, all finite (and with float32, within float32's range); complex refused."""
    a = np.asarray(a)
    if a.dtype.kind == "c":
        raise ValueError(f"{what} is complex ({a.dtype}); expected real values (the imaginary part "
                         f"would be dropped)")
    if a.dtype.kind not in "biuf":
        raise ValueError(f"{what} has dtype {a.dtype}; expected real numbers")
    if a.size == 0 or a.dtype.kind != "f":
        return a
    top = float(np.abs(a).max())
    limit = FLOAT32_MAX if float32 else np.inf
    if not top <= limit:  # NaN fails every comparison
        bad = ~np.isfinite(a) if not np.isfinite(top) else np.abs(a) > limit
        pos = int(np.argmax(bad))
        v = float(a.flat[pos])
        why = "not a finite number" if not np.isfinite(v) else f"beyond float32's range (|v| <= {FLOAT32_MAX:.8g})"
        raise ValueError(f"{what}: value {v!r} (entry {pos}) is {why}; expected finite values")
    return a


def _compressed(M, what: str):
    """(data, indices, indptr, shape) of a CSR view of scipy matrix M, without letting scipy
    walk unchecked indices: csr as is, csc as the csr of its transpose (swapped back by the
    caller), coo after checking its coordinates, any other format through scipy's own checks."""
    if M.format == "csr":
        return M.data, M.indices, M.indptr, M.shape, False
    if M.format == "csc":
        return M.data, M.indices, M.indptr, (M.shape[1], M.shape[0]), True
    if M.format == "coo":
        r = ids(M.row, what, M.shape[0], name="row index")
        ids(M.col, what, M.shape[1], name="column index")
        if r.shape != M.col.shape or r.shape != M.data.shape:
            raise ValueError(f"{what}: a coo matrix with {r.size} rows, {M.col.size} columns and "
                             f"{M.data.size} values; expected as many of each")
    M = M.tocsr()  # bsr, dia, lil, dok hold no raw indices a kernel could trip on; coo checked above
    return M.data, M.indices, M.indptr, M.shape, False


def csr(data, indices, indptr, shape, what: str, *, index_name: str = "feature index",
        copy: bool = False) -> sp.csr_matrix:
    """The checked csr float32 [n, m] of raw parts (module docstring: `features`), sorted and
    with duplicates summed. ValueError names `what` and the first bad entry. The parts are
    shared with the result unless they need changing (copy: never shared)."""
    n, m = _shape(shape, what)
    indices = integer_array(indices, f"{what}: indices")
    indptr = pointer(indptr, f"{what}: indptr", n, total=indices.shape[0])
    indices = ids(indices, what, m, name=index_name, ptr=indptr)
    data = finite(data, what)
    if data.ndim != 1 or data.shape[0] != indices.shape[0]:
        raise ValueError(f"{what} has {data.size} values for {indices.shape[0]} indices; expected one each")
    M = sp.csr_matrix((data.astype(np.float32, copy=False), indices, indptr), shape=(n, m), copy=copy)
    if not M.has_canonical_format:  # safe now: the structure is checked
        M = M.copy()  # the caller's arrays stay as they were
        M.sum_duplicates()  # scipy's meaning of a repeated entry: their sum (it also sorts)
        finite(M.data, what)  # two large values may sum past float32's range
    return M


def _shape(shape, what: str) -> tuple[int, int]:
    try:
        n, m = (int(v) for v in shape)
        bad = any(isinstance(v, (bool, np.bool_)) or int(v) != v for v in shape)
    except (TypeError, ValueError):
        raise ValueError(f"{what} has shape {shape!r}; expected (n_rows, n_columns)") from None
    if bad or n < 0 or m < 0:
        raise ValueError(f"{what} has shape {shape!r}; expected two non-negative integers")
    return n, m


def features(X, what: str = "X") -> sp.csr_matrix:
    """Any scipy sparse matrix [n, n_features] as checked csr float32 (module docstring)."""
    if not sp.issparse(X):
        raise ValueError(f"{what} must be a scipy.sparse matrix [n_points, n_features] (csr preferred), "
                         f"got {type(X).__name__}")
    data, indices, indptr, shape, transposed = _compressed(X, what)
    if transposed:  # csc: checked as the csr of its transpose
        M = csr(data, indices, indptr, shape, what, index_name="row index")
        return csr_from_canonical(M.T.tocsr(), what)
    return csr(data, indices, indptr, shape, what)


def csr_from_canonical(M: sp.csr_matrix, what: str) -> sp.csr_matrix:
    M = sp.csr_matrix(M, dtype=np.float32)
    if not M.has_canonical_format:
        M.sum_duplicates()
    return M


def labels(Y, what: str = "Y", n_labels: int | None = None) -> sp.csr_matrix:
    """A scipy sparse indicator matrix [n, n_labels] as checked csr float32 of ones: label ids
    in [0, n_labels), stored zeros dropped (no label), duplicates counted once."""
    if not sp.issparse(Y):
        raise ValueError(f"{what} must be a scipy.sparse indicator matrix, got {type(Y).__name__}")
    data, indices, indptr, shape, transposed = _compressed(Y, what)
    if transposed:
        Y = csr(data, indices, indptr, shape, what, index_name="row index").T.tocsr()
        data, indices, indptr, shape = Y.data, Y.indices, Y.indptr, Y.shape
    n, m = _shape(shape, what)
    if n_labels is not None and m != n_labels:
        raise ValueError(f"{what} has {m} columns but n_labels = {n_labels}")
    M = csr(data, indices, indptr, shape, what, index_name="label id", copy=True)
    M.eliminate_zeros()  # before the ones: a stored zero is no label
    M.data[:] = 1.0
    return M


def count(value, what: str, lo: int = 0, hi: int | None = None) -> int:
    """An integer setting or argument (not a bool, not a float with a fraction) in [lo, hi]."""
    ok = isinstance(value, (numbers.Integral, np.integer)) and not isinstance(value, (bool, np.bool_))
    if ok and lo <= int(value) and (hi is None or int(value) <= hi):
        return int(value)
    rng = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
    raise ValueError(f"{what} = {value!r} must be an integer {rng}")


def label_lists(Y, n_points: int, n_labels: int | None = None, what: str = "Y") -> sp.csr_matrix:
    """n_points lists of label ids (integers >= 0; a float only when integral) as csr float32
    [n_points, n_labels] of ones; n_labels None: the largest label + 1. Strings, booleans,
    fractions and ids beyond int32 are refused, never converted."""
    if isinstance(Y, (str, bytes)):
        raise ValueError(f"{what} is a string; expected a list of label lists, one per point")
    try:
        rows = list(Y)
    except TypeError:
        raise ValueError(f"{what} must be a scipy.sparse indicator matrix [n_points, n_labels] or a list of "
                         f"label lists (integers >= 0), one per point") from None
    if len(rows) != n_points:
        raise ValueError(f"{what} has {len(rows)} label lists but X has {n_points} rows: give one per point")
    arrays = []
    for i, r in enumerate(rows):
        if isinstance(r, (str, bytes)) or (isinstance(r, np.ndarray) and r.dtype.kind in "USO"):
            raise ValueError(f"{what}[{i}] = {r!r} is a string; expected a list of integer label ids")
        try:
            a = np.asarray(r if isinstance(r, np.ndarray) else list(r))
        except (TypeError, ValueError):
            raise ValueError(f"{what}[{i}] = {r!r} is not a list of integer label ids") from None
        if a.size == 0:
            arrays.append(np.empty(0, np.int64))
            continue
        if a.ndim != 1 or a.dtype.kind not in "iuf":
            raise ValueError(f"{what}[{i}] = {r!r} is not a list of integer label ids "
                             f"(got {'booleans' if a.dtype.kind == 'b' else a.dtype})")
        if a.dtype.kind == "f":
            if not (np.isfinite(a).all() and (a == np.round(a)).all()):
                raise ValueError(f"{what}[{i}] = {r!r} holds a label that is not an integer")
        if a.min() < 0 or a.max() > INDEX_MAX:
            bad = a.min() if a.min() < 0 else a.max()
            raise ValueError(f"{what}[{i}] holds label {int(bad)}: labels are integers in [0, {INDEX_MAX}]")
        arrays.append(np.unique(a.astype(np.int64)))
    flat = np.concatenate(arrays) if arrays else np.empty(0, np.int64)
    width = int(flat.max()) + 1 if flat.size else 0
    if n_labels is None:
        n_labels = width
    elif width > n_labels:
        raise ValueError(f"{what} holds label {width - 1} but n_labels = {n_labels}: labels are in [0, n_labels)")
    indptr = np.zeros(n_points + 1, np.int64)
    np.cumsum([a.size for a in arrays], out=indptr[1:])
    return sp.csr_matrix((np.ones(flat.size, np.float32), flat.astype(np.int32), indptr), shape=(n_points, n_labels))


def load_npz(path: str, what: str | None = None, index_name: str = "feature index") -> sp.csr_matrix:
    """A `scipy.sparse.save_npz` file as checked csr float32 (`features`; its column ids named
    `index_name` in messages), its raw arrays checked before scipy builds anything from them.
    Never unpickles."""
    what = what or path
    try:
        with np.load(path, allow_pickle=False) as f:
            parts = {k: f[k] for k in f.files}
    except (ValueError, OSError, EOFError) as e:
        raise ValueError(f"{path}: not a scipy sparse .npz file (scipy.sparse.save_npz): {e}") from None
    fmt = parts.get("format")
    fmt = fmt.item() if isinstance(fmt, np.ndarray) and fmt.ndim == 0 else None
    fmt = fmt.decode("ascii", "replace") if isinstance(fmt, bytes) else fmt
    need = {"csr": ("data", "indices", "indptr", "shape"), "csc": ("data", "indices", "indptr", "shape"),
            "coo": ("data", "row", "col", "shape")}
    if fmt not in need and fmt not in ("bsr", "dia"):
        raise ValueError(f"{path}: not a scipy sparse .npz file (scipy.sparse.save_npz): its 'format' is "
                         f"{fmt!r}; expected 'csr', 'csc' or 'coo'")
    if fmt in need:
        missing = [k for k in need[fmt] if k not in parts]
        if missing:
            raise ValueError(f"{path}: a {fmt} .npz without {', '.join(missing)} (scipy.sparse.save_npz writes them)")
        n, m = _shape(parts["shape"], what)
        if fmt == "coo":
            r = ids(parts["row"], what, n, name="row index")
            c = ids(parts["col"], what, m, name=index_name)
            d = finite(parts["data"], what)
            if not (r.shape == c.shape == d.shape):
                raise ValueError(f"{what}: {r.size} rows, {c.size} columns and {d.size} values; expected as many")
            order = np.argsort(r, kind="stable")
            indptr = np.zeros(n + 1, np.int64)
            np.cumsum(np.bincount(r, minlength=n), out=indptr[1:])
            return csr(d[order], c[order], indptr, (n, m), what, index_name=index_name)
        if fmt == "csc":
            M = csr(parts["data"], parts["indices"], parts["indptr"], (m, n), what, index_name="row index")
            return csr_from_canonical(M.T.tocsr(), what)
        return csr(parts["data"], parts["indices"], parts["indptr"], (n, m), what, index_name=index_name)
    try:  # bsr, dia: scipy checks their structure when it builds them
        M = sp.load_npz(path)
    except (ValueError, KeyError, OSError) as e:
        raise ValueError(f"{path}: not a scipy sparse .npz file (scipy.sparse.save_npz): {e}") from None
    return features(M, what)


# ---------------------------------------------------------------------------- model directories


def one(a, what: str, lo: float, hi: float, integer: bool) -> float | int:
    """The single value of a saved array of shape [1] (or a scalar), in [lo, hi]."""
    a = np.asarray(a)
    if a.size != 1:
        raise ValueError(f"{what} has shape {a.shape}; expected one value")
    if integer:
        a = integer_array(a.reshape(-1), what)
        v = int(a[0])
    else:
        a = finite(a.reshape(-1), what, float32=False)
        v = float(a[0])
    if not lo <= v <= hi:
        raise ValueError(f"{what} = {v!r} is not in [{lo}, {hi}]")
    return v


def neighbour_store(arrays: dict, where: str, n_labels: int | None = None) -> None:
    """The arrays of a dslide.infer.fusion store (`knn.*` of a checkpoint), checked in place:
    post_ptr int [F + 1] over post_pt ids in [0, N) with finite post_val; y_ptr [N + 1] over
    y_idx in [0, n_labels); k in [1, 1024]; share in [0, 1]; the prototypes likewise."""
    w = f"{where}: knn."
    y_ptr = pointer(arrays["y_ptr"], w + "y_ptr", total=np.shape(arrays["y_idx"])[0])
    n_points = y_ptr.shape[0] - 1
    ids(arrays["y_idx"], w + "y_idx", n_labels if n_labels is not None else INDEX_MAX + 1, name="label id")
    post_ptr = pointer(arrays["post_ptr"], w + "post_ptr", total=np.shape(arrays["post_pt"])[0])
    ids(arrays["post_pt"], w + "post_pt", n_points, name="point id")
    val = finite(arrays["post_val"], w + "post_val")
    if val.shape != np.shape(arrays["post_pt"]):
        raise ValueError(f"{w}post_val has shape {val.shape}; expected {np.shape(arrays['post_pt'])} (one per post_pt)")
    if "k" in arrays:
        one(arrays["k"], w + "k", 1, 1024, integer=True)
    for name in ("share", "weight"):  # the chosen shares of the fused score
        if name in arrays:
            one(arrays[name], w + name, 0.0, 1.0, integer=False)
    if "temperature" in arrays:  # the chosen temperature of the fused score's softmax
        one(arrays["temperature"], w + "temperature", 0.01, 100.0, integer=False)
    if "pr_ptr" in arrays:
        norm = finite(arrays["pr_norm"], w + "pr_norm")
        L = norm.shape[0] if norm.ndim == 1 else -1
        if L < 0 or (n_labels is not None and L != n_labels):
            raise ValueError(f"{w}pr_norm has shape {norm.shape}; expected [{n_labels}] (one per label)")
        pr_ptr = pointer(arrays["pr_ptr"], w + "pr_ptr", total=np.shape(arrays["pr_lab"])[0])
        if pr_ptr.shape[0] != post_ptr.shape[0]:
            raise ValueError(f"{w}pr_ptr has {pr_ptr.shape[0]} entries; expected {post_ptr.shape[0]} (as post_ptr)")
        ids(arrays["pr_lab"], w + "pr_lab", L, name="label id")
        pv = finite(arrays["pr_val"], w + "pr_val")
        if pv.shape != np.shape(arrays["pr_lab"]):
            raise ValueError(f"{w}pr_val has shape {pv.shape}; expected {np.shape(arrays['pr_lab'])}")
        if "pr_perm" in arrays:
            perm = ids(arrays["pr_perm"], w + "pr_perm", L, name="label id")
            if perm.shape[0] != L or (L and np.bincount(perm, minlength=L).max() != 1):
                raise ValueError(f"{w}pr_perm is not a permutation of the {L} labels")


def hidden_store(arrays: dict, where: str, n_labels: int, width: int) -> None:
    """The arrays of a dslide.infer.hidden_knn store (`hidden_knn.*` of a checkpoint), checked in
    place: H finite float [N, width]; y_ptr [N + 1] over y_idx in [0, n_labels); k in [1, 1024],
    power in [0, 64], weight in [0, 1]."""
    w = f"{where}: hidden_knn."
    missing = [name for name in ("H", "y_ptr", "y_idx") if name not in arrays]
    if missing:
        raise ValueError(f"{w[:-1]} lacks {', '.join(missing)}")
    H = np.asarray(arrays["H"])
    if H.ndim != 2 or H.shape[1] != width or H.dtype.kind != "f":
        raise ValueError(f"{w}H is {H.dtype} {H.shape}; expected float [n, {width}] (the last hidden layer's width)")
    finite(H, w + "H")
    y_ptr = pointer(arrays["y_ptr"], w + "y_ptr", total=np.shape(arrays["y_idx"])[0])
    if y_ptr.shape[0] != H.shape[0] + 1:
        raise ValueError(f"{w}y_ptr has {y_ptr.shape[0]} entries; expected {H.shape[0] + 1} (one per row of H, and one)")
    ids(arrays["y_idx"], w + "y_idx", n_labels, name="label id")
    if "k" in arrays:
        one(arrays["k"], w + "k", 1, 1024, integer=True)
    if "power" in arrays:
        one(arrays["power"], w + "power", 0.0, 64.0, integer=False)
    if "weight" in arrays:
        one(arrays["weight"], w + "weight", 0.0, 1.0, integer=False)


def neighbor_index(arrays: dict, where: str, dim: int | None = None, n_cells: int | None = None) -> None:
    """The arrays of an lsh.NeighborIndex (`nn.*` of a checkpoint), checked in place: points
    int8 [n, dim], graph int [n, D] of ids in [-1, n), cell_ptr [n_cells + 1] over cell_ids in
    [0, n), label_ptr [n + 1] over label_ids >= 0."""
    w = f"{where}: nn."
    points = np.asarray(arrays["points"])
    if points.dtype != np.int8 or points.ndim != 2 or (dim is not None and points.shape[1] != dim):
        raise ValueError(f"{w}points is {points.dtype} {points.shape}; expected int8 [n, {dim or 'd'}]")
    n = points.shape[0]
    graph = integer_array(arrays["graph"], w + "graph", ndim=2)
    if graph.shape[0] != n:
        raise ValueError(f"{w}graph has {graph.shape[0]} rows; expected {n} (one per point)")
    ids(graph, w + "graph", n, lo=-1, name="point id")
    cell_ids = ids(arrays["cell_ids"], w + "cell_ids", n, name="point id")
    cell_ptr = pointer(arrays["cell_ptr"], w + "cell_ptr", n_cells, total=cell_ids.shape[0])
    del cell_ptr
    label_ids = ids(arrays["label_ids"], w + "label_ids", INDEX_MAX + 1, name="label id")
    pointer(arrays["label_ptr"], w + "label_ptr", n, total=label_ids.shape[0])


def anchor_tables(arrays: dict, where: str, n_items: int, shape: tuple) -> None:
    """The arrays of an lsh.AnchorTables (`index.*` or `anchor.*` of a checkpoint), checked:
    anchors float32 finite of `shape` [L, A, d]; fill int [L, A] in [0, T]; the first fill
    entries of each bucket (buckets int [L, A, T]) ids in [0, n_items), the kernels' rows."""
    anchors = finite(arrays["anchors"], f"{where}.anchors")
    if anchors.shape != tuple(shape):
        raise ValueError(f"{where}.anchors has shape {anchors.shape}; expected {tuple(shape)}")
    buckets = integer_array(arrays["buckets"], f"{where}.buckets", ndim=3)
    fill = integer_array(arrays["fill"], f"{where}.fill", ndim=2)
    if buckets.shape[:2] != anchors.shape[:2] or fill.shape != anchors.shape[:2]:
        raise ValueError(f"{where}: buckets {buckets.shape} and fill {fill.shape}; expected "
                         f"[{shape[0]}, {shape[1]}, T] and [{shape[0]}, {shape[1]}]")
    ids(fill, f"{where}.fill", buckets.shape[2] + 1, name="bucket fill")
    used = np.arange(buckets.shape[2])[None, None, :] < fill[:, :, None]
    ids(buckets[used], f"{where}.buckets", n_items, name="id")
