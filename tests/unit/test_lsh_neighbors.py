"""lsh.neighbors: the k-NN graph, its best-first search and the neighbours' labels, against numpy."""

import numpy as np
import pytest

from dslide import lsh
from dslide.lsh import neighbors as NB


def _clusters(seed=0, n=600, d=12, k=20, noise=0.25):
    rs = np.random.default_rng(seed)
    centres = rs.normal(size=(k, d))
    X = centres[rs.integers(0, k, n)] + noise * rs.normal(size=(n, d))
    return X.astype(np.float32), centres


def _brute(Q, P, k):
    """The k best rows of P per query by dot product, ties to the lower index (float64; exact
    for the int8 vectors the search compares)."""
    S = Q.astype(np.float64) @ P.astype(np.float64).T
    ids = np.arange(P.shape[0])
    return np.stack([np.lexsort((ids, -S[q]))[:k] for q in range(Q.shape[0])])


def test_knn_rows_equal_numpy_with_ties_and_any_row_range():
    X, _ = _clusters(1, n=300)
    X[7] = X[3]  # an exact duplicate: 3 and 7 are each other's best, ties go to the lower index
    X[8] = X[3]
    P = NB.unit_rows(X)
    S = P.astype(np.float64) @ P.astype(np.float64).T
    np.fill_diagonal(S, -np.inf)
    ids = np.arange(P.shape[0])
    want = np.stack([np.lexsort((ids, -S[i]))[:6] for i in range(P.shape[0])])
    got = NB.knn_rows(P, 0, P.shape[0], 6, block=64)
    # float32 BLAS against float64 may swap near-equal neighbours: compare sets, then the exact ties
    agree = np.mean([len(np.intersect1d(got[i], want[i])) / 6 for i in range(P.shape[0])])
    assert agree >= 0.99
    assert list(got[3, :2]) == [7, 8] and list(got[7, :2]) == [3, 8]
    np.testing.assert_array_equal(NB.knn_rows(P, 100, 170, 6, block=32), got[100:170])
    # the per-row selection against numpy's on the same float32 similarities: identical
    S32 = P[:50] @ P.T
    sel = np.empty((50, 6), np.int32)
    NB.top_of_rows(S32, 6, 0, sel)
    S32[np.arange(50), np.arange(50)] = -np.inf
    np.testing.assert_array_equal(sel, np.stack([np.lexsort((ids, -S32[i]))[:6] for i in range(50)]))
    assert not np.any(got == np.arange(P.shape[0])[:, None])  # never its own neighbour


def test_reverse_links_are_the_most_similar_points_that_list_a_point():
    X, _ = _clusters(2, n=200)
    P = NB.unit_rows(X)
    G = NB.knn_rows(P, 0, P.shape[0], 4)
    rptr, rids = NB.reverse_lists(G, P.shape[0])
    full = np.empty((P.shape[0], 7), np.int32)
    NB.add_reverse(G, P, 3, rptr, rids, full)
    S = P.astype(np.float64) @ P.astype(np.float64).T
    for i in range(P.shape[0]):
        who = [v for v in range(P.shape[0]) if i in G[v] and v not in G[i]]
        want = sorted(who, key=lambda v: (-S[i, v], v))[:3]
        np.testing.assert_array_equal(full[i, :4], G[i])
        got = [v for v in full[i, 4:] if v >= 0]
        assert got == want, i
        assert np.all(full[i, 4 + len(got):] == -1)


