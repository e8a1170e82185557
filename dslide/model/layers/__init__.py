"""Layer kinds, one module each; every kind speaks the protocol of `Layer` (layers/base.py).

    dense   DenseLayer: every neuron computed (layers/dense.py)
    lsh     LSHLayer: a few neurons per step from a candidate source (layers/lsh.py)

A new kind is one module and its entry in `KINDS` (docs/architecture.md); the
network, the training loop, the checkpoints and the memory account call only
the protocol.
"""

from dslide.model.layers.base import Layer
from dslide.model.layers.dense import DenseLayer
from dslide.model.layers.lsh import LSHLayer

#: Config.layer_kind's names -> their classes
KINDS = {"dense": DenseLayer, "lsh": LSHLayer}


def make_layer(kind: str, *args, **kw) -> Layer:
    """A layer of kind `kind` (a key of KINDS); args and kw: those of `Layer`."""
    return KINDS[kind](*args, **kw)


__all__ = ["KINDS", "DenseLayer", "Layer", "LSHLayer", "make_layer"]
