"""Adam moments stored as bfloat16 against independent references.

Conversions are checked against rounding done in float64 arithmetic (not the
bit tricks the kernels use); the update against float32 moments over a few
hundred steps; the random bits against the thread count and the rank layout.
"""

import numba
import numpy as np
import pytest
from numba import njit

from dslide.config import Config
from dslide.model import bfloat16 as BF
from dslide.model import kernels as K
from dslide.model.network import Network


@njit
def _nearest(x):
    out = np.empty(x.shape[0], np.uint16)
    for i in range(x.shape[0]):
        out[i] = BF.f32_to_bf16(x[i])
    return out


@njit
def _stochastic(x, r):
    out = np.empty(x.shape[0], np.uint16)
    for i in range(x.shape[0]):
        out[i] = BF.f32_to_bf16_stochastic(x[i], r[i])
    return out


def _neighbours(x):
    """The two bfloat16 values around each float32 x (truncated toward zero, and one unit
    further from zero) as float64, computed from the value, not from bit arithmetic."""
    x = np.asarray(x, np.float64)
    e = np.floor(np.log2(np.abs(x)))
    ulp = 2.0 ** (e - 7)  # 8 significant bits
    lo = np.trunc(x / ulp) * ulp
    hi = lo + np.sign(x) * ulp
    return lo, hi, ulp


def test_nearest_rounding_matches_float64_reference_ties_to_even():
    rs = np.random.default_rng(0)
    x = np.concatenate([rs.normal(size=5000) * 10.0 ** rs.integers(-30, 30, 5000),
                        rs.uniform(-1, 1, 2000)]).astype(np.float32)
    x = x[x != 0]
    # exact ties: the dropped 16 bits are 0x8000, for both parities of the kept mantissa
    ties = (np.array([0x3F808000, 0x3F818000, 0xBF808000, 0xBF818000, 0x47FF8000], np.uint32)).view(np.float32)
    x = np.concatenate([x, ties])
    got = BF.from_bfloat16(_nearest(x)).astype(np.float64)
    lo, hi, ulp = _neighbours(x)
    d_lo, d_hi = np.abs(x - lo), np.abs(x - hi)
    even_lo = (np.abs(np.round(lo / ulp)) % 2) == 0
    want = np.where(d_lo < d_hi, lo, np.where(d_hi < d_lo, hi, np.where(even_lo, lo, hi)))
    np.testing.assert_array_equal(got, want)
    assert got[-5:].tolist() == [1.0, 1.015625, -1.0, -1.015625, 131072.0]
    # the numpy helper is the same rounding, and widening is exact
    np.testing.assert_array_equal(BF.to_bfloat16(x), _nearest(x))
    np.testing.assert_array_equal(BF.from_bfloat16(BF.to_bfloat16(got.astype(np.float32))), got)


def test_special_values_survive():
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30, 3.3e38], np.float32)
    got = BF.from_bfloat16(_nearest(x))
    assert got[0] == 0 and got[1] == 0 and np.signbit(got[1])
    assert got[2] == np.inf and got[3] == -np.inf and np.isnan(got[4])
    assert got[5] == pytest.approx(1e-30, rel=2**-8) and got[5] > np.finfo(np.float32).tiny  # TINY: normal
    sto = BF.from_bfloat16(_stochastic(x, np.full(x.size, 0xFFFF, np.uint32)))
    assert np.isnan(sto[4]) and sto[2] == np.inf and sto[0] == 0


def test_stochastic_rounding_is_unbiased_and_between_neighbours():
    x = np.float32(1.0 + 2**-10)  # a quarter of the way from 1 to the next bfloat16 (1 + 2^-7)
    n = 200_000
    bits = _bits_kernel(99, n)
    assert bits.max() < 2**16 and abs(bits.mean() / 2**16 - 0.5) < 0.005
    got = BF.from_bfloat16(_stochastic(np.full(n, x), bits)).astype(np.float64)
    assert set(np.unique(got)) == {1.0, 1.0 + 2**-7}
    # P(round up) = 1/8: the mean is x within 4 standard errors
    se = 2**-7 * np.sqrt(0.125 * 0.875 / n)
    assert abs(got.mean() - float(x)) < 4 * se


@njit
def _bits_kernel(key, n):
    out = np.empty(n, np.uint32)
    seed = BF.row_seed(np.uint64(key), np.uint64(0))
    for k in range(n):
        out[k] = BF.fmix32(np.uint32(seed + np.uint32(k))) >> np.uint32(16)
    return out


def _adam_run(moment_dtype, steps, W0, grads, rk_fn):
    W = W0.copy()
    M = np.zeros(W.shape, moment_dtype)
    V = np.zeros(W.shape, moment_dtype)
    rows = np.arange(W.shape[0], dtype=np.int32)
    for t in range(1, steps + 1):
        hp = K.adam_params(1e-2, 0.9, 0.999, 1e-8, t, np.float32)
        K.adam_rows_nobias(rows, grads(t), W, M, V, hp, rk_fn(t))
    return W, M, V


