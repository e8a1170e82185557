"""XMC metrics against hand-worked numbers and a brute-force pure-Python reference.

The reference (`ref_*` below) is written straight from the definitions in
dslide/metrics.py (which follow pyxclib's xc_metrics): Python sets, loops over
points and `sorted(key=(-score, label))`, no numpy in the arithmetic.
"""

import math

import numpy as np
import pytest
import scipy.sparse as sp

from dslide import metrics as m

# ----------------------------------------------------------------------------
# Brute-force reference
# ----------------------------------------------------------------------------


def ref_label_sets(Y):
    Y = sp.coo_matrix(Y)
    sets = [set() for _ in range(Y.shape[0])]
    acc = {}
    for i, j, v in zip(Y.row.tolist(), Y.col.tolist(), Y.data.tolist()):
        acc[(i, j)] = acc.get((i, j), 0.0) + v  # scipy sums duplicate entries
    for (i, j), v in acc.items():
        if v != 0:
            sets[i].add(j)
    return sets


def ref_rank_dense(S, k):
    out = []
    for row in S.tolist():
        ranked = sorted(range(len(row)), key=lambda j: (-row[j], j))[:k]
        out.append(ranked + [-1] * (k - len(ranked)))
    return out


def ref_rank_sparse(P, k):
    P = sp.csr_matrix(P)  # only structure + values; entries kept as stored (incl. zeros)
    out = []
    for i in range(P.shape[0]):
        entries = {}
        for e in range(P.indptr[i], P.indptr[i + 1]):
            j = int(P.indices[e])
            entries[j] = entries.get(j, 0.0) + float(P.data[e])
        ranked = sorted(entries, key=lambda j: (-entries[j], j))[:k]
        out.append(ranked + [-1] * (k - len(ranked)))
    return out


def ref_metrics(sets, ranked, k, w=None):
    """P@k, nDCG@k and (with weights w) PSP@k, PSnDCG@k for k' = 1..k, as lists."""
    n = len(sets)
    disc = [1.0 / math.log2(r + 2) for r in range(k)]
    P, N, PSP, PSN = [], [], [], []
    for kk in range(1, k + 1):
        p_sum = n_sum = 0.0
        ps_num = ps_den = psn_num = psn_den = 0.0
        for y, pred in zip(sets, ranked):
            pred = list(pred)[:kk]
            hits = [1.0 if (j >= 0 and j in y) else 0.0 for j in pred]
            p_sum += sum(hits) / kk
            if not y:
                continue  # contributes 0 to every sum, still counts in n
            norm = sum(disc[r] for r in range(min(kk, len(y))))
            n_sum += sum(h * disc[r] for r, h in enumerate(hits)) / norm
            if w is not None:
                gains = [w[j] * h for j, h in zip(pred, hits)]
                best = sorted((w[j] for j in y), reverse=True)[:kk]
                ps_num += sum(gains)
                ps_den += sum(best)
                psn_num += sum(g * disc[r] for r, g in enumerate(gains)) / norm
                psn_den += sum(b * disc[r] for r, b in enumerate(best)) / norm
        P.append(p_sum / n)
        N.append(n_sum / n)
        PSP.append(ps_num / ps_den if ps_den > 0 else 0.0)
        PSN.append(psn_num / psn_den if psn_den > 0 else 0.0)
    return (P, N, PSP, PSN) if w is not None else (P, N)


def all_metrics(Y, pred, k, w):
    return (
        m.precision_at_k(Y, pred, k),
        m.ndcg_at_k(Y, pred, k),
        m.psprecision_at_k(Y, pred, w, k),
        m.psndcg_at_k(Y, pred, w, k),
    )


# ----------------------------------------------------------------------------
# Hand-worked example
# ----------------------------------------------------------------------------
#
# L = 6 labels, 3 points:  y_0 = {0, 2},  y_1 = {1},  y_2 = {} (no labels)
# top-3 predictions:       pred_0 = [2, 1, 0], pred_1 = [-1, 3, 1], pred_2 = [4, 5, -1]
# hits:                    [1, 0, 1],          [0, 0, 1],           [0, 0, 0]
# inverse propensities w = [2, 5, 3, 1, 1, 1]
# discounts 1/log2(r+1):   r=1: 1, r=2: 1/log2(3) = 0.6309297536, r=3: 1/log2(4) = 0.5

