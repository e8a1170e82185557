"""The inference pipeline: query -> hidden layers -> output top k -> merge -> fusion.

    for each batch of query rows (normalised as they are gathered, dslide.model.inputs):
        x            = the network's hidden layers, no dropout (Network.hidden)
        (s, i)_r     = rank r's best K of its output slice: every label scored
                       (Layer.topk), or what the inference index retrieves
        (s, i)       = merge_topk of every rank's (s, i)_r (dslide.model.topk)
        fused top k  = the model's softmax over its K candidates mixed with the
                       neighbour store's votes (dslide.infer.fusion), where the
                       model keeps a store and knn is not 0
        hidden top k = those scores (or the softmax, where nothing is fused) mixed
                       with the votes of the query's nearest training points in
                       the last hidden layer (dslide.infer.hidden_knn), where the
                       model keeps them and hidden_knn is not 0

K is k, or knn_candidates where the labels are fused or the hidden neighbours
vote. Every rank ends with the same result.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from dslide import metrics
from dslide.infer.approx import Bound
from dslide.infer.fusion import tempered
from dslide.infer.hidden_knn import softmax_rows
from dslide.model.inputs import csr_parts, input_norms, make_batch
from dslide.model.topk import merge_topk
from dslide.timings import Timings

#: points scored at a time: exact scoring holds a [batch, column block] of scores; the
#: inference index only [batch, hidden], and the more points a batch has, the more of
#: them share an anchor and read its bucket's weight rows together (AnchorTables.topk)
PREDICT_BATCH = {"exact": 1024, "index": 65536}


@dataclass(frozen=True)
class Fusion:
    """The fusion stage's settings: the model's neighbour store and what the configuration
    resolves from it (the neighbours a query takes, the neighbours' weight, the prototypes'
    share, the softmax's temperature: Config.neighbours, fusion_weight, proto_share,
    fusion_temperature)."""

    store: object  # fusion.NeighbourLabels
    neighbours: int
    weight: float
    power: float
    share: float
    prototypes: int  # prototypes a query takes (0: none)
    pr_power: float
    candidates: int  # the network's candidates the softmax runs over
    bound: object  # approx.Bound: what a query's searches read under --lsh
    temperature: float = 1.0  # the network's logits are divided by it before their softmax

    @classmethod
    def of(cls, model) -> "Fusion | None":
        """The model's fusion stage, or None (no store, or knn = 0)."""
        cfg, store = model.config, model.neighbours
        if store is None or cfg.knn == 0:
            return None
        share = cfg.proto_share(store.share)
        return cls(store, cfg.neighbours(store.k), cfg.fusion_weight(store.weight), cfg.knn_power, share,
                   cfg.proto_candidates if store.has_prototypes and share > 0 else 0, cfg.proto_power,
                   cfg.knn_candidates, Bound.of(cfg), cfg.fusion_temperature(store.temperature))

    def fuse(self, X: sp.csr_matrix, m_ids, m_scores, k: int, comm, exact: bool = True, timings=None):
        """Top k of the fused scores of query rows X from the network's merged candidates:
        (ids int64 [n, k], scores float64 [n, k]); the searches shared over comm's ranks, exact
        or (exact False) bounded whatever the training points (dslide.infer.approx).
        timings (dslide.timings.Timings): gets the seconds of each search and of the fusion."""
        timings = Timings() if timings is None else timings
        with timings.time("fusion_neighbours"):
            nn_ids, nn_sims = self.store.neighbours(X, self.neighbours, comm, approx=not exact and self.bound)
        with timings.time("fusion_prototypes"):
            pr_ids, pr_sims = (self.store.prototypes(X, self.prototypes, comm, approx=not exact and self.bound) if self.prototypes
                               else (None, None))
        with timings.time("fusion_fuse"):
                return self.store.fuse(m_ids, tempered(m_scores, self.temperature), nn_ids, nn_sims, self.weight,
                                       self.power, k, pr_ids, pr_sims, self.share, self.pr_power)


