"""The output layer's inference index: which labels a query scores at inference.

Built once, at the end of training, from a rank's final weights W float
[n_r, d] (neuron-major), its biases b float [n_r] and a communicator, never
from a layer: anchors are k-means centres of the hidden vectors H of some
training points (the same on every rank), each anchor's bucket the labels
that score highest there (a threshold agreed across ranks, so P ranks keep
what 1 rank keeps), and, optionally, a k-NN graph over those points whose
nearest neighbours lend a query their labels (lsh.neighbors).

    index = InferenceIndex.build(H, W, b, comm, lc, n, seed, labels)
    scores, ids, n_scored = index.topk(x, W, b, k, lo, comm, lc)

A query scores exactly what the buckets of its `index_probes` nearest anchors
hold, plus its nearest points' labels; with P ranks each scores its own slice.
"""

from __future__ import annotations

import time

import numpy as np

from dslide import lsh, validate
from dslide.comm import Comm
from dslide.config import LSHConfig
from dslide.model.sharding import row_share
from dslide.model.topk import kth_largest, order_keys

#: anchors of the inference index filled at a time: their [chunk, T] ids, scores-turned-keys
#: and comparison masks are the fill's transient (13 bytes an entry, a fraction of what all
#: anchors at once would take), besides the one block of scores that score_top reuses
INDEX_CHUNK = 256


def index_labels(share: float, n: int, min_labels: int = 0) -> int:
    """Labels a query of an inference index over n labels scores: `share` of them, at least
    min(min_labels, n) (lsh.index_share, lsh.index_min_labels)."""
    return max(1, int(np.ceil(share * n)), min(int(min_labels), n))


def index_bucket(share: float, n: int, neighbors: int = 0, labels_per_point: float = 0.0, min_labels: int = 0) -> int:
    """Bucket size T of an inference index that scores `index_labels(share, n, min_labels)`
    labels per query: the neighbours' labels (about neighbors x labels_per_point ids a query)
    come out of it."""
    return max(1, index_labels(share, n, min_labels) - int(np.ceil(neighbors * labels_per_point)))