def test_search_finds_the_exact_nearest_points_on_clustered_data():
    """Property: the beam search returns the exact top-1 for >= 95% of queries, without scanning
    everything; a beam as wide as the data returns the exact top 5 (the clusters' sub-graphs
    are searched to the end) and computes more similarities than a narrow one."""
    X, centres = _clusters(3, n=2000, d=16, k=40)
    rs = np.random.default_rng(4)
    Q = (centres[rs.integers(0, 40, 300)] + 0.25 * rs.normal(size=(300, 16))).astype(np.float32)
    # cells: the nearest centre of each point (what the anchors give the index)
    codes = np.argmin(((X[:, None, :] - centres[None]) ** 2).sum(-1), axis=1)
    qcodes = np.argmin(((Q[:, None, :] - centres[None]) ** 2).sum(-1), axis=1)
    labels = (np.arange(2001, dtype=np.int64), np.arange(2000, dtype=np.int32))
    index = lsh.NeighborIndex.build(X, codes, 40, *labels, M=8, R=8)
    want = _brute(NB.quantize(Q), index.points, 5)
    nn, visited = index.neighbors(Q, qcodes, ef=32, k=5)
    # the int8 vectors' top-1 is as close as the float top-1, to within their rounding
    Xc = X[np.argsort(codes, kind="stable")]  # the index keeps the points cell by cell
    cos = NB.unit_rows(Q).astype(np.float64) @ NB.unit_rows(Xc).astype(np.float64).T
    assert np.all(cos[np.arange(300), want[:, 0]] >= cos.max(axis=1) - 0.01)
    assert np.mean(nn[:, 0] == want[:, 0]) >= 0.95
    assert np.mean([np.isin(want[q], nn[q]).mean() for q in range(300)]) >= 0.9
    assert visited.max() < 2000  # it did not scan everything
    nn_all, visited_all = index.neighbors(Q[:20], qcodes[:20], ef=2000, k=5)
    np.testing.assert_array_equal(nn_all, want[:20])
    assert np.all(visited_all >= visited[:20])


def test_search_from_an_empty_cell_and_beam_narrower_than_k():
    X, centres = _clusters(5, n=100, d=8, k=5)
    codes = np.zeros(100, np.int64)  # every point in cell 0; cells 1 and 2 are empty
    index = lsh.NeighborIndex.build(X, codes, 3, np.arange(101, dtype=np.int64), np.arange(100, dtype=np.int32),
                                    M=6, R=6)
    nn, _ = index.neighbors(X[:10] + 0.01, np.full(10, 2), ef=1, k=3)  # ef is raised to k
    assert np.all(nn >= 0)
    want = _brute(NB.quantize(X[:10] + 0.01), index.points, 3)
    assert np.mean(nn[:, 0] == want[:, 0]) >= 0.9


def test_neighbour_labels_in_a_slice_are_local_sorted_distinct():
    label_ptr = np.array([0, 3, 3, 5, 7], np.int64)
    label_ids = np.array([2, 9, 15, 9, 11, 2, 30], np.int32)
    nn = np.array([[0, 2, 3], [1, -1, -1], [3, 2, 0]], np.int32)
    xptr, xids = NB.labels_in_range(nn, label_ptr, label_ids, 2, 16)
    per_query = [list(xids[xptr[q]:xptr[q + 1]]) for q in range(3)]
    assert per_query == [[0, 7, 9, 13], [], [0, 7, 9, 13]]  # {2, 9, 11, 15} - 2; 30 is another rank's


def _anchored(seed=6):
    rs = np.random.default_rng(seed)
    m, d, A, T, k = 500, 10, 5, 30, 6
    W = rs.normal(size=(m, d)).astype(np.float32)
    b = rs.normal(size=m).astype(np.float32)
    tables = lsh.AnchorTables(d, 1, A, T, seed=1)
    tables.fit_anchors(rs.normal(size=(100, d)).astype(np.float32))
    Q = rs.normal(size=(23, d)).astype(np.float32)
    return W, b, tables, Q, k, rs