@dataclass(frozen=True)
class HiddenVotes:
    """The hidden neighbours' stage: the model's store (hidden_knn.HiddenNeighbours) and what the
    configuration resolves from it (the neighbours a query takes, their power, their weight)."""

    store: object
    neighbours: int
    power: float
    weight: float
    candidates: int  # the labels of the scores before the stage that it rescores
    probes: int  # under --lsh: the cells of the store a query searches (approx_hidden_probes)

    @classmethod
    def of(cls, model) -> "HiddenVotes | None":
        """The model's hidden neighbours' stage, or None (no store, hidden_knn 0 or weight 0)."""
        cfg, store = model.config, getattr(model, "hidden_neighbours", None)
        if store is None or cfg.hidden_knn == 0:
            return None
        k = cfg.hidden_knn if cfg.hidden_knn is not None else store.k
        power = cfg.hidden_knn_power if cfg.hidden_knn_power is not None else store.power
        weight = cfg.hidden_knn_weight if cfg.hidden_knn_weight is not None else store.weight
        if not k or not weight or power is None:
            return None
        return cls(store, int(k), float(power), float(weight), max(5, cfg.knn_candidates), cfg.approx_hidden_probes)

    def fuse(self, H, b_ids, b_p, k: int, comm, exact: bool = True, timings=None):
        """Top k of the base scores (b_ids, b_p: the fused scores or the network's softmax) mixed
        with the votes of the hidden vectors H's nearest stored points: (ids, scores); exact
        False: the points of the `probes` nearest cells searched (HiddenNeighbours.search)."""
        timings = Timings() if timings is None else timings
        with timings.time("hidden_neighbours"):
            nn_ids, nn_sims = self.store.search(H, self.neighbours, comm, None if exact else self.probes)
        with timings.time("hidden_fuse"):
            return self.store.fuse(b_ids, b_p, nn_ids, nn_sims, self.power, self.weight, k)


def scores_every_label(model, exact: bool) -> bool:
    """Whether a prediction scores every output label: exact, an output kind without an index, or
    an LSH output too narrow for one (lsh.index_min_width) that was given none."""
    out = model.network.layers[-1]
    return exact or not out.indexable or (model.index is None and out.too_narrow_for_index())


def output_topk(model, batch, k: int, exact: bool, biases=None):
    """This rank's best k output labels of a batch: (scores float64 [B, k], global ids int64
    [B, k], labels scored int64 [B]); exact: every label of the slice, otherwise what the
    model's inference index retrieves (an output kind without one, or an LSH output too narrow
    for one, lsh.index_min_width, scores every label). biases: None, or a list of output bias
    vectors (this rank's, as the layer's `b`) scored in place of the layer's, every label scored:
    a list of those triples, one per vector."""
    net = model.network
    out = net.layers[-1]
    with model.timings.time("predict_hidden"):
        x = net.hidden(batch, own=True)
    if biases is not None:
        with model.timings.time("predict_output"):
            return out.topk(x, k, biases)
    if scores_every_label(model, exact):
        with model.timings.time("predict_output"):
            return out.topk(x, k)
    if model.index is None:
        raise ValueError("this model has no inference index for --lsh: it is built at the end of "
                         "training (lsh.index_anchors > 0); score every label instead (exact)")
    with model.timings.time("predict_output"), model.timings.time("index_query"):
        return model.index.topk(x.dense(), out.W, out.b, k, out.lo, net.comm, model.config.layer_lsh(out.index))


