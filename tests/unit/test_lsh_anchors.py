"""Anchor tables (dslide/lsh/anchors.py, with kmeans.py and rerank.py) against numpy references
and on planted structure."""

import numpy as np
import pytest

from dslide import lsh
from dslide.lsh import anchors as A
from dslide.lsh import kmeans as KM
from dslide.lsh import rerank


def _planted(seed=0, n_items=4000, d=24, n_topics=40, n_queries=600):
    """Items of a few topics with biases spread like label priors; queries near topic centres
    (ReLU-like: non-negative). Each query's best items are its topic's items with high bias."""
    rs = np.random.default_rng(seed)
    centres = np.abs(rs.normal(size=(n_topics, d))).astype(np.float32)
    topic = rs.integers(0, n_topics, n_items)
    W = (centres[topic] + 0.6 * rs.normal(size=(n_items, d))).astype(np.float32)
    W *= rs.lognormal(0.0, 0.3, (n_items, 1)).astype(np.float32)
    b = (-12.0 + 3.0 * rs.random(n_items) ** 3).astype(np.float32)
    qt = rs.integers(0, n_topics, n_queries)
    Q = np.maximum(centres[qt] + 0.3 * rs.normal(size=(n_queries, d)), 0).astype(np.float32)
    return W, b, Q


def test_score_top_matches_numpy_with_ties_to_the_lower_index():
    rs = np.random.default_rng(1)
    W = rs.normal(size=(3000, 8)).astype(np.float32)
    W[100:110] = W[7]  # exact ties: the lower ids come first
    b = rs.normal(size=3000).astype(np.float32)
    b[100:110] = b[7]
    C = rs.normal(size=(70, 8)).astype(np.float32)  # more than one block of anchors
    ids, scores = A.score_top(C, W, b, 50)
    S = C @ W.T + b
    for a in range(C.shape[0]):
        ref = np.lexsort((np.arange(W.shape[0]), -S[a]))[:50]
        np.testing.assert_array_equal(ids[a], ref)
        np.testing.assert_allclose(scores[a], S[a, ref], rtol=1e-6)


def test_top_rows_when_the_sampled_threshold_misses():
    """A row whose large values all fall between the sampled positions: the selection must
    still be exact (it falls back to the whole row)."""
    n, T = 100_000, 64
    row = np.zeros((1, n), np.float32)
    step = n // 8192
    hidden = np.arange(1, n, step)[:T]  # never a sampled position (those are multiples of step)
    row[0, hidden] = np.linspace(5, 6, T, dtype=np.float32)
    ids = np.empty((1, T), np.int32)
    sc = np.empty((1, T), np.float32)
    A.top_rows(row, T, ids, sc)
    np.testing.assert_array_equal(ids[0], hidden[::-1])


def test_union_of_buckets_matches_numpy():
    rs = np.random.default_rng(2)
    L, n_anchors, T, n_items = 3, 9, 7, 40
    buckets = rs.integers(0, n_items, (L, n_anchors, T)).astype(np.int32)
    fill = rs.integers(0, T + 1, (L, n_anchors)).astype(np.int32)
    codes = rs.integers(0, n_anchors, (25, L)).astype(np.int32)
    mark = np.zeros(n_items, np.uint8)
    for limit in (1, 4, T):
        ref = set()
        for i in range(codes.shape[0]):
            for l in range(L):
                a = codes[i, l]
                ref.update(buckets[l, a, :min(limit, fill[l, a])].tolist())
        np.testing.assert_array_equal(A.union_of_buckets(codes, buckets, fill, limit, 0, mark), sorted(ref))
        assert not mark.any()
        # a cap takes rank by rank: every bucket's best before any second best
        for total in (1, 5, 12, 1000):
            got = A.union_of_buckets(codes, buckets, fill, limit, total, mark)
            seen, order = set(), []
            for t in range(limit):
                for i in range(codes.shape[0]):
                    for l in range(L):
                        a = codes[i, l]
                        j = int(buckets[l, a, t])
                        if t < min(limit, fill[l, a]) and j not in seen:
                            seen.add(j)
                            order.append(j)
            np.testing.assert_array_equal(got, sorted(order[:total]))
            assert not mark.any()


