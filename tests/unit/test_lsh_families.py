"""Hash families: collision rates against similarity, determinism, ranges, and
bit-for-bit agreement with pure-Python re-implementations of the definitions."""

import math

import numba
import numpy as np
import pytest

from dslide import lsh
from dslide.lsh._common import densify

DENSE_FAMILIES = ("srp", "dwta", "wta")


# ----------------------------------------------------------------------------
# Independent references (plain Python integers, no numba)
# ----------------------------------------------------------------------------

def py_code(vals_row, l, fam, range_pow):
    """Table l's bucket from the K values, per the documented formula."""
    code = sum(int(vals_row[l * fam.K + k]) * fam.radix**k for k in range(fam.K))
    if range_pow >= fam.code_bits:
        return code
    x = (int(fam.red_a[l]) * code + int(fam.red_b[l])) % 2**64
    return x >> (64 - range_pow)


def py_probe(h, t, n_bins, a, b):
    key = ((h + 1) << 32) | t
    x = (int(a) * key + int(b)) % 2**64
    return ((x >> 32) * n_bins) >> 32


def py_densify(vals, a, b, stats=None):
    """Optimal densification as documented: probes t = 1..4N, then a circular scan."""
    n = len(vals)
    nonempty = [v >= 0 for v in vals]
    if not any(nonempty):
        return [0] * n
    out = list(vals)
    for h in range(n):
        if nonempty[h]:
            continue
        for t in range(1, 4 * n + 1):
            j = py_probe(h, t, n, a, b)
            if nonempty[j]:
                out[h] = vals[j]
                break
        else:
            if stats is not None:
                stats["fallback"] += 1
            for s in range(1, n):
                j = (h + s) % n
                if nonempty[j]:
                    out[h] = vals[j]
                    break
    return out


def py_dwta_values(x, fam):
    """DWTA from its definition: arg-max over strictly positive entries of each bin."""
    vals = []
    for h in range(fam.n_hashes):
        dims = fam.bin_dims[h * fam.bin_size:(h + 1) * fam.bin_size]
        best, arg = 0.0, -1
        for p, d in enumerate(dims):
            if x[d] > best:
                best, arg = x[d], p
        vals.append(arg)
    return py_densify(vals, fam.probe_a, fam.probe_b)


# ----------------------------------------------------------------------------
# Pairs with controlled similarity
# ----------------------------------------------------------------------------

def cosine_pairs(rng, n, dim, c):
    """n pairs (x, y) with cos(x, y) = c exactly, uniformly rotated."""
    x = rng.standard_normal((n, dim))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    z = rng.standard_normal((n, dim))
    z -= np.sum(z * x, axis=1, keepdims=True) * x
    z /= np.linalg.norm(z, axis=1, keepdims=True)
    y = c * x + math.sqrt(1.0 - c * c) * z
    return x.astype(np.float32), y.astype(np.float32)


def jaccard_pairs(rng, n, dim, union, shared):
    """n pairs of 0/1 vectors whose sets have |S u T| = union, |S n T| = shared."""
    each = (union - shared) // 2
    assert 2 * each + shared == union
    S = np.zeros((n, dim), np.float32)
    T = np.zeros((n, dim), np.float32)
    for i in range(n):
        items = rng.choice(dim, union, replace=False)
        S[i, items[:shared + each]] = rng.uniform(0.1, 2.0, shared + each)
        T[i, items[:shared]] = 1.0
        T[i, items[shared + each:]] = 3.0
    return S, T


COS_LEVELS = (0.0, 0.3, 0.6, 0.8, 0.95)


@pytest.mark.parametrize("name", DENSE_FAMILIES)
def test_collision_rate_rises_with_cosine(name):
    rng = np.random.default_rng(11)
    fam = lsh.make_family(name, 64, 2, 50, seed=3)
    value_rate, code_rate = [], []
    for c in COS_LEVELS:
        x, y = cosine_pairs(rng, 300, 64, c)
        value_rate.append(np.mean(fam.hash_values(x) == fam.hash_values(y)))
        code_rate.append(np.mean(fam.hash(x) == fam.hash(y)))
    # 15k value samples per level: binomial sd <= 0.004; steps between levels are >= 0.03.
    assert np.all(np.diff(value_rate) > 0.02), value_rate
    assert np.all(np.diff(code_rate) > 0.01), code_rate
    # A full code needs all K values to agree: roughly value_rate ** K (K = 2).
    assert code_rate[-1] > 0.5 and code_rate[0] < value_rate[0], (value_rate, code_rate)


