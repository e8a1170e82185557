"""The network: fully connected layers split column-wise over ranks.

With P ranks, layer l of n_l neurons is split into contiguous column slices
(`dslide.sharding`); rank r holds W_r, b_r, their Adam moments and, for an
LSH layer, hash tables over its own neurons only. One training step:

    forward   x_0 = X (sparse features, the same batch on every rank)
              z_r = x_{l-1} W_r + b_r          each rank its own slice
              x_l = allgather(relu(z_r))       dense: [B, n_l]; LSH: (id, value) pairs
              output: p = softmax over the active neurons of all ranks, its
              normaliser from one all-reduce of per-sample (max, sum exp)
    backward  dz_r = p - y on the rank's own active neurons
              dx_{l-1} = reduce_scatter(sum_r dz_r W_r^T)   each rank keeps its slice
              W_r, b_r <- Adam on the rows that received gradient (lazy)

Weights of neuron j of layer l depend only on (seed, l, j), so the model is
the same whatever P is; a dense layer's exact computation on P ranks equals
the 1-rank one up to float rounding of the cross-rank sums.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from dslide import kernels as K
from dslide import rng
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


class CSRInput:
    """The raw sparse features of a batch (no gradient flows into them)."""

    def __init__(self, indptr, indices, data):
        self.indptr, self.indices, self.data = indptr, indices, data


class DenseAct:
    """Full activations a [B, n] replicated on every rank, after an all-gather.

    `scatter` is the backward partner: the ranks' partial gradients of `a`
    are summed and each rank keeps its own columns.
    """

    def __init__(self, a, bounds, mask=None):
        self.a, self.bounds, self.mask = a, bounds, mask

    def scatter(self, comm: Comm, partial):
        if self.mask is not None:
            partial *= self.mask
        return comm.reduce_scatter_columns(partial, self.bounds)


class SparseAct:
    """Gathered sparse activations: sample-major CSR over global neuron ids.

    `perm[e]` is the rank-major position (the order of the all-gather) of the
    sample-major entry e; `totals[r]` how many entries rank r contributed.
    """

    def __init__(self, all_counts, all_ids, all_vals, n):
        P, B = all_counts.shape
        self.totals = all_counts.sum(axis=1).astype(np.int64)
        self.n = n
        # rank-major: rank r's entries of sample i start at rank_start[r] + cum[r, i]
        cum = np.zeros((P, B + 1), dtype=np.int64)
        np.cumsum(all_counts, axis=1, out=cum[:, 1:])
        rank_start = np.concatenate(([0], np.cumsum(self.totals)[:-1]))
        per_sample = all_counts.sum(axis=0)
        self.indptr = np.zeros(B + 1, dtype=np.int64)
        np.cumsum(per_sample, out=self.indptr[1:])
        # order samples first, ranks second
        src = (rank_start[:, None] + cum[:, :-1]).T.reshape(-1)
        lens = all_counts.T.reshape(-1).astype(np.int64)
        starts = np.repeat(src - np.concatenate(([0], np.cumsum(lens)[:-1])), lens)
        self.perm = starts + np.arange(int(lens.sum()), dtype=np.int64)
        self.indices = all_ids[self.perm]
        self.data = all_vals[self.perm]

    def dense(self, dtype):
        B = self.indptr.shape[0] - 1
        out = np.zeros((B, self.n), dtype=dtype)
        rows = np.repeat(np.arange(B), np.diff(self.indptr))
        out[rows, self.indices] = self.data
        return out

    def take(self, dense_grad):
        """Values of a dense [B, n] gradient at this activation's entries (sample-major)."""
        rows = np.repeat(np.arange(self.indptr.shape[0] - 1), np.diff(self.indptr))
        return dense_grad[rows, self.indices]

    def scatter(self, comm: Comm, partial_vals):
        rank_major = np.empty_like(partial_vals)
        rank_major[self.perm] = partial_vals
        return comm.reduce_scatter_sparse(rank_major, self.totals)