@pytest.mark.parametrize("probes", [1, 2])
def test_topk_with_extras_scores_the_union_of_bucket_and_extras_exactly(probes):
    """Extras (a query's neighbours' labels) are scored besides its buckets, once each: the
    result is the numpy top k of the union, and n_scored counts the union."""
    W, b, tables, Q, k, rs = _anchored()
    tables.fill(W, b)  # buckets in score order: the grouped kernel needs a sorted copy
    codes = tables.codes(Q, probes)
    S = Q.astype(np.float64) @ W.astype(np.float64).T + b
    extra = []
    for q in range(Q.shape[0]):
        mine = set(np.concatenate([tables.buckets[0, a] for a in codes[q]]).tolist())
        outside = rs.choice([j for j in range(W.shape[0]) if j not in mine], 4, replace=False)
        inside = rs.choice(sorted(mine), 2, replace=False)  # already retrieved: not scored twice
        extra.append(np.sort(np.concatenate([outside, inside])).astype(np.int32))
    best = int(np.argmax(S[0]))
    extra[0] = np.union1d(extra[0], [best]).astype(np.int32)  # query 0's best label only as an extra
    xptr = np.concatenate([[0], np.cumsum([e.size for e in extra])]).astype(np.int64)
    xids = np.concatenate(extra)
    scores, ids, n_scored = tables.topk(Q, W, b, k, probes=probes, extras=(xptr, xids))
    for q in range(Q.shape[0]):
        cand = np.union1d(np.concatenate([tables.buckets[0, a] for a in codes[q]]), extra[q])
        ref = cand[np.lexsort((cand, -S[q, cand]))[:k]]
        np.testing.assert_array_equal(ids[q], ref)
        np.testing.assert_allclose(scores[q], S[q, ref], rtol=1e-5, atol=1e-5)
        assert n_scored[q] == cand.size
    assert ids[0, 0] == best
    plain = tables.topk(Q, W, b, k, probes=probes)
    assert np.all(plain[2] < n_scored)


def test_the_index_keeps_points_cell_by_cell_with_their_own_labels():
    X, _ = _clusters(7, n=50, d=6, k=3)
    codes = np.random.default_rng(0).integers(0, 4, 50)
    ptr = np.arange(51, dtype=np.int64) * 2
    ids = np.repeat(np.arange(50, dtype=np.int32), 2) * 10 + np.tile([0, 1], 50).astype(np.int32)
    index = lsh.NeighborIndex.build(X, codes, 4, ptr, ids, M=3, R=3)
    perm = np.argsort(codes, kind="stable")
    np.testing.assert_array_equal(index.points, NB.quantize(X[perm]))
    np.testing.assert_array_equal(index.cell_ptr, np.concatenate([[0], np.cumsum(np.bincount(codes, minlength=4))]))
    for i, p in enumerate(perm):  # point i of the index is point p of the input, labels and all
        np.testing.assert_array_equal(index.label_ids[index.label_ptr[i]:index.label_ptr[i + 1]], [10 * p, 10 * p + 1])


def _integer_points(seed, n=240, d=10, cells=12):
    """Small-integer vectors (every dot product exact in float32, many ties) sorted by a cell
    code, with the cells' CSR pointer: the inputs of cell_rows and refine_rows."""
    rs = np.random.default_rng(seed)
    P = rs.integers(-3, 4, size=(n, d)).astype(np.float32)
    P[5] = P[4]  # exact duplicates: their ties go to the lower index
    codes = np.sort(rs.integers(0, cells, n)).astype(np.int64)
    ptr = np.zeros(cells + 1, np.int64)
    np.cumsum(np.bincount(codes, minlength=cells), out=ptr[1:])
    return P, codes, ptr


def _best(P, i, pool, M):
    """The M best of `pool` for point i by P[i] . P[j] (float64, exact here), i left out, ties to
    the lower index; -1 pads."""
    pool = np.array(sorted(set(int(j) for j in pool) - {i}), np.int64)
    s = P[pool].astype(np.float64) @ P[i].astype(np.float64)
    top = pool[np.lexsort((pool, -s))][:M]
    return np.concatenate([top, -np.ones(M - top.size, np.int64)])