def test_srp_dense_bit_collision_is_one_minus_angle_over_pi():
    rng = np.random.default_rng(5)
    fam = lsh.make_family("srp", 64, 4, 25, seed=9, sparsity=1.0)
    n_pairs = 800
    for c in (-0.5, 0.0, 0.3, 0.6, 0.8, 0.95):
        x, y = cosine_pairs(rng, n_pairs, 64, c)
        same = fam.hash_values(x) == fam.hash_values(y)
        p = 1.0 - math.acos(c) / math.pi
        sd = math.sqrt(p * (1 - p) / same.size)
        # Pairs are uniformly rotated, so each bit collides with probability exactly
        # p; 4.5 binomial sd leaves a false alarm rate ~1e-5 per level.
        assert abs(same.mean() - p) < 4.5 * sd, (c, same.mean(), p, sd)


def test_minhash_collision_tracks_jaccard():
    rng = np.random.default_rng(2)
    fam = lsh.make_family("minhash", 2000, 2, 50, seed=4)
    value_rate, code_rate = [], []
    for shared in (10, 30, 50, 70, 90):
        S, T = jaccard_pairs(rng, 200, 2000, 100, shared)
        J = shared / 100
        vr = np.mean(fam.hash_values(S) == fam.hash_values(T))
        value_rate.append(vr)
        code_rate.append(np.mean(fam.hash(S) == fam.hash(T)))
        # Densification collides with probability J, plus chance equality of offsets
        # taken from different bins (<= 1/10 here: bins hold 20 positions).
        assert J - 0.03 < vr < J + 0.1 * (1 - J) + 0.03, (J, vr)
    assert np.all(np.diff(value_rate) > 0.1), value_rate
    assert np.all(np.diff(code_rate) > 0.05), code_rate


def test_minhash_csr_matches_dense_and_uses_only_presence():
    import scipy.sparse as sp
    rng = np.random.default_rng(8)
    fam = lsh.make_family("minhash", 500, 3, 8, seed=1)
    X = (rng.random((40, 500)) < 0.03) * rng.uniform(0.5, 3.0, (40, 500))
    X[3] = 0.0  # the empty set gets the fixed code
    A = sp.csr_matrix(X.astype(np.float32))
    codes = fam.hash_csr(A.indptr, A.indices, A.data, range_pow=12)
    np.testing.assert_array_equal(codes, fam.hash(X, 12))
    # Explicit zeros in data are absent, like in the dense form.
    B = A.copy()
    B.data[::2] = 0.0
    np.testing.assert_array_equal(fam.hash_csr(B.indptr, B.indices, B.data, 12),
                                  fam.hash(B.toarray(), 12))
    np.testing.assert_array_equal(codes[3], fam.hash(np.zeros((1, 500)), 12)[0])


@pytest.mark.parametrize("name,params", [("srp", {}), ("srp", {"sparsity": 1.0}), ("dwta", {}),
                                         ("wta", {"window": 5}), ("minhash", {}),
                                         ("minhash", {"value_bits": 2})])
def test_codes_are_the_documented_assembly_of_values(name, params):
    rng = np.random.default_rng(1)
    dim = 300 if name == "minhash" else 40
    fam = lsh.make_family(name, dim, 3, 7, seed=12, **params)
    X = np.maximum(rng.standard_normal((25, dim)), 0).astype(np.float32)
    if name == "minhash":
        X *= rng.random((25, dim)) < 0.1
    vals = fam.hash_values(X)
    assert vals.shape == (25, 21) and vals.dtype == np.int32
    assert vals.min() >= 0 and vals.max() < fam.radix
    for rp in sorted({1, min(5, fam.code_bits), fam.code_bits}):
        codes = fam.hash(X, rp)
        assert codes.shape == (25, 7) and codes.dtype == np.int32
        assert codes.min() >= 0 and codes.max() < 2**rp
        expect = [[py_code(vals[i], l, fam, rp) for l in range(7)] for i in range(25)]
        np.testing.assert_array_equal(codes, np.array(expect))
    np.testing.assert_array_equal(fam.hash(X), fam.hash(X, fam.code_bits))


