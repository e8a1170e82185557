"""A data set's rows as batches: what training and inference both read data through.

The features are never copied whole: `csr_parts` gives a CSR matrix's arrays
(no copy where their types already fit), `input_norms` each row's divisor,
and `make_batch` gathers a batch of rows and normalises them on the way.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from dslide.model import kernels as K
from dslide.model.batch import Batch


def normalise_inputs(X: sp.csr_matrix, how: str, dtype) -> sp.csr_matrix:
    """Rows scaled to unit L2 norm ("l2") or left as they are ("none"); float `dtype`, sorted indices."""
    X = sp.csr_matrix(X, dtype=dtype, copy=True)
    X.sort_indices()
    if how == "l2":
        norms = input_norms(X, how)  # float64: squares of float32 values overflow float32
        X.data /= np.repeat(norms, np.diff(X.indptr))
    return X


def input_norms(X: sp.csr_matrix, how: str):
    """Per row, what `normalise_inputs` divides it by: float64 [n] L2 norms (1 for an empty
    row), or None for "none". float64, because a row's norm overflows float32 once its values
    come near float32's maximum (3.4e38), which would zero the row. With these, batches are
    normalised as they are gathered (`make_batch`) and the data set is never copied: one CSR
    per rank, mapped from the cache where it came from one."""
    if how == "none":
        return None
    out = np.empty(X.shape[0], np.float64)
    K.row_norms(X.indptr, X.data, out)
    return out


def csr_parts(M: sp.csr_matrix, dtype=None):
    """(indptr int64, indices int32, data) of a CSR matrix; data cast to `dtype` when given."""
    indptr = M.indptr.astype(np.int64, copy=False)
    indices = M.indices.astype(np.int32, copy=False)
    data = M.data if dtype is None else M.data.astype(dtype, copy=False)
    return indptr, indices, data


def make_batch(X_parts, Y_parts, rows: np.ndarray, step: int, n_global: int = 0, norms=None) -> Batch:
    """The batch of data rows `rows`; norms (from `input_norms`): divide each row by its norm."""
    xp, xi, xd = K.gather_rows(*X_parts, rows)
    if norms is not None:
        xd /= np.repeat(norms[rows], np.diff(xp))  # divided in float64, stored in xd's dtype
    if Y_parts is None:
        yp, yi = np.zeros(rows.shape[0] + 1, dtype=np.int64), np.empty(0, dtype=np.int32)
    else:
        yp, yi, _ = K.gather_rows(*Y_parts, rows)
    return Batch((xp, xi, xd), (yp, yi), rows.astype(np.int64), step, n_global)