def test_union_per_query_is_each_querys_union_in_rank_order_skipping_marked_ids():
    """dslide.model.kernels.own_candidates (lsh.scope = "sample"): per query, the first k distinct
    ids of its buckets, rank by rank across the tables, leaving out the marked ones."""
    from dslide.model import kernels

    assert kernels.own_candidates is A.union_per_query
    rs = np.random.default_rng(3)
    L, n_anchors, T, n_items = 3, 9, 7, 40
    buckets = rs.integers(0, n_items, (L, n_anchors, T)).astype(np.int32)
    fill = rs.integers(0, T + 1, (L, n_anchors)).astype(np.int32)
    codes = rs.integers(0, n_anchors, (25, L)).astype(np.int32)
    skip = rs.choice(n_items, 6, replace=False)
    for k in (0, 1, 5, 30):
        mark = np.zeros(n_items, np.uint8)
        mark[skip] = 1
        out = np.full((codes.shape[0], k), 99, np.int32)
        cnt = A.union_per_query(codes, buckets, fill, k, mark, out)
        assert np.array_equal(np.flatnonzero(mark), np.sort(skip))  # as it went in
        for i in range(codes.shape[0]):
            order = []
            for t in range(T):
                for l in range(L):
                    a = codes[i, l]
                    j = int(buckets[l, a, t])
                    if t < fill[l, a] and j not in order and j not in skip:
                        order.append(j)
            want = order[:k]
            assert cnt[i] == len(want) and out[i, :cnt[i]].tolist() == want and (out[i, cnt[i]:] == -1).all()


