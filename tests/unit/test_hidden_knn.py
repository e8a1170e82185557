"""The hidden neighbours' votes (dslide.infer.hidden_knn) against numpy, their choice on the
validation split (dslide.train.validation.choose_hidden), and the stage in training,
prediction and the run directory."""

import numpy as np
import pytest
import scipy.sparse as sp

from dslide.infer import hidden_knn as HK
from dslide.train import validation as V


def _labels(rng, n, L, per=3):
    rows = [np.sort(rng.choice(L, rng.integers(0, per + 1), replace=False)) for _ in range(n)]
    ptr = np.r_[0, np.cumsum([len(r) for r in rows])]
    idx = np.concatenate(rows) if ptr[-1] else np.empty(0, np.int64)
    return sp.csr_matrix((np.ones(ptr[-1], np.float32), idx, ptr), shape=(n, L))


def _reference(b_ids, b_p, nn_ids, nn_sims, Y, power, weight, k, L):
    """Per query the dense score (1 - weight) b + weight v over every label, its top k by
    (score desc, label asc) among the labels that got a contribution."""
    Yd = Y.toarray()
    out_ids, out_s = [], []
    for q in range(b_ids.shape[0]):
        score = np.zeros(L)
        held = np.zeros(L, bool)
        for j, p in zip(b_ids[q], b_p[q]):
            if j >= 0:
                score[j] += (1 - weight) * p
                held[j] = True
        w = np.array([max(s, 0) ** power if i >= 0 and s > 0 else 0.0 for i, s in zip(nn_ids[q], nn_sims[q])])
        if w.sum() > 0:
            for i, wi in zip(nn_ids[q], w / w.sum()):
                if wi > 0:
                    score[Yd[i] > 0] += weight * wi
                    held[Yd[i] > 0] = True
        labs = np.flatnonzero(held)
        order = np.lexsort((labs, -score[labs]))[:k]
        ids = np.full(k, -1)
        s = np.full(k, -np.inf)
        ids[:len(order)], s[:len(order)] = labs[order], score[labs[order]]
        out_ids.append(ids)
        out_s.append(s)
    return np.array(out_ids), np.array(out_s)


@pytest.mark.parametrize("power,weight", [(4.0, 0.1), (16.0, 0.3), (1.0, 0.0), (4.0, 1.0)])
def test_fuse_is_the_dense_numpy_mix_and_its_top_k(power, weight):
    rng = np.random.default_rng(3)
    n, N, L, K, kn, k = 40, 30, 25, 8, 6, 5
    Y = _labels(rng, N, L)
    b_ids = np.array([rng.choice(L, K, replace=False) for _ in range(n)])
    b_ids[::7, -3:] = -1  # fewer candidates than K
    b_p = np.round(rng.random((n, K)), 1) / 4  # ties between labels
    b_p[b_ids < 0] = 0.0
    nn_ids = np.array([rng.choice(N, kn, replace=False) for _ in range(n)])
    nn_sims = np.round(rng.uniform(-0.2, 1.0, (n, kn)), 2)
    nn_ids[::5, -2:] = -1
    store = HK.HiddenNeighbours.build(rng.random((N, 4)), Y)
    got_ids, got_s = store.fuse(b_ids, b_p, nn_ids, nn_sims, power, weight, k)
    want_ids, want_s = _reference(b_ids, b_p, nn_ids, nn_sims, Y, power, weight, k, L)
    np.testing.assert_allclose(got_s, want_s, rtol=1e-12)
    # the order of equal scores: the lower label (where the sums are equal bit for bit)
    same = np.isclose(got_s, want_s, rtol=0, atol=0)
    assert (got_ids[same] == want_ids[same]).all()
    assert (got_ids == want_ids).mean() > 0.97
    if weight == 0.0:  # the base alone, its order
        np.testing.assert_array_equal(got_s, want_s)