Y_HAND = sp.csr_matrix(
    (np.ones(3, np.float32), np.array([0, 2, 1]), np.array([0, 2, 3, 3])), shape=(3, 6)
)
TOP_HAND = np.array([[2, 1, 0], [-1, 3, 1], [4, 5, -1]])
W_HAND = np.array([2.0, 5.0, 3.0, 1.0, 1.0, 1.0])
D2 = 0.6309297535714575  # 1/log2(3)

# P@1 = (1 + 0 + 0)/1 / 3 = 1/3
# P@2 = ((1+0)/2 + (0+0)/2 + 0) / 3 = 1/6
# P@3 = ((1+0+1)/3 + (0+0+1)/3 + 0) / 3 = 1/3   (point 2, no labels, still counts in the 3)
P_HAND = [1 / 3, 1 / 6, 1 / 3]
# point 0: DCG = 1, 1, 1 + 0.5 = 1.5;  N (|y|=2) = 1, 1 + D2 = 1.6309297536, 1.6309297536
# point 1: DCG = 0, 0, 0.5;            N (|y|=1) = 1, 1, 1
# nDCG@1 = (1/1 + 0 + 0) / 3                       = 0.3333333333
# nDCG@2 = (1/1.6309297536 + 0 + 0) / 3            = 0.6131471928 / 3 = 0.2043823976
# nDCG@3 = (1.5/1.6309297536 + 0.5/1 + 0) / 3      = (0.9197207892 + 0.5) / 3 = 0.4732402631
NDCG_HAND = [0.3333333333, 0.2043823976, 0.4732402631]
# gains w*hit: point 0 [3, 0, 2], point 1 [0, 0, 5]
# ideal (true labels by decreasing w): point 0 [3, 2], point 1 [5]
# PSP@1 = (3 + 0) / (3 + 5)             = 3/8  = 0.375
# PSP@2 = (3+0 + 0+0) / (3+2 + 5)       = 3/10 = 0.3
# PSP@3 = (3+0+2 + 0+0+5) / (3+2 + 5)   = 10/10 = 1.0
PSP_HAND = [0.375, 0.3, 1.0]
# PSDCG:  prediction point 0: 3, 3, 3 + 2*0.5 = 4;      point 1: 0, 0, 5*0.5 = 2.5
#         ideal      point 0: 3, 3 + 2*D2 = 4.2618595, 4.2618595; point 1: 5, 5, 5
# each divided by the point's N above:
# PSnDCG@1 = (3/1 + 0) / (3/1 + 5/1)                               = 0.375
# PSnDCG@2 = (3/1.6309297536 + 0) / (4.2618595071/1.6309297536 + 5)
#          = 1.8394415784 / (2.6131471928 + 5)                      = 0.2416138204
# PSnDCG@3 = (4/1.6309297536 + 2.5/1) / 7.6131471928
#          = (2.4525887712 + 2.5) / 7.6131471928                    = 0.6505310676
PSN_HAND = [0.375, 0.2416138204, 0.6505310676]


def test_hand_worked_top_k_array():
    p, n, psp, psn = all_metrics(Y_HAND, TOP_HAND, 3, W_HAND)
    for got in (p, n, psp, psn):
        assert got.dtype == np.float64 and got.shape == (3,)
    np.testing.assert_allclose(p, P_HAND, rtol=0, atol=1e-9)
    np.testing.assert_allclose(n, NDCG_HAND, rtol=0, atol=1e-9)
    np.testing.assert_allclose(psp, PSP_HAND, rtol=0, atol=1e-9)
    np.testing.assert_allclose(psn, PSN_HAND, rtol=0, atol=1e-9)


def test_hand_worked_extra_columns_ignored():
    # k' = 4 > k = 3: the 4th column must not be read (label 1 would be a hit for point 0).
    wide = np.hstack([TOP_HAND, [[1], [0], [0]]]).astype(np.int32)
    np.testing.assert_allclose(m.precision_at_k(Y_HAND, wide, 3), P_HAND, atol=1e-12)


