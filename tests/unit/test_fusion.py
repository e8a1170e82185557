"""Neighbour-label fusion (dslide.infer.fusion) against plain numpy references."""

import numpy as np
import pytest
import scipy.sparse as sp

from dslide.comm import Comm
from dslide.infer import fusion, lists
from dslide.infer.predict import predict_topk, predict_topk_scores


def _data(seed=0, n=300, f=60, L=40, density=0.08):
    rng = np.random.default_rng(seed)
    X = sp.random(n, f, density=density, format="csr", random_state=rng, dtype=np.float32)
    X.data = np.round(X.data * 4 + 1, 0).astype(np.float32)  # small integers: many exact ties
    Y = sp.random(n, L, density=0.06, format="csr", random_state=rng)
    Y.data[:] = 1.0
    return X, Y.astype(np.float32)


def _reference_neighbours(Xq, Xt, k):
    def unit(A):
        A = A.toarray().astype(np.float64)
        nrm = np.linalg.norm(A, axis=1, keepdims=True)
        return np.divide(A, nrm, out=np.zeros_like(A), where=nrm > 0)

    S = unit(Xq) @ unit(Xt).T
    ids = np.full((S.shape[0], k), -1)
    sims = np.full((S.shape[0], k), -np.inf)
    for q in range(S.shape[0]):
        cand = np.nonzero((unit(Xq)[q] != 0) @ (unit(Xt) != 0).T)[0]  # points sharing a feature
        order = sorted(cand, key=lambda p: (-S[q, p], p))[:k]
        ids[q, :len(order)] = order
        sims[q, :len(order)] = S[q, order]
    return ids, sims


def test_l2_rows_matches_numpy_and_survives_float32_max():
    X, _ = _data()
    X[3, 5] = np.float32(3e38)  # its square overflows float32
    X[3, 7] = np.float32(3e38)
    N = fusion.l2_rows(X).toarray()
    A = X.toarray().astype(np.float64)
    nrm = np.linalg.norm(A, axis=1, keepdims=True)
    np.testing.assert_allclose(N, np.divide(A, nrm, out=np.zeros_like(A), where=nrm > 0), rtol=1e-6, atol=1e-7)
    assert N[3, 5] == pytest.approx(np.sqrt(0.5), rel=1e-6)


@pytest.mark.parametrize("k", [1, 5, 12])
def test_search_matches_brute_force(k):
    X, Y = _data()
    Xq, _ = _data(seed=1, n=50)
    store = fusion.NeighbourLabels.build(X, Y)
    ids, sims = store.neighbours(Xq, k)
    ref_ids, ref_sims = _reference_neighbours(Xq, X, k)
    np.testing.assert_allclose(sims, ref_sims, rtol=1e-5, atol=1e-6)
    # ids agree wherever the similarity is not tied with the next one within float32 rounding
    clear = np.abs(np.diff(np.concatenate([ref_sims, np.full((len(ref_sims), 1), -np.inf)], 1), axis=1)) > 1e-5
    clear &= np.concatenate([np.ones((len(ref_sims), 1), bool), clear[:, :-1]], 1)
    assert (ids[clear] == ref_ids[clear]).mean() == 1.0
    assert clear.mean() > 0.5


def _common_features(seed, n, f=80, common=4):
    """Rows whose first `common` features are in most points at small values (a frequent
    word's low weight) and the others sparse: the case search_bounded bounds."""
    rng = np.random.default_rng(seed)
    X = sp.random(n, f, density=0.05, format="lil", random_state=rng, dtype=np.float32)
    for j in range(common):
        held = rng.random(n) < 0.9 - 0.2 * j
        X[np.flatnonzero(held), j] = np.round(rng.random(held.sum()) * 3 + 1).astype(np.float32) * 0.2
    return sp.csr_matrix(X, dtype=np.float32)