def test_bfloat16_moments_track_float32_over_300_steps():
    """Gradients of fixed per-element scale, shrinking 4x after step 100 (so v must decay;
    measured: weights 0.7%, v 1.8%, m 0.4% off):
    the weights' total change stays within 3% of float32's and v within 3% (median); v
    rounded to nearest instead drifts far beyond that (it stops decaying), which this
    tolerance would catch."""
    rs = np.random.default_rng(5)
    R, d, steps = 64, 96, 300
    W0 = rs.normal(size=(R, d)).astype(np.float32)
    scale = np.exp(rs.normal(size=(R, d))).astype(np.float32)
    G = [(rs.normal(size=(R, d)) * scale * (1.0 if t <= 100 else 0.25)).astype(np.float32) for t in range(steps + 1)]
    W32, M32, V32 = _adam_run(np.float32, steps, W0, lambda t: G[t], lambda t: K.NO_ROUNDING)
    Wb, Mb, Vb = _adam_run(np.uint16, steps, W0, lambda t: G[t], lambda t: BF.rounding_key(7, t, 0, 0, d))
    assert Mb.dtype == np.uint16
    rel_w = np.linalg.norm((Wb - W0) - (W32 - W0)) / np.linalg.norm(W32 - W0)
    rel_v = np.median(np.abs(BF.from_bfloat16(Vb) / V32 - 1))
    rel_m = np.linalg.norm(BF.from_bfloat16(Mb) - M32) / np.linalg.norm(M32)
    assert rel_w < 0.03 and rel_v < 0.03 and rel_m < 0.03, (rel_w, rel_v, rel_m)

    # the same with v rounded to nearest (numpy, from the same gradients): v stalls
    m = np.zeros((R, d), np.float32)
    v = np.zeros((R, d), np.float32)
    for t in range(1, steps + 1):
        m = BF.from_bfloat16(BF.to_bfloat16(0.9 * m + 0.1 * G[t]))
        v = BF.from_bfloat16(BF.to_bfloat16(np.float32(0.999) * v + np.float32(0.001) * G[t] * G[t]))
    assert np.median(np.abs(v / V32 - 1)) > 2 * 0.03  # measured 8.7%


def test_rounding_does_not_depend_on_threads_or_rank_layout():
    """The random bits of element (r, c) come from its global position: two half-slices
    with their offsets give the whole array's result, bit for bit, at 1 and at 2 threads."""
    rs = np.random.default_rng(2)
    R, d, steps = 40, 33, 5
    W0 = rs.normal(size=(R, d)).astype(np.float32)
    G = [rs.normal(size=(R, d)).astype(np.float32) for _ in range(steps + 1)]
    key = 4242
    whole = _adam_run(np.uint16, steps, W0, lambda t: G[t], lambda t: BF.rounding_key(key, t, 0, 0, d))
    half = R // 2 + 3
    parts = [_adam_run(np.uint16, steps, W0[a:b], lambda t, a=a, b=b: G[t][a:b],
                       lambda t, a=a: BF.rounding_key(key, t, a, 0, d)) for a, b in ((0, half), (half, R))]
    for i in range(3):
        np.testing.assert_array_equal(np.concatenate([parts[0][i], parts[1][i]]), whole[i])
    old = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = _adam_run(np.uint16, steps, W0, lambda t: G[t], lambda t: BF.rounding_key(key, t, 0, 0, d))
    finally:
        numba.set_num_threads(old)
    for i in range(3):
        np.testing.assert_array_equal(one[i], whole[i])
    # and the bits differ from step to step (a fresh draw each step)
    assert not np.array_equal(_bits_kernel(BF.rounding_key(key, 1, 0, 0, d)[0], 64),
                              _bits_kernel(BF.rounding_key(key, 2, 0, 0, d)[0], 64))


def test_network_trains_with_bfloat16_moments_close_to_float32():
    import scipy.sparse as sp

    from dslide.model.inputs import csr_parts, make_batch

    rs = np.random.default_rng(0)
    n, F, L = 64, 40, 300
    X = sp.random(n, F, density=0.2, format="csr", random_state=1, dtype=np.float32)
    Y = sp.csr_matrix((rs.random((n, L)) < 0.02).astype(np.float32) + sp.eye(n, L, format="csr", dtype=np.float32))
    losses = {}
    for md in ("float32", "bfloat16"):
        cfg = Config(hidden=(16,), kinds=("dense", "lsh"), adam_dtype=None if md == "float32" else md, seed=1,
                     lr=1e-2, lr_schedule="constant", dropout=0.0, batch_size=n)
        net = Network(cfg, F, L)
        out = []
        for step in range(1, 61):
            out.append(net.train_step(make_batch(csr_parts(X), csr_parts(Y, np.float32), np.arange(n), step)))
        losses[md] = np.array(out)
        want = np.uint16 if md == "bfloat16" else np.float32
        assert all(l.opt_W.m.dtype == want and l.opt_b.v.dtype == want for l in net.layers)
    assert losses["bfloat16"][-1] < 0.6 * losses["bfloat16"][0]  # it learns
    np.testing.assert_allclose(losses["bfloat16"], losses["float32"], rtol=0.05)


def test_config_checks_adam_dtype():
    assert Config().moment_dtype == "float32"
    assert Config(dtype="float64").moment_dtype == "float64"
    assert Config(adam_dtype="bfloat16").moment_dtype == "bfloat16"
    with pytest.raises(ValueError, match="adam_dtype = 'float16' is not valid; choose one of"):
        Config(adam_dtype="float16")
    with pytest.raises(ValueError, match="needs dtype = 'float32'"):
        Config(adam_dtype="bfloat16", dtype="float64")