class InferenceIndex:
    """Anchor tables (lsh.AnchorTables, one table) over a rank's labels and, optionally,
    the nearest-neighbour graph of the training points (lsh.NeighborIndex, the same on
    every rank); bucket_target: the T the buckets were filled for."""

    def __init__(self, tables, neighbors=None, bucket_target: int = 0):
        self.tables, self.neighbors, self.bucket_target = tables, neighbors, bucket_target

    @classmethod
    def build(cls, H, W, b, comm: Comm, lc: LSHConfig, n: int, seed: int, labels=None):
        """(index, timings) from the inputs H float [m, d] (the same on every rank) and this
        rank's W float [n_r, d], b float [n_r] of a layer of n labels. labels: (ptr int64 [m + 1],
        ids int32) the points' labels (CSR, global ids); with lc.index_neighbors > 0 a query
        also scores the labels of its index_neighbors nearest points, and the buckets give up
        the room those take on average, so that a query scores `index_share` of the layer (at
        least `index_min_labels`) in all."""
        t0 = time.perf_counter()
        A = min(lc.index_anchors, H.shape[0])
        use_nn = lc.index_neighbors > 0 and labels is not None
        per_point = float(labels[0][-1]) / max(1, H.shape[0]) if use_nn else 0.0
        T = index_bucket(lc.index_share, n, lc.index_neighbors if use_nn else 0, per_point, lc.index_min_labels)
        tables = lsh.AnchorTables(W.shape[1], 1, A, min(T, W.shape[0]), seed)
        tables.fit_anchors(H, share=lambda m, block, rows: _blocks_shared(m, block, comm, rows))
        t1 = time.perf_counter()
        index = cls(tables)
        index.fill(W, b, comm, T, lc)
        t2 = time.perf_counter()
        info = {"kmeans_s": t1 - t0, "fill_s": t2 - t1, "anchors": A, "bucket": T}
        if use_nn:
            near = lsh.neighbors.near_cells(tables.anchors[0], lc.index_graph_cells) if lc.index_graph_cells else None
            index.neighbors = lsh.NeighborIndex.build(H, tables.codes(H)[:, 0], A, labels[0], labels[1],
                                                      lc.index_degree, lc.index_degree, near=near,
                                                      share=lambda m, width, rows: _rows_shared(m, width, comm,
                                                                                                "index", rows))
            info["graph_s"] = time.perf_counter() - t2
        return index, info

    def fill(self, W, b, comm: Comm, T: int, lc: LSHConfig) -> None:
        """Fill the buckets: per anchor, this rank's labels among the T best of the whole
        layer (a threshold found by bisection over ranks: P all-reduces of A counts).
        Anchors are taken INDEX_CHUNK at a time (every rank the same chunks, in order), so
        besides the buckets int32 [A, min(T, n_r)] the transient stays bounded."""
        tables = self.tables
        C = tables.anchors[0]
        A, t = C.shape[0], min(T, W.shape[0])
        # a bucket serves the queries of its anchor's cell, h = c + e, whose scores are
        # w.c + b + w.e: rank by a shrunk mean plus a margin for the spread of w.e (sd ~ |w|)
        #   bucket score_j = index_shrink * w_j.c + b_j + index_spread * |w_j|
        wn = np.sqrt(np.einsum("ij,ij->i", W, W, dtype=np.float64))
        b_eff = (b + lc.index_spread * wn).astype(b.dtype)
        del wn
        buckets = np.empty((1, A, t), np.int32)
        fill = np.empty((1, A), np.int32)
        for s in range(0, A, INDEX_CHUNK):
            Cs = np.ascontiguousarray(lc.index_shrink * C[s:s + INDEX_CHUNK], dtype=C.dtype)
            ids, scores = lsh.anchors.score_top(Cs, W, b_eff, t)
            keys = order_keys(scores, in_place=True)  # int32 over the scores' own memory
            theta = kth_largest(keys, T, comm)
            f = (keys >= theta[:, None]).sum(axis=1).astype(np.int32)  # rows are sorted best first
            del keys, scores
            # what a bucket keeps, by id: queries then read the weight rows in address order
            # (faster scoring than in score order)
            ids[np.arange(t)[None, :] >= f[:, None]] = np.iinfo(np.int32).max
            ids.sort(axis=1)
            buckets[0, s:s + INDEX_CHUNK] = ids
            fill[0, s:s + INDEX_CHUNK] = f
        tables.set_buckets(buckets, fill)
        self.bucket_target = T

    def topk(self, x, W, b, k: int, lo: int, comm: Comm, lc: LSHConfig):
        """The best k of this rank's labels per input x float [B, d] among what the index
        retrieves (its buckets and, when it has them, its nearest training points' labels):
        (scores float64 [B, k], global ids int64 [B, k] (-1: missing), n_scored int64 [B])."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        codes = self.tables.codes(x, lc.index_probes)
        extras = None
        if self.neighbors is not None:
            nn = _nearest_points(self.neighbors, x, codes[:, 0], lc.index_search, lc.index_neighbors, comm)
            extras = self.neighbors.extras(nn, lo, lo + W.shape[0])
        s, i, n = self.tables.topk(x, W, b, k, lc.index_probes, extras=extras, codes=codes)
        i[i >= 0] += lo
        return s, i, n

    # -- state ------------------------------------------------------------------------------

    #: how ranks split each array of `state` (None: every rank holds it whole and alike;
    #: the buckets are each rank's own, refilled from its weights for a new layout)
    SHARD_AXES = {"anchors": None, "bucket": None, **{f"nn.{k}": None for k in lsh.NeighborIndex.KEYS}}

    def state(self) -> dict:
        """Its arrays by name: the anchor tables' (anchors, counts, buckets, fill, ready), the
        bucket target (bucket), and the neighbour graph's as nn.*."""
        out = dict(self.tables.state_arrays())
        out["bucket"] = np.array([self.bucket_target], dtype=np.int64)
        if self.neighbors is not None:
            out.update({f"nn.{k}": v for k, v in self.neighbors.state_arrays().items()})
        return out

    @classmethod
    def from_state(cls, arrays: dict, W, b, comm: Comm, lc: LSHConfig, seed: int, same_layout: bool = True):
        """The index of `state()`-named arrays, or None when they hold none; for a new layout
        (same_layout False) the anchors are kept and the buckets refilled from W, b."""
        if "anchors" not in arrays:
            return None
        anchors = np.asarray(arrays["anchors"])
        tables = lsh.AnchorTables(W.shape[1], 1, anchors.shape[1], 1, seed)
        index = cls(tables, bucket_target=int(np.asarray(arrays["bucket"])[0]))
        own = {k: v for k, v in arrays.items() if not k.startswith("nn.") and k != "bucket"}
        if same_layout:
            validate.anchor_tables(own, "the inference index", W.shape[0], tables.anchors.shape)
            tables.load_state_arrays(own)
        else:
            tables.anchors[...] = anchors
            tables.ready = True
            index.fill(W, b, comm, index.bucket_target, lc)
        if "nn.points" in arrays:  # the same on every rank: each reads the labels of its own slice
            nn = {k[len("nn."):]: v for k, v in arrays.items() if k.startswith("nn.")}
            missing = [k for k in lsh.NeighborIndex.KEYS if k not in nn]
            if missing:
                raise ValueError(f"the inference index lacks nn.{', nn.'.join(missing)}")
            # whatever the manifest's hash says, what the search kernel indexes with is checked
            validate.neighbor_index(nn, "the inference index", dim=W.shape[1], n_cells=anchors.shape[1])
            index.neighbors = lsh.NeighborIndex.from_state(nn)
        return index

    @property
    def memory_bytes(self) -> int:
        return self.tables.memory_bytes + (0 if self.neighbors is None else self.neighbors.memory_bytes)

    @staticmethod
    def estimate(lc: LSHConfig, d: int, n: int, n_local: int) -> dict:
        """Bytes of a rank's index over n_local of n labels with inputs of d (index: what it
        holds; index_build: the transient of building it), from the configuration alone.

        index: index_anchors anchors and their buckets, room for min(T, n_local) ids each
        (T = index_share of the labels, at least index_min_labels; a rank fills its share of
        the T); with
        index_neighbors, every rank's copy of the index_points points (unit hidden vectors
        as int8, graph of 2 x index_degree links, cells, ~5 labels a point).
        index_build: the hidden vectors of index_points points, then the larger of k-means'
        distances, one block of scores and a chunk of anchors' candidates, or a block of
        the neighbour graph's similarities."""
        A = min(lc.index_anchors, lc.index_points)
        T = index_labels(lc.index_share, n, lc.index_min_labels)
        t_local = min(T, n_local)
        index = A * d * 4 + A * (8 + 4) + A * t_local * 4
        pts = lc.index_points
        graph = 0
        if lc.index_neighbors:
            # points int8 [pts, d], graph int32 [pts, 2 degree], cells (A + 1) int64 and
            # pts int32, labels (pts + 1) int64 and ~5 int32 a point
            index += pts * d + pts * 2 * lc.index_degree * 4 + (A + 1) * 8 + pts * 4 + (pts + 1) * 8 + 5 * pts * 4
            graph = lsh.neighbors.GRAPH_BLOCK * pts * 4 + pts * d * 4  # a block's similarities; the unit rows
        # k-means: a block of distances, the seeding subset, float64 sums; fill: one block of
        # scores, and per chunk of anchors the top-T ids and scores with keys in place, a key
        # temporary and a mask
        kmeans = lsh.kmeans.kmeans_block(A) * A * 4 + 4 * A * d * 4 + A * d * 8
        fill = lsh.anchors.score_block(n_local) * n_local * 4 + min(A, INDEX_CHUNK) * t_local * (4 + 4 + 4 + 1)
        return {"index": index, "index_build": pts * d * 4 + max(kmeans, fill, graph)}