@pytest.mark.parametrize("k", [1, 5, 20])
def test_the_bounded_search_is_the_plain_search_bit_for_bit(k):
    """search_bounded against search on the same lists: every id and float32 sum, with common
    features settled by the bounds, queries of common features alone, a negative query value,
    queries sharing fewer than k points, and ids mapped through perm."""
    X = _common_features(0, 2000)
    raw = sp.lil_matrix(_common_features(1, 300))
    raw[7, 0] = -0.5  # a negative value: its query reads every list
    raw[8, :] = 0.0  # an empty query
    raw[9, :] = 0.0
    raw[9, 1], raw[9, 2] = 1.0, 2.0  # common features alone
    raw[10, :] = 0.0
    raw[10, 79] = 1.0  # one rare feature: fewer than k points, perhaps
    raw = sp.csr_matrix(raw)
    Q = fusion.l2_rows(raw)
    store = fusion.NeighbourLabels.build(X, sp.csr_matrix((2000, 3), dtype=np.float32))
    a = store.arrays
    rows = store.rows()
    top = store._bounded()[3]
    q = (Q.indptr.astype(np.int64), Q.indices.astype(np.int32), Q.data)
    lists = (a["post_ptr"], a["post_pt"], a["post_val"])
    perm = np.random.default_rng(2).permutation(2000).astype(np.int32)

    def plain(mapping):
        out = (np.full((300, k), -1, np.int32), np.full((300, k), -np.inf, np.float32))
        fusion.search(*q, *lists, 2000, k, 3, mapping, *out)
        return out

    def bounded(mapping, common, top_val=top):
        out = (np.full((300, k), -1, np.int32), np.full((300, k), -np.inf, np.float32))
        fusion.search_bounded(*q, *lists, *rows, top_val, common, 2000, k, 3, mapping, *out)
        return out

    for mapping in (fusion._NO_PERM, perm):
        want = plain(mapping)
        for common in (200, 1000):
            got = bounded(mapping, common)
            np.testing.assert_array_equal(got[0], want[0])
            np.testing.assert_array_equal(got[1], want[1])
    # the bounds are in use: understated (every common list's largest value 0), points that
    # rank by their common features are left out
    wrong = bounded(fusion._NO_PERM, 200, np.zeros_like(top))
    assert not np.array_equal(wrong[1], plain(fusion._NO_PERM)[1])
    # the store's own search takes the bounded kernel (lists of 1,000 to 1,800 points are common)
    assert fusion.bound_list(2000) == 1024 and store._bounded() is not None
    ids, sims = store.neighbours(raw, k)
    want = plain(fusion._NO_PERM)
    np.testing.assert_array_equal(ids, want[0])
    np.testing.assert_array_equal(sims, want[1])


def test_a_store_with_a_negative_value_searches_plainly():
    X = _common_features(0, 1500)
    X[3, 5] = -1.0
    store = fusion.NeighbourLabels.build(X, sp.csr_matrix((1500, 3), dtype=np.float32))
    assert store._bounded() is None  # the bounds need non-negative values
    Q = _common_features(1, 40)
    ref_ids, ref_sims = _reference_neighbours(Q, X, 5)
    ids, sims = store.neighbours(Q, 5)
    np.testing.assert_allclose(sims, ref_sims, rtol=1e-5, atol=1e-6)


def test_search_is_the_same_at_any_thread_count():
    import numba

    X, Y = _data(n=500)
    Xq, _ = _data(seed=2, n=64)
    store = fusion.NeighbourLabels.build(X, Y)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        a = store.neighbours(Xq, 7)
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
        b = store.neighbours(Xq, 7)
    finally:
        numba.set_num_threads(before)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


def _reference_fuse(m_ids, m_logits, nn_ids, nn_sims, Y, weight, power, k, pr_ids=None, pr_sims=None, share=0.0,
                    pr_power=1.0):
    Y = Y.tocsr()
    out = []
    for q in range(len(m_ids)):
        score = {}
        ok = m_ids[q] >= 0
        z = m_logits[q][ok]
        p = np.exp(z - z.max()) / np.exp(z - z.max()).sum() if ok.any() else z
        for j, pj in zip(m_ids[q][ok], p):
            score[int(j)] = score.get(int(j), 0.0) + (1 - weight) * pj
        pw = np.zeros(0)
        if pr_ids is not None:
            pgood = (pr_ids[q] >= 0) & (pr_sims[q] > 0)
            pw = pr_sims[q][pgood].astype(np.float64) ** pr_power
        a = share if pw.sum() > 0 else 0.0  # a query without prototypes: the points take it all
        good = (nn_ids[q] >= 0) & (nn_sims[q] > 0)
        w = nn_sims[q][good].astype(np.float64) ** power
        for pt, wi in zip(nn_ids[q][good], w / w.sum() if w.sum() > 0 else w):
            for j in Y.indices[Y.indptr[pt]:Y.indptr[pt + 1]]:
                score[int(j)] = score.get(int(j), 0.0) + weight * (1 - a) * wi
        if a > 0:
            for j, wi in zip(pr_ids[q][pgood], pw / pw.sum()):
                score[int(j)] = score.get(int(j), 0.0) + weight * a * wi
        best = sorted(score.items(), key=lambda t: (-t[1], t[0]))[:k]
        out.append(best)
    return out


@pytest.mark.parametrize("weight,power,share", [(0.0, 1.0, 0.0), (0.7, 4.0, 0.0), (1.0, 1.0, 0.0), (0.6, 4.0, 0.5),
                                                (1.0, 2.0, 1.0)])