def test_cell_rows_equal_a_numpy_search_of_the_near_cells_and_knn_rows_with_every_cell():
    P, codes, ptr = _integer_points(3)
    n, A, M = P.shape[0], ptr.size - 1, 7
    rs = np.random.default_rng(4)
    near = np.stack([np.concatenate([[a], rs.choice(np.setdiff1d(np.arange(A), [a]), 2, replace=False)])
                     for a in range(A)]).astype(np.int32)
    near[0, 2] = -1  # an ignored slot
    got = np.empty((n, M), np.int32)
    NB.cell_rows(P, codes, ptr, near, 0, n, M, got)
    for i in range(n):
        pool = np.concatenate([np.arange(ptr[c], ptr[c + 1]) for c in near[codes[i]] if c >= 0])
        np.testing.assert_array_equal(got[i], _best(P, i, pool, M))
    part = np.empty((50, M), np.int32)
    NB.cell_rows(P, codes, ptr, near, 100, 150, M, part)
    np.testing.assert_array_equal(part, got[100:150])  # any row range: what ranks share
    every = np.tile(np.arange(A, dtype=np.int32), (A, 1))  # all cells: the exact graph
    NB.cell_rows(P, codes, ptr, every, 0, n, M, got)
    np.testing.assert_array_equal(got, NB.knn_rows(P, 0, n, M))


def test_refine_rows_take_the_best_of_the_neighbours_neighbours_and_never_lose():
    P, codes, ptr = _integer_points(5)
    n, M = P.shape[0], 6
    rs = np.random.default_rng(6)
    G = np.stack([rs.choice(np.setdiff1d(np.arange(n), [i]), M, replace=False) for i in range(n)]).astype(np.int32)
    G[9, 3:] = -1  # a short row
    got = np.empty((n, M), np.int32)
    NB.refine_rows(P, G, 0, n, got)
    S = P.astype(np.float64) @ P.astype(np.float64).T
    for i in range(n):
        pool = [j for j in G[i] if j >= 0] + [v for j in G[i] if j >= 0 for v in G[j] if v >= 0]
        np.testing.assert_array_equal(got[i], _best(P, i, pool, M))
        old = sorted((S[i, j] for j in G[i] if j >= 0), reverse=True)
        assert all(S[i, got[i, t]] >= old[t] for t in range(len(old)))


def test_the_approximate_graph_finds_most_of_the_exact_neighbours():
    """On clustered points, the cells of k-means anchors and one neighbour-of-neighbour round
    find at least 95% of the exact graph's links; with every cell near, all of them."""
    from dslide.lsh.kmeans import kmeans, nearest

    X, _ = _clusters(7, n=1500, d=16, k=40, noise=0.4)
    A = 60
    C = kmeans(X, A, 1)
    codes = nearest(X, C, 1)[:, 0]
    labels = (np.arange(1501, dtype=np.int64), np.zeros(1500, np.int32))
    exact = lsh.NeighborIndex.build(X, codes, A, *labels, M=8, R=0)
    approx = lsh.NeighborIndex.build(X, codes, A, *labels, M=8, R=0, near=NB.near_cells(C, 6))
    every = lsh.NeighborIndex.build(X, codes, A, *labels, M=8, R=0, near=NB.near_cells(C, A))
    def found(g):
        return np.mean([len(np.intersect1d(g.graph[i], exact.graph[i])) / 8 for i in range(1500)])

    assert found(approx) >= 0.95
    # BLAS against the kernel's own sums may swap near-equal links (the integer test above is exact)
    assert found(every) >= 0.999
    nc = NB.near_cells(C, 6)
    assert (nc[:, 0] == np.arange(A)).all()  # a cell is its own nearest
    with pytest.raises(ValueError, match="near"):
        lsh.NeighborIndex.build(X, codes, A, *labels, M=8, R=0, near=nc[:5])