class _Adam:
    """Adam moments of one parameter array."""

    def __init__(self, shape, dtype):
        self.m = np.zeros(shape, dtype=dtype)
        self.v = np.zeros(shape, dtype=dtype)


def _entries_of_csr(indptr):
    """int32 [nnz]: the row (sample) of every stored entry of a CSR matrix."""
    return np.repeat(np.arange(indptr.shape[0] - 1, dtype=np.int32), np.diff(indptr))


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


def softmax_xent(comm: Comm, blocks, target_block: int, targets, lab_ptr, mean_over: int) -> float:
    """Softmax cross-entropy over logits split into blocks here and over ranks.

    blocks: float arrays [B, *] of this rank's logits for each sample (-inf
    where a slot is unused); targets (rows, cols, weights) index blocks[target_block].
    The normaliser of sample i is S_i = sum over all blocks of all ranks of
    exp(z - M_i), from one all-reduce of per-sample (max, sum). In place, every
    block becomes dz = (p - y) / N (N = mean_over, the whole batch's size); a
    sample without labels gets dz = 0. Returns this rank's share of the
    batch's mean loss, -sum y log p / N.
    """
    B = lab_ptr.shape[0] - 1
    N = mean_over
    m = np.full(B, -np.inf)
    for z in blocks:
        if z.shape[1]:
            np.maximum(m, z.max(axis=1), out=m)
    rows, cols, w = targets
    y_logit = blocks[target_block][rows, cols].astype(np.float64)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    se = np.zeros(B)
    for z in blocks:
        K.shift_rows(z, m_safe)
        np.exp(z, out=z)
        K.flush_sum_rows(z, se)
    gmax, gsum = comm.allreduce_logsumexp(m, se)
    ok = (np.diff(lab_ptr) > 0) & (gsum > 0)
    scale = np.zeros(B)
    scale[ok] = np.exp(m_safe[ok] - gmax[ok]) / gsum[ok] / N
    for z in blocks:
        K.scale_flush_rows(z, scale)
    np.subtract.at(blocks[target_block], (rows, cols), (w / N).astype(blocks[target_block].dtype))
    return float(np.sum(w * (np.log(gsum[rows]) + gmax[rows] - y_logit))) / N


class Layer:
    """Common state of a layer slice: sizes, shard, parameters, optimiser."""

    kind = "?"

    def __init__(self, index, d_in, n, is_output, comm: Comm, config: Config, dtype, grad_comm=None):
        self.index, self.d_in, self.n, self.is_output = index, d_in, n, is_output
        self.comm, self.config, self.dtype = comm, config, np.dtype(dtype)
        # data parallel: every rank holds the whole layer and gradients are summed over grad_comm
        self.grad_comm = grad_comm
        self.bounds = shard_bounds(n, comm.size)
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

    def adam_params(self, step):
        c = self.config
        return K.adam_params(c.lr * self.lr_factor(step), c.beta1, c.beta2, c.eps, step, self.dtype)

    #: steps of the whole run, for the learning-rate schedule (set by `fit`; 0: constant)
    total_steps = 0

    def lr_factor(self, step: int) -> float:
        """Learning-rate multiplier of step `step` (1-based): linear decay to 0 at `total_steps`."""
        if self.config.lr_schedule == "constant" or not self.total_steps:
            return 1.0
        return max(0.0, 1.0 - (step - 1) / self.total_steps)

    # -- state (checkpoints) ---------------------------------------------------------

    #: axis of the neuron (column) index in each parameter array, for resharding
    column_axis = {"W": 1, "b": 0}

    def state(self) -> dict:
        """This slice's arrays by name (views, not copies)."""
        return {"W": self.W, "b": self.b, "W.m": self.opt_W.m, "W.v": self.opt_W.v,
                "b.m": self.opt_b.m, "b.v": self.opt_b.v}

    def load_state(self, arrays: dict) -> None:
        for name, arr in Layer.state(self).items():
            if name not in arrays:
                raise ValueError(f"layer {self.index}: checkpoint lacks {name!r}")
            new = np.asarray(arrays[name])
            if new.shape != arr.shape:
                raise ValueError(f"layer {self.index}: checkpoint's {name!r} has shape {new.shape}, "
                                 f"this network's slice needs {arr.shape}")
            arr[...] = new