def test_fuse_matches_python_reference(weight, power, share):
    X, Y = _data()
    Xq, _ = _data(seed=3, n=40)
    Xq[7] = 0  # a query that shares no feature: no neighbours, no prototypes
    Xq = sp.csr_matrix(Xq)
    Xq.eliminate_zeros()
    store = fusion.NeighbourLabels.build(X, Y, prototypes=True)
    nn_ids, nn_sims = store.neighbours(Xq, 6)
    pr_ids, pr_sims = store.prototypes(Xq, 7)
    assert (pr_ids[7] == -1).all() and (pr_ids[:7] >= 0).any()
    rng = np.random.default_rng(4)
    K = 8
    m_ids = np.stack([rng.choice(Y.shape[1], K, replace=False) for _ in range(40)]).astype(np.int64)
    m_ids[0, 5:] = -1  # fewer candidates than K
    m_logits = rng.normal(size=(40, K))
    ids, scores = store.fuse(m_ids, m_logits, nn_ids, nn_sims, weight, power, 5, pr_ids, pr_sims, share, 16.0)
    ref = _reference_fuse(m_ids, m_logits, nn_ids, nn_sims, Y, weight, power, 5, pr_ids, pr_sims, share, 16.0)
    for q, best in enumerate(ref):
        np.testing.assert_allclose(scores[q, :len(best)], [s for _, s in best], rtol=1e-9)
        # the same labels up to the order of exactly tied scores
        assert sorted(ids[q, :len(best)].tolist()) == sorted(j for j, _ in best) or \
            np.allclose(sorted(scores[q, :len(best)]), sorted(s for _, s in best))
        assert (ids[q, len(best):] == -1).all()


def _reference_prototypes(X, Y):
    """Plain numpy: each label's normalised sum of its points' normalised rows, and |sum|."""
    A = X.toarray().astype(np.float64)
    A = np.divide(A, np.linalg.norm(A, axis=1, keepdims=True), out=np.zeros_like(A),
                  where=np.linalg.norm(A, axis=1, keepdims=True) > 0)
    S = Y.toarray().astype(np.float64).T @ A
    nrm = np.linalg.norm(S, axis=1)
    return np.divide(S, nrm[:, None], out=np.zeros_like(S), where=nrm[:, None] > 0), nrm


def test_label_prototypes_match_numpy_whatever_the_thread_count():
    import numba

    X, Y = _data()
    Y = sp.lil_matrix(Y)
    Y[:, 11] = 0  # a label no point has: no prototype
    Y = sp.csr_matrix(Y)
    Y.eliminate_zeros()
    C, nrm = _reference_prototypes(X, Y)
    before = numba.get_num_threads()
    got = []
    for threads in (1, 2):
        numba.set_num_threads(threads)
        try:
            got.append(fusion.NeighbourLabels.build(X, Y, prototypes=True).arrays)
        finally:
            numba.set_num_threads(before)
    a = got[0]
    # pr_lab holds the labels renumbered by falling frequency; pr_perm maps them back
    counts = np.bincount(Y.indices, minlength=Y.shape[1])
    assert sorted(a["pr_perm"]) == list(range(Y.shape[1])) and np.all(np.diff(counts[a["pr_perm"]]) <= 0)
    labels = a["pr_perm"][a["pr_lab"]]
    dense = sp.csc_matrix((a["pr_val"], labels, a["pr_ptr"]), shape=(Y.shape[1], X.shape[1])).toarray()
    np.testing.assert_allclose(dense, C, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(a["pr_norm"], nrm, rtol=1e-6)
    assert a["pr_norm"][11] == 0 and 11 not in labels
    assert all(np.all(np.diff(a["pr_lab"][a["pr_ptr"][f]:a["pr_ptr"][f + 1]]) > 0) for f in range(X.shape[1]))
    for name in ("pr_ptr", "pr_lab", "pr_val", "pr_norm", "pr_perm"):
        np.testing.assert_array_equal(got[0][name], got[1][name])


def unrenumbered(store):
    """The same store with its prototypes' labels as they are, as stores were saved before the
    renumbering (pr_lab holding the labels, no pr_perm)."""
    a = dict(store.state_arrays())
    perm = a.pop("pr_perm")
    lab, ptr = perm[a["pr_lab"]], a["pr_ptr"]
    order = np.concatenate([ptr[f] + np.argsort(lab[ptr[f]:ptr[f + 1]], kind="stable")
                            for f in range(len(ptr) - 1)])
    a["pr_lab"], a["pr_val"] = lab[order].astype(np.int32), a["pr_val"][order]
    return fusion.NeighbourLabels.from_state(a)


def test_a_store_without_the_renumbering_searches_alike():
    """A store saved before the renumbering (pr_lab holding the labels, no pr_perm) finds
    the same prototypes: ids, similarities and their ties to the lower label."""
    X, Y = _data()
    Xq, _ = _data(seed=8, n=30)
    new = fusion.NeighbourLabels.build(X, Y, prototypes=True)
    old = unrenumbered(new)
    perm, a = new.arrays["pr_perm"], old.arrays
    assert "pr_perm" not in a and np.any(perm != np.arange(len(perm)))
    # the labels themselves, ascending per feature, each with its own value
    assert all(np.all(np.diff(a["pr_lab"][a["pr_ptr"][f]:a["pr_ptr"][f + 1]]) > 0) for f in range(X.shape[1]))
    C, _ = _reference_prototypes(X, Y)
    dense = sp.csc_matrix((a["pr_val"], a["pr_lab"], a["pr_ptr"]), shape=(Y.shape[1], X.shape[1])).toarray()
    np.testing.assert_allclose(dense, C, rtol=1e-6, atol=1e-7)
    for k in (3, 6):
        got, want = new.prototypes(Xq, k), old.prototypes(Xq, k)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])


