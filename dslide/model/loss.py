"""The output layer's losses over logits split over ranks.

Softmax cross-entropy (`loss = "softmax"`):

Each rank computes its local statistics (`softmax_stats`), the network
exchanges them (one all-reduce of per-sample max and sum of exponentials,
`Comm.allreduce_logsumexp`), and each rank finishes its own slice
(`softmax_finish`). `label_targets` says which of the batch's labels a rank's
columns hold.

One softmax per label (`loss = "label-softmax"`): each of a point's labels is scored
against the point's negatives alone, its other labels left out of the normaliser. The
statistics are the negatives' (`softmax_stats` with the targets excluded), merged by the
same all-reduce; each rank then sums its labels' terms of the negatives' gradient
(`label_softmax_weights`), one more all-reduce of B floats adds them over ranks, and each
rank finishes its slice (`label_softmax_finish`). With one label a point it is the softmax.

Binary cross-entropy (`loss = "bce"`, `bce_finish`): one sigmoid per label, so each
rank finishes its own slice with no exchange.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from dslide.model import kernels


def label_targets(Y, lo: int, hi: int):
    """The batch's labels owned by columns [lo, hi): (rows int64, local cols int64, weights float64).

    Each sample's labels share its unit of target mass: weight 1 / |labels|.
    """
    yp, yi = Y
    return kernels.label_targets(np.asarray(yp, np.int64), yi, int(lo), int(hi))


def softmax_stats(z, exclude=None):
    """Per sample, this rank's (m_i = max_j z_ij, s_i = sum_j exp(z_ij - m_i)) as float64 [B] each.

    In place, z becomes exp(z - m) (rows of -inf: m = -inf, s = 0, z = 0);
    values below kernels.TINY are flushed to zero (no subnormal leaves). float32 z takes
    kernels.exp_flush_sum_rows' exp (the same bits on any CPU), float64 z numpy's.
    exclude: None, or (rows, cols) entries set to 0 before the sums (s_i then sums the
    sample's other columns; m_i is still the max over all of them).
    """
    B = z.shape[0]
    m = np.full(B, -np.inf)
    if z.shape[1]:
        np.maximum(m, z.max(axis=1), out=m)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    se = np.zeros(B)
    if z.dtype == np.float32:  # the exp of kernels' own, in the pass that flushes and sums
        if exclude is not None:
            z[exclude] = -np.inf
        kernels.exp_flush_sum_rows(z, m_safe, se)
        return m, se
    kernels.shift_rows(z, m_safe)
    np.exp(z, out=z)
    if exclude is not None:
        z[exclude] = 0
    kernels.flush_sum_rows(z, se)
    return m, se


def softmax_finish(e, m, gmax, gsum, targets, y_logit, lab_ptr, mean_over: int) -> float:
    """dz = (p - y) / N in place of e = exp(z - m) (from `softmax_stats`), given the
    normaliser (gmax, gsum) of every rank's logits; returns this rank's share of
    the batch's mean loss -sum y log p / N (N = mean_over).

    targets (rows, cols, weights) index e; y_logit float64: the logits at the
    targets, read before `softmax_stats`. A sample without labels gets dz = 0.
    """
    B = lab_ptr.shape[0] - 1
    N = mean_over
    ok = (np.diff(lab_ptr) > 0) & (gsum > 0)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    scale = np.zeros(B)
    scale[ok] = np.exp(m_safe[ok] - gmax[ok]) / gsum[ok] / N
    kernels.scale_flush_rows(e, scale)
    rows, cols, w = targets
    np.subtract.at(e, (rows, cols), (w / N).astype(e.dtype))
    return float(np.sum(w * (np.log(gsum[rows]) + gmax[rows] - y_logit))) / N


def label_softmax_weights(gmax, gneg, targets, y_logit, B: int):
    """(r float64 [B], den float64 [targets], e float64 [targets]): per sample, this rank's share
    of r_i = sum over its labels y of w_y / den_y, den_y = e_y + S_i, where e_y = exp(z_y - M_i),
    S_i = the sum of exp(z_ij - M_i) over the sample's negatives and (M, S) = (gmax, gneg) their
    merged statistics. Summed over ranks, r_i e_ij is a negative's gradient; den and e go on to
    `label_softmax_finish`."""
    rows, _, w = targets
    ey = np.exp(y_logit - gmax[rows])
    den = ey + gneg[rows]
    r = np.bincount(rows, weights=np.divide(w, den, out=np.zeros_like(den), where=den > 0), minlength=B)
    return r, den, ey


def label_softmax_finish(e, m, gmax, r, den, ey, targets, y_logit, mean_over: int) -> float:
    """One softmax per label: the loss of sample i is sum_y w_y (log(e_y + S_i) - log e_y), each
    label y against the negatives alone (e_y, S_i, den_y = e_y + S_i as in
    `label_softmax_weights`, ey its e_y, w_y = 1 / |labels|). In place of e = exp(z - m) with the targets
    zeroed (`softmax_stats(z, targets)`): dz = r_i e_ij exp(m_i - M_i) / N at the negatives (r
    summed over ranks) and w_y (e_y / den_y - 1) / N at the labels; returns this rank's share of
    the batch's mean loss (N = mean_over). A sample without labels gets dz = 0."""
    B = e.shape[0]
    N = mean_over
    live = np.isfinite(gmax)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    scale = np.zeros(B)
    scale[live] = r[live] * np.exp(m_safe[live] - gmax[live]) / N
    kernels.scale_flush_rows(e, scale)
    rows, cols, w = targets
    ok = den > 0
    q = np.divide(ey, den, out=np.ones_like(den), where=ok)
    e[rows, cols] = (w * (q - 1.0) / N).astype(e.dtype)
    return float(np.sum(w[ok] * (np.log(den[ok]) + gmax[rows][ok] - y_logit[ok]))) / N


_TINY = kernels.TINY  # globals numba folds in as constants
_LANES = kernels.SUM_LANES


def _sigmoid_softplus(z):
    """In place z <- sigmoid(z) (values below kernels.TINY flushed to 0); returns each row's
    sum of softplus(z) = log(1 + e^z), float64 [B]. An entry of -inf (a padding slot) becomes
    0 and adds 0.

    numpy's vectorised exp and log1p give e = exp(-|z|) and log1p(e) (numba's are scalar calls,
    five times slower here); `_sigmoid_softplus_rows` combines them: softplus(z) = max(z, 0) +
    log1p(e), sigmoid(z) = 1 / (1 + e) for z >= 0 and e / (1 + e) below, with no overflow."""
    e = np.abs(z)
    np.negative(e, out=e)
    np.exp(e, out=e)
    return _sigmoid_softplus_rows(z, e, np.log1p(e))


@njit(cache=True, inline="always")
def _sigmoid_term(z, e, l, i, j, zero, one, tiny):
    """z[i, j] <- sigmoid(z[i, j]) (below tiny: 0) from e = exp(-|z|), l = log1p(e); returns
    the entry's softplus, max(z, 0) + l, as float64."""
    v = z[i, j]
    p = one / (one + e[i, j])
    p = p if v >= zero else e[i, j] * p
    z[i, j] = p if p >= tiny else zero
    return np.float64((v if v > zero else zero) + l[i, j])


@njit(parallel=True, cache=True)
def _sigmoid_softplus_rows(z, e, l):
    """z <- sigmoid(z) from e = exp(-|z|) and l = log1p(e); each row's sum of max(z, 0) + l,
    float64, in kernels.SUM_LANES partial sums (a fixed order whatever the CPU or the thread
    count; strict float semantics: -inf entries pass through)."""
    B, m = z.shape
    part = np.zeros(B)
    tiny = z.dtype.type(_TINY)
    zero = z.dtype.type(0.0)
    one = z.dtype.type(1.0)
    body = m - m % _LANES
    for i in prange(B):
        acc = np.zeros(_LANES)
        for a in range(0, body, _LANES):
            for q in range(_LANES):
                acc[q] += _sigmoid_term(z, e, l, i, a + q, zero, one, tiny)
        s = 0.0
        for q in range(_LANES):
            s += acc[q]
        for j in range(body, m):
            s += _sigmoid_term(z, e, l, i, j, zero, one, tiny)
        part[i] = s
    return part


def bce_finish(z, targets, mean_over: int) -> float:
    """dz = (sigmoid(z) - y) / N in place of the logits z [B, m], y = 1 at the targets
    (rows, cols, _: each sample's labels among the columns) and 0 elsewhere; returns
    this rank's share of the batch's loss sum_ij (log(1 + e^z_ij) - y_ij z_ij) / N
    (N = mean_over). Every column is a negative of every sample it is not a label of."""
    rows, cols, _ = targets
    N = mean_over
    y_sum = float(np.sum(z[rows, cols], dtype=np.float64))
    total = float(np.sum(_sigmoid_softplus(z)))
    np.subtract.at(z, (rows, cols), z.dtype.type(1.0))
    z *= z.dtype.type(1.0 / N)
    return (total - y_sum) / N