class DenseLayer(Layer):
    """Every neuron computed: Y_r = act(X W_r + b_r), W = [W_0 ... W_{P-1}].

    W_r float [d_in, n_r] input-major (rows are input features, so a sparse
    input sums a few rows); b_r float [n_r]. Dense inputs go through BLAS.
    Rank r owns columns [lo, hi) of the layer.
    """

    kind = "dense"

    def __init__(self, *args):
        super().__init__(*args)
        self.W = np.empty((self.d_in, self.n_local), dtype=self.dtype)
        rng.init_input_major(self.init_key, self.lo, self.W, self.scale)
        self.b = np.zeros(self.n_local, dtype=self.dtype)
        self.opt_W = _Adam(self.W.shape, self.dtype)
        self.opt_b = _Adam(self.b.shape, self.dtype)
        self._count = np.zeros(self.d_in, dtype=np.int32)
        self._gbuf = K.thread_scratch(self.n_local, self.dtype)
        self._dirty = np.zeros(self.d_in, dtype=np.uint8)

    # -- forward ---------------------------------------------------------------------

    def logits(self, inp):
        """z_r = x W_r + b_r: float [B, n_r]."""
        if isinstance(inp, (CSRInput, SparseAct)):
            B = inp.indptr.shape[0] - 1
            z = np.empty((B, self.n_local), dtype=self.dtype)
            K.csr_times_rows(inp.indptr, inp.indices, inp.data.astype(self.dtype, copy=False), self.W, self.b, z)
            return z
        z = inp.a @ self.W
        z += self.b
        return z

    def forward(self, inp, batch: Batch, train: bool):
        """Hidden: returns relu(z_r) [B, n_r]. Output: the partial loss (training) or z_r."""
        self.inp = inp
        z = self.logits(inp)
        if not self.is_output:
            np.maximum(z, 0, out=z)
            self.out = z
            return z
        if not train:
            return z
        self.dz = z  # overwritten in place: z is not needed after the softmax
        return softmax_xent(self.comm, [z], 0, label_targets(batch.Y, self.lo, self.hi), batch.Y[0], batch.mean_over)

    # -- backward --------------------------------------------------------------------

    def backward(self, grad_local, step: int):
        """Gradient wrt this slice's output [B, n_r] (None for the output layer,
        which kept its own) -> partial gradient wrt the input (summed over
        ranks by the input's `scatter`), or None for raw features."""
        if self.is_output:
            dz = self.dz
        else:
            dz = grad_local
            dz *= self.out > 0
        inp = self.inp
        dx = None
        if isinstance(inp, SparseAct):
            dx = np.empty(inp.indices.shape[0], dtype=self.dtype)
            K.rows_dot_csr(inp.indptr, inp.indices, self.W, dz, dx)
        elif isinstance(inp, DenseAct):
            dx = dz @ self.W.T
        self.update(inp, dz, step)
        self.inp = self.out = self.dz = None
        return dx

    def update(self, inp, dz, step):
        hp = self.adam_params(step)
        gb = dz.sum(axis=0)
        if self.grad_comm is not None:
            self.grad_comm.allreduce_sum_inplace(gb)
        K.adam_dense(self.b, self.opt_b.m, self.opt_b.v, gb, hp)
        if isinstance(inp, DenseAct):
            G = inp.a.T @ dz
            if self.grad_comm is not None:
                self.grad_comm.allreduce_sum_inplace(G)
            K.adam_dense(self.W, self.opt_W.m, self.opt_W.v, G, hp)
            return
        # sparse input: only the rows of features present in the batch get gradient
        order = np.empty(inp.indices.shape[0], dtype=np.int64)
        touched, start = K.group_by_row(inp.indices, self.d_in, self._count, order)
        samples = _entries_of_csr(inp.indptr)
        data = inp.data.astype(self.dtype, copy=False)
        if self.grad_comm is not None:
            # data parallel, as DDP does it: the whole dense gradient is all-reduced
            G = np.zeros_like(self.W)
            K.rows_grad(touched, start, order, samples, data, dz, G)
            self.grad_comm.allreduce_sum_inplace(G)
            K.adam_dense(self.W, self.opt_W.m, self.opt_W.v, G, hp)
            return
        empty = np.empty(0, dtype=self.dtype)
        K.rows_grad_adam(touched, start, order, samples, data, dz,
                         self.W, self.opt_W.m, self.opt_W.v, empty, empty, empty, hp, self._gbuf, self._dirty)

    # -- views for checks, checkpoints and inference ---------------------------------

    def neuron_major(self):
        """W_r^T as float [n_r, d_in] (a view)."""
        return self.W.T


