"""The dense layer kind: every neuron computed, with BLAS or a sparse-row kernel."""

from __future__ import annotations

import numpy as np

from dslide import kernels
from dslide import rng
from dslide.batch import Act, Batch, Out
from dslide.layers.base import Layer
from dslide.loss import label_targets
from dslide.optim import Grads


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
