"""The dense layer kind: every neuron computed, with BLAS or a sparse-row kernel."""

from __future__ import annotations

import numpy as np

from dslide import rng
from dslide.model import kernels
from dslide.model.batch import Act, Batch, Out
from dslide.model.layers.base import Layer
from dslide.model.loss import label_targets
from dslide.model.optim import Grads
from dslide.model.sharding import shard_bounds
from dslide.model.topk import EXACT_BLOCK_BYTES, scores_topk


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
        self._gbuf = kernels.thread_scratch(self.n_local, self.dtype)
        self.touched = np.zeros(self.d_in, dtype=np.uint8)

    def forward(self, x, batch: Batch, train: bool):
        """Hidden: relu(x W_r + b_r) [B, n_r]; output: the logits. x: CSR features or an Act."""
        if isinstance(x, Act):
            z = x.a @ (self.W if x.ids is None else self.W[x.ids])
            z += self.b
        else:
            indptr, indices, data = x
            z = np.empty((indptr.shape[0] - 1, self.n_local), dtype=self.dtype)
            kernels.csr_times_rows(indptr, indices, data.astype(self.dtype, copy=False), self.W, self.b, z)
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
        touched, start = kernels.group_by_row(indices, self.d_in, self._count, order)
        samples = np.repeat(np.arange(indptr.shape[0] - 1, dtype=np.int32), np.diff(indptr))
        data = data.astype(self.dtype, copy=False)
        if self.dense_grads:  # as DDP does it: the whole gradient, for the all-reduce
            G = np.zeros_like(self.W)
            kernels.rows_grad(touched, start, order, samples, data, g, G)
            return None, Grads(None, G, gb)
        return None, Grads(sparse=(touched, start, order, samples, data, g), gb=gb)

    def update(self, grads: Grads, hp, step: int = 0) -> None:
        rW, rb = self.opt_W.rounding(step), self.opt_b.rounding(step)
        kernels.adam_dense(self.b, self.opt_b.m, self.opt_b.v, grads.gb, hp, rb)
        if grads.sparse is not None:
            touched, start, order, samples, data, g = grads.sparse
            empty = np.empty(0, dtype=self.dtype)
            kernels.rows_grad_adam(touched, start, order, samples, data, g, self.W, self.opt_W.m, self.opt_W.v,
                                   empty, empty, empty, hp, self._gbuf, self.touched, rW, kernels.NO_ROUNDING)
        elif grads.rows is None:
            kernels.adam_dense(self.W, self.opt_W.m, self.opt_W.v, grads.G, hp, rW)
            self.touched[:] = 1
        else:
            kernels.adam_rows_nobias(grads.rows, grads.G, self.W, self.opt_W.m, self.opt_W.v, hp, rW)
            self.touched[grads.rows] = 1

    def neuron_major(self):
        """W_r^T as float [n_r, d_in] (a view)."""
        return self.W.T

    @classmethod
    def estimate(cls, config, index, d_in, n, n_local, is_output, threads) -> dict:
        out = super().estimate(config, index, d_in, n, n_local, is_output, threads)
        item = np.dtype(config.dtype).itemsize
        B = config.batch_size
        # _count int32 [d_in], touched uint8 [d_in], _gbuf [threads, n_local]
        out["scratch"] = d_in * 5 + threads * n_local * item
        # activations [B, n] (all ranks' columns after the gather) and the gradient alike
        out["step"] = 3 * B * n * item + 2 * B * n_local * item
        out["rows"] = d_in
        return out