def test_prototypes_search_is_the_numpy_cosine_ranking():
    X, Y = _data()
    Xq, _ = _data(seed=8, n=30)
    store = fusion.NeighbourLabels.build(X, Y, prototypes=True)
    C, _ = _reference_prototypes(X, Y)
    ids, sims = store.prototypes(Xq, 6)
    Q = Xq.toarray().astype(np.float64)
    Q /= np.maximum(np.linalg.norm(Q, axis=1, keepdims=True), 1e-300)
    S = Q @ C.T
    share = (Xq.toarray() != 0).astype(int) @ (C != 0).T.astype(int) > 0
    for q in range(len(Q)):
        order = sorted(np.nonzero(share[q])[0], key=lambda j: (-S[q, j], j))[:6]
        np.testing.assert_allclose(sims[q, :len(order)], S[q, order], rtol=1e-5, atol=1e-6)
        # the same labels up to exact float ties
        assert ids[q, :len(order)].tolist() == order or np.allclose(S[q, ids[q, :len(order)]], S[q, order], atol=1e-6)
    b = store.prototypes(Xq, 6, comm=Comm())
    np.testing.assert_array_equal(ids, b[0])
    with pytest.raises(ValueError, match="no label prototypes"):
        fusion.NeighbourLabels.build(X, Y).prototypes(Xq, 3)


def test_neighbours_shared_over_a_stand_in_comm_equal_one_process():
    X, Y = _data()
    Xq, _ = _data(seed=5, n=33)
    store = fusion.NeighbourLabels.build(X, Y)
    a = store.neighbours(Xq, 4)
    b = store.neighbours(Xq, 4, comm=Comm())
    np.testing.assert_array_equal(a[0], b[0])


def test_state_round_trip():
    X, Y = _data()
    store = fusion.NeighbourLabels.build(X, Y)
    again = fusion.NeighbourLabels.from_state(store.state_arrays())
    Xq, _ = _data(seed=6, n=20)
    np.testing.assert_array_equal(store.neighbours(Xq, 3)[0], again.neighbours(Xq, 3)[0])
    with pytest.raises(ValueError, match="y_idx"):
        fusion.NeighbourLabels({k: v for k, v in store.state_arrays().items() if k != "y_idx"}, 10)
    assert not again.has_prototypes
    store = fusion.NeighbourLabels.build(X, Y, prototypes=True)
    assert store.temperature is None and "temperature" not in store.state_arrays()  # none chosen: the setting's
    store.k, store.share, store.weight, store.temperature = 7, 0.25, 0.05, 2.0
    again = fusion.NeighbourLabels.from_state(store.state_arrays())
    assert (again.k, again.share, again.weight, again.temperature) == (7, 0.25, 0.05, 2.0)
    assert again.has_prototypes and again.n_labels == Y.shape[1]
    np.testing.assert_array_equal(store.prototypes(Xq, 3)[1], again.prototypes(Xq, 3)[1])
    with pytest.raises(ValueError, match="lack pr_norm"):
        fusion.NeighbourLabels({k: v for k, v in store.state_arrays().items() if k != "pr_norm"}, 10)


def _fit_tiny(knn, **kw):
    from dslide import train as T
    from dslide.config import Config
    from dslide.datasets.synthetic import generate_split
    from dslide.io.data import XMCData

    tr, te = generate_split("tiny", 400, 60, seed=3)
    cfg = Config(hidden=(16,), epochs=2.0, batch_size=32, knn=knn, knn_weight=0.6, knn_candidates=12, **kw)
    model, _ = T.fit(tr, cfg, index=False)
    return T, model, tr, te