def test_grid_hits_are_fuses_top_k_looked_up_in_the_truth():
    rng = np.random.default_rng(5)
    n, N, L, K, kn, k = 60, 40, 20, 10, 8, 5
    Y = _labels(rng, N, L)
    truth = _labels(rng, n, L, per=4)
    b_ids = np.array([rng.choice(L, K, replace=False) for _ in range(n)])
    b_p = rng.dirichlet(np.ones(K), n)
    nn_ids = np.array([rng.choice(N, kn, replace=False) for _ in range(n)])
    nn_sims = rng.uniform(0, 1, (n, kn))
    store = HK.HiddenNeighbours.build(rng.random((N, 3)), Y)
    weights = [0.0, 0.05, 0.3, 0.9]
    hits = store.grid_hits(b_ids, b_p, nn_ids, nn_sims, 4.0, weights, truth, k)
    T = truth.toarray() > 0
    for g, w in enumerate(weights):
        ids, _ = store.fuse(b_ids, b_p, nn_ids, nn_sims, 4.0, w, k)
        want = np.array([[j >= 0 and T[q, j] for j in ids[q]] for q in range(n)], np.uint8)
        np.testing.assert_array_equal(hits[g], want)
    assert hits[0].sum() != hits[3].sum()  # the weights change the predictions


def test_search_is_numpys_cosine_ranking_with_ties_to_the_lower_point(monkeypatch):
    monkeypatch.setattr(HK, "QUERY_BLOCK", 3)  # several query blocks
    rng = np.random.default_rng(1)
    H = rng.standard_normal((50, 6)).astype(np.float32)
    H[10] = H[3] * 2.0  # the same direction: a tie, the lower id first
    H[20] = 0.0  # a point with no direction scores 0
    store = HK.HiddenNeighbours.build(H, _labels(rng, 50, 9))
    Q = np.vstack([rng.standard_normal((7, 6)), H[3:4] * 0.5]).astype(np.float32)
    ids, sims = store.search(Q, 4)
    U = H / np.maximum(np.linalg.norm(H, axis=1, keepdims=True), 1e-30)
    Qu = Q / np.linalg.norm(Q, axis=1, keepdims=True)
    S = Qu @ U.T
    for q in range(Q.shape[0]):
        order = np.lexsort((np.arange(50), -np.round(S[q], 5)))[:4]
        np.testing.assert_array_equal(ids[q], order)
        np.testing.assert_allclose(sims[q], S[q][order], atol=1e-5)
    assert list(ids[-1][:2]) == [3, 10]
    with pytest.raises(ValueError, match="5 hidden units but the hidden neighbours hold 6"):
        store.search(Q[:, :5], 2)


def _choice_data(rng, helpful: bool):
    """Validation points whose base ranks one wrong label first; their nearest stored points
    hold their true label (helpful) or labels drawn independently of it."""
    n, N, L = 300, 2000, 40  # 50 stored points a label
    truth_lab = rng.integers(0, L, n)
    truth = sp.csr_matrix((np.ones(n, np.float32), (np.arange(n), truth_lab)), shape=(n, L))
    b_ids = np.stack([(truth_lab + 1) % L, truth_lab, (truth_lab + 2) % L, (truth_lab + 3) % L,
                      (truth_lab + 4) % L], axis=1).astype(np.int64)
    b_p = np.tile([0.5, 0.3, 0.1, 0.06, 0.04], (n, 1))
    store_lab = rng.integers(0, L, N)
    Y = sp.csr_matrix((np.ones(N, np.float32), (np.arange(N), store_lab)), shape=(N, L))
    store = HK.HiddenNeighbours.build(rng.random((N, 3)), Y)
    nn_ids = np.empty((n, 25), np.int64)
    for q in range(n):
        pool = np.flatnonzero(store_lab == truth_lab[q]) if helpful else np.arange(N)
        pool = pool if pool.size >= 25 else np.r_[pool, np.setdiff1d(np.arange(N), pool)]
        nn_ids[q] = rng.permutation(pool[:25]) if helpful else rng.choice(N, 25, replace=False)
    nn_sims = np.sort(rng.uniform(0.5, 1.0, (n, 25)), axis=1)[:, ::-1]
    return store, truth, b_ids, b_p, nn_ids, nn_sims


