"""The data types a training step passes between the network and its layers.

    Batch  one mini-batch, identical on every rank (the input of a step)
    Act    a layer's output on every rank, after the all-gather: the next layer's input
    Out    a layer's own output slice, before the all-gather
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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
    layer's width; mask float [B, n_r] or None: the dropout of this rank's
    columns bounds[r]:bounds[r+1], applied to them before the all-gather (its
    backward applies it to their summed gradient); own: `a` holds this rank's
    columns bounds[r]:bounds[r+1] only, not gathered (the input of an output
    layer split by rows).
    """

    a: np.ndarray
    ids: np.ndarray | None
    bounds: np.ndarray
    n: int
    mask: np.ndarray | None = None
    own: bool = False

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
    weights): the batch's labels among its columns, and `shift`: None, or what it added to
    the logits a (broadcastable to a: the sampled softmax's log-Q correction of its random
    neurons), which a binary loss takes off."""

    a: np.ndarray
    ids: np.ndarray | None
    targets: tuple | None = None
    shift: np.ndarray | None = None