class LSHLayer(Layer):
    """Only selected neurons computed: z[i, j] = W[j] . x_i + b[j] for j in active(i).

    W_r float [n_r, d_in] neuron-major (each neuron's weight vector is
    contiguous: it is what the hash tables index and what a dot product
    reads). Rank r queries its own tables over its own neurons [lo, hi).

    In training, a sample's active set on rank r has two parts:
    - the shared block C, scored for every sample of the batch with one BLAS
      product x W[C]^T: in the output layer, every label of the batch owned
      here (each sample's own labels are its positives, the other samples'
      labels its negatives: for those columns the gradient is the full
      softmax gradient, so frequent labels are held down exactly as often as
      they are pushed up), then the rank's share of `min_active` neurons drawn
      uniformly afresh each step, which stand for all the other neurons of the
      slice: in the softmax each counts (n_r - |labels|) / |random| times
      (log-Q correction of sampled softmax, Jean et al. 2015);
    - its own LSH candidates not in C (hard negatives), at most `max_active`.
    At inference only the LSH candidates are scored.
    """

    kind = "lsh"

    def __init__(self, *args, lsh_config: LSHConfig):
        super().__init__(*args)
        from dslide import lsh

        self.lc = lsh_config
        self.W = np.empty((self.n_local, self.d_in), dtype=self.dtype)
        rng.init_neuron_major(self.init_key, self.lo, self.W, self.scale)
        self.b = np.zeros(self.n_local, dtype=self.dtype)
        self.opt_W = _Adam(self.W.shape, self.dtype)
        self.opt_b = _Adam(self.b.shape, self.dtype)
        lc = lsh_config
        self.max_active = min(scaled_count(lc.max_active, self.n_local, self.n), self.n_local)
        n_random = lc.random_count(self.n)
        self.n_random = min(scaled_count(n_random, self.n_local, self.n), self.n_local) if n_random else 0
        params = {"bin_size": lc.bin_size} if lc.family == "dwta" else {}
        # Hash functions derive from the seed and the layer only, never from the rank.
        self.family = lsh.make_family(lc.family, self.d_in, lc.K, lc.L, _seed31(self.config.seed, 7, self.index), **params)
        self.range_pow = lc.range_pow or self.auto_range_pow(self.n_local, lc.capacity, self.family.code_bits)
        self.tables = lsh.HashTables(self.family, self.range_pow, lc.capacity, policy=lc.policy,
                                     seed=_seed31(self.config.seed, 8, self.index, self.lo))
        self.tables.build(self.W)
        self.neg_key = rng.stream_key(self.config.seed, rng.NEGATIVES, self.index, self.lo)
        self._shared_pos = np.full(self.n_local, -1, dtype=np.int32)
        self._mark = np.zeros(self.n_local, dtype=np.uint8)
        self._count = np.zeros(self.n_local, dtype=np.int32)
        self._gbuf = K.thread_scratch(self.d_in, self.dtype)
        self.dirty = np.zeros(self.n_local, dtype=np.uint8)
        self.rehash_period = float(lc.rehash_every)
        self.rebuild_period = float(lc.rebuild_every)
        self.next_rehash = lc.rehash_every
        self.next_rebuild = lc.rebuild_every
        self.query_time = 0.0

    @staticmethod
    def auto_range_pow(n_local: int, capacity: int, code_bits: int) -> int:
        """Buckets for about `capacity / 4` neurons each on average, within the code's bits."""
        want = int(np.ceil(np.log2(max(4.0 * n_local / capacity, 2.0))))
        return int(min(max(want, 1), code_bits, 24))

    # -- active sets -------------------------------------------------------------------

    def candidates(self, x):
        lc = self.lc
        t0 = time.perf_counter()
        if lc.select == "topk":
            out = self.tables.query(x, mode="topk", m=self.max_active)
        elif lc.select == "threshold":
            out = self.tables.query(x, mode="threshold", t=lc.threshold)
        else:
            out = self.tables.query(x, mode="union")
        self.query_time += time.perf_counter() - t0
        return out

    def shared_block(self, batch: Batch, train: bool):
        """(C, correction) of a step: the shared neurons (sorted local ids of the
        batch's labels here, then random ones) and what each adds to its logit."""
        if not train:
            return np.empty(0, dtype=np.int32), np.empty(0, dtype=self.dtype)
        if self.is_output:
            g = batch.Y[1]
            labels = np.unique(g[(g >= self.lo) & (g < self.hi)]).astype(np.int32) - self.lo
        else:
            labels = np.empty(0, dtype=np.int32)
        corr = np.zeros(labels.shape[0], dtype=self.dtype)
        if self.n_random == 0:
            return labels, corr
        drawn = K.shared_sample(rng.stream_key(self.neg_key, batch.step), self.n_local, self.n_random, self._mark)
        rand = np.setdiff1d(drawn, labels, assume_unique=True).astype(np.int32)
        if rand.shape[0] == 0:
            return labels, corr
        weight = 1.0
        if self.is_output:  # the random neurons stand for every neuron of the slice not in `labels`
            weight = (self.n_local - labels.shape[0]) / rand.shape[0]
        C = np.concatenate([labels, rand])
        corr = np.concatenate([corr, np.full(rand.shape[0], np.log(weight), dtype=self.dtype)])
        return C, corr

    def select(self, x, batch: Batch, train: bool):
        """(C, correction, ids, cnt) of a batch: see the class docstring."""
        B = x.shape[0]
        C, corr = self.shared_block(batch, train)
        q_ptr, q_ids, _ = self.candidates(x)
        ids = np.empty((B, self.max_active), dtype=np.int32)
        cnt = np.empty(B, dtype=np.int32)
        self._shared_pos[C] = np.arange(C.shape[0], dtype=np.int32)
        K.select_active(q_ptr, q_ids, self.max_active, self._shared_pos, ids, cnt)
        self._shared_pos[C] = -1
        return C, corr, ids, cnt

    # -- forward / backward ----------------------------------------------------------------

    def forward(self, x, batch: Batch, train: bool):
        """x float [B, d_in] dense. Hidden: (per-sample counts, global ids, values) of
        the active outputs. Output: the partial loss (training) or (ids, cnt, z)."""
        self.x = x
        C, corr, ids, cnt = self.select(x, batch, train)
        z = np.zeros(ids.shape, dtype=self.dtype)
        K.active_forward(x, self.W, self.b, ids, cnt, z)
        self.WC = self.W[C]  # a copy: the backward pass needs the weights before the update
        zC = x @ self.WC.T
        zC += self.b[C]
        self.C, self.ids, self.cnt = C, ids, cnt
        if not self.is_output:
            K.relu_active(z, cnt)
            np.maximum(zC, 0, out=zC)
            self.z, self.zC = z, zC
            own = np.arange(ids.shape[1])[None, :] < cnt[:, None]
            counts = cnt + C.shape[0]
            gids = np.concatenate([ids, np.broadcast_to(C, (x.shape[0], C.shape[0]))], axis=1)
            vals = np.concatenate([z, zC], axis=1)
            keep = np.concatenate([own, np.ones(zC.shape, dtype=bool)], axis=1)
            self._keep = keep
            return counts.astype(np.int32), (gids[keep] + self.lo).astype(np.int32), vals[keep]
        if not train:
            return ids, cnt, z
        zC += corr
        z[np.arange(z.shape[1])[None, :] >= cnt[:, None]] = -np.inf
        rows, cols, w = label_targets(batch.Y, self.lo, self.hi)
        self._shared_pos[C] = np.arange(C.shape[0], dtype=np.int32)
        cols = self._shared_pos[cols].astype(np.int64)  # every label of the batch is in C
        self._shared_pos[C] = -1
        loss = softmax_xent(self.comm, [z, zC], 1, (rows, cols, w), batch.Y[0], batch.mean_over)
        self.dz, self.dzC = z, zC
        return loss

    def backward(self, grad_vals, step: int):
        """grad_vals: for a hidden layer, the gradient of its own active outputs in
        the order `forward` returned them (None for the output layer). Returns
        the partial gradient wrt the dense input, float [B, d_in]."""
        if self.is_output:
            dz, dzC = self.dz, self.dzC
        else:
            full = np.zeros(self._keep.shape, dtype=self.dtype)
            full[self._keep] = grad_vals
            A = self.z.shape[1]
            dz, dzC = np.ascontiguousarray(full[:, :A]), np.ascontiguousarray(full[:, A:])
            K.relu_backward_active(dz, self.z, self.cnt)
            dzC *= self.zC > 0
        dx = np.empty_like(self.x)
        K.active_backward_input(self.W, self.ids, self.cnt, dz, dx)
        if self.C.shape[0]:
            dx += dzC @ self.WC
        self.update(dz, dzC, step)
        self.x = self.z = self.zC = self.dz = self.dzC = self.WC = None
        return dx

    def update(self, dz, dzC, step):
        hp = self.adam_params(step)
        mask = np.arange(dz.shape[1])[None, :] < self.cnt[:, None]
        rows = self.ids[mask]
        samples = np.nonzero(mask)[0].astype(np.int32)
        coefs = dz[mask]
        order = np.empty(rows.shape[0], dtype=np.int64)
        touched, start = K.group_by_row(rows, self.n_local, self._count, order)
        K.rows_grad_adam(touched, start, order, samples, coefs, self.x, self.W, self.opt_W.m, self.opt_W.v,
                         self.b, self.opt_b.m, self.opt_b.v, hp, self._gbuf, self.dirty)
        if self.C.shape[0]:
            # C and every sample's own neurons are disjoint, so no row gets two steps
            G = dzC.T @ self.x
            K.adam_rows(self.C, G, dzC.sum(axis=0), self.W, self.opt_W.m, self.opt_W.v,
                        self.b, self.opt_b.m, self.opt_b.v, hp, self.dirty)

    # -- LSH upkeep --------------------------------------------------------------------------

    def maintain(self, step: int) -> str | None:
        """Rehash changed neurons or rebuild the tables when their time has come."""
        g = self.lc.growth
        if step >= self.next_rebuild:
            self.tables.build(self.W)
            self.dirty[:] = 0
            self.rebuild_period *= g
            self.next_rebuild = step + max(1, int(round(self.rebuild_period)))
            self.next_rehash = step + max(1, int(round(self.rehash_period)))
            return "rebuild"
        if step >= self.next_rehash:
            changed = np.flatnonzero(self.dirty).astype(np.int32)
            if changed.size:
                self.tables.update(changed, self.W[changed])
            self.dirty[:] = 0
            self.rehash_period *= g
            self.next_rehash = step + max(1, int(round(self.rehash_period)))
            return "rehash"
        return None

    def neuron_major(self):
        return self.W

    column_axis = {"W": 0, "b": 0}

    def state(self) -> dict:
        out = super().state()
        out["dirty"] = self.dirty
        out["schedule"] = np.array([self.rehash_period, self.rebuild_period, self.next_rehash, self.next_rebuild])
        out.update({f"tables.{k}": v for k, v in self.tables.state_arrays().items()})
        return out

    def load_state(self, arrays: dict, tables: bool = True) -> None:
        """Restore a slice; without `tables` (a resharded checkpoint) the tables are rebuilt."""
        base = {k: v for k, v in arrays.items() if k in ("W", "b", "W.m", "W.v", "b.m", "b.v")}
        Layer.load_state(self, base)
        if "schedule" in arrays:
            rp, bp, nr, nb = np.asarray(arrays["schedule"], dtype=np.float64)
            self.rehash_period, self.rebuild_period = float(rp), float(bp)
            self.next_rehash, self.next_rebuild = int(nr), int(nb)
        if tables:
            self.dirty[...] = np.asarray(arrays["dirty"])
            self.tables.load_state_arrays({k[len("tables."):]: v for k, v in arrays.items() if k.startswith("tables.")})
        else:
            self.dirty[...] = 0
            self.tables.build(self.W)