def test_the_choice_keeps_the_base_where_the_neighbours_labels_are_independent_of_the_truth():
    store, truth, b_ids, b_p, nn_ids, nn_sims = _choice_data(np.random.default_rng(0), helpful=False)
    (c, a, w), figures = V.choose_hidden(store, truth, b_ids, b_p, nn_ids, nn_sims, counts=V.HIDDEN_COUNTS,
                                         powers=V.HIDDEN_POWERS, weights=V.HIDDEN_WEIGHTS)
    assert (c, a, w) == (0, 0.0, 0.0)
    assert figures[(0, 0.0, 0.0)] == (0.0, pytest.approx(1 / 5))  # the base: the truth second of three
    assert len(figures) == 1 + 2 * 2 * 5
    assert max(sum(v) for v in figures.values()) <= sum(figures[(0, 0.0, 0.0)]) + V.CHOICE_MARGIN


def test_the_choice_takes_the_votes_where_the_neighbours_hold_the_truth():
    store, truth, b_ids, b_p, nn_ids, nn_sims = _choice_data(np.random.default_rng(0), helpful=True)
    (c, a, w), figures = V.choose_hidden(store, truth, b_ids, b_p, nn_ids, nn_sims, counts=V.HIDDEN_COUNTS,
                                         powers=V.HIDDEN_POWERS, weights=V.HIDDEN_WEIGHTS)
    assert w > 0 and figures[(c, a, w)][0] == 1.0  # every point's label first
    # a weight below the base's margin (0.5 - 0.3 = 0.2 of (1 - w) against w) leaves the order
    assert figures[(10, 4.0, 0.03)][0] == 0.0
    assert w >= 0.2


def _fit_small(**over):
    from dslide import train as T
    from dslide.comm import Comm
    from dslide.config import NARROW_OUTPUT, Config
    from dslide.io.data import XMCData

    rng = np.random.default_rng(8)
    n, L = 2400, NARROW_OUTPUT + 1
    X = sp.random(n, 40, density=0.12, format="csr", random_state=rng, dtype=np.float32)
    labels = np.where(rng.random(n) < 0.5, rng.integers(0, 5, n), rng.integers(0, 800, n))
    Y = sp.csr_matrix((np.ones(n, np.float32), (np.arange(n), labels)), shape=(n, L))
    cfg = Config(**{"hidden": (4,), "batch_size": 200, "seed": 2, "epochs": 2.0, "early_stop": True, "exact": True,
                    **over})
    model, _ = T.fit(XMCData(X[:2000], Y[:2000]), cfg, comm=Comm(), index=False)
    return model, X[2000:], Y[2000:]


