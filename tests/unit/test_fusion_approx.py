"""The approximate search of the neighbour store (dslide.infer.approx) against a numpy brute force."""

import numpy as np
import pytest
import scipy.sparse as sp

from dslide.infer import approx, fusion


def _clustered(seed=0, n=2000, f=400, topics=40, words=12, L=60):
    """Points drawn from topics (each a set of features), tf-idf-like values: a neighbour is a
    point of the same topic, as in real data."""
    rng = np.random.default_rng(seed)
    topic_words = rng.choice(f, size=(topics, 30), replace=True)
    rows, cols, vals = [], [], []
    labels = []
    for i in range(n):
        t = rng.integers(topics)
        w = np.unique(np.concatenate([rng.choice(topic_words[t], words), rng.integers(0, f, 3)]))
        rows += [i] * w.size
        cols += list(w)
        vals += list(rng.uniform(0.2, 2.0, w.size))
        labels.append((t * L // topics + rng.integers(0, 2)) % L)
    X = sp.csr_matrix((np.array(vals, np.float32), (rows, cols)), shape=(n, f))
    Y = sp.csr_matrix((np.ones(n, np.float32), (np.arange(n), labels)), shape=(n, L))
    return X, Y


def _brute(Xq, Xt, k):
    """numpy: the k points of largest cosine (ties to the lower id) and their cosines."""
    def unit(A):
        A = A.toarray().astype(np.float64)
        nrm = np.linalg.norm(A, axis=1, keepdims=True)
        return np.divide(A, nrm, out=np.zeros_like(A), where=nrm > 0)

    S = unit(Xq) @ unit(Xt).T
    ids = np.lexsort((np.broadcast_to(np.arange(S.shape[1]), S.shape), -S), axis=1)[:, :k]
    return ids, np.take_along_axis(S, ids, axis=1)


def _recall(ids, ref):
    return np.mean([np.isin(ref[q], ids[q]).mean() for q in range(ref.shape[0])])


@pytest.mark.parametrize("cap", [1, 3, 7])
def test_pruning_breaks_ties_at_the_cap_to_the_lower_id_as_a_stable_sort_does(cap):
    rng = np.random.default_rng(cap)
    lengths = rng.integers(0, 20, 40)
    ptr = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    ids = np.concatenate([np.sort(rng.choice(100, n, replace=False)) for n in lengths]).astype(np.int32)
    val = rng.integers(1, 4, ptr[-1]).astype(np.float32) / 4  # three values: ties everywhere
    p, i, v = approx.prune(ptr, ids, val, cap)
    crossed = 0
    for f in range(40):
        a, b = ptr[f], ptr[f + 1]
        keep = np.sort(np.argsort(-val[a:b], kind="stable")[:cap])  # the reference
        np.testing.assert_array_equal(i[p[f]:p[f + 1]], ids[a:b][keep])
        np.testing.assert_array_equal(v[p[f]:p[f + 1]], val[a:b][keep])
        if b - a > cap and np.sum(val[a:b] == val[a:b][np.argsort(-val[a:b], kind="stable")[cap - 1]]) > 1:
            crossed += 1
    assert crossed > 5  # lists where a tie straddles the cap


def test_pruning_keeps_the_largest_values_per_feature_in_id_order():
    ptr = np.array([0, 4, 4, 6], np.int64)
    ids = np.array([0, 2, 5, 7, 1, 3], np.int32)
    val = np.array([0.1, 0.9, 0.5, 0.9, 0.3, 0.2], np.float32)
    p, i, v = approx.prune(ptr, ids, val, 2)
    np.testing.assert_array_equal(p, [0, 2, 2, 4])
    np.testing.assert_array_equal(i, [2, 7, 1, 3])  # a tie of 0.9: both kept; in id order
    np.testing.assert_array_equal(v, np.float32([0.9, 0.9, 0.3, 0.2]))
    r_ptr, r_feat, r_val = approx.transpose(ptr, ids, val, 8)
    A = sp.csc_matrix((val, ids, ptr), shape=(8, 3)).tocsr()
    A.sort_indices()
    np.testing.assert_array_equal(r_ptr, A.indptr)
    np.testing.assert_array_equal(r_feat, A.indices)
    np.testing.assert_array_equal(r_val, A.data)


def test_without_pruning_the_search_is_the_exact_search_bit_for_bit():
    """Lists long enough to hold every point, every query feature, every touched point a
    candidate: the ids and float32 similarities of the exact kernel."""
    X, Y = _clustered(n=500)
    Xq, _ = _clustered(seed=1, n=80)
    store = fusion.NeighbourLabels.build(X, Y)
    a = store.arrays
    full = approx.ApproxPostings(a["post_ptr"], a["post_pt"], a["post_val"], store.n_points, np.empty(0, np.int32),
                                 postings=X.shape[0])
    ids, sims, _ = full.search(fusion.l2_rows(Xq), 10, query_features=Xq.shape[1], candidates=X.shape[0])
    e_ids, e_sims = store.neighbours(Xq, 10)
    np.testing.assert_array_equal(ids, e_ids)
    np.testing.assert_array_equal(sims, e_sims)


@pytest.mark.parametrize("postings,features,candidates,floor", [(64, 8, 32, 0.9), (32, 16, 64, 0.7)])
def test_pruned_search_recalls_the_brute_force_neighbours(postings, features, candidates, floor):
    """Recall@10 of the numpy brute force on clustered data; the similarities returned are the
    true cosines of the points returned, best first."""
    X, Y = _clustered()
    Xq, _ = _clustered(seed=1, n=200)
    store = fusion.NeighbourLabels.build(X, Y)
    a = store.arrays
    ap = approx.ApproxPostings(a["post_ptr"], a["post_pt"], a["post_val"], store.n_points, np.empty(0, np.int32),
                               postings=postings)
    ids, sims, read = ap.search(fusion.l2_rows(Xq), 10, query_features=features, candidates=candidates)
    ref_ids, ref_sims = _brute(Xq, X, 10)
    rec = _recall(ids, ref_ids)
    assert rec >= floor, rec
    found = ids >= 0
    S = _brute(Xq, X, X.shape[0])  # every cosine, to check those returned
    true = np.full(ids.shape, np.nan)
    for q in range(ids.shape[0]):
        pos = np.argsort(S[0][q])
        true[q, found[q]] = S[1][q][pos][ids[q, found[q]]]
    np.testing.assert_allclose(sims[found], true[found], rtol=1e-5, atol=1e-6)
    assert np.all(np.diff(np.where(found, sims, -np.inf), axis=1) <= 0)  # best first


def test_work_per_query_is_bounded_whatever_the_training_points():
    """Entries read per query: at most features x postings plus the candidates' rows, at 2,000
    training points as at 8,000, while the exact search reads about 4x as many."""
    reads = {}
    for n in (2000, 8000):
        X, Y = _clustered(n=n)
        Xq, _ = _clustered(seed=1, n=100)
        store = fusion.NeighbourLabels.build(X, Y)
        a = store.arrays
        ap = approx.ApproxPostings(a["post_ptr"], a["post_pt"], a["post_val"], n, np.empty(0, np.int32),
                                   postings=32)
        _, _, read = ap.search(fusion.l2_rows(Xq), 5, query_features=6, candidates=20)
        row_max = int(np.diff(ap.rows[0]).max())
        assert read.max() <= 6 * 32 + 20 * row_max
        reads[n] = (read.mean(), np.diff(a["post_ptr"])[Xq.indices].sum() / Xq.shape[0])
    assert reads[8000][1] > 3 * reads[2000][1]
    assert reads[8000][0] < 1.3 * reads[2000][0]


def test_approximate_prototypes_recall_the_exact_ones_and_keep_their_labels():
    X, Y = _clustered()
    Xq, _ = _clustered(seed=1, n=200)
    store = fusion.NeighbourLabels.build(X, Y, prototypes=True)
    e_ids, e_sims = store.prototypes(Xq, 5)
    ids, sims = store.prototypes(Xq, 5, approx=True)
    assert _recall(ids, e_ids) >= 0.9
    both = (ids[:, :1] == e_ids[:, :1])
    np.testing.assert_array_equal(sims[:, :1][both], e_sims[:, :1][both])


def test_approximate_neighbours_shared_over_a_stand_in_comm_equal_one_process():
    from dslide.comm import Comm

    X, Y = _clustered(n=600)
    Xq, _ = _clustered(seed=2, n=50)
    store = fusion.NeighbourLabels.build(X, Y)
    a = store.neighbours(Xq, 7, approx=True)
    b = store.neighbours(Xq, 7, Comm(), approx=True)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


def test_recall_grows_with_the_lists_kept_and_is_whole_without_pruning():
    X, Y = _clustered()
    Xq, _ = _clustered(seed=1, n=200)
    store = fusion.NeighbourLabels.build(X, Y)
    a = store.arrays
    ref_ids, _ = _brute(Xq, X, 10)
    recalls = []
    for postings in (8, 32, 128, X.shape[0]):
        ap = approx.ApproxPostings(a["post_ptr"], a["post_pt"], a["post_val"], store.n_points,
                                   np.empty(0, np.int32), postings=postings)
        ids, _, _ = ap.search(fusion.l2_rows(Xq), 10, query_features=X.shape[1], candidates=X.shape[0])
        recalls.append(_recall(ids, ref_ids))
    assert recalls == sorted(recalls)
    assert recalls[0] < 0.9 and recalls[-1] >= 0.99  # the last: float ties aside


def test_the_approx_settings_bound_the_search_that_fused_prediction_runs():
    """approx_postings / approx_features / approx_candidates reach the store's search: a
    prediction's Fusion carries them, and the store searches exactly what a direct pruned
    search with them finds (brute force judges that the tight bound recalls less)."""
    from dslide.config import Config
    from dslide.infer.predict import Fusion

    X, Y = _clustered()
    Xq, _ = _clustered(seed=1, n=200)
    store = fusion.NeighbourLabels.build(X, Y)
    cfg = Config(knn=10, approx_postings=8, approx_features=2, approx_candidates=12)
    bound = Fusion.of(type("M", (), {"config": cfg, "neighbours": store})()).bound
    assert bound == approx.Bound(8, 2, 12) and approx.Bound.of(Config()) == approx.Bound()
    ids, sims = store.neighbours(Xq, 10, approx=bound)
    a = store.arrays
    direct = approx.ApproxPostings(a["post_ptr"], a["post_pt"], a["post_val"], store.n_points,
                                   np.empty(0, np.int32), postings=8)
    d_ids, d_sims, read = direct.search(fusion.l2_rows(Xq), 10, query_features=2, candidates=12)
    np.testing.assert_array_equal(ids, d_ids)
    np.testing.assert_array_equal(sims, d_sims)
    default = approx.ApproxPostings(a["post_ptr"], a["post_pt"], a["post_val"], store.n_points, np.empty(0, np.int32))
    assert read.sum() < default.search(fusion.l2_rows(Xq), 10)[2].sum()  # the tight bound reads less
    ref_ids, _ = _brute(Xq, X, 10)
    assert _recall(ids, ref_ids) < _recall(store.neighbours(Xq, 10, approx=True)[0], ref_ids)
    with pytest.raises(ValueError, match="approx_postings"):
        Config(approx_postings=0)