class RowDenseLayer(DenseLayer):
    """A dense output layer split by rows (`output_split`): rank r holds W[R_r, :] for the
    rows R_r = [lo, hi) of the hidden columns it computed, and every label.

    Its input is this rank's own slice of the last hidden layer (an Act of its columns,
    never all-gathered). Forward: z = allreduce(x_r W[R_r, :]) + b, the whole [B, n]
    logits on every rank, so the softmax needs no exchange. Backward: dx_r = dz W[R_r, :]^T
    is already this rank's gradient slice (no reduce-scatter), dW[R_r, :] = x_r^T dz, and
    db = sum dz, the same on every rank, which keeps the biases alike. `bounds`, `lo` and
    `hi` are of the rows (the axis a checkpoint splits); `label_bounds` of the label
    slices each rank reports at inference (top k).
    """

    split = "rows"

    def __init__(self, *args, **kw):
        Layer.__init__(self, *args, **kw)
        self.label_bounds = self.bounds
        self.bounds = shard_bounds(self.d_in, self.comm.size, kw.get("weights"))
        self.lo, self.hi = int(self.bounds[self.comm.rank]), int(self.bounds[self.comm.rank + 1])
        self.n_local = self.n
        self.W = np.empty((self.hi - self.lo, self.n), dtype=self.dtype)
        rng.init_input_rows(self.init_key, self.lo, self.W, self.scale)
        self.b = np.zeros(self.n, dtype=self.dtype)
        # the same global layout (row-major over [d_in, n]) as the column split's, so the
        # rounding bits are the same whichever split holds an element; b whole
        self._optimiser((self.lo, 0, self.n), (0, 0, self.n))
        self.touched = np.zeros(self.W.shape[0], dtype=np.uint8)

    def labels(self) -> tuple[int, int]:
        return 0, self.n

    def _own(self, x: Act) -> np.ndarray:
        """This rank's rows of the input: x.a as it is, or its columns [lo, hi) of a whole one
        (its input layer is dense: `Config.output_rows`, so x has every column)."""
        return x.a if x.a.shape[1] == self.W.shape[0] else x.a[:, self.lo:self.hi]

    def forward(self, x, batch: Batch, train: bool):
        a = np.ascontiguousarray(self._own(x))
        z = a @ self.W
        self.comm.allreduce_sum_inplace(z, kind="output_rows")
        z += self.b
        targets = label_targets(batch.Y, 0, self.n) if train else None
        return Out(z, None, targets), (a,)

    def backward(self, g, tape):
        (a,) = tape
        return g @ self.W.T, Grads(None, a.T @ g, g.sum(axis=0))

    def topk(self, x, k: int, biases=None):
        """This rank's best k of its label slice `label_bounds` (every rank has every logit
        after the all-reduce; the slices keep the ranks' candidates disjoint for the merge).
        biases: None, or a list of bias vectors [n] scored in place of `b`, the products made
        once: a list of the triples, one per vector (LayerBase.topk)."""
        a = self._own(x)
        llo, lhi = int(self.label_bounds[self.comm.rank]), int(self.label_bounds[self.comm.rank + 1])
        B = a.shape[0]
        each = [self.b] if biases is None else list(biases)
        best = [(np.empty((B, k)), np.empty((B, k), dtype=np.int64)) for _ in each]
        # the [rows, n] logits in row blocks of at most EXACT_BLOCK_BYTES (the same on every rank)
        step = max(1, EXACT_BLOCK_BYTES // (4 * self.n))
        for r0 in range(0, B, step):
            p = np.ascontiguousarray(a[r0:r0 + step]) @ self.W
            self.comm.allreduce_sum_inplace(p, kind="evaluation")
            for j, b in enumerate(each):
                z = p if j == len(each) - 1 else p.copy()  # the last one takes the products' own
                z += b
                best[j][0][r0:r0 + step], best[j][1][r0:r0 + step] = scores_topk(z[:, llo:lhi], k, llo)
        n = np.full(B, lhi - llo, dtype=np.int64)
        out = [(s, i, n) for s, i in best]
        return out[0] if biases is None else out

    def neuron_major(self):
        raise ValueError("a row-split output layer holds rows of W, not neurons: full_parameters gathers it")

    def shard_axes(self) -> dict:
        return {**super().shard_axes(), "W": 0, "W.m": 0, "W.v": 0, "b": None, "b.m": None, "b.v": None}

    @classmethod
    def estimate(cls, config, index, d_in, n, n_local, is_output, threads) -> dict:
        """As Layer.estimate, with n_local the rank's rows of W (its hidden columns), not labels."""
        item = np.dtype(config.dtype).itemsize
        moment = np.dtype(kernels.MOMENT_DTYPES[config.moment_dtype]).itemsize
        vals = n_local * n + n
        B = config.batch_size
        # the logits [B, n] and their gradient; the rank's hidden slice, its gradient, the parameter gradient
        return {"weights": vals * item, "moments": 2 * vals * moment, "scratch": n_local,
                "step": (2 * B * n + 2 * B * n_local + n_local * n) * item, "rows": n_local}
