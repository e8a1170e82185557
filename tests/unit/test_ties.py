"""The one order of tied scores (dslide.model.topk): higher score first, then the lower label id, the
same in the exact top k, the merge over ranks, the prediction files and every metric.

Before it was pinned, the exact top k kept an arbitrary member of a tie straddling the k-th
place (argpartition's choice), so `predict` and a metric computed from the score matrix
could rank different labels first."""

import numpy as np
import pytest
import scipy.sparse as sp

from dslide import metrics
from dslide.io import formats
from dslide.model.topk import best_columns, blocked_topk, merge_topk, scores_topk


def _reference(S: np.ndarray, k: int) -> np.ndarray:
    """Per row: the k best columns by (score desc, column asc), by one full lexsort."""
    cols = np.arange(S.shape[1])
    return np.array([np.lexsort((cols, -row))[:k] for row in S], dtype=np.int64)


def _tied_scores(seed=0, n=40, m=60):
    # few distinct values: most rows tie across the k-th place
    return np.round(np.random.default_rng(seed).random((n, m)) * 3).astype(np.float32)


@pytest.mark.parametrize("k", [1, 3, 7, 40])
def test_the_exact_top_k_keeps_the_lower_ids_of_a_tie_across_the_cut(k):
    S = _tied_scores()
    want = _reference(S, k)
    np.testing.assert_array_equal(best_columns(S, k), want)
    _, ids = scores_topk(S, k, 0)
    np.testing.assert_array_equal(ids, want)
    # blocked over column blocks: x = I, neuron-major W = S^T gives x W^T + 0 = S
    n, m = S.shape
    _, ids = blocked_topk(np.eye(n, dtype=np.float32), np.ascontiguousarray(S.T), np.zeros(m, np.float32), k, 0,
                          block=max(k, 8))
    np.testing.assert_array_equal(ids, want)


def test_the_merge_over_ranks_gives_what_one_rank_gives():
    S = _tied_scores(1)
    k = 5
    bounds = [0, 17, 31, S.shape[1]]  # uneven slices, as three ranks own them
    parts = [scores_topk(S[:, lo:hi], k, lo) for lo, hi in zip(bounds[:-1], bounds[1:])]
    s, ids = merge_topk(np.stack([p[0] for p in parts]), np.stack([p[1] for p in parts]), k)
    np.testing.assert_array_equal(ids, _reference(S, k))
    np.testing.assert_array_equal(s, np.take_along_axis(S, ids, axis=1))


def test_ids_text_csr_and_scores_give_the_same_metrics(tmp_path):
    S = _tied_scores(2).astype(np.float64)
    n, L = S.shape
    k = 5
    scores, ids = scores_topk(S, k, 0)
    rng = np.random.default_rng(3)
    Y = sp.csr_matrix((rng.random((n, L)) < 0.1).astype(np.float32))
    want = metrics.evaluate(Y, ids, k=k)
    assert metrics.evaluate(Y, S, k=k) == want  # the dense score matrix, every label a candidate
    assert metrics.evaluate(Y, formats.predictions_csr(ids, scores, L), k=k) == want
    for fmt in ("text", "npz"):
        path = tmp_path / f"p.{fmt}"
        formats.write_predictions(str(path), ids, scores, L, fmt=fmt)
        back_ids, back_scores = formats.read_predictions(str(path))
        np.testing.assert_array_equal(back_ids, ids)
        np.testing.assert_array_equal(back_scores, scores)
        assert metrics.evaluate(Y, back_ids, k=k) == want


def test_scores_a_float32_copy_would_tie_keep_their_order_in_the_files(tmp_path):
    # fused scores are float64: two that differ below float32's precision must not swap
    ids = np.array([[7, 3]])
    scores = np.array([[0.31093752000001, 0.31093752]])
    assert np.float32(scores[0, 0]) == np.float32(scores[0, 1])
    for fmt in ("text", "npz"):
        path = tmp_path / f"p.{fmt}"
        formats.write_predictions(str(path), ids, scores, 10, fmt=fmt)
        np.testing.assert_array_equal(formats.read_predictions(str(path))[0], ids)
    assert metrics.precision_at_k(sp.csr_matrix(([1.0], ([0], [7])), shape=(1, 10)),
                                  formats.predictions_csr(ids, scores, 10), k=1)[0] == 1.0


