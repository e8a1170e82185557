"""Layer kinds, one module each; every kind speaks the protocol of `Layer` (layers/base.py).

    dense   DenseLayer: every neuron computed (layers/dense.py)
    lsh     LSHLayer: a few neurons per step from a candidate source (layers/lsh.py)
"""

from dslide.layers.base import Layer
from dslide.layers.dense import DenseLayer
from dslide.layers.lsh import LSHLayer

__all__ = ["Layer", "DenseLayer", "LSHLayer"]
