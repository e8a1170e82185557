"""lsh._topk.push_top, the top-k buffer of the re-ranking and graph kernels, against numpy sorting:
the k best by score, ties to the lower id, whatever order the candidates arrive in."""

import numpy as np
import pytest
from numba import njit

from dslide.lsh._topk import better, push_top


@njit
def _offer_growing(scores, ids, k, rows, r):
    """Offer every candidate to row r of an empty buffer; returns (scores, ids) of its filled part."""
    top_s = np.full((rows, k), 7.0)
    top_i = np.full((rows, k), 7, np.int64)
    size = 0
    for t in range(scores.shape[0]):
        size = push_top(top_s, top_i, r, size, k, scores[t], ids[t])
    return top_s[r, :size].copy(), top_i[r, :size].copy()


@njit
def _offer_full(scores, ids, k):
    """The anchors kernels' use: a buffer prefilled with (-inf, -1), pushed with size = k."""
    top_s = np.full((1, k), -np.inf)
    top_i = np.full((1, k), -1, np.int64)
    for t in range(scores.shape[0]):
        push_top(top_s, top_i, 0, k, k, scores[t], ids[t])
    return top_s[0].copy(), top_i[0].copy()


def _reference(scores, ids, k):
    order = np.lexsort((ids, -scores))[:k]  # score descending, then id ascending
    return scores[order], ids[order]


def _cases(n_cases=300):
    rng = np.random.default_rng(26)
    for case in range(n_cases):
        n = int(rng.integers(0, 40))
        k = int(rng.integers(1, 12))
        levels = int(rng.integers(1, 6)) if case % 2 else 1000  # few distinct scores: many ties
        scores = rng.integers(0, levels, n).astype(np.float64) / 4.0
        ids = rng.permutation(1000)[:n].astype(np.int64)  # distinct, in random order
        yield scores, ids, k


def test_a_growing_buffer_keeps_the_k_best_ties_to_the_lower_id():
    for scores, ids, k in _cases():
        want_s, want_i = _reference(scores, ids, k)
        for rows, r in ((1, 0), (3, 2)):
            got_s, got_i = _offer_growing(scores, ids, k, rows, r)
            np.testing.assert_array_equal(got_i, want_i)
            np.testing.assert_array_equal(got_s, want_s)


def test_a_prefilled_full_buffer_keeps_the_k_best_and_pads_with_minus_inf():
    for scores, ids, k in _cases():
        pad = max(0, k - scores.size)
        want_s, want_i = _reference(np.concatenate([scores, np.full(pad, -np.inf)]),
                                    np.concatenate([ids, np.full(pad, -1)]), k)
        got_s, got_i = _offer_full(scores, ids, k)
        np.testing.assert_array_equal(got_i, want_i)
        np.testing.assert_array_equal(got_s, want_s)


def test_the_kth_score_is_numpys_kth_largest():
    """The buffer's last score is what np.argpartition puts at position n - k."""
    for scores, ids, k in _cases():
        if scores.size < k:
            continue
        kth = scores[np.argpartition(scores, scores.size - k)[scores.size - k]]
        got_s, _ = _offer_growing(scores, ids, k, 1, 0)
        assert got_s[-1] == kth


def test_a_tie_with_the_last_entry_keeps_the_lower_id_in_either_order():
    for order in ((5, 3), (3, 5)):
        got_s, got_i = _offer_growing(np.array([2.0, 1.0, 1.0]), np.array([9, *order]), 2, 1, 0)
        assert got_i.tolist() == [9, 3] and got_s.tolist() == [2.0, 1.0]


@pytest.mark.parametrize("a, b, want", [((1.0, 4), (0.5, 1), True), ((0.5, 1), (1.0, 4), False),
                                        ((1.0, 2), (1.0, 3), True), ((1.0, 3), (1.0, 2), False)])
def test_better_is_larger_score_then_lower_id(a, b, want):
    assert njit(lambda s1, i1, s2, i2: better(s1, i1, s2, i2))(*a, *b) is want