def test_nearest_and_minibatch_step_match_numpy():
    rs = np.random.default_rng(3)
    C = rs.normal(size=(12, 5)).astype(np.float32)
    X = rs.normal(size=(30, 5)).astype(np.float32)
    d = ((X[:, None, :] - C[None]) ** 2).sum(-1)
    np.testing.assert_array_equal(KM.nearest(X, C, 1)[:, 0], d.argmin(1))
    np.testing.assert_array_equal(KM.nearest(X, C, 3), np.argsort(d, axis=1, kind="stable")[:, :3])
    codes = d.argmin(1).astype(np.int32)
    counts = rs.integers(0, 200, 12).astype(np.float64)
    C2, n2 = C.astype(np.float64), counts.copy()
    for i in range(X.shape[0]):  # the reference, one point at a time
        a = codes[i]
        n2[a] += 1
        C2[a] += (X[i] - C2[a]) / min(n2[a], 100.0)
    KM.minibatch_kmeans_step(C, counts, X, codes, 100.0)
    np.testing.assert_allclose(C, C2, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(counts, n2)


def test_kmeans_recovers_well_separated_clusters():
    rs = np.random.default_rng(4)
    centres = rs.normal(size=(6, 3)) * 20
    X = (centres[rs.integers(0, 6, 1200)] + rs.normal(size=(1200, 3))).astype(np.float32)
    C = KM.kmeans(X, 6, seed=0, iters=20)
    # every true centre has an anchor within 1.5 (noise sd 1)
    dist = np.sqrt(((centres[:, None, :] - C[None]) ** 2).sum(-1)).min(axis=1)
    assert dist.max() < 1.5, dist
    with pytest.raises(ValueError, match="at least 10 points"):
        KM.kmeans(X[:5], 10, seed=0)


def test_planted_structure_top1_retrieved_for_95_percent_of_queries_at_a_small_share():
    """Anchors from a sample of queries, buckets of 5% of the items: the exact top-1 (biases
    included) is retrieved for >= 95% of held-out queries; measured 0.998. A static shortlist of
    the 5% highest-bias items gets far less (measured 0.35), and random projections of the same
    items (SimHash over [w, b], 5% budget) too."""
    W, b, Q = _planted()
    fit_q, test_q = Q[:300], Q[300:]
    share = 0.05
    T = int(share * W.shape[0])
    tables = lsh.AnchorTables(W.shape[1], 1, 64, T, seed=0)
    tables.fit_anchors(fit_q)
    tables.fill(W, b)
    S = test_q @ W.T + b
    exact = np.argmax(S, axis=1)
    scores, ids, n_scored = tables.topk(test_q, W, b, 5)
    hit = (ids[:, 0] == exact).mean()
    static = np.argsort(-b)[:T]
    hit_static = np.isin(exact, static).mean()
    assert hit >= 0.95, hit
    assert hit_static < hit - 0.3, (hit_static, hit)
    assert np.all(n_scored == T)
    # exact re-ranking: the k best of each query's bucket, by numpy
    codes = tables.codes(test_q)[:, 0]
    for q in range(0, test_q.shape[0], 37):
        cand = tables.buckets[0, codes[q]]
        ref = cand[np.lexsort((cand, -S[q, cand]))[:5]]
        np.testing.assert_array_equal(ids[q], ref)
        np.testing.assert_allclose(scores[q], S[q, ref], rtol=1e-5)


@pytest.mark.parametrize("threads", [1, 2])
def test_grouped_rescoring_equals_numpy_per_query_with_ties_and_short_buckets(threads):
    """One table, one probe: queries are scored anchor by anchor (topk_by_anchor). Each query's
    result must be the k best of its own bucket by a float64 numpy product (ties to the lower
    id, -inf / -1 past a short bucket), whatever the grouping or thread count, and the same as
    the per-query kernel (topk_of_buckets) gives."""
    import numba

    rs = np.random.default_rng(11)
    m, d, n_anchors, k = 700, 16, 6, 7
    W = rs.normal(size=(m, d)).astype(np.float32)
    W[50:60] = W[3]  # exact ties
    b = rs.normal(size=m).astype(np.float32)
    b[50:60] = b[3]
    tables = lsh.AnchorTables(d, 1, n_anchors, 40, seed=2)
    tables.fit_anchors(rs.normal(size=(200, d)).astype(np.float32))
    # queries next to the anchors, 1, 3, 2, 5, 1 and 4 of them: single queries, odd and even groups
    per_anchor = [1, 3, 2, 5, 1, 4]
    Q = np.concatenate([tables.anchors[0, a] + 0.01 * rs.normal(size=(c, d)) for a, c in enumerate(per_anchor)])
    Q = Q.astype(np.float32)[rs.permutation(sum(per_anchor))]
    buckets = np.stack([np.sort(rs.choice(np.arange(100, m), 40, replace=False)) for _ in range(n_anchors)])[None]
    buckets = buckets.astype(np.int32)
    buckets[0, :, :3] = [3, 50, 51]  # the tied items in every bucket
    buckets[0] = np.sort(buckets[0], axis=1)
    fill = np.full((1, n_anchors), 40, np.int32)
    fill[0, 1] = 4  # fewer than k items: the rest is -inf / -1
    fill[0, 2] = 38  # not a multiple of the 4 items scored at a time...
    fill[0, 4] = 39
    b[buckets[0, 2, 37]] = b[buckets[0, 4, 38]] = 50.0  # ...and the last one is every query's best
    tables.set_buckets(buckets, fill)
    old = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        scores, ids, n_scored = tables.topk(Q, W, b, k)
    finally:
        numba.set_num_threads(old)
    codes = tables.codes(Q)[:, 0]
    np.testing.assert_array_equal(np.bincount(codes, minlength=n_anchors), per_anchor)
    S = Q.astype(np.float64) @ W.T.astype(np.float64) + b
    for q in range(Q.shape[0]):
        cand = buckets[0, codes[q], :fill[0, codes[q]]]
        ref = cand[np.lexsort((cand, -S[q, cand]))[:k]]
        np.testing.assert_array_equal(ids[q, :ref.size], ref)
        np.testing.assert_allclose(scores[q, :ref.size], S[q, ref], rtol=1e-5, atol=1e-5)
        assert np.all(ids[q, ref.size:] == -1) and np.all(np.isneginf(scores[q, ref.size:]))
        assert n_scored[q] == cand.size
    per_query = [np.empty((Q.shape[0], k)), np.empty((Q.shape[0], k), np.int64), np.empty(Q.shape[0], np.int64)]
    rerank.topk_of_buckets(Q, W, b, codes[:, None].astype(np.int32), tables.buckets, tables.fill_count, k,
                      np.zeros((2, m), np.uint8), np.zeros(Q.shape[0] + 1, np.int64), np.zeros(0, np.int32),
                      *per_query)
    np.testing.assert_array_equal(ids, per_query[1])
    np.testing.assert_array_equal(n_scored, per_query[2])


def test_grouped_rescoring_gives_an_item_the_same_bits_from_any_place_or_path():
    """A label's score from topk_by_anchor must not depend on where it sat: in a full block of
    four or the short last one, in a bucket or among a query's extras, beside an even or odd
    number of queries (a layer split over P ranks puts its labels at other places in other
    buckets: the scores must be the 1-rank ones bit for bit). Every pair's bits are compared
    across five layouts, d = 100 (not a multiple of any vector width)."""
    rs = np.random.default_rng(23)
    m, d, n = 41, 100, 5
    W = rs.normal(size=(m, d)).astype(np.float32)
    b = rs.normal(size=m).astype(np.float32)
    X = rs.normal(size=(n, d)).astype(np.float32)
    every = np.arange(m, dtype=np.int32)

    def scores(bucket, extras, groups):
        """{(query, item): score} with one anchor's bucket, each query's extras, queries grouped."""
        bucket = np.sort(np.asarray(bucket, np.int32))
        buckets = np.full((1, len(groups), m), np.iinfo(np.int32).max, np.int32)
        buckets[0, :, :bucket.size] = bucket
        fill = np.full((1, len(groups)), bucket.size, np.int32)
        order = np.concatenate(groups).astype(np.int64)
        gptr = np.concatenate([[0], np.cumsum([len(g) for g in groups])]).astype(np.int64)
        xptr = np.arange(n + 1, dtype=np.int64) * len(extras)
        xids = np.tile(np.asarray(extras, np.int32), n)
        S, I, N = np.empty((n, m)), np.empty((n, m), np.int64), np.empty(n, np.int64)
        rerank.topk_by_anchor(X, W, b, order, gptr, np.arange(len(groups), dtype=np.int64), buckets, fill, m, 1,
                              xptr, xids, S, I, N)
        assert np.all(N == m) and np.all(np.sort(I, axis=1) == every)
        return {(q, int(j)): S[q, t] for q in range(n) for t, j in enumerate(I[q])}

    layouts = [scores(every, [], [[0, 1, 2, 3, 4]]),
               scores(every[1::2], every[::2], [[0, 1], [2, 3, 4]]),
               scores(every[5:], every[:5], [[4], [0, 2], [1, 3]]),
               scores(every[:-3], every[-3:], [[3, 1, 4, 0, 2]]),
               scores([], every, [[0], [1], [2], [3], [4]])]
    for other in layouts[1:]:
        assert all(other[key] == v for key, v in layouts[0].items())  # the same bits
    S = X.astype(np.float64) @ W.T.astype(np.float64) + b
    got = np.array([[layouts[0][(q, j)] for j in range(m)] for q in range(n)])
    np.testing.assert_allclose(got, S, rtol=1e-5, atol=1e-5)


def test_probes_union_their_buckets():
    W, b, Q = _planted(seed=5, n_items=600)
    tables = lsh.AnchorTables(W.shape[1], 2, 16, 20, seed=3)
    tables.fit_anchors(Q[:200])
    tables.fill(W, b)
    q = Q[200:230]
    _, _, n1 = tables.topk(q, W, b, 3, probes=1)
    _, _, n2 = tables.topk(q, W, b, 3, probes=2)
    codes = tables.codes(q, probes=2)  # [n, L * 2]: table 0's two nearest, then table 1's
    for i in range(q.shape[0]):
        want = set()
        for col in range(4):
            want.update(tables.buckets[col // 2, codes[i, col]].tolist())
        assert n2[i] == len(want)
        one = set(tables.buckets[0, codes[i, 0]].tolist()) | set(tables.buckets[1, codes[i, 2]].tolist())
        assert n1[i] == len(one)


def test_observe_places_then_moves_anchors_and_errors_are_clear():
    tables = lsh.AnchorTables(4, 1, 8, 3, seed=1)
    with pytest.raises(ValueError, match="no anchors yet"):
        tables.codes(np.zeros((2, 4), np.float32))
    x = np.arange(20, dtype=np.float32).reshape(5, 4)
    assert not tables.observe(x)  # 5 of the 8 inputs needed
    assert tables.observe(x + 100)  # now 10: 8 of them become the anchors
    rows = {tuple(r) for r in np.concatenate([x, x + 100])}
    assert all(tuple(a) in rows for a in tables.anchors[0])
    before = tables.anchors.copy()
    tables.observe(np.full((3, 4), 1000.0, np.float32))
    assert not np.array_equal(before, tables.anchors)
    with pytest.raises(ValueError, match=r"shape \[n, 4\]"):
        tables.observe(np.zeros((2, 5), np.float32))


def test_kmeans_in_small_blocks_of_distances_gives_the_same_anchors():
    """k-means' distances taken 7 rows at a time (and kmeans_block's byte cap) give what
    one block of every row gives."""
    rs = np.random.default_rng(3)
    X = (rs.normal(size=(6, 5))[rs.integers(0, 6, 400)] + 0.3 * rs.normal(size=(400, 5))).astype(np.float32)
    np.testing.assert_allclose(KM.kmeans(X, 6, seed=0, iters=10, block=7), KM.kmeans(X, 6, seed=0, iters=10),
                               rtol=1e-5, atol=1e-6)
    assert KM.kmeans_block(2048) == A.SCORE_BLOCK_BYTES // (4 * 2048) == 4096
    assert KM.kmeans_block(256) == 8192 and KM.kmeans_block(1 << 40) == 1