def test_training_records_the_choice_and_prediction_adds_the_votes_as_numpy_would():
    """Training scores the grid on the validation split (recorded, the no-op among it); with
    a chosen store prediction mixes the fused scores with the votes of the query's nearest
    stored points, as the kernels' numpy reference does."""
    from dslide.infer.predict import predict_topk_scores
    from dslide.train.infer_build import hidden_vectors

    model, Xt, _ = _fit_small()
    rec = model.index_info["hidden_choice"]
    assert rec["validation_points"] == 500  # of the 2,000 points fit sees
    assert "hidden_knn 0 power 0 weight 0" in rec["p@1/p@5"] and len(rec["p@1/p@5"]) == 21
    # force a store with a large weight (whatever was chosen)
    model.hidden_neighbours = None
    base_ids, base_s = predict_topk_scores(model, Xt, max(5, model.config.knn_candidates))
    from dslide.train.infer_build import build_hidden_neighbours

    model.config = model.config.replace(hidden_knn=7, hidden_knn_power=2.0, hidden_knn_weight=0.5)
    from dslide.io.data import XMCData

    train = XMCData(*_fit_data())
    build_hidden_neighbours(model, train)
    store = model.hidden_neighbours
    assert store.n_points == 2000 and (store.k, store.power, store.weight) == (7, 2.0, 0.5)
    H = hidden_vectors(model, Xt)
    U = store.arrays["H"]
    Hu = H / np.maximum(np.linalg.norm(H, axis=1, keepdims=True), 1e-30)
    S = Hu @ U.T
    nn = np.argsort(-S, axis=1, kind="stable")[:, :7]
    sims = np.take_along_axis(S, nn, axis=1)
    base_p = base_s if model.neighbours is not None else HK.softmax_rows(base_ids, base_s)
    want_ids, want_s = _reference(base_ids, base_p, nn, sims, sp.csr_matrix(train.Y), 2.0, 0.5, 5,
                                  model.n_labels)
    ids, s = predict_topk_scores(model, Xt, 5)
    np.testing.assert_allclose(s, want_s, rtol=1e-5)
    assert (ids == want_ids).mean() > 0.95
    assert not np.array_equal(ids, base_ids[:, :5])  # the votes count
    # --lsh: the points of each query's nearest cells of the store (approx_hidden_probes)
    model.config = model.config.replace(approx_hidden_probes=1)
    model.hidden_neighbours = None
    lb_ids, lb_s = predict_topk_scores(model, Xt, max(5, model.config.knn_candidates), exact=False)
    model.hidden_neighbours = store
    nn1, sims1 = store.search(H, 7, probes=1)
    assert (nn1 != nn).any()  # one cell of 45 misses some exact neighbours
    lb_p = lb_s if model.neighbours is not None else HK.softmax_rows(lb_ids, lb_s)
    want_ids, want_s = _reference(lb_ids, lb_p, nn1, sims1, sp.csr_matrix(train.Y), 2.0, 0.5, 5, model.n_labels)
    ids, s = predict_topk_scores(model, Xt, 5, exact=False)
    np.testing.assert_allclose(s, want_s, rtol=1e-5)
    assert (ids == want_ids).mean() > 0.95
    # unfused: the network alone, no stage
    raw, _ = predict_topk_scores(model, Xt, 5, fused=False)
    model.config = model.config.replace(hidden_knn=0)
    off, _ = predict_topk_scores(model, Xt, 5, fused=False)
    np.testing.assert_array_equal(raw, off)


def _fit_data():
    from dslide.config import NARROW_OUTPUT

    rng = np.random.default_rng(8)
    n, L = 2400, NARROW_OUTPUT + 1
    X = sp.random(n, 40, density=0.12, format="csr", random_state=rng, dtype=np.float32)
    labels = np.where(rng.random(n) < 0.5, rng.integers(0, 5, n), rng.integers(0, 800, n))
    Y = sp.csr_matrix((np.ones(n, np.float32), (np.arange(n), labels)), shape=(n, L))
    return X[:2000], Y[:2000]


def test_no_split_no_hidden_layer_or_zero_keeps_no_store():
    model, _, _ = _fit_small(early_stop=False, knn=0)
    assert model.hidden_neighbours is None
    assert model.index_info["hidden_choice"]["why"] == "no validation split to check it on"
    model, _, _ = _fit_small(hidden_knn=0)
    assert model.hidden_neighbours is None and "hidden_choice" not in model.index_info
    model, _, _ = _fit_small(hidden_knn=5, hidden_knn_power=4.0, hidden_knn_weight=0.0)
    assert model.hidden_neighbours is None and "hidden_choice" not in model.index_info
    model, _, _ = _fit_small(hidden_knn=5, hidden_knn_power=4.0, hidden_knn_weight=0.2)  # given: kept, no choice
    assert model.hidden_neighbours.k == 5 and model.hidden_neighbours.n_points == 2000
    assert "hidden_choice" not in model.index_info


