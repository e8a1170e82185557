"""CompactTables (buckets sized to what they hold) against a brute-force reference and
against fixed-capacity tables that never fill."""

import numpy as np
import pytest

from dslide import lsh


def _reference(item_codes, qcodes, mode, m=None, t=None):
    """Per query: (ids, counts) from counting, per item, the tables whose code matches."""
    out = []
    for q in qcodes:
        cnt = (item_codes == q[None, :]).sum(axis=1)
        ids = np.flatnonzero(cnt)
        if mode == "union":
            out.append((ids, cnt[ids]))
            continue
        if mode == "threshold":
            ids = ids[cnt[ids] >= t]
        order = np.lexsort((ids, -cnt[ids]))
        ids = ids[order]
        if mode == "topk":
            ids = ids[:m]
        out.append((ids, cnt[ids]))
    return out


def _fam(L=6, dim=10, K=6):
    return lsh.make_family("srp", dim, K, L, seed=1)


@pytest.mark.parametrize("mode,m,t", [("union", None, None), ("topk", 7, None), ("threshold", None, 2)])
def test_queries_match_brute_force(mode, m, t):
    rs = np.random.default_rng(0)
    L, n_items, rp = 6, 300, 3
    T = lsh.CompactTables(_fam(L), rp)
    codes = rs.integers(0, 1 << rp, (n_items, L)).astype(np.int32)
    T.build_codes(codes)
    q = rs.integers(0, 1 << rp, (25, L)).astype(np.int32)
    ptr, ids, cnt = T.query_codes(q, mode=mode, m=m, t=t)
    for i, (rid, rcnt) in enumerate(_reference(codes, q, mode, m, t)):
        np.testing.assert_array_equal(ids[ptr[i]:ptr[i + 1]], rid)
        np.testing.assert_array_equal(cnt[ptr[i]:ptr[i + 1]], rcnt)
    # every item sits once per table, in its own bucket, ascending ids within a bucket
    for l in range(L):
        assert sorted(T.ids[l].tolist()) == list(range(n_items))
        for b in range(1 << rp):
            bucket = T.ids[l, T.offsets[l, b]:T.offsets[l, b + 1]]
            assert (codes[bucket, l] == b).all() and (np.diff(bucket) > 0).all()
    assert T.memory_bytes == L * ((1 << rp) + 1 + 2 * n_items) * 4


def test_same_results_as_fixed_capacity_tables_that_never_fill():
    rs = np.random.default_rng(1)
    W = rs.normal(size=(2000, 10)).astype(np.float32)
    Q = rs.normal(size=(40, 10)).astype(np.float32)
    compact = lsh.CompactTables(_fam(), 5)
    fixed = lsh.HashTables(_fam(), 5, capacity=2000)
    compact.build(W)
    fixed.build(W)
    assert fixed.bucket_sizes()["full_fraction"] == 0
    for mode, kw in (("union", {}), ("topk", {"m": 30}), ("threshold", {"t": 3})):
        for a, b in zip(compact.query(Q, mode=mode, **kw), fixed.query(Q, mode=mode, **kw)):
            np.testing.assert_array_equal(a, b)
    # and after moving some items (repeated ids: the last vector wins)
    ids = np.array([3, 77, 3, 1999, 500])
    newW = rs.normal(size=(5, 10)).astype(np.float32)
    compact.update(ids, newW)
    fixed.update(ids, newW)
    W2 = W.copy()
    W2[ids] = newW  # numpy: the last assignment to a repeated index wins
    fresh = lsh.CompactTables(_fam(), 5)
    fresh.build(W2)
    np.testing.assert_array_equal(compact.ids, fresh.ids)
    np.testing.assert_array_equal(compact.offsets, fresh.offsets)
    for a, b in zip(compact.query(Q, mode="union"), fixed.query(Q, mode="union")):
        np.testing.assert_array_equal(a, b)


def test_state_round_trip_and_checks():
    rs = np.random.default_rng(2)
    T = lsh.CompactTables(_fam(), 4)
    T.build(rs.normal(size=(100, 10)).astype(np.float32))
    U = lsh.CompactTables(_fam(), 4)
    U.load_state_arrays({k: v.copy() for k, v in T.state_arrays().items()})
    Q = rs.normal(size=(9, 10)).astype(np.float32)
    for a, b in zip(T.query(Q, mode="topk", m=5), U.query(Q, mode="topk", m=5)):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="offsets' has shape"):
        lsh.CompactTables(_fam(), 5).load_state_arrays(T.state_arrays())
    with pytest.raises(ValueError, match="exceeds the 6 bits"):
        lsh.CompactTables(_fam(), 7)
    with pytest.raises(ValueError, match="ids must lie in"):
        T.update([100], rs.normal(size=(1, 10)).astype(np.float32))
    with pytest.raises(ValueError, match="empty"):
        lsh.CompactTables(_fam(), 4).query(Q)


def test_a_layer_uses_compact_tables_by_default():
    from dslide.comm import Comm
    from dslide.config import Config, LSHConfig
    from dslide.model.candidates.hashing import auto_range_pow
    from dslide.model.network import Network

    net = Network(Config(hidden=(16,), kinds=("dense", "lsh"), lsh=LSHConfig(family="dwta")), 50, 20000, Comm())
    tables = net.layers[-1].candidates.tables
    assert isinstance(tables, lsh.CompactTables) and tables.n_items == 20000
    assert tables.range_pow == auto_range_pow(20000, 0, 18) == 11  # 20,000 / 2^11: 9.8 a bucket
    net = Network(Config(hidden=(16,), kinds=("dense", "lsh"), lsh=LSHConfig(family="dwta", capacity=32)),
                  50, 20000, Comm())
    assert isinstance(net.layers[-1].candidates.tables, lsh.HashTables)
