"""The optimiser: what backward hands to update (`Grads`) and Adam's moments (`Adam`).

The update kernels themselves (dense, lazy rows, fused sparse rows) are in
dslide.model.kernels; each layer calls the ones that fit its layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dslide.model import bfloat16, kernels


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


class Adam:
    """Adam moments m, v of one parameter array, stored as `moment_dtype` (a float type, or
    uint16 bit patterns for "bfloat16"; see dslide.model.bfloat16).

    key: the array's stream key for stochastic rounding; origin (r0, c0, stride): element
    (r, c) of the local array is global element (r + r0) * stride + c + c0 of the layer's
    (so the rounding does not depend on how the layer is split over ranks).
    """

    def __init__(self, shape, moment_dtype: str, key, origin):
        dtype = kernels.MOMENT_DTYPES[moment_dtype]
        self.rounds = moment_dtype == "bfloat16"
        # np.zeros maps zero pages lazily: rows that never receive gradient cost no memory
        self.m = np.zeros(shape, dtype=dtype)
        self.v = np.zeros(shape, dtype=dtype)
        self.key, self.origin = key, origin

    def rounding(self, step: int) -> np.ndarray:
        """The kernels' `rk` argument for this step."""
        if not self.rounds:
            return kernels.NO_ROUNDING
        return bfloat16.rounding_key(self.key, step, *self.origin)

