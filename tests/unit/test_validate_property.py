"""Random malformed CSR structures through dslide.validate: each is either refused with a
ValueError naming it, or returned in the form the kernels assume, and then read by the
kernels that index with it (csr_times_rows, gather_rows) without one access out of bounds
(NUMBA_BOUNDSCHECK=1, in a process of its own with its own numba cache), and with scipy's
meaning of the input (duplicates summed)."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dslide import validate

INDEX_DTYPES = [np.int32, np.int64, np.uint32, np.int8, np.float64, np.bool_]
VALUES = st.sampled_from([0.0, 1.0, -2.5, 3e38, 1e39, -1e39, np.nan, np.inf, -np.inf, 1e-45, 7.0])


@st.composite
def raw_csr(draw):
    """(data, indices, indptr, shape) of a CSR that is often wrong: pointers that fall, jump,
    start elsewhere, end before or past the data; ids out of range, negative or of another
    dtype; values NaN, inf or beyond float32; a shape that disagrees."""
    n = draw(st.integers(0, 5))
    m = draw(st.integers(0, 6))
    nnz = draw(st.integers(0, 8))
    counts = draw(st.lists(st.integers(0, nnz), min_size=n, max_size=n))
    ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    if n:
        ptr = np.minimum(ptr, nnz)
        ptr[-1] = nnz
    if draw(st.booleans()):  # break the pointers
        how = draw(st.sampled_from(["set", "length", "start", "end"]))
        if how == "set" and ptr.size:
            ptr[draw(st.integers(0, ptr.size - 1))] = draw(st.integers(-3, nnz + 3))
        elif how == "length":
            ptr = np.append(ptr, nnz) if draw(st.booleans()) or ptr.size < 2 else ptr[:-1]
        elif how == "start" and ptr.size:
            ptr[0] = draw(st.integers(1, 3))
        elif ptr.size:
            ptr[-1] = draw(st.integers(-2, nnz + 3))
    ptr = ptr.astype(draw(st.sampled_from([np.int64, np.int32, np.uint64, np.float64])))
    indices = np.array(draw(st.lists(st.integers(-3, m + 3), min_size=nnz, max_size=nnz)), np.int64)
    if draw(st.booleans()):  # mostly in range: valid structures (with duplicates, unsorted) get through
        indices = np.mod(indices, max(m, 1))
    indices = indices.astype(draw(st.sampled_from(INDEX_DTYPES)))
    extra = draw(st.sampled_from([0, 0, 0, 1, -1]))
    data = np.array(draw(st.lists(VALUES, min_size=max(0, nnz + extra), max_size=max(0, nnz + extra))))
    data = data.astype(draw(st.sampled_from([np.float32, np.float64, np.int64])), copy=False) \
        if np.isfinite(data).all() and np.abs(data).max(initial=0) < 3e38 else data
    shape = (n + draw(st.sampled_from([0, 0, 0, 1, -1])), m)
    return data, indices, ptr, shape


def _check_accepted(M, data, indices, ptr, shape):
    """What validate returns: csr float32 of the asked shape, canonical, in range, finite,
    meaning what scipy means by the input."""
    n, m = shape
    assert isinstance(M, sp.csr_matrix) and M.shape == (n, m) and M.dtype == np.float32
    p = M.indptr
    assert p[0] == 0 and p[-1] == M.indices.size == M.data.size and (np.diff(p) >= 0).all()
    if M.indices.size:
        assert M.indices.min() >= 0 and M.indices.max() < m
    for i in range(n):
        row = M.indices[p[i]:p[i + 1]]
        assert (np.diff(row) > 0).all()  # sorted, unique
    assert np.isfinite(M.data).all()
    # the reference in float32 too: a float64 value becomes its nearest float32 (1e-45 becomes
    # the subnormal 1.4e-45), which no relative tolerance would accept
    ref = sp.csr_matrix((np.asarray(data, np.float64).astype(np.float32), np.asarray(indices),
                         np.asarray(ptr, np.int64)), shape=shape)
    np.testing.assert_allclose(M.toarray(), ref.toarray(), rtol=1e-6)


KERNEL_CHECK = textwrap.dedent("""
    import sys
    import numpy as np
    import scipy.sparse as sp
    from dslide.model.kernels import csr_times_rows, gather_rows

    # boundscheck is on: a deliberate bad index raises (else this process would test nothing)
    try:
        csr_times_rows(np.array([0, 1]), np.array([5], np.int32), np.ones(1, np.float32),
                       np.ones((2, 3), np.float32), np.zeros(3, np.float32), np.empty((1, 3), np.float32))
    except (IndexError, SystemError):  # (a prange kernel reports it as a SystemError)
        pass
    else:
        sys.exit("NUMBA_BOUNDSCHECK is not in effect")
    arrays = np.load(sys.argv[1])
    for i in range(int(arrays["count"])):
        indptr, indices, data = arrays[f"{i}.indptr"], arrays[f"{i}.indices"], arrays[f"{i}.data"]
        n, m = (int(v) for v in arrays[f"{i}.shape"])
        W = np.arange(max(m, 1) * 3, dtype=np.float32).reshape(max(m, 1), 3)[:m]
        b = np.ones(3, np.float32)
        out = np.empty((n, 3), np.float32)
        csr_times_rows(indptr, indices, data, W, b, out)
        want = sp.csr_matrix((data, indices, indptr), shape=(n, m)) @ W + b
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-3)
        rows = np.arange(n, dtype=np.int64)[::-1].copy()
        p, idx, val = gather_rows(indptr, indices, data, rows)
        assert p[-1] == indices.size
    print("checked", int(arrays["count"]))
""")


def test_malformed_csr_is_refused_with_a_message_or_passes_the_kernels(tmp_path):
    accepted, refused = [], []

    @settings(derandomize=True, max_examples=400, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(raw_csr())
    def one(parts):
        data, indices, ptr, shape = parts
        try:
            M = validate.csr(data, indices, ptr, shape, "X")
        except ValueError as e:
            assert str(e).startswith("X") and len(str(e)) > 10, str(e)
            refused.append(str(e))
            return
        _check_accepted(M, data, indices, ptr, shape)
        accepted.append(M)

    one()
    assert accepted and refused  # both sides of the gate were exercised
    arrays = {"count": np.array(len(accepted))}
    for i, M in enumerate(accepted):
        arrays.update({f"{i}.indptr": M.indptr, f"{i}.indices": M.indices, f"{i}.data": M.data,
                       f"{i}.shape": np.array(M.shape)})
    np.savez(tmp_path / "accepted.npz", **arrays)
    env = {**os.environ, "NUMBA_BOUNDSCHECK": "1", "NUMBA_CACHE_DIR": str(tmp_path / "numba-cache"),
           "NUMBA_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-c", KERNEL_CHECK, str(tmp_path / "accepted.npz")], capture_output=True,
                       text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.split() == ["checked", str(len(accepted))]
