"""Summary statistics of a data set, and the label-centroid classifier's P@1: any family's data.

`stats` and `format_stats` print what `dslide data gen --stats` and
`python -m dslide.datasets.synthetic --stats` show; `centroid_p_at_1` is the
baseline the suite's members are calibrated against (dslide.datasets.suite).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from dslide.io.data import XMCData


def stats(data: XMCData) -> dict:
    """Summary statistics of a data set (plain Python numbers and lists)."""
    X, Y = data.X, data.Y
    nnz = np.diff(X.indptr)
    labs = np.diff(Y.indptr)
    freq = np.bincount(Y.indices, minlength=data.n_labels)
    occ = max(int(freq.sum()), 1)
    sorted_freq = np.sort(freq)[::-1]
    top1 = max(1, data.n_labels // 100)
    q = [0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99]
    values = X.data if X.nnz else np.zeros(1, dtype=np.float32)
    return {
        "points": data.n_points,
        "features": data.n_features,
        "labels": data.n_labels,
        "nnz_mean": float(nnz.mean()) if len(nnz) else 0.0,
        "nnz_median": float(np.median(nnz)) if len(nnz) else 0.0,
        "nnz_p99": float(np.quantile(nnz, 0.99)) if len(nnz) else 0.0,
        "nnz_max": int(nnz.max()) if len(nnz) else 0,
        "labels_mean": float(labs.mean()) if len(labs) else 0.0,
        "labels_max": int(labs.max()) if len(labs) else 0,
        "value_quantiles": dict(zip(q, np.quantile(values, q).round(3).tolist())),
        "value_max": float(values.max()),
        "labels_seen": int(np.count_nonzero(freq)),
        "label_freq_head": sorted_freq[:10].tolist(),
        "label_top1pct_share": float(sorted_freq[:top1].sum() / occ),
        "labels_seen_once": int(np.count_nonzero(freq == 1)),
    }


def format_stats(s: dict) -> str:
    vq = "  ".join(f"p{int(k * 100)}={v:g}" for k, v in s["value_quantiles"].items())
    return "\n".join([
        f"points {s['points']:,}  features {s['features']:,}  labels {s['labels']:,}",
        f"nnz/point     mean {s['nnz_mean']:.2f}  median {s['nnz_median']:g}  "
        f"p99 {s['nnz_p99']:g}  max {s['nnz_max']}",
        f"labels/point  mean {s['labels_mean']:.3f}  max {s['labels_max']}",
        f"values        {vq}  max={s['value_max']:g}",
        f"label freq    head {s['label_freq_head']}  top 1% of labels carry "
        f"{100 * s['label_top1pct_share']:.1f}% of occurrences",
        f"              {s['labels_seen']:,} labels occur, {s['labels_seen_once']:,} of them once",
    ])


def centroid_p_at_1(train: XMCData, test: XMCData, chunk: int = 256) -> float:
    """P@1 of the label-centroid classifier: argmax_l (x_test · c_l).

    c_l = mean of the L2-normalised rows of train.X over the train points carrying l
    (csr [n_labels, n_features]); labels never seen in training score 0. A test point
    counts as correct when its top-scoring label is one of its labels; ties go to the
    lowest label id, and a point scoring 0 for every label counts as a miss. Computed on
    `chunk` test points at a time so that memory stays bounded.
    """
    Xn = _l2_normalise(train.X)
    Yt = train.Y.T.tocsr()
    counts = np.asarray(Yt.sum(axis=1)).ravel()
    inv = np.divide(1.0, counts, out=np.zeros_like(counts, dtype=np.float64), where=counts > 0)
    C = (sp.diags(inv.astype(np.float32)) @ (Yt @ Xn)).tocsr()  # [L, F]
    CT = C.T.tocsr()  # [F, L]
    hits = 0
    for a in range(0, test.n_points, chunk):
        S = (test.X[a:a + chunk] @ CT).tocsr()  # [chunk, L], sparse
        S.sort_indices()  # so that argmax breaks ties towards the lowest label id
        Yc = test.Y[a:a + chunk]
        for r in range(S.shape[0]):
            lo, hi = S.indptr[r], S.indptr[r + 1]
            if hi == lo:
                continue
            best = S.indices[lo + int(np.argmax(S.data[lo:hi]))]
            row = Yc.indices[Yc.indptr[r]:Yc.indptr[r + 1]]
            hits += bool(np.any(row == best))
    return hits / max(test.n_points, 1)


def _l2_normalise(X: sp.csr_matrix) -> sp.csr_matrix:
    norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())
    inv = np.divide(1.0, norms, out=np.zeros_like(norms), where=norms > 0)
    return (sp.diags(inv.astype(np.float32)) @ X).tocsr()