@pytest.mark.parametrize("temperature", [None, 3.0])
def test_predictions_are_the_numpy_fusion_of_model_softmax_and_neighbour_votes(temperature):
    from dslide.model.inputs import normalise_inputs
    from dslide.model.network import full_parameters

    T, model, tr, te = _fit_tiny(knn=4, proto_weight=0.5, knn_temperature=temperature)
    assert model.neighbours.temperature == (temperature or 1.0)  # kept with the store
    ids, scores = predict_topk_scores(model, te.X, 5)
    # the model's logits, by numpy from the gathered parameters
    (W0, b0), (W1, b1) = full_parameters(model.network)
    Xn = normalise_inputs(sp.csr_matrix(te.X), "l2", np.float32).toarray().astype(np.float64)
    Z = np.maximum(Xn @ W0 + b0, 0) @ W1 + b1
    top = np.argsort(-Z, axis=1, kind="stable")[:, :12]
    ref_nn, _ = _reference_neighbours(te.X, tr.X, 4)
    S = (lambda A: A / np.linalg.norm(A, axis=1, keepdims=True))(te.X.toarray().astype(np.float64)) @ \
        (lambda A: A / np.linalg.norm(A, axis=1, keepdims=True))(tr.X.toarray().astype(np.float64)).T
    Y = sp.csr_matrix(tr.Y)
    cfg = model.config
    assert cfg.proto_candidates == 20 and cfg.proto_power == 16.0  # the defaults
    C, _ = _reference_prototypes(tr.X, Y)
    Q = te.X.toarray().astype(np.float64)
    P = (Q / np.linalg.norm(Q, axis=1, keepdims=True)) @ C.T
    agree = 0
    for q in range(te.n_points):
        z = Z[q, top[q]] / (temperature or 1.0)
        p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
        score = np.zeros(tr.n_labels)
        score[top[q]] += 0.4 * p
        w = np.maximum(S[q, ref_nn[q]], 0) ** 4.0
        for pt, wi in zip(ref_nn[q], w / w.sum()):
            score[Y.indices[Y.indptr[pt]:Y.indptr[pt + 1]]] += 0.6 * 0.5 * wi
        near = np.argsort(-P[q], kind="stable")[:20]
        pw = np.maximum(P[q, near], 0) ** 16.0
        score[near] += 0.6 * 0.5 * pw / pw.sum()
        ref = np.sort(score)[::-1][:5]
        np.testing.assert_allclose(scores[q], ref, rtol=1e-4, atol=1e-6)
        agree += set(ids[q]) == set(np.argsort(-score, kind="stable")[:5])
    assert agree >= te.n_points - 2  # ids may differ only where float32 logits tie at the 5th place


def test_knn_zero_leaves_the_model_alone_and_saves_no_store(tmp_path):
    T, model, tr, te = _fit_tiny(knn=0)
    assert model.neighbours is None
    assert not any(k.startswith("knn.") for k in model.network.layers[-1].state(weights_only=True))


def test_proto_weight_zero_builds_no_prototypes_and_fuses_the_points_alone():
    import dataclasses

    T, plain, tr, te = _fit_tiny(knn=4, proto_weight=0.0)
    assert not plain.neighbours.has_prototypes
    _, protos, _, _ = _fit_tiny(knn=4, proto_weight=0.5)  # the same network: proto_weight does not touch training
    assert protos.neighbours.has_prototypes
    a = predict_topk_scores(plain, te.X, 5)
    b = predict_topk_scores(protos, te.X, 5)
    assert not np.allclose(a[1], b[1])  # the prototypes move the fused scores
    c = predict_topk_scores(dataclasses.replace(protos, config=protos.config.replace(proto_weight=0.0)), te.X, 5)
    np.testing.assert_array_equal(a[0], c[0])
    np.testing.assert_allclose(a[1], c[1], rtol=1e-12)


def test_store_survives_a_checkpoint(tmp_path):
    from dslide.comm import Comm
    from dslide.infer.parts import sections
    from dslide.io import checkpoint as ck
    from dslide.train import build_network

    T, model, tr, te = _fit_tiny(knn=3, proto_weight=0.5)
    before = predict_topk_scores(model, te.X, 5)
    ck.save(model.network, tmp_path / "run", Comm(), weights_only=True, sections=sections(model))
    fresh = build_network((tr.n_features, tr.n_labels), model.config, Comm())
    ck.load_into(fresh.network, ck.latest(tmp_path / "run"), Comm(), weights_only=True, sections=sections(fresh))
    assert fresh.neighbours is not None
    after = predict_topk_scores(fresh, te.X, 5)
    np.testing.assert_array_equal(before[0], after[0])
    np.testing.assert_allclose(before[1], after[1], rtol=1e-12)


