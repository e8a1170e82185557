"""The network: fully connected layers split column-wise over ranks.

With P ranks, layer l of n_l neurons is split into contiguous column slices
(`dslide.sharding`); rank r holds W_r, b_r, their Adam moments and, for an
LSH layer, the tables over its own neurons only. One training step:

    forward   x_0 = X (sparse features, the same batch on every rank)
              z_r = x_{l-1} W_r[:, C_r] + b_r[C_r]   each rank its active columns C_r
                    (a dense layer: all of them; an LSH layer: one block per step)
              x_l = allgather(relu(z_r))              [B, sum_r |C_r|] with the columns' ids
              output: p = softmax over the active neurons of all ranks, its
              normaliser from one all-reduce of per-sample (max, sum exp)
    backward  dz_r = p - y on the rank's own active neurons
              dx_{l-1} = reduce_scatter(sum_r dz_r W_r[:, C_r]^T)   each rank keeps its columns
              W_r, b_r <- Adam on the rows that received gradient (lazy)

Weights of neuron j of layer l depend only on (seed, l, j), so the model is
the same whatever P is; a dense layer's exact computation on P ranks equals
the 1-rank one up to float rounding of the cross-rank sums.

Every layer speaks one protocol (`Layer`): forward(x, batch, train) ->
(Out, tape); backward(g, tape) -> (gradient of its input, parameter
gradients); update(grads, hp, step); maintain(step); state() / shard_axes() /
load_state(). What backward needs travels in the tape; the network moves
activations between ranks and calls nothing else.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from dslide import kernels as K
from dslide import rng
from dslide.candidates import make_candidates
from dslide.comm import Comm
from dslide.config import Config, LSHConfig
from dslide.sharding import scaled_count, shard_bounds


@dataclass
class Batch:
    """One mini-batch, identical on every rank.

    X: CSR (indptr int64 [B+1], indices int32, data float) of the features;
    Y: CSR (indptr int64 [B+1], indices int32) of the global label ids;
    sample_ids: int64 [B], the samples' indices in the data set (they key the
    random streams, so draws do not depend on batching across ranks);
    step: the global step number (1-based) of this batch;
    n_global: the size of the whole batch the loss is averaged over (larger
    than B when data-parallel ranks each take a slice of it; 0 means B).
    """

    X: tuple
    Y: tuple
    sample_ids: np.ndarray
    step: int
    n_global: int = 0

    @property
    def size(self) -> int:
        return self.sample_ids.shape[0]

    @property
    def mean_over(self) -> int:
        return self.n_global or self.size


@dataclass
class Act:
    """A layer's output on every rank, after the all-gather: the next layer's input.

    a float [B, m]: the values of m columns; ids int32 [m]: their global
    neuron ids (None: every neuron of the layer, in order, m = n); bounds
    int64 [P + 1]: rank r computed columns bounds[r]:bounds[r+1]; n: the
    layer's width; mask float [B, m] or None: the dropout applied to `a`
    (its backward applies it to the gradient too).
    """

    a: np.ndarray
    ids: np.ndarray | None
    bounds: np.ndarray
    n: int
    mask: np.ndarray | None = None

    def dense(self) -> np.ndarray:
        """The activations as float [B, n] (zero outside the active columns)."""
        if self.ids is None:
            return self.a
        out = np.zeros((self.a.shape[0], self.n), dtype=self.a.dtype)
        out[:, self.ids] = self.a
        return out


@dataclass
class Out:
    """A layer's own output slice: a float [B, m_r] at global ids int32 [m_r] (None: all its
    columns, in order). An output layer in training also gives its targets (rows, cols into a,
    weights) and the number of its neurons the block stands for (for checks)."""

    a: np.ndarray
    ids: np.ndarray | None
    targets: tuple | None = None


def label_targets(Y, lo: int, hi: int):
    """The batch's labels owned by columns [lo, hi): (rows int64, local cols int64, weights float64).

    Each sample's labels share its unit of target mass: weight 1 / |labels|.
    """
    yp, yi = Y
    per = np.diff(yp)
    rows = np.repeat(np.arange(per.shape[0]), per)
    w = 1.0 / per[rows]
    sel = (yi >= lo) & (yi < hi)
    return rows[sel], yi[sel].astype(np.int64) - lo, w[sel]


# ----------------------------------------------------------------------------
# softmax cross-entropy over logits split over ranks: local statistics,
# exchange (Network), finish
# ----------------------------------------------------------------------------


def softmax_stats(z):
    """Per sample, this rank's (m_i = max_j z_ij, s_i = sum_j exp(z_ij - m_i)) as float64 [B] each.

    In place, z becomes exp(z - m) (rows of -inf: m = -inf, s = 0, z = 0);
    values below kernels.TINY are flushed to zero (no subnormal leaves).
    """
    B = z.shape[0]
    m = np.full(B, -np.inf)
    if z.shape[1]:
        np.maximum(m, z.max(axis=1), out=m)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    K.shift_rows(z, m_safe)
    np.exp(z, out=z)
    se = np.zeros(B)
    K.flush_sum_rows(z, se)
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
    K.scale_flush_rows(e, scale)
    rows, cols, w = targets
    np.subtract.at(e, (rows, cols), (w / N).astype(e.dtype))
    return float(np.sum(w * (np.log(gsum[rows]) + gmax[rows] - y_logit))) / N


# ----------------------------------------------------------------------------
# parameter gradients (what backward hands to update)
# ----------------------------------------------------------------------------


@dataclass
class Grads:
    """Gradients of some rows of a layer's parameters.

    rows int32 [R] or None (every row); G float [R or all, d] (rows of the
    layer's W in its own layout); gb float [n_r] of the bias (every column) or
    None when the bias gradient goes with the rows (gbr float [R]).
    For a dense layer over raw sparse features G is not materialised:
    `sparse` = (touched, start, order, samples, data, dz) for the fused kernel.
    """

    rows: np.ndarray | None = None
    G: np.ndarray | None = None
    gb: np.ndarray | None = None
    gbr: np.ndarray | None = None
    sparse: tuple | None = None

    def arrays(self) -> list:
        """The arrays a data-parallel exchange sums over ranks."""
        return [a for a in (self.G, self.gb, self.gbr) if a is not None]


class _Adam:
    """Adam moments m, v of one parameter array, stored as `moment_dtype` (a float type, or
    uint16 bit patterns for "bfloat16"; see kernels.py).

    key: the array's stream key for stochastic rounding; origin (r0, c0, stride): element
    (r, c) of the local array is global element (r + r0) * stride + c + c0 of the layer's
    (so the rounding does not depend on how the layer is split over ranks).
    """

    def __init__(self, shape, moment_dtype: str, key, origin):
        dtype = K.MOMENT_DTYPES[moment_dtype]
        self.rounds = moment_dtype == "bfloat16"
        # np.zeros maps zero pages lazily: rows that never receive gradient cost no memory
        self.m = np.zeros(shape, dtype=dtype)
        self.v = np.zeros(shape, dtype=dtype)
        self.key, self.origin = key, origin

    def rounding(self, step: int) -> np.ndarray:
        """The kernels' `rk` argument for this step."""
        if not self.rounds:
            return K.NO_ROUNDING
        return K.rounding_key(self.key, step, *self.origin)


# ----------------------------------------------------------------------------
# layers
# ----------------------------------------------------------------------------


class Layer:
    """Common state of a layer slice: sizes, shard, parameters, optimiser.

    The protocol every kind implements:
        forward(x, batch, train) -> (Out, tape)   x: the batch's CSR features
                                                  (first layer) or an Act
        backward(g, tape) -> (dx, Grads)          g float [B, m_r]: gradient of
                                                  this rank's outputs; dx: partial
                                                  gradient of x's columns [B, m]
                                                  (None for raw features)
        update(grads, hp, step)                   Adam on what received gradient (step:
                                                  the global step, which keys the rounding
                                                  of bfloat16 moments)
        maintain(step) -> str | None              periodic upkeep (LSH tables)
        state() -> {name: array}, shard_axes() -> {name: axis | None}, load_state(arrays, same_layout)
        sync_arrays() -> (rows, whole)            what replicas average (dslide.replicas)
        rows_synced(ids)                          rows a replica synchronisation rewrote

    `touched` uint8 [rows of W]: set by `update` on every row of W it changed
    (axis 0: input rows of a dense layer, neurons of an LSH layer); the replica
    synchronisation reads and clears it.
    """

    kind = "?"

    def __init__(self, index, d_in, n, is_output, comm: Comm, config: Config, dtype, dense_grads=False,
                 weights=None):
        self.index, self.d_in, self.n, self.is_output = index, d_in, n, is_output
        self.comm, self.config, self.dtype = comm, config, np.dtype(dtype)
        # data parallel: every rank holds the whole layer and gradients are summed over ranks,
        # which needs them as whole arrays
        self.dense_grads = dense_grads
        self.bounds = shard_bounds(n, comm.size, weights)
        self.lo, self.hi = int(self.bounds[comm.rank]), int(self.bounds[comm.rank + 1])
        self.n_local = self.hi - self.lo
        # Glorot uniform, except for a first hidden layer: it sums a few rows of W
        # per sample and its inputs are L2-normalised rows (input_norm="l2"), so
        # the scale of its pre-activations is that of one weight whatever the
        # number of features; Glorot's sqrt(6 / (n_features + n)) ties it to the
        # feature count instead. Its scale is the `init_input_scale` setting.
        if index == 0 and not is_output:
            self.scale = config.init_input_scale
        else:
            self.scale = np.sqrt(6.0 / (d_in + n))
        self.init_key = rng.stream_key(config.seed, rng.INIT, index)
        # an output layer's neighbour labels (dslide.fusion), built after training
        self.neighbour_labels = None

    def _optimiser(self, w_origin) -> None:
        """Adam state for W (its global layout: w_origin = (r0, c0, stride)) and b."""
        md = self.config.moment_dtype
        key = rng.stream_key(self.config.seed, rng.ROUNDING, self.index)
        self.opt_W = _Adam(self.W.shape, md, rng.stream_key(key, 0), w_origin)
        self.opt_b = _Adam(self.b.shape, md, rng.stream_key(key, 1), (0, self.lo, self.n))

    def maintain(self, step: int) -> str | None:
        return None

    # -- replicas (dslide.replicas) ----------------------------------------------------

    def sync_arrays(self) -> tuple[list, list]:
        """(rows, whole): the parameters replicas average. `rows` share axis 0 with
        `touched` and are averaged on the rows some replica changed; `whole` change
        entirely every step (a dense layer's bias) and are averaged whole. Adam's
        moments are not among them: each replica keeps its own (docs/replicas.md)."""
        return [self.W], [self.b]

    def rows_synced(self, ids: np.ndarray) -> None:
        """Rows `ids` of W were rewritten by a replica synchronisation."""

    # -- state (checkpoints) ---------------------------------------------------------

    def state(self, weights_only: bool = False) -> dict:
        """This slice's arrays by name (the live arrays, not copies); weights_only: what
        inference needs (no optimiser state, nothing only training uses)."""
        out = {"W": self.W, "b": self.b}
        if not weights_only:
            out.update({"W.m": self.opt_W.m, "W.v": self.opt_W.v, "b.m": self.opt_b.m, "b.v": self.opt_b.v})
        if self.neighbour_labels is not None:
            out.update({f"knn.{k}": v for k, v in self.neighbour_labels.state_arrays().items()})
        return out

    def shard_axes(self) -> dict:
        """For each array of `state`: the axis along which ranks split it (the neuron axis),
        None for an array every rank holds whole and alike; arrays not named here are
        this rank's own derived state, rebuilt when the layout changes."""
        from dslide import fusion

        c = self.neuron_axis
        return {"W": c, "W.m": c, "W.v": c, "b": 0, "b.m": 0, "b.v": 0, **{f"knn.{k}": None for k in fusion.KEYS}}

    def load_state(self, arrays: dict, same_layout: bool = True, weights_only: bool = False) -> None:
        """Restore a slice from `state()`-named arrays (for a new layout: the ones in
        `shard_axes`, already cut to this rank's columns). An entry that is the live array
        itself (from `state()`) was filled in place. weights_only: the arrays of
        `state(weights_only=True)` only; the optimiser state is left as it is."""
        if "knn.y_ptr" in arrays:  # the same on every rank
            from dslide import fusion

            self.neighbour_labels = fusion.NeighbourLabels.from_state(
                {k[len("knn."):]: v for k, v in arrays.items() if k.startswith("knn.")})
        for name, arr in Layer.state(self, weights_only).items():
            if name.startswith("knn."):
                continue
            if name not in arrays:
                raise ValueError(f"layer {self.index}: checkpoint lacks {name!r}")
            new = arrays[name]
            if new is arr:  # filled in place by the caller
                continue
            new = np.asarray(new)
            if new.shape != arr.shape or new.dtype != arr.dtype:
                raise ValueError(f"layer {self.index}: checkpoint's {name!r} is {new.dtype} {new.shape}, "
                                 f"this network's slice needs {arr.dtype} {arr.shape}"
                                 + (" (Adam moments of another adam_dtype)" if "." in name else ""))
            arr[...] = new


class DenseLayer(Layer):
    """Every neuron computed: Y_r = act(X W_r + b_r), W = [W_0 ... W_{P-1}].

    W_r float [d_in, n_r] input-major (rows are input features, so a sparse
    input sums a few rows and a block input takes a few rows); b_r float [n_r].
    Rank r owns columns [lo, hi) of the layer.
    """

    kind = "dense"
    neuron_axis = 1

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.W = np.empty((self.d_in, self.n_local), dtype=self.dtype)
        rng.init_input_major(self.init_key, self.lo, self.W, self.scale)
        self.b = np.zeros(self.n_local, dtype=self.dtype)
        self._optimiser((0, self.lo, self.n))  # W [d_in, n_r]: column c is neuron lo + c
        self._count = np.zeros(self.d_in, dtype=np.int32)
        self._gbuf = K.thread_scratch(self.n_local, self.dtype)
        self.touched = np.zeros(self.d_in, dtype=np.uint8)

    def forward(self, x, batch: Batch, train: bool):
        """Hidden: relu(x W_r + b_r) [B, n_r]; output: the logits. x: CSR features or an Act."""
        if isinstance(x, Act):
            z = x.a @ (self.W if x.ids is None else self.W[x.ids])
            z += self.b
        else:
            indptr, indices, data = x
            z = np.empty((indptr.shape[0] - 1, self.n_local), dtype=self.dtype)
            K.csr_times_rows(indptr, indices, data.astype(self.dtype, copy=False), self.W, self.b, z)
        if not self.is_output:
            np.maximum(z, 0, out=z)
        targets = label_targets(batch.Y, self.lo, self.hi) if (self.is_output and train) else None
        return Out(z, None, targets), (x, None if self.is_output else z)

    def backward(self, g, tape):
        x, out = tape
        if out is not None:
            g *= out > 0
        gb = g.sum(axis=0)
        if isinstance(x, Act):
            Wx = self.W if x.ids is None else self.W[x.ids]
            dx = g @ Wx.T
            G = x.a.T @ g
            if x.ids is not None and self.dense_grads:
                full = np.zeros_like(self.W)
                full[x.ids] = G
                return dx, Grads(None, full, gb)
            return dx, Grads(x.ids, G, gb)
        # raw sparse features: only the rows of features present in the batch get gradient
        indptr, indices, data = x
        order = np.empty(indices.shape[0], dtype=np.int64)
        touched, start = K.group_by_row(indices, self.d_in, self._count, order)
        samples = np.repeat(np.arange(indptr.shape[0] - 1, dtype=np.int32), np.diff(indptr))
        data = data.astype(self.dtype, copy=False)
        if self.dense_grads:  # as DDP does it: the whole gradient, for the all-reduce
            G = np.zeros_like(self.W)
            K.rows_grad(touched, start, order, samples, data, g, G)
            return None, Grads(None, G, gb)
        return None, Grads(sparse=(touched, start, order, samples, data, g), gb=gb)

    def update(self, grads: Grads, hp, step: int = 0) -> None:
        rW, rb = self.opt_W.rounding(step), self.opt_b.rounding(step)
        K.adam_dense(self.b, self.opt_b.m, self.opt_b.v, grads.gb, hp, rb)
        if grads.sparse is not None:
            touched, start, order, samples, data, g = grads.sparse
            empty = np.empty(0, dtype=self.dtype)
            K.rows_grad_adam(touched, start, order, samples, data, g, self.W, self.opt_W.m, self.opt_W.v,
                             empty, empty, empty, hp, self._gbuf, self.touched, rW, K.NO_ROUNDING)
        elif grads.rows is None:
            K.adam_dense(self.W, self.opt_W.m, self.opt_W.v, grads.G, hp, rW)
            self.touched[:] = 1
        else:
            K.adam_rows_nobias(grads.rows, grads.G, self.W, self.opt_W.m, self.opt_W.v, hp, rW)
            self.touched[grads.rows] = 1

    def neuron_major(self):
        """W_r^T as float [n_r, d_in] (a view)."""
        return self.W.T


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
    scores every label (exact) or what its inference index retrieves
    (`build_index`: anchor tables built from the final weights).
    """

    kind = "lsh"
    neuron_axis = 0

    def __init__(self, *args, lsh_config: LSHConfig, **kw):
        super().__init__(*args, **kw)
        self.lc = lc = lsh_config
        self.W = np.empty((self.n_local, self.d_in), dtype=self.dtype)
        rng.init_neuron_major(self.init_key, self.lo, self.W, self.scale)
        self.b = np.zeros(self.n_local, dtype=self.dtype)
        self._optimiser((self.lo, 0, self.d_in))  # W [n_r, d_in]: row r is neuron lo + r
        per = lc.active_count(self.n)
        self.max_active = min(scaled_count(per, self.n_local, self.n), self.n_local) if per else 0
        self.own = self.is_output and lc.scope == "sample" and self.max_active > 0
        self.max_candidates = scaled_count(lc.max_candidates, self.n_local, self.n) if lc.max_candidates else 0
        n_random = lc.random_count(self.n)
        self.n_random = min(scaled_count(n_random, self.n_local, self.n), self.n_local) if n_random else 0
        seed = self.config.seed
        # Hash functions and anchors derive from the seed and the layer only, never from the rank.
        self.candidates = self._make_candidates()
        self.neg_key = rng.stream_key(seed, rng.NEGATIVES, self.index, self.lo)
        self._pos = np.full(self.n_local, -1, dtype=np.int32)
        self._mark = np.zeros(self.n_local, dtype=np.uint8)
        self.dirty = np.zeros(self.n_local, dtype=np.uint8)
        self.touched = np.zeros(self.n_local, dtype=np.uint8)
        self.inference = None  # inference tables (lsh.AnchorTables), from build_index
        self.neighbors = None  # the index's nearest training points (lsh.NeighborIndex), from build_index
        self.query_time = 0.0
        self.last_block = (0, 0, 0)  # (labels, candidates, random) of the last training step, for reports
        self.last_ids = np.empty(0, dtype=np.int32)  # and its local ids, for checks
        self.last_own = None  # lsh.scope "sample": each sample's own candidates of the last step, for checks
        self.block_sum, self.block_steps = np.zeros(3), 0  # running totals, for `block_mean`
        self.candidates.maintain(0, self.W, self.b, self.dirty)

    def _make_candidates(self):
        seed = self.config.seed
        return make_candidates(self.lc.family, self.d_in, self.n_local, self.max_active, self.lc,
                               (_seed31(seed, 7, self.index), _seed31(seed, 8, self.index, self.lo)),
                               self.max_candidates)

    # -- the step's block ----------------------------------------------------------------

    def block(self, x, batch: Batch):
        """(C int32 [m] local ids, corr float [m] added to their logits, n_labels, own) of a
        training step; own: None, or (P int32 [B, k] each sample's own candidates, -1 past
        its count; corr float [B] added to the random neurons' logits instead of `corr`)."""
        if self.is_output:
            g = batch.Y[1]
            labels = np.unique(g[(g >= self.lo) & (g < self.hi)]).astype(np.int32) - self.lo
        else:
            labels = np.empty(0, dtype=np.int32)
        t0 = time.perf_counter()
        cand = np.empty(0, dtype=np.int32) if self.own else self.candidates.batch(x)
        self.query_time += time.perf_counter() - t0
        if labels.size and cand.size:
            cand = cand[~np.isin(cand, labels, assume_unique=True)]
        exact = np.concatenate([labels, cand]).astype(np.int32)
        rand = np.empty(0, dtype=np.int32)
        if self.n_random and exact.size < self.n_local:
            drawn = K.shared_sample(rng.stream_key(self.neg_key, batch.step), self.n_local, self.n_random, self._mark)
            self._mark[exact] = 1
            rand = drawn[self._mark[drawn] == 0]
            self._mark[exact] = 0
        C = np.concatenate([exact, rand])
        corr = np.zeros(C.size, dtype=self.dtype)
        own, n_cand = None, cand.size
        if self.own:
            t0 = time.perf_counter()
            P = np.empty((x.shape[0], self.max_active), np.int32)
            self._mark[C] = 1
            cnt = self.candidates.own(x, self._mark, P)
            self._mark[C] = 0
            if cnt is None:
                P, cnt = P[:, :0], np.zeros(x.shape[0], np.int64)
            self.query_time += time.perf_counter() - t0
            row_corr = np.zeros(x.shape[0], dtype=self.dtype)
            if rand.size:
                row_corr[:] = np.log((self.n_local - exact.size - cnt) / rand.size)
            own, n_cand = (P, row_corr), (float(cnt.mean()) if cnt.size else 0.0)
            self.last_own = P
        elif self.is_output and rand.size:
            # the random neurons stand for every neuron of the slice not scored exactly
            corr[exact.size:] = np.log((self.n_local - exact.size) / rand.size)
        self.last_block, self.last_ids = (labels.size, n_cand, rand.size), C
        self.block_sum += self.last_block
        self.block_steps += 1
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
        WC = self.W[C]  # a copy: the backward pass needs the weights before the update
        z = xd @ WC.T
        z += self.b[C]
        z += corr
        if own is not None:
            P, row_corr = own
            z[:, n_labels:] += row_corr[:, None]
            zp = np.empty(P.shape, dtype=z.dtype)
            K.own_scores(xd, self.W, self.b, P, zp)
            z = np.concatenate([z, zp], axis=1)
        targets = None
        if self.is_output:
            rows, cols, w = label_targets(batch.Y, self.lo, self.hi)
            self._pos[C[:n_labels]] = np.arange(n_labels, dtype=np.int32)
            cols = self._pos[cols].astype(np.int64)  # every label of the batch leads the block
            self._pos[C[:n_labels]] = -1
            targets = (rows, cols, w)
        else:
            np.maximum(z, 0, out=z)
        tape = (x, xd, C, WC, None if self.is_output else z, None if own is None else own[0])
        return Out(z, (C + self.lo).astype(np.int32), targets), tape

    def backward(self, g, tape):
        x, xd, C, WC, out, P = tape
        if out is not None:
            g *= out > 0
        m = C.size
        gs = g[:, :m] if P is not None else g
        dx = gs @ WC
        G = gs.T @ xd
        gbr = gs.sum(axis=0)
        if P is not None and P.shape[1]:
            # each sample's own candidates: W is still the weights of the forward pass
            gp = np.ascontiguousarray(g[:, m:])
            K.own_dx(gp, self.W, P, dx)
            flat = P.ravel()
            occ = np.flatnonzero(flat >= 0)
            U, inv = np.unique(flat[occ], return_inverse=True)
            start = np.zeros(U.size + 1, np.int64)
            np.cumsum(np.bincount(inv, minlength=U.size), out=start[1:])
            order = occ[np.argsort(inv, kind="stable")].astype(np.int64)
            GU = np.empty((U.size, G.shape[1]), dtype=G.dtype)
            gbU = np.empty(U.size, dtype=gbr.dtype)
            K.own_dw(start, order, gp, xd, P.shape[1], GU, gbU)
            C = np.concatenate([C, U.astype(C.dtype)])
            G = np.concatenate([G, GU])
            gbr = np.concatenate([gbr, gbU])
        if x.ids is not None:
            dx = np.ascontiguousarray(dx[:, x.ids])
        return dx, Grads(C, G, gbr=gbr)

    def update(self, grads: Grads, hp, step: int = 0) -> None:
        K.adam_rows(grads.rows, grads.G, grads.gbr, self.W, self.opt_W.m, self.opt_W.v,
                    self.b, self.opt_b.m, self.opt_b.v, hp, self.dirty,
                    self.opt_W.rounding(step), self.opt_b.rounding(step))
        self.touched[grads.rows] = 1

    def sync_arrays(self) -> tuple[list, list]:
        return [self.W, self.b], []

    def rows_synced(self, ids: np.ndarray) -> None:
        self.dirty[ids] = 1  # their hash codes are stale: rehashed with the updated rows

    def maintain(self, step: int) -> str | None:
        return self.candidates.maintain(step, self.W, self.b, self.dirty)

    def block_mean(self) -> dict:
        """This rank's mean block per training step so far: labels, candidates, random neurons."""
        m = self.block_sum / max(1, self.block_steps)
        return {"labels": float(m[0]), "candidates": float(m[1]), "random": float(m[2])}

    @property
    def upkeep_s(self) -> float:
        return self.candidates.upkeep_s

    # -- inference index ----------------------------------------------------------------

    def build_index(self, H, comm: Comm, labels=None) -> dict:
        """Inference tables from the final weights: anchors = k-means of the inputs H
        float [n, d_in] (the same on every rank), each bucket the labels that score
        highest at its anchor (a threshold agreed across ranks, so P ranks keep what 1
        rank keeps). labels: (ptr int64 [n + 1], ids int32) the points' labels (CSR,
        global ids); with lsh.index_neighbors > 0 a query also scores the labels of its
        index_neighbors nearest points (lsh.neighbors), and the buckets give up the room
        those take on average, so that a query scores `index_share` of the layer in all.
        Returns timings."""
        from dslide import lsh

        lc = self.lc
        t0 = time.perf_counter()
        A = min(lc.index_anchors, H.shape[0])
        use_nn = lc.index_neighbors > 0 and labels is not None
        per_point = float(labels[0][-1]) / max(1, H.shape[0]) if use_nn else 0.0
        T = index_bucket(lc.index_share, self.n, lc.index_neighbors if use_nn else 0, per_point)
        tables = lsh.AnchorTables(self.d_in, 1, A, min(T, self.n_local), _seed31(self.config.seed, 9, self.index))
        tables.fit_anchors(H)
        t1 = time.perf_counter()
        self.inference = tables
        self.neighbors = None
        fill_index(self, comm, T)
        t2 = time.perf_counter()
        info = {"kmeans_s": t1 - t0, "fill_s": t2 - t1, "anchors": A, "bucket": T}
        if use_nn:
            self.neighbors = lsh.NeighborIndex.build(H, tables.codes(H)[:, 0], A, labels[0], labels[1],
                                                     lc.index_degree, lc.index_degree,
                                                     rows=lambda P, M: _graph_rows(P, M, comm))
            info["graph_s"] = time.perf_counter() - t2
        return info

    def topk(self, x, k: int):
        """This rank's best k neurons per input among what the inference index retrieves
        (its buckets and, when the index has them, its nearest training points' labels):
        (scores float64 [B, k], global ids int64 [B, k], n_scored int64 [B])."""
        if self.inference is None:
            raise ValueError("this model has no inference index for --lsh: it is built at the end of "
                             "training (lsh.index_anchors > 0); score every label instead (exact)")
        t0 = time.perf_counter()
        x = np.ascontiguousarray(x, dtype=np.float32)
        codes = self.inference.codes(x, self.lc.index_probes)
        extras = None
        if self.neighbors is not None:
            nn = _nearest_points(self.neighbors, x, codes[:, 0], self.lc.index_search, self.lc.index_neighbors,
                                 self.comm)
            extras = self.neighbors.extras(nn, self.lo, self.lo + self.n_local)
        s, i, n = self.inference.topk(x, self.W, self.b, k, self.lc.index_probes, extras=extras, codes=codes)
        i[i >= 0] += self.lo
        self.query_time += time.perf_counter() - t0
        return s, i, n

    # -- state ------------------------------------------------------------------------------

    def neuron_major(self):
        return self.W

    def state(self, weights_only: bool = False) -> dict:
        out = super().state(weights_only)
        if not weights_only:
            out["dirty"] = self.dirty
            out.update(self.candidates.state())
        if self.inference is not None:
            out.update({f"index.{k}": v for k, v in self.inference.state_arrays().items()})
            out["index.bucket"] = np.array([self.inference.bucket_target], dtype=np.int64)
        if self.neighbors is not None:
            out.update({f"nn.{k}": v for k, v in self.neighbors.state_arrays().items()})
        return out

    def load_state(self, arrays: dict, same_layout: bool = True, weights_only: bool = False) -> None:
        """Restore a slice; for a new layout the tables are rebuilt from the weights
        (and the inference index refilled from its anchors). weights_only: the weights
        and the inference index; the training candidates stay as built."""
        super().load_state(arrays, same_layout, weights_only)
        if not weights_only:
            self._load_candidates(arrays, same_layout)
        if "index.anchors" in arrays:
            from dslide import lsh

            anchors = np.asarray(arrays["index.anchors"])
            tables = lsh.AnchorTables(self.d_in, 1, anchors.shape[1], 1, _seed31(self.config.seed, 9, self.index))
            tables.bucket_target = int(np.asarray(arrays["index.bucket"])[0])
            self.inference = tables
            if same_layout:
                tables.load_state_arrays({k[len("index."):]: v for k, v in arrays.items()
                                          if k.startswith("index.") and k != "index.bucket"})
            else:
                tables.anchors[...] = anchors
                tables.ready = True
                fill_index(self, self.comm, tables.bucket_target)
        if "nn.points" in arrays:  # the same on every rank: each reads the labels of its own slice
            from dslide import lsh

            self.neighbors = lsh.NeighborIndex.from_state({k[len("nn."):]: v for k, v in arrays.items()
                                                           if k.startswith("nn.")})

    def _load_candidates(self, arrays: dict, same_layout: bool) -> None:
        if same_layout:
            self.dirty[...] = np.asarray(arrays["dirty"])
            self.candidates.load_state(arrays)
        else:
            self.dirty[...] = 0
            self.candidates = self._make_candidates()
            anchor = {k: v for k, v in arrays.items() if k.startswith("anchor.")}
            if anchor and bool(np.asarray(anchor["anchor.ready"])[0]):
                # the anchors are the same on every rank: keep them, refill from the weights
                self.candidates.tables.load_state_arrays({
                    "anchors": anchor["anchor.anchors"], "counts": anchor["anchor.counts"],
                    "buckets": np.zeros((self.lc.L, self.lc.anchors, 0), np.int32),
                    "fill": np.zeros((self.lc.L, self.lc.anchors), np.int32), "ready": np.array([True])})
            self.candidates.maintain(0, self.W, self.b, self.dirty)
            if "anchor.schedule" in anchor:
                self.candidates.refill.load(anchor["anchor.schedule"])

    def shard_axes(self) -> dict:
        from dslide import lsh

        out = super().shard_axes()
        out.update({"anchor.anchors": None, "anchor.counts": None, "anchor.ready": None, "anchor.schedule": None,
                    "index.anchors": None, "index.bucket": None})
        out.update({f"nn.{k}": None for k in lsh.NeighborIndex.KEYS})
        return out


#: anchors of the inference index filled at a time: their [chunk, T] ids, scores-turned-keys
#: and comparison masks are the fill's transient (13 bytes an entry; 256 x 6,701 = 22 MB at
#: 670,091 labels, against 178 MB for all 2048 anchors at once), besides the one block of
#: scores that score_top reuses
INDEX_CHUNK = 256


def index_bucket(share: float, n: int, neighbors: int = 0, labels_per_point: float = 0.0) -> int:
    """Bucket size T of an inference index that scores `share` of n labels per query: the
    neighbours' labels (about neighbors x labels_per_point ids a query) come out of it."""
    return max(1, int(np.ceil(share * n)) - int(np.ceil(neighbors * labels_per_point)))


def _nearest_points(index, x, cells, ef: int, k: int, comm: Comm) -> np.ndarray:
    """The k nearest training points of every query x (the same on every rank): int32 [n, k].
    Each rank searches a share of the queries (n x k int32 gathered), so the search costs
    1/P of its time at P ranks."""
    return _rows_shared(x.shape[0], k, comm, "evaluation",
                        lambda lo, hi: index.neighbors(x[lo:hi], cells[lo:hi], ef, k)[0])


def _graph_rows(P, M: int, comm: Comm) -> np.ndarray:
    """The k-NN graph rows of all n points P (unit rows, the same on every rank): int32 [n, M],
    each rank computing a share of them."""
    from dslide import lsh

    return _rows_shared(P.shape[0], M, comm, "index", lambda lo, hi: lsh.neighbors.knn_rows(P, lo, hi, M))


def _rows_shared(n: int, width: int, comm: Comm, kind: str, rows) -> np.ndarray:
    """int32 [n, width] whose rows lo:hi of each rank's contiguous share come from rows(lo, hi),
    gathered on every rank."""
    if comm.size == 1:
        return np.ascontiguousarray(rows(0, n), dtype=np.int32)
    per = -(-n // comm.size)
    lo, hi = min(n, comm.rank * per), min(n, (comm.rank + 1) * per)
    mine = np.full((per, width), -1, np.int32)
    if hi > lo:
        mine[:hi - lo] = rows(lo, hi)
    return np.ascontiguousarray(comm.allgather_rows(mine, kind=kind).reshape(comm.size * per, width)[:n])


def fill_index(layer: LSHLayer, comm: Comm, T: int) -> None:
    """Fill layer.index's buckets: per anchor, this rank's labels among the T best of the
    whole layer (a threshold found by bisection over ranks: P all-reduces of A counts).
    Anchors are taken INDEX_CHUNK at a time (every rank the same chunks, in order), so
    besides the buckets int32 [A, min(T, n_local)] the transient stays bounded."""
    from dslide import lsh

    tables = layer.inference
    C = tables.anchors[0]
    A, t = C.shape[0], min(T, layer.n_local)
    lc = layer.lc
    # a bucket serves the queries of its anchor's cell, h = c + e, whose scores are
    # w.c + b + w.e: rank by a shrunk mean plus a margin for the spread of w.e (sd ~ |w|)
    #   bucket score_j = index_shrink * w_j.c + b_j + index_spread * |w_j|
    Wn = layer.neuron_major()
    wn = np.sqrt(np.einsum("ij,ij->i", Wn, Wn, dtype=np.float64))
    b_eff = (layer.b + lc.index_spread * wn).astype(layer.b.dtype)
    del wn
    buckets = np.empty((1, A, t), np.int32)
    fill = np.empty((1, A), np.int32)
    for s in range(0, A, INDEX_CHUNK):
        Cs = np.ascontiguousarray(lc.index_shrink * C[s:s + INDEX_CHUNK], dtype=C.dtype)
        ids, scores = lsh.anchors.score_top(Cs, layer.W, b_eff, t)
        keys = _order_keys(scores, in_place=True)  # int32 over the scores' own memory
        theta = kth_largest(keys, T, comm)
        f = (keys >= theta[:, None]).sum(axis=1).astype(np.int32)  # rows are sorted best first
        del keys, scores
        # what a bucket keeps, by id: queries then read the weight rows in address order
        # (25-30% faster scoring than in score order, measured at 670,091 labels)
        ids[np.arange(t)[None, :] >= f[:, None]] = np.iinfo(np.int32).max
        ids.sort(axis=1)
        buckets[0, s:s + INDEX_CHUNK] = ids
        fill[0, s:s + INDEX_CHUNK] = f
    tables.set_buckets(buckets, fill)
    tables.bucket_target = T


def _order_keys(scores, in_place: bool = False) -> np.ndarray:
    """Integer keys that order like the float32 scores (the IEEE bit pattern, sign-folded):
    int64, or with in_place int32 written over the scores' own memory (float32, C-contiguous)."""
    if not in_place:
        i = np.ascontiguousarray(scores, dtype=np.float32).view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF) - 1, i)
    keys = scores.view(np.int32)
    mag = keys & 0x7FFFFFFF
    np.negative(mag, out=mag)
    mag -= 1
    np.copyto(keys, mag, where=keys < 0)
    return keys


def kth_largest(keys, k: int, comm: Comm) -> np.ndarray:
    """Per row, the k-th largest key over every rank's rows keys int64 [A, T_r]:
    the largest t with sum_r |{keys >= t}| >= k (bisection; -2^31 - 1 when fewer
    than k keys exist). Every rank gets the same thresholds."""
    A = keys.shape[0]
    lo = np.full(A, -(2**31) - 1, dtype=np.int64)
    hi = np.full(A, 2**31 - 1, dtype=np.int64)
    if comm.size == 1:
        if keys.shape[1] >= k:
            return np.sort(keys, axis=1)[:, keys.shape[1] - k]
        return lo
    while (lo < hi).any():
        mid = (lo + hi + 1) // 2
        cnt = comm.allreduce_sum((keys >= mid[:, None]).sum(axis=1).astype(np.int64), kind="index")
        ok = cnt >= k
        lo = np.where(ok, mid, lo)
        hi = np.where(ok, hi, mid - 1)
    return lo


def _seed31(*words) -> int:
    """A non-negative 63-bit seed for the lsh package from (seed, *words)."""
    return int(rng.stream_key(*words) >> np.uint64(1))


class Network:
    """The layers of one rank, and one training step over a batch."""

    def __init__(self, config: Config, n_features: int, n_labels: int, comm: Comm | None = None,
                 total_steps: int | None = None, shard_weights=None):
        """shard_weights: each rank's share of every layer (float [P]); None takes the
        configuration's explicit `shard_weights` (even shares when it is empty or "auto")."""
        config = config.resolve(n_labels)
        self.config = config
        self.world = comm or Comm()
        if config.parallel == "data":
            # every rank the whole model, a slice of each batch, gradients all-reduced
            if any(config.layer_kind(i, w) == "lsh" for i, w in enumerate([*config.hidden, n_labels])):
                raise ValueError("parallel = 'data' all-reduces dense gradients and needs dense layers; "
                                 "set exact = true (or kinds to 'dense'), or use parallel = 'model'")
            self.comm = Comm()
            self.grad_comm = self.world if self.world.size > 1 else None
        else:
            self.comm, self.grad_comm = self.world, None
        self.dtype = np.dtype(config.dtype)
        if shard_weights is None and isinstance(config.shard_weights, tuple) and config.shard_weights:
            shard_weights = config.shard_weights
        self.shard_weights = None if shard_weights is None else tuple(float(w) for w in shard_weights)
        widths = [n_features, *config.hidden, n_labels]
        for i, w in enumerate(widths[1:]):
            if w < self.comm.size:
                raise ValueError(f"layer {i} has {w} neurons, fewer than the {self.comm.size} ranks; "
                                 f"every rank needs at least one neuron of every layer")
        self.layers: list[Layer] = []
        for i in range(len(widths) - 1):
            args = (i, widths[i], widths[i + 1], i == len(widths) - 2, self.comm, config, self.dtype)
            kw = {"dense_grads": self.grad_comm is not None, "weights": self.shard_weights}
            if config.layer_kind(i, widths[i + 1]) == "lsh":
                self.layers.append(LSHLayer(*args, lsh_config=config.layer_lsh(i), **kw))
            else:
                self.layers.append(DenseLayer(*args, **kw))
        self.n_features, self.n_labels = n_features, n_labels
        self.widths = widths
        self.step = 0
        self.total_steps = total_steps
        self.timers = defaultdict(float)  # seconds per phase, for benchmarks

    @property
    def n_params(self) -> int:
        """Parameters of the whole model (all ranks): sum of d_in * n + n over layers."""
        return sum(d * n + n for d, n in zip(self.widths[:-1], self.widths[1:]))

    def describe(self) -> list[dict]:
        """The shape of the network: one dict per layer (what a checkpoint must match)."""
        return [{"index": l.index, "kind": l.kind, "d_in": l.d_in, "n": l.n} for l in self.layers]

    # -- training ---------------------------------------------------------------------------

    def init_output_bias(self, label_counts: np.ndarray, n_points: int) -> None:
        """Output biases from the label prior: b_j = log((count_j + 1) / (n + n_labels)).

        label_counts: float [n_labels], training points per label (the whole
        vector on every rank; each takes its slice).
        """
        out = self.layers[-1]
        prior = np.log((label_counts[out.lo:out.hi] + 1.0) / (n_points + self.n_labels))
        out.b[:] = prior.astype(self.dtype)
        out.maintain(0)  # tables that rank by score see the new biases

    def set_total_steps(self, total: int) -> None:
        """The length of the run, for the learning-rate schedule."""
        self.total_steps = int(total)

    def lr_factor(self, step: int) -> float:
        """Learning-rate multiplier of step `step` (1-based): linear decay to 0 at total_steps."""
        if self.config.lr_schedule == "constant":
            return 1.0
        if not self.total_steps:
            raise ValueError("lr_schedule = 'linear' decays over the run, whose length is unknown: call "
                             "set_total_steps(n) first (fit does), or use lr_schedule = 'constant'")
        return max(0.0, 1.0 - (step - 1) / self.total_steps)

    def adam_params(self, step: int):
        c = self.config
        return K.adam_params(c.lr * self.lr_factor(step), c.beta1, c.beta2, c.eps, step, self.dtype)

    def train_step(self, batch: Batch) -> float:
        """Forward, backward and update on one batch; returns this rank's partial loss
        (the batch's mean loss is the sum of the partial losses over ranks)."""
        self.step = batch.step
        hp = self.adam_params(batch.step)
        t0 = time.perf_counter()
        x, acts, tapes = batch.X, [], []
        for layer in self.layers[:-1]:
            out, tape = layer.forward(x, batch, True)
            x = self._gather(layer, out, batch, train=True)
            acts.append(x)
            tapes.append(tape)
        out_layer = self.layers[-1]
        out, tape = out_layer.forward(x, batch, True)
        tapes.append(tape)
        loss, g = self._softmax(out, batch)
        t1 = time.perf_counter()
        for layer in reversed(self.layers):
            dx, grads = layer.backward(g, tapes[layer.index])
            if self.grad_comm is not None:
                for arr in grads.arrays():
                    self.grad_comm.allreduce_sum_inplace(arr)
            layer.update(grads, hp, batch.step)
            if layer.index > 0:
                g = self._scatter(acts[layer.index - 1], dx)
        t2 = time.perf_counter()
        for layer in self.layers:
            layer.maintain(batch.step)
        t3 = time.perf_counter()
        tm = self.timers
        tm["forward"] += t1 - t0
        tm["backward"] += t2 - t1
        tm["lsh_upkeep"] += t3 - t2
        for layer in self.layers:
            if isinstance(layer, LSHLayer):
                tm["lsh_query"] += layer.query_time
                layer.query_time = 0.0
        return loss

    def _softmax(self, out: Out, batch: Batch):
        """The loss share and dz = (p - y) / N of the output slice: local statistics, one
        all-reduce of per-sample (max, sum exp), finish."""
        z = out.a
        rows, cols, _ = out.targets
        y_logit = z[rows, cols].astype(np.float64)
        m, se = softmax_stats(z)
        gmax, gsum = self.comm.allreduce_logsumexp(m, se)
        loss = softmax_finish(z, m, gmax, gsum, out.targets, y_logit, batch.Y[0], batch.mean_over)
        return loss, z

    def _gather(self, layer: Layer, out: Out, batch: Batch, train: bool) -> Act:
        """All ranks' output slices as the next layer's input (forward partner of `_scatter`)."""
        if out.ids is None:
            a = self.comm.allgather_columns(out.a, layer.bounds)
            act = Act(a, None, layer.bounds, layer.n)
            c = self.config
            if train and c.dropout > 0:
                mask = np.empty_like(a)
                K.dropout_mask(rng.stream_key(c.seed, rng.DROPOUT, layer.index, batch.step), batch.sample_ids,
                               a.shape[1], c.dropout, mask)
                act.a, act.mask = a * mask, mask
            return act
        a, ids, bounds = self.comm.allgather_block(out.a, out.ids)
        return Act(a, ids, bounds, layer.n)

    def _scatter(self, act: Act, partial):
        """Backward partner of `_gather`: the ranks' partial gradients of act's columns summed,
        each rank keeping its own."""
        if act.mask is not None:
            partial *= act.mask
        return self.comm.reduce_scatter_columns(np.ascontiguousarray(partial, dtype=self.dtype), act.bounds)

    # -- inference ----------------------------------------------------------------------------

    def hidden(self, batch: Batch):
        """The last hidden representation of a batch (inference: no dropout, no labels):
        an Act, or the CSR features when there is no hidden layer."""
        x = batch.X
        for layer in self.layers[:-1]:
            out, _ = layer.forward(x, batch, False)
            x = self._gather(layer, out, batch, train=False)
        return x

    def local_topk(self, batch: Batch, k: int, exact: bool):
        """This rank's best k output neurons per sample: (scores [B, k], global ids int64 [B, k],
        neurons scored int64 [B]).

        exact: every neuron of the slice scored (blocked matrix products);
        otherwise an LSH output layer scores what its inference index retrieves.
        Missing entries (fewer than k candidates) have score -inf and id -1.
        """
        out = self.layers[-1]
        x = self.hidden(batch)
        B = batch.size
        if exact or isinstance(out, DenseLayer):
            if isinstance(x, Act):
                x = x.dense()
            else:
                x = sp.csr_matrix((x[2], x[1], x[0]), shape=(B, out.d_in))
            s, i = _blocked_topk(x, out.neuron_major(), out.b, k, out.lo)
            return s, i, np.full(B, out.n_local, dtype=np.int64)
        return out.topk(x.dense(), k)


#: the most a column block of exact scoring may take: its scores (float32) and their
#: argpartition (int64), 12 bytes an entry. Evaluation runs with every weight and moment
#: resident; 1,024 points x 8,192 columns were 190 MB (with a negated copy of the scores)
EXACT_BLOCK_BYTES = 32 << 20


def _blocked_topk(x, Wn, b, k, lo, block=8192):
    """Top k of x @ Wn^T + b per row, over column blocks of at most `block` columns and
    EXACT_BLOCK_BYTES; (scores float64 [B, k], ids int64 [B, k]).

    x float [B, d] dense or a scipy CSR matrix; Wn float [n, d] neuron-major.
    Ties go to the lower id.
    """
    B = x.shape[0]
    n = Wn.shape[0]
    best_s = np.full((B, k), -np.inf)
    best_i = np.full((B, k), -1, dtype=np.int64)
    block = max(k, min(block, EXACT_BLOCK_BYTES // (12 * max(1, B))))
    for c0 in range(0, n, block):
        c1 = min(n, c0 + block)
        s = np.asarray(x @ Wn[c0:c1].T)
        s += b[c0:c1]
        kk = min(k, c1 - c0)
        # the kk largest sit at the end after partitioning at c - kk (no negated copy of s)
        part = np.argpartition(s, s.shape[1] - kk, axis=1)[:, s.shape[1] - kk:]
        cand_s = np.concatenate([best_s, np.take_along_axis(s, part, axis=1).astype(np.float64)], axis=1)
        cand_i = np.concatenate([best_i, part + c0 + lo], axis=1)
        order = np.lexsort((cand_i, -cand_s), axis=1)[:, :k]
        best_s = np.take_along_axis(cand_s, order, axis=1)
        best_i = np.take_along_axis(cand_i, order, axis=1)
    return best_s, best_i


def merge_topk(all_scores, all_ids, k):
    """Merge per-rank candidates [P, B, k] into the global top k per sample (ties: lower id)."""
    P, B, kk = all_scores.shape
    s = all_scores.transpose(1, 0, 2).reshape(B, P * kk)
    i = all_ids.transpose(1, 0, 2).reshape(B, P * kk)
    # -inf candidates (missing) sort last; lexsort's last key is primary
    order = np.lexsort((np.where(i < 0, np.iinfo(np.int64).max, i), -s), axis=1)[:, :k]
    return np.take_along_axis(s, order, axis=1), np.take_along_axis(i, order, axis=1)


def full_parameters(net: Network) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every layer's whole (W [d_in, n] input-major, b [n]), gathered from all ranks.

    For checks and checkpoint conversion: it moves the whole model, never use
    it in a training step.
    """
    out = []
    for layer in net.layers:
        W = layer.W.T if isinstance(layer, LSHLayer) else layer.W
        W_full = net.comm.allgather_columns(np.ascontiguousarray(W), layer.bounds, kind="checks")
        b_full = net.comm.allgather_columns(layer.b[None, :], layer.bounds, kind="checks")[0]
        out.append((W_full, b_full))
    return out