def _seed31(*words) -> int:
    """A non-negative 63-bit seed for the lsh package from (seed, *words)."""
    return int(rng.stream_key(*words) >> np.uint64(1))


class Network:
    """The layers of one rank, and one training step over a batch."""

    def __init__(self, config: Config, n_features: int, n_labels: int, comm: Comm | None = None):
        config = config.resolve(n_labels)
        self.config = config
        self.world = comm or Comm()
        if config.parallel == "data":
            # every rank the whole model, a slice of each batch, gradients all-reduced
            if any(config.layer_kind(i, w) == "lsh" for i, w in enumerate([*config.hidden, n_labels])):
                raise ValueError("parallel = 'data' all-reduces dense gradients and needs dense layers; "
                                 "set exact = true (or kinds to 'dense'), or use parallel = 'model'")
            self.comm, grad_comm = Comm(), (self.world if self.world.size > 1 else None)
        else:
            self.comm, grad_comm = self.world, None
        self.dtype = np.dtype(config.dtype)
        widths = [n_features, *config.hidden, n_labels]
        for i, w in enumerate(widths[1:]):
            if w < self.comm.size:
                raise ValueError(f"layer {i} has {w} neurons, fewer than the {self.comm.size} ranks; "
                                 f"every rank needs at least one neuron of every layer")
        self.layers: list[Layer] = []
        for i in range(len(widths) - 1):
            args = (i, widths[i], widths[i + 1], i == len(widths) - 2, self.comm, config, self.dtype, grad_comm)
            if config.layer_kind(i, widths[i + 1]) == "lsh":
                self.layers.append(LSHLayer(*args, lsh_config=config.layer_lsh(i)))
            else:
                self.layers.append(DenseLayer(*args))
        self.n_features, self.n_labels = n_features, n_labels
        self.widths = widths
        self.step = 0
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

    def set_total_steps(self, total: int) -> None:
        """The length of the run, for the learning-rate schedule."""
        for layer in self.layers:
            layer.total_steps = total

    def train_step(self, batch: Batch) -> float:
        """Forward, backward and update on one batch; returns this rank's partial loss
        (the batch's mean loss is the sum of the partial losses over ranks)."""
        self.step = batch.step
        t0 = time.perf_counter()
        acts = []
        act = CSRInput(*batch.X)
        for layer in self.layers[:-1]:
            act = self._forward_hidden(layer, act, batch, train=True)
            acts.append(act)
        out = self.layers[-1]
        loss = out.forward(self._input_for(out, act), batch, train=True)
        t1 = time.perf_counter()
        grad = out.backward(None, batch.step)
        for layer, act in zip(reversed(self.layers[:-1]), reversed(acts)):
            grad = self._grad_for(act, grad, self.layers[layer.index + 1])
            grad = layer.backward(act.scatter(self.comm, grad), batch.step)
        t2 = time.perf_counter()
        for layer in self.layers:
            if isinstance(layer, LSHLayer):
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
        return float(loss)

    def _input_for(self, layer, act):
        """What a layer reads: LSH layers read dense vectors (sparse activations are expanded)."""
        if isinstance(layer, LSHLayer) and isinstance(act, SparseAct):
            return act.dense(self.dtype)
        if isinstance(layer, LSHLayer) and isinstance(act, DenseAct):
            return act.a
        return act

    def _grad_for(self, act, grad, consumer):
        """The consumer's input gradient in the representation `act.scatter` expects."""
        if isinstance(act, SparseAct) and isinstance(consumer, LSHLayer):
            return act.take(grad)
        return grad

    def _forward_hidden(self, layer, act, batch, train):
        c = self.config
        if isinstance(layer, DenseLayer):
            local = layer.forward(act, batch, train)
            full = self.comm.allgather_columns(local, layer.bounds)
            mask = None
            if train and c.dropout > 0:
                mask = np.empty_like(full)
                K.dropout_mask(rng.stream_key(c.seed, rng.DROPOUT, layer.index, batch.step), batch.sample_ids,
                               full.shape[1], c.dropout, mask)
                full = full * mask
            return DenseAct(full, layer.bounds, mask)
        counts, ids, vals = layer.forward(self._input_for(layer, act), batch, train)
        return SparseAct(*self.comm.allgather_sparse(counts, ids, vals), layer.n)

    # -- inference ----------------------------------------------------------------------------

    def hidden(self, batch: Batch):
        """The last hidden representation of a batch (inference: no dropout, no labels)."""
        act = CSRInput(*batch.X)
        for layer in self.layers[:-1]:
            act = self._forward_hidden(layer, act, batch, train=False)
        return act

    def local_topk(self, batch: Batch, k: int, exact: bool):
        """This rank's best k output neurons per sample: (scores [B, k], global ids int64 [B, k]).

        exact: every neuron of the slice scored (blocked matrix products);
        otherwise an LSH layer scores only the neurons its tables retrieve.
        Missing entries (fewer than k candidates) have score -inf and id -1.
        """
        out = self.layers[-1]
        x = self._input_for(out, self.hidden(batch))
        B = batch.size
        if exact or isinstance(out, DenseLayer):
            if isinstance(x, DenseAct):
                x = x.a
            elif isinstance(x, (SparseAct, CSRInput)):
                x = sp.csr_matrix((x.data, x.indices, x.indptr), shape=(B, out.d_in))
            return _blocked_topk(x, out.neuron_major(), out.b, k, out.lo)
        ids, cnt, z = out.forward(x, batch, train=False)  # no labels, no shared random set
        scores = np.full((B, k), -np.inf, dtype=np.float64)
        gids = np.full((B, k), -1, dtype=np.int64)
        for i in range(B):  # B rows of at most max_active: cheap next to the products above
            c = cnt[i]
            kk = min(k, c)
            if kk == 0:
                continue
            part = np.argpartition(-z[i, :c], kk - 1)[:kk]
            part = part[np.lexsort((ids[i, part], -z[i, part]))]
            scores[i, :kk] = z[i, part]
            gids[i, :kk] = ids[i, part] + out.lo
        return scores, gids


def _blocked_topk(x, Wn, b, k, lo, block=8192):
    """Top k of x @ Wn^T + b per row, over column blocks; (scores float64 [B, k], ids int64 [B, k]).

    x float [B, d] dense or a scipy CSR matrix; Wn float [n, d] neuron-major.
    Ties go to the lower id.
    """
    B = x.shape[0]
    n = Wn.shape[0]
    best_s = np.full((B, k), -np.inf)
    best_i = np.full((B, k), -1, dtype=np.int64)
    for c0 in range(0, n, block):
        c1 = min(n, c0 + block)
        s = np.asarray(x @ Wn[c0:c1].T)
        s += b[c0:c1]
        kk = min(k, c1 - c0)
        part = np.argpartition(-s, kk - 1, axis=1)[:, :kk]
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