def test_a_chosen_temperature_survives_a_checkpoint_and_moves_the_scores(tmp_path):
    from dslide.comm import Comm
    from dslide.infer.parts import sections
    from dslide.io import checkpoint as ck
    from dslide.train import build_network

    T, model, tr, te = _fit_tiny(knn=3, proto_weight=0.5)
    assert model.config.knn_temperature is None and model.neighbours.temperature == 1.0
    plain = predict_topk_scores(model, te.X, 5)
    model.neighbours.temperature = 3.0  # as the validation split would choose it
    hot = predict_topk_scores(model, te.X, 5)
    assert not np.allclose(plain[1], hot[1])
    ck.save(model.network, tmp_path / "run", Comm(), weights_only=True, sections=sections(model))
    fresh = build_network((tr.n_features, tr.n_labels), model.config, Comm())
    ck.load_into(fresh.network, ck.latest(tmp_path / "run"), Comm(), weights_only=True, sections=sections(fresh))
    assert fresh.neighbours.temperature == 3.0
    after = predict_topk_scores(fresh, te.X, 5)
    np.testing.assert_array_equal(hot[0], after[0])
    np.testing.assert_allclose(hot[1], after[1], rtol=1e-12)


def _clustered(seed=0, n=240, f=80, L=60):
    """Points in clusters that share features and labels, some exact duplicates: the
    neighbour count changes the votes' precision."""
    rng = np.random.default_rng(seed)
    centre = rng.integers(0, 12, n)
    rows, cols, vals, labs = [], [], [], []
    for i, c in enumerate(centre):
        feats = np.unique(np.concatenate([c * 6 + rng.integers(0, 6, 4), rng.integers(0, f, 2)]))
        rows += [i] * len(feats)
        cols += feats.tolist()
        vals += (0.5 + rng.random(len(feats))).tolist()  # continuous: no ties but the duplicate's
        labs.append(np.unique(np.concatenate([c * 5 + rng.integers(0, 5, 2), rng.integers(0, L, 1)])))
    X = sp.csr_matrix((np.array(vals, np.float32), (rows, cols)), shape=(n, f))
    X[n - 1] = X[0]  # an exact duplicate: it ties with the point itself
    Y = sp.csr_matrix((np.ones(sum(map(len, labs)), np.float32),
                       (np.repeat(np.arange(n), list(map(len, labs))), np.concatenate(labs))), shape=(n, L))
    return sp.csr_matrix(X), Y


def _reference_leave_one_out(X, Y, rows, choices, power):
    """Plain numpy: cosine to every other point sharing a feature, ties to the lower id, the
    first c by similarity vote with sim**power, P@1 / P@5 of the point's own labels."""
    A = X.toarray().astype(np.float64)
    A /= np.maximum(np.linalg.norm(A, axis=1, keepdims=True), 1e-300)
    S = A @ A.T
    share = (X.toarray() != 0).astype(int) @ (X.toarray() != 0).T.astype(int) > 0
    Yd = Y.toarray()
    out = {}
    for c in choices:
        p1 = p5 = 0.0
        for q in rows:
            cand = [p for p in np.nonzero(share[q])[0] if p != q]
            near = sorted(cand, key=lambda p: (-S[q, p], p))[:c]
            w = np.array([max(S[q, p], 0.0) ** power for p in near])
            votes = (w[:, None] * Yd[near]).sum(0) / w.sum() if w.sum() > 0 else np.zeros(Yd.shape[1])
            order = sorted([j for j in range(Yd.shape[1]) if votes[j] > 0], key=lambda j: (-votes[j], j))[:5]
            p1 += Yd[q, order[0]] if order else 0.0
            p5 += Yd[q, order].sum() / 5
        out[c] = (p1 / len(rows), p5 / len(rows))
    return out


def test_choose_k_is_the_numpy_leave_one_out():
    X, Y = _clustered()
    store = fusion.NeighbourLabels.build(X, Y)
    rows = np.arange(0, X.shape[0], 2)
    rows = np.append(rows, X.shape[0] - 1)  # the duplicate of point 0: its twin must be found, not itself
    k, scores = store.choose_k(X, Y, rows, (10, 1, 3, 30), 4.0)
    ref = _reference_leave_one_out(X, Y, rows, (10, 1, 3, 30), 4.0)
    for c in (10, 1, 3, 30):
        np.testing.assert_allclose(scores[c], ref[c], rtol=1e-6)  # one label differing moves it by 1/605
    assert k == max((10, 1, 3, 30), key=lambda c: (ref[c][1], -(10, 1, 3, 30).index(c)))
    assert len({round(v[1], 9) for v in scores.values()}) > 1  # the counts do differ here
    # over a stand-in communicator (the search shared out), the same answer
    assert store.choose_k(X, Y, rows, (10, 1, 3, 30), 4.0, comm=Comm()) == (k, scores)