def _pyxclib_read_sparse_file(path):
    """pyxclib's `read_sparse_file` with its defaults (header=True, safe_read=True): a header
    `n_rows n_cols`, then per row `i:v` pairs whose indices must be sorted and unique."""
    with open(path) as f:
        n, m = (int(t) for t in f.readline().split())
        rows, cols, vals = [], [], []
        for r, line in enumerate(f):
            idx = [int(t.split(":")[0]) for t in line.split()]
            if any(b <= a for a, b in zip(idx, idx[1:])):
                raise ValueError(f"Feature indices at row {r} should be sorted and unique")
            for tok in line.split():
                i, v = tok.split(":")
                rows.append(r), cols.append(int(i)), vals.append(np.float32(v))
    assert r == n - 1
    return sp.csr_matrix((vals, (rows, cols)), shape=(n, m), dtype=np.float32)


def test_the_text_file_is_what_pyxclib_reads_with_its_defaults(tmp_path):
    ids = np.array([[3, 0, -1], [1, 2, 0]])
    scores = np.array([[2.5, -1.0, 0.0], [0.75, 0.5, -3.0]])
    formats.write_predictions(str(tmp_path / "p.txt"), ids, scores, 4)
    assert (tmp_path / "p.txt").read_text().splitlines() == ["2 4", "0:-1.0 3:2.5", "0:-3.0 1:0.75 2:0.5"]
    P = _pyxclib_read_sparse_file(tmp_path / "p.txt")
    np.testing.assert_array_equal(P.toarray(), [[-1.0, 0, 0, 2.5], [-3.0, 0.75, 0.5, 0]])
    back_ids, back_scores = formats.read_predictions(str(tmp_path / "p.txt"), k=3)
    np.testing.assert_array_equal(back_ids, ids)  # best first again, -1 past the row's entries
    np.testing.assert_array_equal(back_scores[ids >= 0], scores[ids >= 0])


@pytest.mark.parametrize("threads", [1, 2])
def test_the_top_k_of_a_block_with_ties_and_fewer_columns_than_k_matches_a_full_sort(threads):
    """scores_topk's kernel (rows split over threads) against one lexsort per row: ties
    straddling the cut, a block narrower than k (padded with -inf and -1), -inf scores."""
    import numba

    S = _tied_scores(4, n=33, m=50)
    S[::5, ::3] = -np.inf
    old = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        for k in (1, 4, 9, 30):  # 30: the heap many levels deep, most pushes ties
            s, ids = scores_topk(S, k, 100)
            want = _reference(S, k)
            np.testing.assert_array_equal(ids, want + 100)
            np.testing.assert_array_equal(s, np.take_along_axis(S, want, axis=1))
        narrow = _tied_scores(5, n=33, m=3)  # finite: a -inf score ranks with the padding
        s, ids = scores_topk(narrow, 5, 0)
        np.testing.assert_array_equal(ids[:, :3], _reference(narrow, 3))
        assert (ids[:, 3:] == -1).all() and np.isneginf(s[:, 3:]).all()
    finally:
        numba.set_num_threads(old)


def _offered_one_by_one(S, k, first):
    """Per row: every score offered to the sorted buffer in column order through push_top, called
    from Python one score at a time (no run of columns passed over): the kernel's semantics."""
    from dslide.lsh._topk import push_top

    top_s, top_i = np.full((S.shape[0], k), -np.inf), np.full((S.shape[0], k), -1, dtype=np.int64)
    for r in range(S.shape[0]):
        for c in range(S.shape[1]):
            push_top(top_s, top_i, r, k, k, np.float64(S[r, c]), first + c)
    return top_s, top_i