def test_the_store_survives_the_run_directory_and_a_crafted_one_is_refused(tmp_path):
    from dslide.comm import Comm
    from dslide.infer.parts import sections
    from dslide.infer.predict import predict_topk_scores
    from dslide.io import checkpoint as ck
    from dslide.io.data import XMCData
    from dslide.session import load_model
    from dslide.train.infer_build import build_hidden_neighbours

    model, Xt, _ = _fit_small()
    model.config = model.config.replace(hidden_knn=5, hidden_knn_power=4.0, hidden_knn_weight=0.3)
    build_hidden_neighbours(model, XMCData(*_fit_data()))
    path = ck.save(model.network, tmp_path / "run", Comm(), weights_only=True, sections=sections(model))
    assert "hidden_knn/H" in set(ck.read_manifest(path)["ranks"][0]["arrays"])
    back = load_model(str(tmp_path / "run"), Comm())
    for name, a in model.hidden_neighbours.state_arrays().items():
        np.testing.assert_array_equal(back.hidden_neighbours.state_arrays()[name], a, err_msg=name)
    np.testing.assert_array_equal(predict_topk_scores(back, Xt, 5)[0], predict_topk_scores(model, Xt, 5)[0])
    # a crafted store: a NaN in H, a label id past the labels
    from dslide.infer.parts import HiddenSection

    good = model.hidden_neighbours.state_arrays()
    for name, change, message in (("H", lambda a: np.where(np.arange(a.size).reshape(a.shape) == 3, np.nan, a),
                                   "hidden_knn.H"),
                                  ("y_idx", lambda a: a + model.n_labels, "hidden_knn.y_idx"),
                                  ("H", lambda a: a[:, :3], "expected float \\[n, 4\\]"),
                                  ("weight", lambda a: a + 2.0, "hidden_knn.weight")):
        bad = dict(good)
        bad[name] = change(good[name])
        with pytest.raises(ValueError, match=message):
            HiddenSection(model).load_state(bad)


def test_the_cell_search_finds_the_exact_neighbours_of_the_cells_it_reads(monkeypatch):
    """--lsh's search: every cell probed gives the exact search's ids and cosines; fewer cells
    give the exact top k among the points of the query's nearest cells (numpy over those
    points), and on clustered points nearly every exact neighbour."""
    monkeypatch.setattr(HK, "QUERY_BLOCK", 16)
    rng = np.random.default_rng(4)
    centres = rng.standard_normal((30, 8))
    H = (centres[rng.integers(0, 30, 900)] + 0.6 * rng.standard_normal((900, 8))).astype(np.float32)
    store = HK.HiddenNeighbours.build(H, _labels(rng, 900, 7))
    C, ptr, pts, Hc = store.cells()
    np.testing.assert_array_equal(Hc, store.arrays["H"][pts])
    assert C.shape == (30, 8) and ptr[-1] == 900 and np.array_equal(np.sort(pts), np.arange(900))
    Q = (centres[rng.integers(0, 30, 50)] + 0.6 * rng.standard_normal((50, 8))).astype(np.float32)
    ids, sims = store.search(Q, 10)
    all_ids, all_sims = store.search(Q, 10, probes=30)
    np.testing.assert_array_equal(all_ids, ids)
    np.testing.assert_allclose(all_sims, sims, atol=1e-5)
    few_ids, few_sims = store.search(Q, 10, probes=3)
    U = store.arrays["H"]
    Qu = HK.unit_rows(Q)
    d = (Qu ** 2).sum(axis=1)[:, None] - 2 * Qu @ C.T + (C ** 2).sum(axis=1)[None, :]
    near = np.argsort(d, axis=1, kind="stable")[:, :3]
    cell_of = np.empty(900, np.int64)
    for j in range(30):
        cell_of[pts[ptr[j]:ptr[j + 1]]] = j
    for q in range(50):
        pool = np.flatnonzero(np.isin(cell_of, near[q]))
        s = Qu[q] @ U[pool].T
        want = pool[np.lexsort((pool, -np.round(s, 5)))[:10]]
        np.testing.assert_array_equal(np.sort(few_ids[q]), np.sort(want))
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(few_ids, ids)])
    assert 0.8 <= recall < 1.0, recall  # the cells left out held some exact neighbours