def test_hand_worked_score_matrices_with_ties():
    # Dense scores whose ranking (ties to the lower label) is the hand example's:
    # row 0: labels 2 and 1 tie at 0.9 -> 1 would win the tie, so 2 gets 1.0;
    #        0 and 3 tie at 0.5 -> 0 (lower) is third.            ranking [2, 1, 0, ...]
    S = np.array(
        [
            [0.5, 0.9, 1.0, 0.5, 0.1, 0.1],
            [0.0, 0.0, 0.0, 0.0, 0.0, 0.0],  # all tied -> [0, 1, 2]: hits [0, 1, 0]
            [0.0, 0.0, 0.0, 0.0, 2.0, 2.0],  # [4, 5, 0]
        ]
    )
    # Row 1 differs from the hand example: top-3 [0, 1, 2] with y_1 = {1}.
    # P@1 = (1 + 0 + 0)/3 = 1/3; P@2 = (1/2 + 1/2 + 0)/3 = 1/3; P@3 = (2/3 + 1/3)/3 = 1/3
    np.testing.assert_allclose(m.precision_at_k(Y_HAND, S, 3), [1 / 3, 1 / 3, 1 / 3], atol=1e-12)
    # nDCG@2 = (1/1.6309297536 + D2/1) / 3 = (0.6131471928 + 0.6309297536)/3 = 0.4146923155
    np.testing.assert_allclose(m.ndcg_at_k(Y_HAND, S, 3)[1], 0.4146923155, atol=1e-9)

    # Sparse scores: only stored entries compete. Row 1 stores only label 3 (a stored 0.0)
    # and label 1 at -2.0; row 2 stores nothing -> all predictions are -1.
    P = sp.csr_matrix(
        (
            np.array([0.5, 0.9, 1.0, 0.0, -2.0]),
            np.array([0, 1, 2, 3, 1]),
            np.array([0, 3, 5, 5]),
        ),
        shape=(3, 6),
    )
    P.sort_indices()
    # ranking: row 0 [2, 1, 0], row 1 [3, 1, -1], row 2 [-1, -1, -1]
    # hits:    [1, 0, 1],       [0, 1, 0],       [0, 0, 0]
    # P@1 = 1/3;  P@2 = (1/2 + 1/2)/3 = 1/3;  P@3 = (2/3 + 1/3)/3 = 1/3
    np.testing.assert_allclose(m.precision_at_k(Y_HAND, P, 3), [1 / 3, 1 / 3, 1 / 3], atol=1e-12)
    # PSP@1 = (3 + 0) / (3 + 5) = 0.375; PSP@2 = (3 + 5) / (3+2 + 5) = 0.8
    np.testing.assert_allclose(m.psprecision_at_k(Y_HAND, P, W_HAND, 3)[:2], [0.375, 0.8], atol=1e-12)
    assert m._topk(P, 3, 6, 3).tolist() == [[2, 1, 0], [3, 1, -1], [-1, -1, -1]]


def test_hand_worked_evaluate_dict():
    out = m.evaluate(Y_HAND, TOP_HAND, k=3, inv_prop=W_HAND)
    assert list(out) == [
        "p@1", "p@2", "p@3", "ndcg@1", "ndcg@2", "ndcg@3",
        "psp@1", "psp@2", "psp@3", "psndcg@1", "psndcg@2", "psndcg@3",
    ]
    assert all(type(v) is float for v in out.values())
    expected = P_HAND + NDCG_HAND + PSP_HAND + PSN_HAND
    np.testing.assert_allclose(list(out.values()), expected, atol=1e-9)
    plain = m.evaluate(Y_HAND, TOP_HAND, k=3)
    assert list(plain) == ["p@1", "p@2", "p@3", "ndcg@1", "ndcg@2", "ndcg@3"]


def test_labels_are_nonzero_entries_and_y_untouched():
    # A stored explicit zero is not a relevant label; a stored 0.5 is.
    Y = sp.csr_matrix((np.array([0.0, 0.5]), np.array([2, 0]), np.array([0, 2])), shape=(1, 3))
    data_before, indices_before = Y.data.copy(), Y.indices.copy()
    # top-2 [2, 0]: hits [0, 1] -> P@1 = 0, P@2 = 1/2
    np.testing.assert_allclose(m.precision_at_k(Y, np.array([[2, 0]]), 2), [0.0, 0.5])
    assert Y.data.tolist() == data_before.tolist() and Y.indices.tolist() == indices_before.tolist()


def test_no_relevant_label_anywhere_gives_zero():
    Y = sp.csr_matrix((2, 4), dtype=np.float32)
    top = np.array([[0, 1], [2, 3]])
    w = np.ones(4)
    for got in all_metrics(Y, top, 2, w):
        assert got.tolist() == [0.0, 0.0]


