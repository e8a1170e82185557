"""Extreme-classification (XMC) ranking metrics: P@k, nDCG@k and their propensity-scored forms.

The definitions follow pyxclib (``xclib.evaluation.xc_metrics``), the reference
implementation behind the Extreme Classification Repository tables:

* every point counts in the mean, including points with no true label, which
  contribute 0 (pyxclib's default, ``Metrics(remove_invalid=False)``, and what its
  ``precision``/``ndcg`` functions always do). On test sets with label-less
  points this lowers every score a little; drop those rows from both Y and pred
  beforehand to get the other convention;
* a label is relevant when its entry in ``Y`` is non-zero (pyxclib would weight
  a hit by the stored value; for 0/1 label matrices the two agree);
* PSP@k and PSnDCG@k are ratios of sums over the whole data set (see
  :func:`psprecision_at_k` and :func:`psndcg_at_k`), not means of per-point ratios.

Predictions come in three forms, all reduced first to a top-k index array
``int64 [n, k]`` ordered best first, with -1 for "no prediction":

* an integer ndarray ``[n, k']``, ``k' >= k``: label indices already ranked best
  first (only the first ``k`` columns are read; -1 means no prediction and counts
  as wrong; a label may appear at most once among them);
* a floating (or bool) ndarray ``[n, L]``: one score per label, every label a
  candidate;
* a scipy sparse matrix ``[n, L]``: scores, and only stored entries (even stored
  zeros) are candidates; a row with fewer than ``k`` entries is padded with -1.

Score ties are broken by the lower label index (dslide.model.topk, the one order of ties
used by predict and the prediction files too), so results never depend on sort
internals. Everything is vectorised over points (no Python loop per point): true
labels are looked up with one ``searchsorted`` over the row-major keys
``i * L + j`` of ``Y`` (O(n k log nnz(Y))); top-k from scores is a row-wise
partition (dense scores, or sparse rows padded to a common width), falling back
to one stable sort of all stored entries when sparse rows are very uneven.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from dslide.model.topk import best_columns

__all__ = [
    "precision_at_k",
    "ndcg_at_k",
    "psprecision_at_k",
    "psndcg_at_k",
    "inverse_propensity",
    "evaluate",
    "precision_from_hits",
]

# Dense top-k works on row blocks of about this many scores, to bound the
# temporaries (partition copy, masks, tie ranks) to a few tens of MB.
_DENSE_BLOCK = 1 << 21
# Sparse top-k pads rows into a dense block when that block is at most this many
# times nnz (plus one slot per row); otherwise it sorts all stored entries once.
_PAD_MAX_RATIO = 4


# ----------------------------------------------------------------------------
# Input checking and reduction to a top-k index array
# ----------------------------------------------------------------------------


def _check_k(k) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k ({k!r}) must be a positive integer")
    return int(k)


def _binary_labels(Y) -> sp.csr_matrix:
    """Y as a canonical csr (sorted indices, no duplicates, no stored zeros); never mutates Y."""
    if not sp.issparse(Y):
        raise ValueError(
            f"Y must be a scipy sparse matrix [n_points, n_labels], got {type(Y).__name__}"
        )
    if Y.ndim != 2:
        raise ValueError(f"Y must be 2-D [n_points, n_labels], got shape {Y.shape}")
    if Y.shape[0] == 0:
        raise ValueError(f"Y has no points (shape {Y.shape}); metrics are means over points")
    Yc = Y.tocsr()
    # Explicit zeros are not relevant labels, and the key lookup needs sorted,
    # unique column indices per row; copy before fixing so the caller's Y is untouched.
    if not Yc.has_canonical_format or (Yc.data == 0).any():
        Yc = Yc.copy() if Yc is Y else Yc
        Yc.sum_duplicates()
        Yc.eliminate_zeros()
    return Yc


def _check_inv_prop(inv_prop, n_labels: int) -> np.ndarray:
    w = np.asarray(inv_prop, dtype=np.float64)
    if w.shape != (n_labels,):
        raise ValueError(
            f"inv_prop must have shape (n_labels,) = ({n_labels},), got {w.shape}"
        )
    if not np.isfinite(w).all() or (w < 0).any():
        bad = np.flatnonzero(~np.isfinite(w) | (w < 0))[0]
        raise ValueError(
            f"inv_prop must be finite and >= 0; inv_prop[{bad}] = {w[bad]!r}"
        )
    return w


def _topk_from_indices(pred: np.ndarray, n: int, L: int, k: int) -> np.ndarray:
    if pred.ndim != 2 or pred.shape[0] != n or pred.shape[1] < k:
        raise ValueError(
            f"top-k prediction array must have shape (n_points, k') with n_points = {n} "
            f"and k' >= k = {k}, got {pred.shape}"
        )
    head = pred[:, :k]
    # Checked before the cast so huge unsigned values cannot wrap onto -1.
    bad = (head < -1) | (head >= L)
    if bad.any():
        i, r = np.argwhere(bad)[0]
        raise ValueError(
            f"predicted label pred[{i}, {r}] = {head[i, r]} is out of range: "
            f"valid labels are 0..{L - 1}, or -1 for no prediction"
        )
    top = np.ascontiguousarray(head, dtype=np.int64)
    # A repeated label would be counted as several hits and inflate P@k.
    s = np.sort(top, axis=1)
    dup = (s[:, 1:] == s[:, :-1]) & (s[:, 1:] >= 0)
    if dup.any():
        i, r = np.argwhere(dup)[0]
        raise ValueError(
            f"row {i} of the top-k prediction array repeats label {s[i, r + 1]} "
            f"among its first {k} entries; each label may be predicted once per point"
        )
    return top


def _check_no_nan(values: np.ndarray, where) -> None:
    if np.isnan(values).any():
        first = np.flatnonzero(np.isnan(values.ravel()))[0]
        raise ValueError(
            f"score matrix has NaN at {where(first)}; scores must be comparable "
            f"(use -inf for 'never predict')"
        )


def _topk_from_dense(S: np.ndarray, n: int, L: int, k: int) -> np.ndarray:
    if S.shape != (n, L):
        raise ValueError(
            f"dense score matrix must have the shape of Y, (n_points, n_labels) = "
            f"({n}, {L}), got {S.shape}"
        )
    out = np.full((n, k), -1, dtype=np.int64)
    ke = min(k, L)
    if ke == 0:
        return out
    block = max(1, _DENSE_BLOCK // L)
    for lo in range(0, n, block):
        B = np.asarray(S[lo : lo + block])
        if B.dtype == np.bool_:
            B = B.astype(np.float32)
        _check_no_nan(B, lambda e: f"[{lo + e // L}, {e % L}]")
        out[lo : lo + B.shape[0], :ke] = best_columns(B, ke)
    return out


def _topk_rows_sparse(indptr, indices, data, n: int, k: int) -> np.ndarray:
    """Top-k column indices per row of a canonical csr, by (data desc, column asc); -1 pads.

    indptr: int [n + 1]; indices: int [nnz] (sorted within rows); data: float [nnz], no NaN.
    Returns int64 [n, k].
    """
    counts = np.diff(indptr).astype(np.int64)
    nnz = len(data)
    out = np.full((n, k), -1, dtype=np.int64)
    if nnz == 0:
        return out
    width = int(counts.max())
    row = np.repeat(np.arange(n, dtype=np.int64), counts)
    pos = np.arange(nnz, dtype=np.int64) - np.repeat(indptr[:-1].astype(np.int64), counts)
    if n * width <= _PAD_MAX_RATIO * nnz + n:
        # Rows of similar length (the usual top-K prediction matrix): pad them
        # into a dense [n, width] block and partition each row, O(nnz) instead of
        # a global O(nnz log nnz) sort. Padding is -inf placed after the real
        # entries, and positions ascend with the column index, so "lower
        # position first" on ties is "lower label first" and real -inf scores
        # beat the padding.
        ke = min(k, width)
        block = max(1, _DENSE_BLOCK // width)
        for lo in range(0, n, block):
            hi = min(n, lo + block)
            a, b = int(indptr[lo]), int(indptr[hi])
            B = np.full((hi - lo, width), -np.inf)
            B[row[a:b] - lo, pos[a:b]] = data[a:b]
            top = best_columns(B, ke)
            first = indptr[lo:hi, None].astype(np.int64)
            real = top < counts[lo:hi, None]
            out[lo:hi, :ke] = np.where(real, indices[np.minimum(first + top, nnz - 1)], -1)
        return out
    # Very uneven rows: one stable lexicographic sort. Input is row-major with
    # columns ascending, so equal scores keep the lower label first, and each
    # row stays in its own slots (pos still indexes within the row).
    order = np.lexsort((-data, row))
    keep = pos < k
    out[row[keep], pos[keep]] = indices[order[keep]]
    return out


def _topk_from_sparse(P, n: int, L: int, k: int) -> np.ndarray:
    if P.shape != (n, L):
        raise ValueError(
            f"sparse score matrix must have the shape of Y, (n_points, n_labels) = "
            f"({n}, {L}), got {P.shape}"
        )
    P = P.tocsr()
    if not P.has_canonical_format:
        P = P.copy()
        P.sum_duplicates()
    data = np.asarray(P.data, dtype=np.float64)
    _check_no_nan(data, lambda e: f"[{np.searchsorted(P.indptr, e, side='right') - 1}, {P.indices[e]}]")
    return _topk_rows_sparse(P.indptr, P.indices, data, n, k)


def topk_of_sparse(P, k: int) -> np.ndarray:
    """The top k column indices of each row of the sparse score matrix P [n, L], best first,
    ties to the lower index, -1 past a row's stored entries: int64 [n, k] (as the metrics
    rank a sparse `pred`)."""
    return _topk_from_sparse(P, P.shape[0], P.shape[1], _check_k(k))


def _topk(pred, n: int, L: int, k: int) -> np.ndarray:
    if sp.issparse(pred):
        if pred.ndim != 2:
            raise ValueError(f"sparse score matrix must be 2-D, got shape {pred.shape}")
        return _topk_from_sparse(pred, n, L, k)
    if isinstance(pred, np.ndarray):
        if np.issubdtype(pred.dtype, np.integer):
            return _topk_from_indices(pred, n, L, k)
        if np.issubdtype(pred.dtype, np.floating) or pred.dtype == np.bool_:
            return _topk_from_dense(pred, n, L, k)
        raise ValueError(
            f"pred ndarray has dtype {pred.dtype}; use an integer dtype for top-k label "
            f"indices or a floating dtype for scores"
        )
    raise ValueError(
        f"pred must be an integer ndarray of top-k labels, a float ndarray of scores, or a "
        f"scipy sparse score matrix; got {type(pred).__name__}"
    )


# ----------------------------------------------------------------------------
# The per-point quantities every metric is built from
# ----------------------------------------------------------------------------


def _hits(Yc: sp.csr_matrix, top: np.ndarray) -> np.ndarray:
    """hits[i, r] = 1.0 if label top[i, r] is relevant to point i, else 0.0; float64 [n, k]."""
    n, L = Yc.shape
    counts = np.diff(Yc.indptr)
    ykeys = np.repeat(np.arange(n, dtype=np.int64) * L, counts) + Yc.indices
    if len(ykeys) == 0:
        return np.zeros(top.shape, dtype=np.float64)
    qkeys = (np.arange(n, dtype=np.int64) * L)[:, None] + top
    pos = np.minimum(np.searchsorted(ykeys, qkeys), len(ykeys) - 1)
    return ((ykeys[pos] == qkeys) & (top >= 0)).astype(np.float64)


def precision_from_hits(hits: np.ndarray) -> np.ndarray:
    """P@k' for k' = 1..k from hits float64 [n, k] (1.0 where point i's r-th prediction is one of
    its labels, as `_hits`): float64 [k], the mean over the n points of (hits of the first k') / k'."""
    ks = np.arange(1, hits.shape[1] + 1)
    return (np.cumsum(hits, axis=1) / ks).mean(axis=0)


def _discounts(k: int) -> np.ndarray:
    """1 / log2(r + 1) for ranks r = 1..k; float64 [k]."""
    return 1.0 / np.log2(np.arange(2, k + 2, dtype=np.float64))


def _ndcg_norm(Yc: sp.csr_matrix, k: int) -> np.ndarray:
    """Ideal DCG sum_{r <= min(k', |y_i|)} 1/log2(r+1) per point and k' = 1..k; float64 [n, k].

    Points with no labels get 1 (their DCG is 0, so they contribute 0, as in pyxclib).
    """
    cum = np.cumsum(_discounts(k))
    m = np.minimum(np.arange(1, k + 1)[None, :], np.diff(Yc.indptr)[:, None])
    return np.where(m > 0, cum[np.maximum(m, 1) - 1], 1.0)


def _ideal_weights(Yc: sp.csr_matrix, w: np.ndarray, k: int) -> np.ndarray:
    """Each point's k largest inverse propensities among its true labels, descending, 0-padded.

    float64 [n, k]: the weights of the best possible top-k prediction.
    """
    n = Yc.shape[0]
    top = _topk_rows_sparse(Yc.indptr, Yc.indices, w[Yc.indices], n, k)
    return np.where(top >= 0, w[np.maximum(top, 0)], 0.0)


def _safe_ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    # No relevant label anywhere (or all weights 0): the score is 0, like P@k.
    return np.divide(num, den, out=np.zeros_like(num), where=den > 0)


class _Prepared:
    """Validated inputs and the shared per-point arrays for one (Y, pred, k)."""

    def __init__(self, Y, pred, k):
        self.k = _check_k(k)
        self.Y = _binary_labels(Y)
        n, L = self.Y.shape
        self.top = _topk(pred, n, L, self.k)
        self.hits = _hits(self.Y, self.top)

    def precision(self) -> np.ndarray:
        return precision_from_hits(self.hits)

    def ndcg(self) -> np.ndarray:
        dcg = np.cumsum(self.hits * _discounts(self.k), axis=1)
        return (dcg / _ndcg_norm(self.Y, self.k)).mean(axis=0)

    def ps_parts(self, inv_prop):
        """(gain, ideal), float64 [n, k] each: the weights w[pred_i[r]] y_i[pred_i[r]] of the
        prediction, and each point's true-label weights in decreasing order (0-padded)."""
        w = _check_inv_prop(inv_prop, self.Y.shape[1])
        gain = self.hits * np.where(self.top >= 0, w[np.maximum(self.top, 0)], 0.0)
        return gain, _ideal_weights(self.Y, w, self.k)

    @staticmethod
    def psprecision(gain, ideal) -> np.ndarray:
        # The 1/k' of each precision and the 1/n of the means cancel in the ratio.
        return _safe_ratio(np.cumsum(gain, axis=1).sum(axis=0), np.cumsum(ideal, axis=1).sum(axis=0))

    def psndcg(self, gain, ideal) -> np.ndarray:
        d = _discounts(self.k)
        norm = _ndcg_norm(self.Y, self.k)
        num = (np.cumsum(gain * d, axis=1) / norm).sum(axis=0)
        den = (np.cumsum(ideal * d, axis=1) / norm).sum(axis=0)
        return _safe_ratio(num, den)


# ----------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------

_ARGS_DOC = """
    Y: scipy sparse [n, L] (any dtype; csr preferred): the true labels, any
       non-zero entry is a relevant label. Not modified.
    pred: the predictions, one of
       * integer ndarray [n, k'], k' >= k: label indices ranked best first; -1 means
         no prediction (counts as wrong); a label may appear once per row;
       * float ndarray [n, L]: scores, every label a candidate;
       * scipy sparse [n, L]: scores, only stored entries are candidates.
       Score ties go to the lower label index.
    k: int >= 1; values are returned for k' = 1..k."""


def precision_at_k(Y, pred, k: int = 5) -> np.ndarray:
    """Precision at k' = 1..k, averaged over all n points.

    P@k' = (1/n) sum_i (1/k') sum_{r <= k'} y_i[pred_i[r]]

    where y_i[j] is 1 when label j is relevant to point i. Points with no labels
    count in the mean with 0, as pyxclib does (so P@1 is at most the fraction of
    points having a label).

    {args}

    Returns float64 [k].
    """
    return _Prepared(Y, pred, k).precision()


def ndcg_at_k(Y, pred, k: int = 5) -> np.ndarray:
    """Normalised discounted cumulative gain at k' = 1..k, averaged over all n points.

    DCG_i@k'  = sum_{r <= k'} y_i[pred_i[r]] / log2(r + 1)
    nDCG@k'   = (1/n) sum_i DCG_i@k' / N_i@k',  N_i@k' = sum_{r <= min(k', |y_i|)} 1/log2(r + 1)

    A point with no labels contributes 0 (and still counts in n), as in pyxclib.

    {args}

    Returns float64 [k].
    """
    return _Prepared(Y, pred, k).ndcg()


def psprecision_at_k(Y, pred, inv_prop, k: int = 5) -> np.ndarray:
    """Propensity-scored precision at k' = 1..k, normalised by the best achievable value.

    With w = inv_prop (w_j = 1/p_j, see :func:`inverse_propensity`):

    PSP@k' = [sum_i sum_{r <= k'} w[pred_i[r]] y_i[pred_i[r]]]
             / [sum_i sum_{r <= min(k', |y_i|)} w_i^(r)]

    where w_i^(1) >= w_i^(2) >= ... are the weights of point i's true labels in
    decreasing order, i.e. the denominator is the same sum for the ideal
    prediction (true labels ranked by decreasing inverse propensity). This is
    pyxclib's ``psprecision``: the ratio of the mean propensity-weighted P@k' of
    the prediction to that of the ideal prediction (the 1/k' and 1/n cancel).
    It is a ratio of sums over points, not a mean of per-point ratios. Points
    with no labels add 0 to both sums. If the denominator is 0 (no relevant
    label has a positive weight) the value is 0.

    {args}
    inv_prop: float [L], finite and >= 0: inverse propensity of each label.

    Returns float64 [k].
    """
    prep = _Prepared(Y, pred, k)
    return prep.psprecision(*prep.ps_parts(inv_prop))


def psndcg_at_k(Y, pred, inv_prop, k: int = 5) -> np.ndarray:
    """Propensity-scored nDCG at k' = 1..k, normalised by the best achievable value.

    With w = inv_prop, N_i@k' the nDCG normaliser of :func:`ndcg_at_k` and
    w_i^(r) point i's true-label weights in decreasing order:

    PSnDCG@k' = [sum_i (sum_{r <= k'} w[pred_i[r]] y_i[pred_i[r]] / log2(r + 1)) / N_i@k']
                / [sum_i (sum_{r <= min(k', |y_i|)} w_i^(r) / log2(r + 1)) / N_i@k']

    This is pyxclib's ``psndcg``: the mean propensity-weighted nDCG@k' of the
    prediction divided by that of the ideal prediction (true labels ranked by
    decreasing inverse propensity), each still normalised per point by the
    unweighted N_i@k'. Points with no labels add 0 to both sums; a zero
    denominator gives 0.

    {args}
    inv_prop: float [L], finite and >= 0: inverse propensity of each label.

    Returns float64 [k].
    """
    prep = _Prepared(Y, pred, k)
    return prep.psndcg(*prep.ps_parts(inv_prop))


for _f in (precision_at_k, ndcg_at_k, psprecision_at_k, psndcg_at_k):
    _f.__doc__ = _f.__doc__.replace("{args}", _ARGS_DOC.strip())
del _f


def inverse_propensity(Y, A: float = 0.55, B: float = 1.5) -> np.ndarray:
    """Inverse label propensities of Jain, Prabhu and Varma (KDD 2016).

    p_l   = 1 / (1 + C exp(-A log(N_l + B))) = 1 / (1 + C (N_l + B)^(-A))
    C     = (log N - 1) (B + 1)^A
    1/p_l = 1 + C (N_l + B)^(-A)            (what is returned)

    N is the number of points (rows of Y), N_l the number of points having label l
    (non-zero entries in column l; duplicates of one entry count once). log is
    natural. Compute it on the training labels. Usual constants (the Extreme
    Classification Repository; pyxclib's ``compute_inv_propesity`` takes them
    without a default; dslide.config.PROPENSITY_PRESETS names them):

    * Amazon data sets (e.g. Amazon-670K):       A = 0.6,  B = 2.6
    * Wikipedia data sets (e.g. WikiLSHTC-325K): A = 0.5,  B = 0.4
    * everything else (e.g. BibTeX, EURLex):     A = 0.55, B = 1.5 (napkinXC's default)

    Y: scipy sparse [N, L]. A: float, finite and >= 0. B: float, finite and > 0.
    Requires N >= 3 so that log N > 1 (otherwise C <= 0 and the weights lose meaning).

    Returns float64 [L], every value >= 1; rare labels get the largest weights.
    """
    Yc = _binary_labels(Y)
    Nl = np.bincount(Yc.indices, minlength=Yc.shape[1])
    return inverse_propensity_from_counts(Nl, Yc.shape[0], A, B)


def inverse_propensity_from_counts(counts, N: int, A: float = 0.55, B: float = 1.5) -> np.ndarray:
    """:func:`inverse_propensity` from the label counts: counts int [L] (N_l, points having
    label l) of N points. Returns float64 [L]; the same checks of A, B and N."""
    if not (np.isfinite(A) and A >= 0):
        raise ValueError(f"A ({A!r}) must be finite and >= 0 (usual: 0.6 Amazon, 0.5 Wikipedia, 0.55 other)")
    if not (np.isfinite(B) and B > 0):
        raise ValueError(f"B ({B!r}) must be finite and > 0 (usual: 2.6 Amazon, 0.4 Wikipedia, 1.5 other)")
    N = int(N)
    if N < 3:
        raise ValueError(f"inverse_propensity needs N >= 3 points so that log N > 1, got N = {N}")
    Nl = np.asarray(counts, dtype=np.float64)
    C = (np.log(N) - 1.0) * (B + 1.0) ** A
    return 1.0 + C * (Nl + B) ** (-A)


def evaluate(Y, pred, k: int = 5, inv_prop=None) -> dict:
    """All metrics at k' = 1..k in one pass, as plain Python floats.

    Keys, in order: "p@1".."p@k", "ndcg@1".."ndcg@k" and, when inv_prop is given,
    "psp@1".."psp@k", "psndcg@1".."psndcg@k". Values are fractions in [0, 1]
    (multiply by 100 for the repository's tables). The top-k reduction and the
    label lookups are done once for all metrics; definitions as in
    :func:`precision_at_k`, :func:`ndcg_at_k`, :func:`psprecision_at_k`,
    :func:`psndcg_at_k`.

    {args}
    inv_prop: None or float [L]: inverse propensities (see :func:`inverse_propensity`).
    """
    prep = _Prepared(Y, pred, k)
    series = [("p", prep.precision()), ("ndcg", prep.ndcg())]
    if inv_prop is not None:
        gain, ideal = prep.ps_parts(inv_prop)
        series += [("psp", prep.psprecision(gain, ideal)), ("psndcg", prep.psndcg(gain, ideal))]
    return {f"{name}@{r + 1}": float(v) for name, vals in series for r, v in enumerate(vals)}


evaluate.__doc__ = evaluate.__doc__.replace("{args}", _ARGS_DOC.strip())