def predict_topk_scores(model, X: sp.csr_matrix, k: int, exact: bool = True, batch_size: int | None = None,
                        stats: dict | None = None, progress=None, fused: bool = True, biases=None):
    """Top k labels per point and their scores (logits): (ids int64 [n, k], scores float64 [n, k]).

    exact: every output neuron scored; otherwise an LSH output layer scores
    only what the model's inference index retrieves. With P ranks each scores its own
    slice and the candidates (B x k per rank) are merged, so every rank gets
    the result. stats (a dict) receives "scored_share": the mean share of the
    labels scored per point. When the model keeps neighbour labels
    (`knn` > 0, dslide.infer.fusion) and `fused`, the scores are the fused ones: the model's
    softmax over its `knn_candidates` best labels mixed with the labels of the
    point's `knn` nearest training points and, where the store holds them, with its
    `proto_candidates` nearest label prototypes (`proto_weight`). progress(n): called
    with the points of each batch done.

    biases: None, or a list of output bias vectors (this rank's slice, as the output layer's
    `b`) to score in place of the layer's, every label scored and unfused, each batch's products
    made once for all of them: a list of (ids, scores), the j-th what the network with biases[j]
    gives (dslide.train.infer_build.apply_prior_shift scores its shifts so).
    """
    if biases is not None:
        return _topk_under_biases(model, X, k, biases, batch_size)
    net = model.network
    if batch_size is None:
        # (scoring every label, a batch's block of scores grows with the batch: the smaller batch)
        batch_size = PREDICT_BATCH["exact" if scores_every_label(model, exact) else "index"]
    X, batches = _batches(model, X, batch_size)
    n = X.shape[0]
    ids = np.empty((n, k), dtype=np.int64)
    scores = np.empty((n, k), dtype=np.float64)
    scored = 0
    fusion = Fusion.of(model) if fused else None
    hidden = HiddenVotes.of(model) if fused else None
    kb = max(k, hidden.candidates) if hidden is not None else k  # the labels the hidden stage rescores
    kk = max(kb, fusion.candidates) if fusion is not None else kb
    for rows, batch in batches:
        s = int(rows[0])
        ls, li, ln = output_topk(model, batch, kk, exact)
        # the layers' communicator: a stand-in in data-parallel mode, where every rank has it all
        with model.timings.time("predict_merge"):
            ms, mi = merge_topk(net.comm.allgather_rows(ls), net.comm.allgather_rows(li), kk)
        if fusion is not None:
            mi, ms = fusion.fuse(X[s:s + len(rows)], mi, ms, kb, net.comm, exact, model.timings)
        if hidden is not None:
            with model.timings.time("predict_hidden"):
                H = net.hidden(batch).dense()
            base = ms if fusion is not None else softmax_rows(mi, ms)
            mi, ms = hidden.fuse(H, mi, base, k, net.comm, exact, model.timings)
        scores[rows], ids[rows] = ms, mi
        scored += int(ln.sum())
        if progress is not None:
            progress(rows.shape[0])
    if stats is not None:
        total = float(net.comm.allreduce_sum(np.array([scored], dtype=np.float64))[0])
        stats["scored_share"] = total / max(1, n) / net.n_labels
    return ids, scores


def _batches(model, X, batch_size: int):
    """(X as CSR, its batches: (rows, Batch) of at most batch_size points each, in order), X's
    width checked against the model's."""
    net = model.network
    if X.shape[1] != net.n_features:
        raise ValueError(f"data has {X.shape[1]} features but the model was trained on {net.n_features}")
    X = sp.csr_matrix(X)
    parts = csr_parts(X, net.dtype)
    norms = input_norms(X, model.config.input_norm)

    def each():
        for s in range(0, X.shape[0], batch_size):
            rows = np.arange(s, min(X.shape[0], s + batch_size))
            yield rows, make_batch(parts, None, rows, net.step, norms=norms)

    return X, each()


def _topk_under_biases(model, X, k: int, biases, batch_size: int | None):
    """predict_topk_scores' `biases` case: the exact, unfused top k of X under each bias vector."""
    net = model.network
    X, batches = _batches(model, X, PREDICT_BATCH["exact"] if batch_size is None else batch_size)
    out = [(np.empty((X.shape[0], k), dtype=np.int64), np.empty((X.shape[0], k), dtype=np.float64)) for _ in biases]
    for rows, batch in batches:
        for (ids, scores), (ls, li, _) in zip(out, output_topk(model, batch, k, True, biases)):
            with model.timings.time("predict_merge"):
                scores[rows], ids[rows] = merge_topk(net.comm.allgather_rows(ls), net.comm.allgather_rows(li), k)
    return out


def predict_topk(model, X: sp.csr_matrix, k: int, exact: bool = True, stats: dict | None = None) -> np.ndarray:
    """Top k label indices per point, best first: int64 [n, k] (-1 where fewer than k were scored)."""
    return predict_topk_scores(model, X, k, exact, stats=stats)[0]


def evaluate(model, data, k: int = 5, exact: bool = True, inv_prop=None) -> dict:
    """P@k, nDCG@k (and PSP@k when inverse propensities are given) on `data` (XMCData), as a dict."""
    pred = predict_topk(model, data.X, k, exact)
    return metrics.evaluate(sp.csr_matrix(data.Y), pred, k=k, inv_prop=inv_prop)