# ----------------------------------------------------------------------------
# inverse_propensity
# ----------------------------------------------------------------------------


def test_inverse_propensity_closed_formula():
    # N = 10 points, label counts N_l = [0, 1, 5, 10]; column 3 is also given a
    # duplicate entry on row 0 (summed by scipy to 2, still one point).
    counts = [0, 1, 5, 10]
    rows, cols = [], []
    for label, c in enumerate(counts):
        rows += list(range(c))
        cols += [label] * c
    rows.append(0)
    cols.append(3)
    Y = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(10, 4))
    # A = 0.55, B = 1.5: C = (ln 10 - 1) * 2.5^0.55 = 1.3025850930 * 1.6552629900 = 2.1561208957
    # 1/p_l = 1 + C * (N_l + 1.5)^-0.55:
    #   N_l = 0:  1 + 2.1561208957 * 1.5^-0.55  = 1 + 2.1561208957 * 0.8001102011 = 2.7251343234
    #   N_l = 1:  1 + 2.1561208957 * 2.5^-0.55  = 1 + (ln 10 - 1)                 = 2.3025850930
    #   N_l = 5:  1 + 2.1561208957 * 6.5^-0.55  = 1 + 2.1561208957 * 0.3571886529 = 1.7701419182
    #   N_l = 10: 1 + 2.1561208957 * 11.5^-0.55 = 1 + 2.1561208957 * 0.2609853850 = 1.5627160420
    got = m.inverse_propensity(Y)
    assert got.dtype == np.float64 and got.shape == (4,)
    np.testing.assert_allclose(got, [2.7251343234, 2.3025850930, 1.7701419182, 1.5627160420], atol=1e-9)
    # Amazon constants A = 0.6, B = 2.6: C = 1.3025850930 * 3.6^0.6 = 1.3025850930 * 2.1566590912
    #   = 2.8092319829;  N_l = 0: 1 + C * 2.6^-0.6 = 1 + 2.8092319829 * 0.5636584100 = 2.5834472328
    #                    N_l = 5: 1 + C * 7.6^-0.6 = 1 + 2.8092319829 * 0.2961500734 = 1.8319542580
    amazon = m.inverse_propensity(Y, A=0.6, B=2.6)
    np.testing.assert_allclose(amazon[[0, 2]], [2.5834472328, 1.8319542580], atol=1e-9)


@pytest.mark.parametrize(
    "kwargs, match",
    [({"A": -0.1}, "A"), ({"A": float("nan")}, "A"), ({"B": 0.0}, "B"), ({"B": float("inf")}, "B")],
)
def test_inverse_propensity_rejects_bad_constants(kwargs, match):
    Y = sp.random(5, 4, density=0.5, format="csr", random_state=0)
    with pytest.raises(ValueError, match=match):
        m.inverse_propensity(Y, **kwargs)


def test_inverse_propensity_needs_three_points():
    with pytest.raises(ValueError, match="N = 2"):
        m.inverse_propensity(sp.csr_matrix(np.eye(2)))


# ----------------------------------------------------------------------------
# Agreement with the brute-force reference on random data
# ----------------------------------------------------------------------------


def random_labels(rng, n, L):
    """Random Y with some empty rows, some explicit stored zeros and duplicate entries."""
    dense = (rng.random((n, L)) < 0.25).astype(np.float32)
    dense[rng.random(n) < 0.2] = 0.0
    Y = sp.coo_matrix(dense)
    zr, zc = rng.integers(0, n, 4), rng.integers(0, L, 4)  # explicit zeros (not labels
    # unless the cell already is one, where they add 0)
    dr, dc = Y.row[:3], Y.col[:3]  # duplicates of existing labels: still one label each
    rows = np.concatenate([Y.row, zr, dr])
    cols = np.concatenate([Y.col, zc, dc])
    data = np.concatenate([Y.data, np.zeros(4, np.float32), np.ones(len(dr), np.float32)])
    return sp.csr_matrix(sp.coo_matrix((data, (rows, cols)), shape=(n, L)), copy=False)