def _nearest_points(index, x, cells, ef: int, k: int, comm: Comm) -> np.ndarray:
    """The k nearest training points of every query x (the same on every rank): int32 [n, k].
    Each rank searches a share of the queries (n x k int32 gathered), so the search costs
    1/P of its time at P ranks."""
    return _rows_shared(x.shape[0], k, comm, "evaluation",
                        lambda lo, hi: index.neighbors(x[lo:hi], cells[lo:hi], ef, k)[0])


def _blocks_shared(n: int, block: int, comm: Comm, rows) -> np.ndarray:
    """int32 [n]: rows(lo, hi) for every block [lo, hi) of `block` rows, block j computed by
    rank j mod P and all gathered (lsh.kmeans's `share`: each block the product one rank
    computes, so P ranks get what one does)."""
    if comm.size == 1:
        return lsh.kmeans.blocks_here(n, block, rows)
    n_blocks = -(-n // block)
    per = -(-n_blocks // comm.size)
    mine = np.full((per, block), -1, np.int32)
    for t, j in enumerate(range(comm.rank, n_blocks, comm.size)):
        lo, hi = j * block, min(n, (j + 1) * block)
        mine[t, :hi - lo] = rows(lo, hi)
    every = comm.allgather_rows(mine, kind="index")  # [P, per, block]
    out = np.empty(n, np.int32)
    for j in range(n_blocks):
        lo, hi = j * block, min(n, (j + 1) * block)
        out[lo:hi] = every[j % comm.size, j // comm.size, :hi - lo]
    return out


def _rows_shared(n: int, width: int, comm: Comm, kind: str, rows) -> np.ndarray:
    """int32 [n, width] whose rows lo:hi of each rank's contiguous share come from rows(lo, hi),
    gathered on every rank."""
    if comm.size == 1:
        return np.ascontiguousarray(rows(0, n), dtype=np.int32)
    per, lo, hi = row_share(n, comm.rank, comm.size)
    mine = np.full((per, width), -1, np.int32)
    if hi > lo:
        mine[:hi - lo] = rows(lo, hi)
    return np.ascontiguousarray(comm.allgather_rows(mine, kind=kind).reshape(comm.size * per, width)[:n])