@pytest.mark.parametrize("name", ("srp", "dwta", "wta", "minhash"))
def test_same_seed_same_codes_different_seed_different(name):
    rng = np.random.default_rng(4)
    dim = 256
    X = np.maximum(rng.standard_normal((300, dim)), 0).astype(np.float32)
    a = lsh.make_family(name, dim, 4, 10, seed=77)
    b = lsh.make_family(name, dim, 4, 10, seed=77)
    c = lsh.make_family(name, dim, 4, 10, seed=78)
    for attr, v in vars(a).items():
        if isinstance(v, np.ndarray):
            np.testing.assert_array_equal(v, getattr(b, attr), err_msg=attr)
    rp = min(a.code_bits, 10)
    ca = a.hash(X, rp)
    np.testing.assert_array_equal(ca, b.hash(X, rp))
    assert np.mean(ca == c.hash(X, rp)) < 0.5
    assert ca.min() >= 0 and ca.max() < 2**rp


@pytest.mark.parametrize("name", ("srp", "dwta", "minhash"))
def test_codes_do_not_depend_on_thread_count(name):
    rng = np.random.default_rng(6)
    X = np.maximum(rng.standard_normal((1500, 200)), 0).astype(np.float32)
    fam = lsh.make_family(name, 200, 8, 9, seed=1)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = fam.hash(X, 7)
    finally:
        numba.set_num_threads(before)
    np.testing.assert_array_equal(one, fam.hash(X, 7))


def test_srp_dense_and_gather_kernels_agree(monkeypatch):
    rng = np.random.default_rng(3)
    X = rng.standard_normal((700, 50)).astype(np.float32)
    X[X < 0.3] = 0.0
    X[5] = 0.0
    X[6] = 0.0
    X[6, ::7] = 1e-40  # denormals count as zero (no slow denormal arithmetic)
    fam = lsh.make_family("srp", 50, 8, 6, seed=2, sparsity=0.4)
    dense = fam.hash(X, 6)
    np.testing.assert_array_equal(dense[5], dense[6])
    monkeypatch.setattr(type(fam), "DENSE_LIMIT", 0)
    np.testing.assert_array_equal(dense, fam.hash(X, 6))
    np.testing.assert_array_equal(dense, [[py_code(v, l, fam, 6) for l in range(6)]
                                          for v in fam.hash_values(X)])


def test_srp_subsets_and_signs():
    fam = lsh.make_family("srp", 30, 2, 3, seed=0, sparsity=0.25)
    assert fam.n_nz == 8 and fam.dims.shape == (6 * 8,) and fam.dims.dtype == np.int32
    for h in range(6):
        sub = fam.dims[h * 8:(h + 1) * 8]
        assert len(set(sub.tolist())) == 8 and np.all(np.diff(sub) > 0)
    assert set(np.unique(fam.signs).tolist()) == {-1.0, 1.0}
    # A hand-computed bit: the signed sum over the subset, >= 0.
    x = np.arange(30, dtype=np.float32) - 14.5
    bits = fam.hash_values(x[None])[0]
    for h in range(6):
        s = sum(float(fam.signs[h * 8 + p]) * float(x[fam.dims[h * 8 + p]]) for p in range(8))
        assert bits[h] == (1 if s >= 0 else 0)


# ----------------------------------------------------------------------------
# DWTA: densification on ReLU-like vectors
# ----------------------------------------------------------------------------

def test_dwta_matches_python_definition_on_sparse_inputs():
    rng = np.random.default_rng(10)
    fam = lsh.make_family("dwta", 32, 3, 6, seed=5, bin_size=4)
    X = np.maximum(rng.standard_normal((60, 32)) - 1.0, 0).astype(np.float32)  # ~84% zeros
    X[0] = 0.0                              # whole vector zero: fixed code
    X[1] = 0.0
    X[1, 7] = 2.0                           # a single positive entry
    X[2] = -np.abs(X[2]) - 1.0              # only negatives: no bin is non-empty either
    X[3, :] = 1.0                           # ties: the first position wins
    got = fam.hash_values(X)
    for i in range(X.shape[0]):
        assert got[i].tolist() == py_dwta_values(X[i].tolist(), fam), i
    assert not got[0].any() and not got[2].any()
    assert not got[3].any()
    codes = fam.hash(X)
    np.testing.assert_array_equal(codes, [[py_code(v, l, fam, fam.code_bits) for l in range(6)]
                                          for v in got])