def non_canonical(P, dup_row):
    data, indices, indptr = [], [], [0]
    for i in range(P.shape[0]):
        lo, hi = P.indptr[i], P.indptr[i + 1]
        data += P.data[lo:hi][::-1].tolist()
        indices += P.indices[lo:hi][::-1].tolist()
        if i == dup_row:
            data.append(1.0)
            indices.append(int(P.indices[lo]))
        indptr.append(len(data))
    Q = sp.csr_matrix((np.array(data), np.array(indices), np.array(indptr)), shape=P.shape)
    assert not Q.has_canonical_format
    return Q


def check_against_reference(Y, pred, ranked, k, w):
    sets = ref_label_sets(Y)
    exp = ref_metrics(sets, ranked, k, w)
    got = all_metrics(Y, pred, k, w)
    for name, g, e in zip(("P", "nDCG", "PSP", "PSnDCG"), got, exp):
        np.testing.assert_allclose(g, e, rtol=1e-12, atol=1e-12, err_msg=name)
    # The score input and its top-k index array give identical numbers.
    top = np.array(ranked, dtype=np.int64)
    for g, t in zip(got, all_metrics(Y, top, k, w)):
        assert g.tolist() == t.tolist()


@pytest.mark.parametrize("seed", range(12))
def test_random_dense_scores_with_ties(seed):
    rng = np.random.default_rng(seed)
    n, L, k = 25, 11, 5
    Y = random_labels(rng, n, L)
    # Few distinct values -> many ties, some across the top-k cut; plus +-inf.
    S = rng.integers(0, 4, (n, L)).astype(np.float64)
    S[rng.random((n, L)) < 0.05] = -np.inf
    S[rng.random((n, L)) < 0.02] = np.inf
    if seed % 2:
        S = S.astype(np.float32)
    w = rng.random(L) * 5
    ranked = ref_rank_dense(S, k)
    assert m._topk(S, n, L, k).tolist() == ranked
    check_against_reference(Y, S, ranked, k, w)


@pytest.mark.parametrize("path", ["padded", "sorted"])
@pytest.mark.parametrize("seed", range(12))
def test_random_sparse_scores_with_ties(seed, path, monkeypatch):
    if path == "sorted":
        monkeypatch.setattr(m, "_PAD_MAX_RATIO", -1)  # never pad: one global sort
    rng = np.random.default_rng(100 + seed)
    n, L, k = 25, 11, 5
    Y = random_labels(rng, n, L)
    mask = rng.random((n, L)) < rng.uniform(0.1, 0.6)
    if seed % 3 == 0:
        mask[0] = True  # one full row among short ones: the global-sort path
    r, c = np.nonzero(mask)
    vals = rng.integers(-2, 3, r.size).astype(np.float64)  # stored zeros and negatives too
    vals[rng.random(r.size) < 0.1] = -np.inf  # stored -inf is still a candidate
    P = sp.csr_matrix((vals, (r, c)), shape=(n, L))
    if seed % 4 == 1:
        # Non-canonical input: every row's entries reversed, and row r[0] given a
        # duplicate of its first entry (scipy semantics: duplicates are summed).
        P = non_canonical(P, r[0])
    w = rng.random(L) * 5
    ranked = ref_rank_sparse(P, k)
    assert m._topk(P, n, L, k).tolist() == ranked
    check_against_reference(Y, P, ranked, k, w)


@pytest.mark.parametrize("seed", range(12))
def test_random_top_k_arrays_with_missing_predictions(seed):
    rng = np.random.default_rng(200 + seed)
    n, L, k = 25, 13, 5
    Y = random_labels(rng, n, L)
    top = np.stack([rng.permutation(L)[:7] for _ in range(n)])
    top[rng.random(top.shape) < 0.2] = -1
    w = rng.random(L) * 5
    ranked = top[:, :k].tolist()
    check_against_reference(Y, top, ranked, k, w)


def test_sparse_paths_agree():
    # The padded-partition path (rows of similar length) and the global-sort path
    # (very uneven rows) must rank identically.
    rng = np.random.default_rng(7)
    n, L, k = 40, 30, 6
    r, c = np.nonzero(rng.random((n, L)) < 0.3)
    P = sp.csr_matrix((rng.integers(0, 3, r.size).astype(float), (r, c)), shape=(n, L))
    padded = m._topk(P, n, L, k)
    # Append one row storing 2000 extra columns: n * width now far exceeds 4 * nnz.
    W = L + 2000
    long_row = sp.csr_matrix((np.ones(W), (np.zeros(W, int), np.arange(W))), shape=(1, W))
    both = sp.vstack([sp.hstack([P, sp.csr_matrix((n, 2000))]), long_row]).tocsr()
    assert (n + 1) * W > m._PAD_MAX_RATIO * both.nnz + n + 1
    assert m._topk(both, n + 1, W, k)[:n].tolist() == padded.tolist() == ref_rank_sparse(P, k)