def test_choose_k_keeps_the_first_count_unless_another_wins_by_the_margin():
    X, Y = _clustered(seed=1)
    store = fusion.NeighbourLabels.build(X, Y)
    rows = np.arange(X.shape[0])
    k, scores = store.choose_k(X, Y, rows, (3, 1, 30), 4.0)
    best = max(v[1] for v in scores.values())
    assert scores[3][1] < best and k == 30  # this data wants many neighbours
    gap = best - scores[3][1]
    assert store.choose_k(X, Y, rows, (3, 1, 30), 4.0, margin=gap)[0] == 3  # not by more than the margin
    assert store.choose_k(X, Y, rows, (3, 1, 30), 4.0, margin=gap * 0.99)[0] == 30
    with pytest.raises(ValueError, match="neighbour count"):
        store.choose_k(X, Y, rows, (), 4.0)


def test_the_chosen_count_is_saved_with_the_store_and_an_old_store_has_none():
    from dslide.config import KNN, Config

    X, Y = _data()
    store = fusion.NeighbourLabels.build(X, Y)
    assert store.k is None and "k" not in store.state_arrays()
    store.k = 5
    again = fusion.NeighbourLabels.from_state(store.state_arrays())
    assert again.k == 5
    assert Config().neighbours(again.k) == 5 and Config(knn=7).neighbours(again.k) == 7
    assert Config().neighbours(None) == KNN  # a store saved before the count was kept


def _reference_left_out_prototypes(X, Y, rows, k):
    """Plain numpy: for each point, every label's prototype rebuilt without it, its k best."""
    A = X.toarray().astype(np.float64)
    A /= np.maximum(np.linalg.norm(A, axis=1, keepdims=True), 1e-300)
    Yd = Y.toarray()
    out = []
    for q in rows:
        keep = np.ones(len(A), bool)
        keep[q] = False
        S = Yd[keep].T @ A[keep]
        nrm = np.linalg.norm(S, axis=1)
        cos = np.divide(S @ A[q], nrm, out=np.full(len(S), -np.inf), where=nrm > 1e-9)
        shares = ((S != 0) & (A[q] != 0)).any(axis=1) & (nrm > 1e-9)  # a label sharing a feature
        cand = sorted(np.nonzero(shares)[0], key=lambda j: (-cos[j], j))[:k]
        out.append((cand, cos[cand]))
    return out


def test_left_out_prototypes_are_the_prototypes_rebuilt_without_the_point():
    X, Y = _clustered(seed=2)
    n = X.shape[0]
    own = sp.csr_matrix((np.ones(20, np.float32), (np.arange(0, 60, 3), np.arange(20))), shape=(n, 20))
    Y = sp.csr_matrix(sp.hstack([Y, own]))  # labels of one point each
    store = fusion.NeighbourLabels.build(X, Y, prototypes=True)
    rows = np.arange(0, X.shape[0], 3)
    ids, sims = store.left_out_prototypes(X, Y, rows, 6)
    ref = _reference_left_out_prototypes(X, Y, rows, 6)
    singles = 0
    for r, (cand, cos) in enumerate(ref):
        got = ids[r][ids[r] >= 0]
        np.testing.assert_allclose(sims[r, :len(cand)], cos, rtol=1e-4, atol=1e-5)
        assert len(got) == len(cand)
        assert got.tolist() == cand or np.allclose(sims[r, :len(cand)], cos, atol=1e-5)
        own = Y[rows[r]].indices
        singles += sum(Y[:, j].nnz == 1 for j in own)
        assert not any(j in got for j in own if Y[:, j].nnz == 1)  # a label of this point alone is gone
    assert singles > 0  # the data has such labels


def _share_data():
    """Near-duplicate pairs whose labels are noisy copies, and shared topic labels."""
    return _clustered(seed=3, n=300)


