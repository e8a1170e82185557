"""The LSH layer kind: a few neurons per step, picked by a candidate source."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dslide import rng
from dslide.config import Config, LSHConfig
from dslide.model import kernels
from dslide.model.batch import Batch, Out
from dslide.model.candidates import SOURCES, make_candidates
from dslide.model.layers.base import Layer
from dslide.model.loss import label_targets
from dslide.model.optim import Grads
from dslide.model.sharding import scaled_count
from dslide.timings import upkeep_name


def block_counts(lc: LSHConfig, n: int, n_local: int, share: float = 1.0) -> tuple[int, int]:
    """A rank's share of the layer's per-step counts, for n_local of its n neurons:
    (candidates per sample, random neurons); `share` of the layer's random neurons (at least
    one where it has any: Config.middle_negatives)."""
    per = lc.active_count(n)
    max_active = min(scaled_count(per, n_local, n), n_local) if per else 0
    n_random = lc.random_count(n)
    if n_random and share < 1.0:
        n_random = max(1, round(n_random * share))
    n_random = min(scaled_count(n_random, n_local, n), n_local) if n_random else 0
    return max_active, n_random


@dataclass
class Block:
    """A training step's block, as `LSHLayer.block_hook` receives it (a debug hook: tests
    and reports; the training step never keeps it).

    ids int32 [m] local ids: the labels, then the candidates, then the random neurons;
    labels, candidates, random: their counts (candidates: with lsh.scope "sample" the mean
    of each sample's own); own: None, or int32 [B, k] each sample's own candidates (-1 past
    its count)."""

    ids: np.ndarray
    labels: int
    candidates: float
    random: int
    own: np.ndarray | None = None

    @property
    def counts(self) -> tuple:
        """(labels, candidates, random)."""
        return self.labels, self.candidates, self.random


class LSHLayer(Layer):
    """A few neurons per step: z[i, c] = W[C[c]] . x_i + b[C[c]] for the step's block C.

    W_r float [n_r, d_in] neuron-major (each neuron's weight vector is
    contiguous: what the tables score and a block gathers). Rank r selects and
    computes its own neurons [lo, hi).

    In training, rank r's block C (one per step, shared by the batch, scored
    with one BLAS product x W[C]^T) holds, in this order:
    - in the output layer, every label of the batch owned here (each sample's
      own labels are its positives, the other samples' labels its negatives:
      frequent labels are held down as often as they are pushed up);
    - the union of the samples' candidates from the rank's tables (at most
      `max_active` per sample: the neurons likely to score high for them);
    - the rank's share of `min_active` neurons drawn uniformly from the rest
      afresh each step, which stand for all the other neurons of the slice: in
      the output layer's softmax each counts (n_r - |labels + candidates|) /
      |random| times (log-Q correction of sampled softmax, Jean et al. 2015).
    Labels and candidates are scored exactly, so the estimate of each sample's
    normaliser is unbiased and exact where the candidates hold its mass.

    At inference a hidden LSH layer computes every neuron; the output layer
    scores every label (`topk`), or the model's inference index
    (dslide.infer.index, built over its final weights) picks what it scores.
    """

    kind = "lsh"
    indexable = True
    neuron_axis = 0
    data_parallel = False  # its gradients are rows of a block, not whole arrays
    kernel_bound = True

    def __init__(self, *args, lsh_config: LSHConfig | None = None, **kw):
        super().__init__(*args, **kw)
        self.lc = lc = lsh_config or self.config.layer_lsh(self.index)
        self.W = np.empty((self.n_local, self.d_in), dtype=self.dtype)
        rng.init_neuron_major(self.init_key, self.lo, self.W, self.scale)
        self.b = np.zeros(self.n_local, dtype=self.dtype)
        self._optimiser((self.lo, 0, self.d_in))  # W [n_r, d_in]: row r is neuron lo + r
        self.max_active, self.n_random = block_counts(lc, self.n, self.n_local)
        self.negative_share = 1.0  # of the random neurons (`set_negative_share`)
        self.own = self.is_output and lc.scope == "sample" and self.max_active > 0
        # the softmax's random neurons stand for the rest of the slice (log-Q correction);
        # a binary loss alone takes them as plain negatives
        self.log_q = self.config.loss != "bce"
        seed = self.config.seed
        # Hash functions and anchors derive from the seed and the layer only, never from the rank.
        self.candidates = self._make_candidates()
        self.neg_key = rng.stream_key(seed, rng.NEGATIVES, self.index, self.lo)
        self._pos = np.full(self.n_local, -1, dtype=np.int32)
        self._mark = np.zeros(self.n_local, dtype=np.uint8)
        self.touched = np.zeros(self.n_local, dtype=np.uint8)
        self.block_sum, self.block_steps = np.zeros(3), 0  # running totals, for `block_mean`
        #: debug hook: None, or a callable given each training step's `Block` (tests, reports)
        self.block_hook = None
        with self.timings.time(upkeep_name(self.index)):
            self.candidates.maintain(0, self.W, self.b)

    def _make_candidates(self):
        seed = self.config.seed
        seeds = (rng.lsh_seed(seed, rng.CANDIDATES, self.index), rng.lsh_seed(seed, rng.TABLES, self.index, self.lo))
        return make_candidates(self.lc, self.d_in, self.n_local, self.max_active, seeds)

    def set_negative_share(self, share: float) -> None:
        share = float(share)
        if share != self.negative_share:
            self.negative_share = share
            self.n_random = block_counts(self.lc, self.n, self.n_local, share)[1]

    # -- the step's block ----------------------------------------------------------------

    def block(self, x, batch: Batch):
        """(C int32 [m] local ids, corr float [m] added to their logits, n_labels, own) of a
        training step; own: None, or (own_ids int32 [B, k] each sample's own candidates, -1 past
        its count; corr float [B] added to the random neurons' logits instead of `corr`)."""
        if self.is_output:
            labels = kernels.batch_labels(batch.Y[1], self.lo, self.hi, self._mark)
        else:
            labels = np.empty(0, dtype=np.int32)
        with self.timings.time("lsh_query"):
            cand = np.empty(0, dtype=np.int32) if self.own else self.candidates.batch(x)
        if labels.size and cand.size:
            cand = cand[~np.isin(cand, labels, assume_unique=True)]
        exact = np.concatenate([labels, cand]).astype(np.int32)
        rand = np.empty(0, dtype=np.int32)
        if self.n_random and exact.size < self.n_local:
            drawn = kernels.shared_sample(rng.stream_key(self.neg_key, batch.step), self.n_local, self.n_random,
                                          self._mark)
            rand = kernels.drop_taken(drawn, exact, self._mark)
        C = np.concatenate([exact, rand])
        corr = np.zeros(C.size, dtype=self.dtype)
        own, n_cand = None, cand.size
        if self.own:
            with self.timings.time("lsh_query"):
                own_ids = np.empty((x.shape[0], self.max_active), np.int32)
                cnt = self.candidates.own(x, C, own_ids)
                if cnt is None:
                    own_ids, cnt = own_ids[:, :0], np.zeros(x.shape[0], np.int64)
            row_corr = np.zeros(x.shape[0], dtype=self.dtype)
            if rand.size and self.log_q:
                row_corr[:] = np.log((self.n_local - exact.size - cnt) / rand.size)
            own, n_cand = (own_ids, row_corr), (float(cnt.mean()) if cnt.size else 0.0)
        elif self.is_output and rand.size and self.log_q:
            # the random neurons stand for every neuron of the slice not scored exactly
            corr[exact.size:] = np.log((self.n_local - exact.size) / rand.size)
        self.block_sum += (labels.size, n_cand, rand.size)
        self.block_steps += 1
        if self.block_hook is not None:
            self.block_hook(Block(C, labels.size, n_cand, rand.size, None if own is None else own[0]))
        return C, corr, labels.size, own

    # -- forward / backward ----------------------------------------------------------------

    def forward(self, x, batch: Batch, train: bool):
        """x: an Act (expanded to float [B, d_in]). Training: the step's block;
        inference: every neuron (a hidden layer; the output layer goes through `topk`)."""
        xd = x.dense()
        if not train:
            z = xd @ self.W.T
            z += self.b
            if not self.is_output:
                np.maximum(z, 0, out=z)
            return Out(z, None), (x, xd, None, self.W, None if self.is_output else z)
        C, corr, n_labels, own = self.block(xd, batch)
        # a copy: the backward pass needs the weights before the update
        WC = kernels.take_rows(self.W, C, np.empty((C.size, self.d_in), dtype=self.W.dtype))
        z = xd @ WC.T
        bc = self.b[C]
        bc += corr
        z += bc  # biases and corrections in one pass over the logits
        shift = corr[None, :] if self.is_output else None
        if own is not None:
            own_ids, row_corr = own
            z[:, n_labels:] += row_corr[:, None]
            zp = np.empty(own_ids.shape, dtype=z.dtype)
            kernels.own_scores(xd, self.W, self.b, own_ids, zp)
            z = np.concatenate([z, zp], axis=1)
            if self.config.loss.endswith("+bce"):
                shift = np.zeros_like(z)
                shift[:, n_labels:C.size] = row_corr[:, None]
        targets = None
        if self.is_output:
            rows, cols, w = label_targets(batch.Y, self.lo, self.hi)
            # every label of the batch leads the block
            targets = (rows, kernels.label_columns(cols, C[:n_labels], self._pos), w)
        else:
            np.maximum(z, 0, out=z)
        tape = (x, xd, C, WC, None if self.is_output else z, None if own is None else own[0])
        return Out(z, (C + self.lo).astype(np.int32), targets, shift), tape

    def backward(self, g, tape):
        x, xd, C, WC, out, own_ids = tape
        if out is not None:
            g *= out > 0
        m = C.size
        gs = g[:, :m] if own_ids is not None else g
        dx = gs @ WC
        G = gs.T @ xd
        gbr = gs.sum(axis=0)
        if own_ids is not None and own_ids.shape[1]:
            # each sample's own candidates: W is still the weights of the forward pass
            gp = np.ascontiguousarray(g[:, m:])
            kernels.own_dx(gp, self.W, own_ids, dx)
            flat = own_ids.ravel()
            occ = np.flatnonzero(flat >= 0)
            U, inv = np.unique(flat[occ], return_inverse=True)
            start = np.zeros(U.size + 1, np.int64)
            np.cumsum(np.bincount(inv, minlength=U.size), out=start[1:])
            order = occ[np.argsort(inv, kind="stable")].astype(np.int64)
            GU = np.empty((U.size, G.shape[1]), dtype=G.dtype)
            gbU = np.empty(U.size, dtype=gbr.dtype)
            kernels.own_dw(start, order, gp, xd, own_ids.shape[1], GU, gbU)
            C = np.concatenate([C, U.astype(C.dtype)])
            G = np.concatenate([G, GU])
            gbr = np.concatenate([gbr, gbU])
        if x.ids is not None:
            dx = np.ascontiguousarray(dx[:, x.ids])
        return dx, Grads(C, G, gbr=gbr)

    def update(self, grads: Grads, hp, step: int = 0) -> None:
        kernels.adam_rows(grads.rows, grads.G, grads.gbr, self.W, self.opt_W.m, self.opt_W.v,
                          self.b, self.opt_b.m, self.opt_b.v, hp, self.candidates.stale_mask(),
                          self.opt_W.rounding(step), self.opt_b.rounding(step))
        self.touched[grads.rows] = 1

    def sync_arrays(self) -> tuple[list, list]:
        return [self.W, self.b], []

    def rows_synced(self, ids: np.ndarray) -> None:
        self.candidates.mark_stale(ids)  # their hash codes are stale: rehashed with the updated rows

    def maintain(self, step: int) -> str | None:
        with self.timings.time(upkeep_name(self.index)):
            return self.candidates.maintain(step, self.W, self.b)

    def block_mean(self) -> dict:
        """This rank's mean block per training step so far: labels, candidates, random neurons."""
        m = self.block_sum / max(1, self.block_steps)
        return {"labels": float(m[0]), "candidates": float(m[1]), "random": float(m[2])}

    @property
    def upkeep_s(self) -> float:
        """Seconds its candidate source spent in upkeep (the run's `upkeep[l]` timing)."""
        return self.timings[upkeep_name(self.index)]

    # -- inference index ----------------------------------------------------------------

    def index_points(self) -> int:
        """Training points whose hidden vectors an inference index over it takes (0: no index,
        lsh.index_anchors 0 or a layer narrower than lsh.index_min_width)."""
        return self.lc.index_points if self.lc.builds_index(self.n) else 0

    def too_narrow_for_index(self) -> bool:
        """Narrower than lsh.index_min_width: no index, and `--lsh` scores every label."""
        return self.n < self.lc.index_min_width

    # -- state ------------------------------------------------------------------------------

    def neuron_major(self):
        return self.W

    # -- memory -----------------------------------------------------------------------------

    @classmethod
    def estimate(cls, config: Config, index, d_in, n, n_local, is_output, threads) -> dict:
        out = super().estimate(config, index, d_in, n, n_local, is_output, threads)
        item = np.dtype(config.dtype).itemsize
        B = config.batch_size
        lc = config.layer_lsh(index)
        per, n_random = block_counts(lc, n, n_local)
        source = SOURCES[lc.family].estimate(d_in, n_local, per, lc, B, item)
        out["tables"] = source["tables"]
        # _pos int32, _mark, touched, the source's stale mask uint8 [n_local]; and the source's own
        out["scratch"] = n_local * 7 + source["scratch"]
        labels = min(n_local, int(np.ceil(B * 5 * n_local / n))) if is_output else 0  # ~5 labels a point
        m = min(n_local, labels + source["candidates"] + n_random)
        # W[C] copied and its gradient [m, d]; the logits [B, m] float (softmax_stats
        # exponentiates them in place, the gradient is written over them); the dense input [B, d]
        out["step"] = max(source["step"], 2 * m * d_in * item + B * m * item + 2 * B * d_in * item)
        out["rows"] = n_local
        return out

    def state(self, weights_only: bool = False) -> dict:
        out = super().state(weights_only)
        if not weights_only:
            out.update(self.candidates.state())
        return out

    def load_state(self, arrays: dict, same_layout: bool = True, weights_only: bool = False) -> None:
        """Restore a slice; for a new layout the tables are rebuilt from the weights.
        weights_only: the weights; the training candidates stay as built."""
        super().load_state(arrays, same_layout, weights_only)
        if not weights_only:
            self._load_candidates(arrays, same_layout)

    def _load_candidates(self, arrays: dict, same_layout: bool) -> None:
        if same_layout:
            self.candidates.load_state(arrays, True, self.W, self.b)
            return
        self.candidates = self._make_candidates()
        with self.timings.time(upkeep_name(self.index)):  # a new layout's tables are built here
            self.candidates.load_state(arrays, False, self.W, self.b)

    def shard_axes(self) -> dict:
        out = super().shard_axes()
        out.update(self.candidates.shard_axes())
        return out
