"""What every layer kind shares: sizes, shard, parameters, optimiser, state.

A layer is one slice of a fully connected layer split column-wise over ranks
(dslide.model.sharding): rank r holds the weights and biases of its neurons
[lo, hi), their Adam moments and whatever its kind derives from them.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from dslide import rng
from dslide.comm import Comm
from dslide.config import Config
from dslide.model import kernels
from dslide.model.batch import Act
from dslide.model.optim import Adam
from dslide.model.sharding import shard_bounds
from dslide.model.topk import blocked_topk, blocked_topk_biases
from dslide.timings import Timings


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
        sync_arrays() -> (rows, whole)            what replicas average (dslide.train.replicas)
        take_touched() -> int64 [m]               the rows its updates changed since the last
                                                  call (its `touched` mask, then cleared)
        rows_synced(ids)                          rows a replica synchronisation rewrote
        topk(x, k) -> (scores, ids, n_scored)     an output layer's best k per input, every
                                                  neuron of its slice scored (inference)
        index_points() -> int                     the training points whose hidden vectors an
                                                  inference index over its neurons takes
                                                  (dslide.train.infer_build; 0: none)
        estimate(config, index, d_in, n, n_local, is_output, threads) -> {kind: bytes}
                                                  classmethod: its memory from the
                                                  configuration alone (dslide.memory)
    and three class attributes: `indexable` (an inference index can be built over its
    neurons, dslide.infer.index), `data_parallel` (its gradients can be all-reduced whole,
    parallel = "data") and `kernel_bound` (its step is mostly numba kernels, which wait
    behind spinning BLAS threads: dslide.train.loop._blas_threads).

    `touched` uint8 [rows of W] is the layer's own: set by `update` on every row of W it
    changed (axis 0: input rows of a dense layer, neurons of an LSH layer); others read it
    and take it (the replicas' synchronisation) only through `take_touched`. The layer
    adds its own timings to the run's `timings` (dslide.timings).
    """

    kind = "?"
    split = "columns"  # an output layer may be split by rows instead (dense.RowDenseLayer)
    indexable = False
    data_parallel = True
    kernel_bound = False

    def __init__(self, index, d_in, n, is_output, comm: Comm, config: Config, dtype, dense_grads=False,
                 weights=None, timings: Timings | None = None):
        self.index, self.d_in, self.n, self.is_output = index, d_in, n, is_output
        self.comm, self.config, self.dtype = comm, config, np.dtype(dtype)
        self.timings = timings if timings is not None else Timings()
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

    def _optimiser(self, w_origin, b_origin=None) -> None:
        """Adam state for W and b (their global layouts: origin = (r0, c0, stride); b's by
        default this rank's neurons [lo, hi) of n)."""
        md = self.config.moment_dtype
        key = rng.stream_key(self.config.seed, rng.ROUNDING, self.index)
        self.opt_W = Adam(self.W.shape, md, rng.stream_key(key, 0), w_origin)
        self.opt_b = Adam(self.b.shape, md, rng.stream_key(key, 1), b_origin or (0, self.lo, self.n))

    def maintain(self, step: int) -> str | None:
        return None

    def set_negative_share(self, share: float) -> None:
        """Draw `share` of the configured uniform negatives from the next training step on
        (Config.middle_negatives); a layer that draws none ignores it."""

    def labels(self) -> tuple[int, int]:
        """The neurons [lo, hi) whose biases and logits this rank holds."""
        return self.lo, self.hi

    def take_touched(self) -> np.ndarray:
        """The rows of W (axis 0) that `update` changed since the last call, int64 sorted;
        their marks are cleared."""
        ids = np.flatnonzero(self.touched).astype(np.int64)
        self.touched[ids] = 0
        return ids

    # -- inference ------------------------------------------------------------------------

    def topk(self, x, k: int, biases=None):
        """This rank's best k neurons per input, every neuron of the slice scored (blocked
        matrix products): (scores float64 [B, k], global ids int64 [B, k], n_scored int64 [B]).
        x: an Act, or the CSR features (indptr, indices, data) when there is no hidden layer.
        Missing entries (fewer than k neurons) have score -inf and id -1. biases: None, or a list
        of bias vectors of the slice scored in place of `b`, the products made once: a list of
        those triples, one per vector."""
        if isinstance(x, Act):
            x = x.dense()
        else:
            x = sp.csr_matrix((x[2], x[1], x[0]), shape=(x[0].shape[0] - 1, self.d_in))
        n = np.full(x.shape[0], self.n_local, dtype=np.int64)
        if biases is None:
            s, i = blocked_topk(x, self.neuron_major(), self.b, k, self.lo)
            return s, i, n
        return [(s, i, n) for s, i in blocked_topk_biases(x, self.neuron_major(), biases, k, self.lo)]

    def index_points(self) -> int:
        return 0

    # -- memory -----------------------------------------------------------------------------

    @classmethod
    def estimate(cls, config: Config, index: int, d_in: int, n: int, n_local: int, is_output: bool,
                 threads: int) -> dict:
        """Bytes of a slice of n_local of the layer's n neurons over d_in inputs, by kind:
        weights (W and b), moments (Adam's m and v); a kind adds its own (tables, index,
        scratch, step: its largest transient of a training step, index_build) and `rows`,
        the length of its `touched` mask."""
        vals = d_in * n_local + n_local
        return {"weights": vals * np.dtype(config.dtype).itemsize,
                "moments": 2 * vals * np.dtype(kernels.MOMENT_DTYPES[config.moment_dtype]).itemsize}

    # -- replicas (dslide.train.replicas) ----------------------------------------------------

    def sync_arrays(self) -> tuple[list, list]:
        """(rows, whole): the parameters replicas average. `rows` share axis 0 with
        `touched` (`take_touched`) and are averaged on the rows some replica changed; `whole` change
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
        return out

    def shard_axes(self) -> dict:
        """For each array of `state`: the axis along which ranks split it (the neuron axis),
        None for an array every rank holds whole and alike; arrays not named here are
        this rank's own derived state, rebuilt when the layout changes."""
        c = self.neuron_axis
        return {"W": c, "W.m": c, "W.v": c, "b": 0, "b.m": 0, "b.v": 0}

    def load_state(self, arrays: dict, same_layout: bool = True, weights_only: bool = False) -> None:
        """Restore a slice from `state()`-named arrays (for a new layout: the ones in
        `shard_axes`, already cut to this rank's columns). An entry that is the live array
        itself (from `state()`) was filled in place. weights_only: the arrays of
        `state(weights_only=True)` only; the optimiser state is left as it is."""
        for name, arr in Layer.state(self, weights_only).items():
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
