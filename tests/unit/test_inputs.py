"""Inputs normalised batch by batch (no copy of the data set) against normalise_inputs."""

import numpy as np
import scipy.sparse as sp

from dslide.model import inputs as I


def test_batches_normalised_on_the_fly_equal_a_normalised_copy():
    rs = np.random.default_rng(0)
    X = sp.random(300, 50, density=0.1, format="csr", random_state=3, dtype=np.float32)
    X.data = rs.uniform(0.1, 5.0, X.nnz).astype(np.float32)
    X.data[X.indptr[7]:X.indptr[8]] = 0  # an empty row stays empty (norm 1)
    X.eliminate_zeros()
    before = X.data.copy()
    norms = I.input_norms(X, "l2")
    np.testing.assert_allclose(norms, np.maximum(np.sqrt(np.asarray(X.multiply(X).sum(axis=1))).ravel(), 0)
                               + (np.diff(X.indptr) == 0), rtol=1e-6)
    assert norms[7] == 1.0 and I.input_norms(X, "none") is None
    ref = I.normalise_inputs(X, "l2", np.float32)
    rows = rs.permutation(300)[:64]
    got = I.make_batch(I.csr_parts(X), None, rows, 1, norms=norms)
    want = I.make_batch(I.csr_parts(ref), None, rows, 1)
    for a, b in zip(got.X, want.X):
        np.testing.assert_allclose(a, b, rtol=2e-7)
    # the data set itself is untouched (batches are copies)
    np.testing.assert_array_equal(X.data, before)