def test_dense_row_blocks(monkeypatch):
    # Several row blocks must give the same ranking as one block.
    rng = np.random.default_rng(3)
    S = rng.integers(0, 3, (17, 9)).astype(np.float64)
    monkeypatch.setattr(m, "_DENSE_BLOCK", 2 * 9)
    assert m._topk(S, 17, 9, 4).tolist() == ref_rank_dense(S, 4)


def test_k_larger_than_labels_pads_dense():
    S = np.array([[0.2, 0.8]])
    assert m._topk(S, 1, 2, 4).tolist() == [[1, 0, -1, -1]]


def test_ideal_prediction_scores_one():
    # Predicting each point's true labels by decreasing inverse propensity is optimal:
    # PSP@k = PSnDCG@k = 1, and nDCG@k = 1 when every point has a label.
    rng = np.random.default_rng(11)
    n, L, k = 30, 20, 5
    dense = rng.random((n, L)) < 0.2
    dense[:, 0] = True
    Y = sp.csr_matrix(dense.astype(np.float32))
    w = m.inverse_propensity(Y)
    top = np.full((n, k), -1)
    for i in range(n):
        labels = sorted(np.flatnonzero(dense[i]).tolist(), key=lambda j: (-w[j], j))[:k]
        top[i, : len(labels)] = labels
    np.testing.assert_allclose(m.psprecision_at_k(Y, top, w, k), 1.0, atol=1e-12)
    np.testing.assert_allclose(m.psndcg_at_k(Y, top, w, k), 1.0, atol=1e-12)
    np.testing.assert_allclose(m.ndcg_at_k(Y, top, k), 1.0, atol=1e-12)


# ----------------------------------------------------------------------------
# Input validation
# ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pred, match",
    [
        (np.zeros((3, 5)), r"\(3, 6\).*\(3, 5\)"),  # dense scores, wrong L
        (sp.csr_matrix((2, 6)), r"\(3, 6\).*\(2, 6\)"),  # sparse scores, wrong n
        (np.array([[0, 1], [1, 2], [2, 3]]), r"k' >= k = 3.*\(3, 2\)"),  # too few columns
        (np.array([[0, 1, 6], [1, 2, 3], [2, 3, 4]]), r"pred\[0, 2\] = 6"),  # out of range
        (np.array([[0, 1, -2], [1, 2, 3], [2, 3, 4]]), r"pred\[0, 2\] = -2"),
        (np.array([[0, 1, 2], [1, 2, 1], [2, 3, 4]]), "row 1.*repeats label 1"),
        (np.array([[np.nan] * 6] * 3), r"NaN at \[0, 0\]"),
        (np.array([["a"] * 6] * 3), "dtype"),
        ([[0, 1, 2]] * 3, "list"),
    ],
)
def test_bad_predictions_raise(pred, match):
    with pytest.raises(ValueError, match=match):
        m.precision_at_k(Y_HAND, pred, 3)


def test_missing_predictions_may_repeat():
    assert m.precision_at_k(Y_HAND, np.array([[-1, -1, 2]] * 3), 3).tolist()[0] == 0.0


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="k"):
        m.precision_at_k(Y_HAND, TOP_HAND, 0)
    with pytest.raises(ValueError, match="scipy sparse"):
        m.precision_at_k(Y_HAND.toarray(), TOP_HAND, 3)
    with pytest.raises(ValueError, match=r"\(6,\).*\(5,\)"):
        m.psprecision_at_k(Y_HAND, TOP_HAND, np.ones(5), 3)
    with pytest.raises(ValueError, match=r"inv_prop\[2\]"):
        m.psndcg_at_k(Y_HAND, TOP_HAND, np.array([1, 1, -1.0, 1, 1, 1]), 3)
    with pytest.raises(ValueError, match="no points"):
        m.ndcg_at_k(sp.csr_matrix((0, 6)), np.zeros((0, 3), int), 3)