def test_a_store_above_the_byte_cap_is_not_chosen_nor_counted(monkeypatch):
    """Left to the split, no store past rules.HIDDEN_STORE_MAX_BYTES is built or counted in the
    memory account (every training point's hidden vector on every rank); given, it is kept."""
    from dslide import memory
    from dslide.config import Config
    from dslide.io.data import XMCData
    from dslide.config import rules
    from dslide.train import infer_build

    model, _, _ = _fit_small()
    cap = rules.HIDDEN_STORE_MAX_BYTES
    monkeypatch.setattr(rules, "HIDDEN_STORE_MAX_BYTES", 4 * 2000 * 4 - 1)  # one byte short
    infer_build.build_hidden_neighbours(model, XMCData(*_fit_data()), val=XMCData(*_fit_data()), base=(None, None))
    assert model.hidden_neighbours is None
    assert "0.0 GiB a rank, above rules.HIDDEN_STORE_MAX_BYTES" in model.index_info["hidden_choice"]["why"]
    model.config = model.config.replace(hidden_knn=3, hidden_knn_power=4.0, hidden_knn_weight=0.1)
    infer_build.build_hidden_neighbours(model, XMCData(*_fit_data()))
    assert model.hidden_neighbours is not None and model.hidden_neighbours.n_points == 2000
    monkeypatch.setattr(rules, "HIDDEN_STORE_MAX_BYTES", cap)
    X, Y = _fit_data()
    data = memory.data_shape(X, Y)
    plain = memory.account(Config(hidden=(16,), hidden_knn=0), 40, 5000, data=data)["neighbours"]
    left = memory.account(Config(hidden=(16,)), 40, 5000, data=data)["neighbours"]
    assert left - plain == memory.hidden_bytes(2000, 16, Y.nnz)
    monkeypatch.setattr(rules, "HIDDEN_STORE_MAX_BYTES", 4 * 2000 * 16 - 1)
    assert memory.account(Config(hidden=(16,)), 40, 5000, data=data)["neighbours"] == plain
    given = memory.account(Config(hidden=(16,), hidden_knn=5), 40, 5000, data=data)["neighbours"]
    assert given - plain == memory.hidden_bytes(2000, 16, Y.nnz)


def test_unit_rows_divides_in_float64_a_block_at_a_time_and_in_place_when_asked(monkeypatch):
    from dslide.lsh import neighbors

    monkeypatch.setattr(neighbors, "UNIT_BLOCK", 7)
    rng = np.random.default_rng(2)
    H = rng.standard_normal((40, 5)).astype(np.float32)
    H[3] = 0.0
    want = (H / np.maximum(np.linalg.norm(H.astype(np.float64), axis=1), 1e-30)[:, None]).astype(np.float32)
    got = HK.unit_rows(H)
    np.testing.assert_array_equal(got, want)
    assert got is not H and not np.shares_memory(got, H)
    mine = H.copy()
    store = HK.HiddenNeighbours.build(mine, sp.csr_matrix((40, 3), dtype=np.float32), inplace=True)
    assert np.shares_memory(store.arrays["H"], mine)
    np.testing.assert_array_equal(mine, want)
    np.testing.assert_array_equal(HK.unit_rows(H.astype(np.float64), inplace=True), want)  # a copy: not float32