def test_densify_fallback_scan():
    """A degenerate probe hash (a=1, b=0 sends every probe to bin 0) forces the scan."""
    vals = np.array([-1, -1, 5, -1, 7, -1], np.int32)
    stats = {"fallback": 0}
    expect = py_densify(vals.tolist(), 1, 0, stats)
    densify(vals, np.uint64(1), np.uint64(0))
    assert vals.tolist() == expect == [5, 5, 5, 7, 7, 5]
    assert stats["fallback"] == 4
    allempty = np.full(4, -1, np.int32)
    densify(allempty, np.uint64(3), np.uint64(0))
    assert allempty.tolist() == [0, 0, 0, 0]


def test_dwta_codes_are_not_degenerate_on_relu_vectors():
    rng = np.random.default_rng(0)
    fam = lsh.make_family("dwta", 128, 6, 50, seed=1)
    X = np.maximum(rng.standard_normal((500, 128)) - 1.3, 0).astype(np.float32)  # ~90% zeros
    assert 0.85 < np.mean(X == 0) < 0.95
    # Fraction of bins with no positive entry, before densification.
    bins = X[:, fam.bin_dims].reshape(500, fam.n_hashes, fam.bin_size)
    empty = np.mean(bins.max(axis=2) <= 0)
    assert empty > 0.3
    codes = fam.hash(X)
    distinct = [len(np.unique(codes[:, l])) for l in range(fam.L)]
    # 500 random sparse vectors over 2**18 buckets: nearly all distinct. Without
    # densification every empty bin would read 0 and codes would pile up.
    assert min(distinct) > 450, distinct
    vals = fam.hash_values(X)
    assert np.all(np.bincount(vals.ravel(), minlength=8) > 0.08 * vals.size)


# ----------------------------------------------------------------------------
# Interface and validation
# ----------------------------------------------------------------------------

def test_registry_and_attributes():
    assert set(lsh.FAMILIES) == {"srp", "dwta", "wta", "minhash"}
    expect_bits = {"srp": 5, "dwta": 15, "wta": 12, "minhash": 5 * 4}
    for name, bits in expect_bits.items():
        params = {"window": 5} if name == "wta" else {}
        fam = lsh.make_family(name, 200, 5, 3, seed=0, **params)
        assert fam.name == name and (fam.dim, fam.K, fam.L) == (200, 5, 3)
        assert fam.code_bits == bits, (name, fam.code_bits)
    # minhash: 200 dims into 15 bins of 13-14 positions -> offsets < 14 -> 4 bits
    assert lsh.make_family("minhash", 200, 5, 3, 0).value_bits == 4


def test_validation_errors_name_the_problem():
    with pytest.raises(ValueError, match="valid: srp, dwta, wta, minhash"):
        lsh.make_family("simhash", 10, 2, 2, 0)
    with pytest.raises(ValueError, match="valid parameters: bin_size"):
        lsh.make_family("dwta", 10, 2, 2, 0, window=4)
    with pytest.raises(ValueError, match="sparsity"):
        lsh.make_family("srp", 10, 2, 2, 0, sparsity=0.0)
    with pytest.raises(ValueError, match=r"K \(0\)"):
        lsh.make_family("srp", 10, 0, 2, 0)
    with pytest.raises(ValueError, match="bin_size"):
        lsh.make_family("dwta", 10, 2, 2, 0, bin_size=11)
    with pytest.raises(ValueError, match="dim >= 2\\*K\\*L"):
        lsh.make_family("minhash", 10, 2, 3, 0)
    fam = lsh.make_family("dwta", 16, 2, 3, 0, bin_size=4)
    with pytest.raises(ValueError, match=r"range_pow \(5\) exceeds the 4 bits.*valid: 1..4"):
        fam.hash(np.zeros((1, 16), np.float32), 5)
    with pytest.raises(ValueError, match=r"shape \[n, 16\]"):
        fam.hash(np.zeros((2, 15), np.float32))
    big = lsh.make_family("srp", 16, 40, 1, 0)
    with pytest.raises(ValueError, match="pass range_pow"):
        big.hash(np.zeros((1, 16), np.float32))
    assert big.hash(np.zeros((1, 16), np.float32), 20).max() < 2**20
    with pytest.raises(ValueError, match="lower K"):
        lsh.make_family("dwta", 16, 30, 1, 0)
