"""Inference through the hash tables against exact scoring and a static shortlist, on any number of ranks.

    rows = compare_inference(model, test, inv_prop)

For a trained model with an LSH output layer and its inference index, the
same test points are ranked three ways, one after the other:
- exact: every label scored (blocked BLAS products);
- --lsh: what the index retrieves for each point, scored exactly;
- static shortlist: the labels with the highest output biases, as many as
  --lsh scored per point on average, scored exactly (what a frequency
  shortlist with no hashing gives);
- when the index has its nearest-training-point graph: its buckets alone,
  refilled to the same share (what the neighbours add).
Each row: share of labels scored, seconds, recall of the exact top-10,
P@1/P@5, PSP@5 (inverse propensities from the training labels). Every rank
gets the same rows.
"""

from __future__ import annotations

import time

import numpy as np
import scipy.sparse as sp

from dslide.infer.predict import predict_topk
from dslide.infer.index import index_bucket
from dslide.metrics import evaluate
from dslide.model import inputs as I
from dslide.model.topk import kth_largest, merge_topk
from dslide.model.topk import order_keys as _order_keys


def static_topk(model, X, k: int, m: int, batch_size: int = 1024):
    """Top k per point among the m labels with the highest bias (over all ranks): ids int64 [n, k]."""
    net = model.network
    out = net.layers[-1]
    keys = _order_keys(out.b[None, :].astype(np.float32))
    keys = np.sort(keys, axis=1)[:, ::-1]
    theta = kth_largest(keys, m, net.comm)[0]
    head = np.flatnonzero(_order_keys(out.b[None, :].astype(np.float32))[0] >= theta)
    Wh, bh = np.ascontiguousarray(out.neuron_major()[head]), out.b[head]
    Xn = I.normalise_inputs(X, model.config.input_norm, net.dtype)
    parts = I.csr_parts(Xn)
    n = Xn.shape[0]
    ids = np.empty((n, k), np.int64)
    for s in range(0, n, batch_size):
        rows = np.arange(s, min(n, s + batch_size))
        h = net.hidden(I.make_batch(parts, None, rows, net.step)).dense()
        S = h @ Wh.T
        S += bh
        kk = min(k, head.size)
        ls = np.full((rows.size, k), -np.inf)
        li = np.full((rows.size, k), -1, np.int64)
        if kk:
            part = np.argpartition(-S, kk - 1, axis=1)[:, :kk]
            sc = np.take_along_axis(S, part, axis=1)
            order = np.lexsort((part, -sc), axis=1)
            ls[:, :kk] = np.take_along_axis(sc, order, axis=1)
            li[:, :kk] = head[np.take_along_axis(part, order, axis=1)] + out.lo
        _, mi = merge_topk(net.comm.allgather_rows(ls), net.comm.allgather_rows(li), k)
        ids[rows] = mi
    return ids


def _recall(pred, exact, k=10):
    return float(np.mean([np.isin(exact[i, :k], pred[i, :k]).mean() for i in range(exact.shape[0])]))


def refill_index(model, share: float) -> None:
    """Refill the model's inference index, same anchors, with buckets of `share` of the labels."""
    out = model.network.layers[-1]
    lc = model.config.layer_lsh(out.index)
    nn = model.index.neighbors
    per_point = 0.0 if nn is None else float(nn.label_ptr[-1]) / max(1, nn.points.shape[0])
    T_ = index_bucket(share, out.n, 0 if nn is None else lc.index_neighbors, per_point)  # share alone: no floor
    model.index.fill(out.W, out.b, model.network.comm, T_, lc)


def compare_inference(model, test, inv_prop, shares=()) -> list[dict]:
    """Rows for exact, --lsh and the static shortlist of equal size (see the module docstring),
    then --lsh again with the index refilled at each of `shares` (same anchors, other bucket sizes)."""
    Y = sp.csr_matrix(test.Y)
    predict_topk(model, test.X[:64], 10, exact=False)  # compile outside the timings
    rows = []
    t0 = time.perf_counter()
    exact = predict_topk(model, test.X, 10, exact=True)
    rows.append(("exact", 1.0, time.perf_counter() - t0, exact))
    stats = {}
    t0 = time.perf_counter()
    pred = predict_topk(model, test.X, 10, exact=False, stats=stats)
    rows.append(("--lsh (the index)" if model.index is not None else "--lsh (every label: no index)",
                 stats["scored_share"], time.perf_counter() - t0, pred))
    index = model.index
    if index is not None:  # (an output narrower than lsh.index_min_width has none: --lsh scores every label)
        n_labels = model.network.n_labels
        m = max(1, int(round(stats["scored_share"] * n_labels)))
        t0 = time.perf_counter()
        static = static_topk(model, test.X, 10, m)
        rows.append(("static shortlist (highest biases)", m / n_labels, time.perf_counter() - t0, static))
    if index is not None and index.neighbors is not None:  # what the neighbours add: the same share from buckets alone
        graph, share = index.neighbors, model.config.layer_lsh(len(model.network.layers) - 1).index_share
        index.neighbors = None
        try:
            refill_index(model, share)
            stats = {}
            t0 = time.perf_counter()
            pred = predict_topk(model, test.X, 10, exact=False, stats=stats)
            rows.append(("--lsh, buckets alone (no neighbours)", stats["scored_share"], time.perf_counter() - t0,
                         pred))
        finally:
            index.neighbors = graph
            refill_index(model, share)
    for share in shares if index is not None else ():
        refill_index(model, share)
        predict_topk(model, test.X[:64], 10, exact=False)
        stats = {}
        t0 = time.perf_counter()
        pred = predict_topk(model, test.X, 10, exact=False, stats=stats)
        rows.append((f"--lsh, buckets of {share:.0%}", stats["scored_share"], time.perf_counter() - t0, pred))
    out = []
    for name, share, secs, ids in rows:
        met = evaluate(Y, ids[:, :5], k=5, inv_prop=inv_prop)
        out.append({"method": name, "share": share, "seconds": secs, "recall@10": _recall(ids, exact),
                    "p@1": met["p@1"], "p@5": met["p@5"], "psp@5": met.get("psp@5", float("nan"))})
    return out