def test_choose_share_is_the_numpy_leave_one_out_with_the_p1_tolerance():
    from dslide.metrics import evaluate

    X, Y = _share_data()
    store = fusion.NeighbourLabels.build(X, Y, prototypes=True)
    rows = np.arange(0, X.shape[0], 2)
    choices = (0.0, 0.25, 0.5, 1.0)
    share, scores = store.choose_share(X, Y, rows, 5, 4.0, choices, 8, 4.0, tolerance=0.0)
    # the reference: numpy neighbours and prototypes, both without the point, fused by the Python reference
    nn_ids, nn_sims = _reference_neighbours(X[rows], X, 6)
    nn = [[p for p in nn_ids[i] if p != q][:5] for i, q in enumerate(rows)]
    A = X.toarray().astype(np.float64)
    A /= np.linalg.norm(A, axis=1, keepdims=True)
    ref_pr = _reference_left_out_prototypes(X, Y, rows, 8)
    for a in choices:
        ids = np.array(nn, np.int32)
        sims = np.array([[A[q] @ A[p] for p in nn[i]] for i, q in enumerate(rows)], np.float32)
        pr_ids = np.array([c + [-1] * (8 - len(c)) for c, _ in ref_pr], np.int32)
        pr_sims = np.array([list(v) + [-np.inf] * (8 - len(v)) for _, v in ref_pr], np.float32)
        no = np.empty((len(rows), 0), np.int64), np.empty((len(rows), 0))
        best = _reference_fuse(*no, ids, sims, Y, 1.0, 4.0, 5, pr_ids, pr_sims, a, 4.0)
        pred = np.array([[j for j, _ in b] + [-1] * (5 - len(b)) for b in best])
        r = evaluate(sp.csr_matrix(Y)[rows], pred, k=5)
        np.testing.assert_allclose(scores[a], (r["p@1"], r["p@5"]), atol=2.5 / len(rows))
    # here the prototypes alone (share 1) have the best P@5 but a P@1 below the points':
    # without tolerance the best P@5 of the rest wins, with a wide one share 1
    assert scores[1.0][1] == max(v[1] for v in scores.values()) and scores[1.0][0] < scores[0.0][0]
    allowed = [a for a in choices if scores[a][0] >= scores[0.0][0]]
    assert share == max(allowed, key=lambda a: (scores[a][1], -choices.index(a))) == 0.5
    loose, _ = store.choose_share(X, Y, rows, 5, 4.0, choices, 8, 4.0, tolerance=1.0)
    assert loose == 1.0
    with pytest.raises(ValueError, match="share in"):
        store.choose_share(X, Y, rows, 5, 4.0, (1.5,), 8, 16.0)


def test_without_a_validation_split_a_store_with_something_to_choose_is_not_built():
    """400 training points: too few for a validation split, so the share left to the data
    cannot be checked and the no-op is taken (the network alone)."""
    T, model, tr, te = _fit_tiny(knn=4)
    assert model.neighbours is None
    assert model.index_info["fusion_choice"]["chosen"] == "off"
    _, alone, _, _ = _fit_tiny(knn=0)
    np.testing.assert_array_equal(predict_topk(model, te.X, 5), predict_topk(alone, te.X, 5))



@pytest.mark.parametrize("threads", [1, 2])
def test_transpose_lists_is_scipys_transpose_rows_ascending_whatever_the_threads(threads):
    import numba

    rng = np.random.default_rng(5)
    A = sp.random(57, 23, density=0.2, format="csr", random_state=6, dtype=np.float64)
    A[3] = 0.0  # an empty row
    A.eliminate_zeros()
    A = sp.vstack([A, sp.csr_matrix(np.r_[np.ones(5), np.zeros(18)][None, :])]).tocsr()  # and a heavy column
    A.sort_indices()
    A.data = rng.integers(1, 9, A.data.size).astype(np.float32)
    before = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        ptr, rows, val = lists.transpose_lists(A.indptr.astype(np.int64), A.indices.astype(np.int32), A.data, 30)
    finally:
        numba.set_num_threads(before)
    want = sp.csc_matrix(sp.hstack([A, sp.csr_matrix((A.shape[0], 7))]))  # 30 columns, the last 7 empty
    want.sort_indices()
    np.testing.assert_array_equal(ptr, want.indptr)
    np.testing.assert_array_equal(rows, want.indices)
    np.testing.assert_array_equal(val, want.data)
    assert ptr.dtype == np.int64 and rows.dtype == np.int32 and val.dtype == np.float32
    assert all(np.all(np.diff(rows[ptr[j]:ptr[j + 1]]) > 0) for j in range(30))


def test_work_cuts_split_the_items_into_ranges_of_about_equal_work():
    work = np.array([5, 0, 1, 1, 1, 1, 1, 0, 0])
    cuts = lists.work_cuts(work, 2)
    assert list(cuts) == [0, 1, 9]  # the first item alone is half the work
    assert list(lists.work_cuts(np.ones(8), 4)) == [0, 2, 4, 6, 8]
    assert list(lists.work_cuts(np.zeros(3), 2)) == [0, 0, 3]  # no work: one range takes all
    many = lists.work_cuts(np.ones(2), 5)  # more parts than items: empty ranges, still in order
    assert many[0] == 0 and many[-1] == 2 and np.all(np.diff(many) >= 0) and many.size == 6