@pytest.mark.parametrize("m", [15, 16, 17, 48, 61])
def test_passing_over_runs_of_low_scores_keeps_what_one_by_one_offers_keep(m):
    """`_push_block` passes over runs of SCAN_RUN columns below the k-th score: widths around the
    run, ties on the k-th score inside and across runs, -inf, and NaN (let in, as push_top lets
    it) give the buffer a score-by-score push gives."""
    from dslide.model.topk import SCAN_RUN

    assert 15 <= SCAN_RUN <= 16  # the widths above straddle one run and end inside a run
    rng = np.random.default_rng(m)
    S = np.round(rng.standard_normal((30, m)) * 1.5).astype(np.float32)
    S[rng.random(S.shape) < 0.1] = -np.inf
    S[rng.random(S.shape) < 0.03] = np.nan
    S[3] = 1.0  # one row all tied
    for k in (1, 5, 20):
        s, ids = scores_topk(S, k, 7)
        want_s, want_i = _offered_one_by_one(S, k, 7)
        np.testing.assert_array_equal(ids, want_i)
        np.testing.assert_array_equal(s, want_s)
    # blocked: the buffer carried from block to block (here 2 and 3 blocks of columns)
    X = np.eye(30, dtype=np.float32)
    finite = np.nan_to_num(S, nan=0.5, neginf=-9.0)
    for block in (m // 2 + 1, m // 3 + 1):
        s, ids = blocked_topk(X, np.ascontiguousarray(finite.T), np.zeros(m, np.float32), 20, 4, block=block)
        want_s, want_i = _offered_one_by_one(finite, 20, 4)
        np.testing.assert_array_equal(ids, want_i)
        np.testing.assert_array_equal(s, want_s)


@pytest.mark.parametrize("seed", range(4))
def test_the_floor_of_group_maxima_keeps_what_one_by_one_offers_keep(seed, monkeypatch):
    """`_push_floor` (a top k of FLOOR_MIN_K or more over a block of FLOOR_MIN_GROUP * k columns or
    more) sorts only the scores that reach the k-th largest group maximum: ties at that floor and at
    the k-th place, -inf, +inf, -0.0 beside 0.0, columns in no group, a NaN (its row offered score
    by score) and a buffer carried from block to block give the buffer a score-by-score push gives."""
    from dslide.model import topk

    def narrow_kernel(*args):
        raise AssertionError("a block this wide goes through _push_floor")

    monkeypatch.setattr(topk, "_push_block", narrow_kernel)
    rng = np.random.default_rng(seed)
    k = topk.FLOOR_MIN_K + 5 * seed
    m = topk.FLOOR_GROUP * k + 9 * seed + 5  # the last m % FLOOR_GROUP columns in no group
    S = np.round(rng.standard_normal((14, m)) * 2).astype(np.float32)  # few values: ties everywhere
    S[1] = rng.standard_normal(m)
    S[2, ::3] = -np.inf
    S[3, [5, m - 1]] = np.inf
    S[4] = 0.0
    S[4, ::2] = -0.0
    S[5, m // 2] = np.nan
    S[6, m - 2] = np.nan  # in the columns of no group
    S[7] = -np.inf  # every score ranks after the padding
    S[8] = 1.0
    S[9, :m // 2] = -np.inf  # half the groups' maxima -inf
    S[10, rng.integers(0, m, 3 * k)] = 50.0  # more than k scores tie at the top
    S[11] = rng.random(m)
    S[11, :k - 1] = 100.0 + np.arange(k - 1)  # k - 1 groups far above the rest: the floor below them
    want_s, want_i = _offered_one_by_one(S, k, 7)
    for got_s, got_i in (scores_topk(S, k, 7),  # one block; then the buffer carried over two
                         topk._merge_block(topk._merge_block(topk._none(14, k), S[:, :m // 2], k, 7), S[:, m // 2:], k,
                                           7 + m // 2)):
        np.testing.assert_array_equal(got_i, want_i)
        np.testing.assert_array_equal(got_s, want_s)
    # blocked_topk over tiles of rows and of columns (x the identity: the scores are Wn's columns)
    B = topk.TILE_ROWS + 20
    F = np.round(rng.standard_normal((B, m)) * 2).astype(np.float32)
    s, ids = blocked_topk(np.eye(B, dtype=np.float32), np.ascontiguousarray(F.T), np.zeros(m, np.float32), k, 3,
                          block=m // 2 + 1)
    want_s, want_i = _offered_one_by_one(F, k, 3)
    np.testing.assert_array_equal(ids, want_i)
    np.testing.assert_array_equal(s, want_s)


@pytest.mark.parametrize("kind", ["dense", "csr"])
def test_the_products_made_once_under_several_biases_give_each_biases_own_top_k(kind):
    """blocked_topk_biases over tiles of rows and columns (ties, a column block narrower than k,
    the floor's blocks and the one-by-one ones) gives for each bias vector what blocked_topk with
    that vector gives, bit for bit, and the dense output layer's topk under biases what it gives
    with each as its `b`."""
    from dslide.model import topk

    rng = np.random.default_rng(5)
    B, d, n, k = topk.TILE_ROWS + 9, 6, 3 * topk.FLOOR_GROUP * topk.FLOOR_MIN_K + 17, topk.FLOOR_MIN_K
    x = np.round(rng.standard_normal((B, d)) * 2).astype(np.float32)
    x = sp.csr_matrix(x) if kind == "csr" else x
    Wn = np.round(rng.standard_normal((n, d)) * 2).astype(np.float32)
    biases = [np.zeros(n, np.float32), np.round(rng.standard_normal(n)).astype(np.float32),
              -np.log(np.arange(1, n + 1, dtype=np.float32))]
    for kk, block in ((k, n // 2 + 1), (5, 700)):
        got = topk.blocked_topk_biases(x, Wn, biases, kk, 11, block=block)
        assert len(got) == len(biases)
        for b, (s, ids) in zip(biases, got):
            want_s, want_i = blocked_topk(x, Wn, b, kk, 11, block=block)
            np.testing.assert_array_equal(ids, want_i)
            np.testing.assert_array_equal(s, want_s)
            assert (np.diff(s, axis=1) <= 0).all()


def _merge_reference(S, I, k):
    """Per row: every rank's candidates in one Python sort by (score desc, id asc, missing last)."""
    P, B, kk = S.shape
    big = np.iinfo(np.int64).max
    out_s, out_i = [], []
    for r in range(B):
        cands = sorted(((S[p, r, j], I[p, r, j]) for p in range(P) for j in range(kk)),
                       key=lambda c: (-c[0], big if c[1] < 0 else c[1]))[:k]
        out_s.append([c[0] for c in cands])
        out_i.append([c[1] for c in cands])
    return np.array(out_s), np.array(out_i, dtype=np.int64)


@pytest.mark.parametrize("seed", range(6))
def test_the_merge_of_sorted_lists_equals_one_sort_of_every_candidate(seed):
    rng = np.random.default_rng(seed)
    P, B, kk = int(rng.integers(1, 5)), 30, int(rng.integers(1, 9))
    S = np.empty((P, B, kk))
    I = np.empty((P, B, kk), np.int64)
    for p in range(P):  # each rank's rows best first, over few distinct scores (ties across ranks)
        S[p], I[p] = scores_topk(np.round(rng.random((B, 3 * kk)) * 4), kk, 100 * p)
    S[:, :, -1][rng.random((P, B)) < 0.3] = -np.inf  # missing candidates
    I[np.isneginf(S)] = -1
    for k in sorted({1, kk, P * kk}):
        s, ids = merge_topk(S, I, k)
        want_s, want_i = _merge_reference(S, I, k)
        np.testing.assert_array_equal(ids, want_i)
        np.testing.assert_array_equal(s, want_s)


def test_a_row_out_of_order_is_merged_by_a_full_sort():
    S = np.array([[[1.0, 3.0, 2.0], [2.5, 0.5, 0.0]],    # rank 0: row 0 unsorted, row 1 sorted
                  [[4.0, 2.0, 1.5], [3.0, 2.5, 2.5]]])   # rank 1: sorted; a tie with rank 0's 2.5
    I = np.array([[[0, 1, 2], [1, 0, 2]], [[5, 4, 3], [3, 4, 5]]])
    s, ids = merge_topk(S, I, 4)
    np.testing.assert_array_equal(ids, [[5, 1, 2, 4], [3, 1, 4, 5]])
    np.testing.assert_array_equal(s, [[4.0, 3.0, 2.0, 2.0], [3.0, 2.5, 2.5, 2.5]])
