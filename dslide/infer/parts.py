"""The model's inference parts as checkpoint sections, beside the layers'.

A section is what dslide.io.checkpoint saves and loads for a part of the model
that is no layer's: `name` (its arrays are saved as "<name>/<key>"), `state()`
(its arrays, {} when the model has none), `shard_axes()` (None for an array
every rank holds alike; an array not named there is the rank's own, rebuilt
for a new layout) and `load_state(arrays, same_layout)`. `legacy` says where
checkpoints from before sections kept the same arrays: in the output layer's
state, under "<old prefix><rest>" for the key "<new prefix><rest>".

    neighbours   the neighbour store (fusion.NeighbourLabels), alike on every rank
    index        the inference index (index.InferenceIndex): anchors and neighbour
                 graph alike on every rank, buckets each rank's own
    hidden_knn   the hidden neighbours (hidden_knn.HiddenNeighbours), alike on every rank
"""

from __future__ import annotations

from dslide import rng
from dslide.infer.fusion import KEYS, NeighbourLabels
from dslide.infer.hidden_knn import KEYS as HIDDEN_KEYS
from dslide.infer.hidden_knn import HiddenNeighbours
from dslide.infer.index import InferenceIndex


class NeighboursSection:
    """The model's neighbour store (`Model.neighbours`)."""

    name = "neighbours"
    legacy = (("knn.", ""),)

    def __init__(self, model):
        self.model = model

    def state(self) -> dict:
        store = self.model.neighbours
        return {} if store is None else store.state_arrays()

    def shard_axes(self) -> dict:
        return dict.fromkeys(KEYS)

    def load_state(self, arrays: dict, same_layout: bool = True) -> None:
        """The store of the arrays (checked first, dslide.validate), or none when they are empty."""
        self.model.neighbours = (NeighbourLabels.from_state(arrays, n_labels=self.model.n_labels,
                                                            where="the neighbour store") if arrays else None)


class IndexSection:
    """The model's inference index (`Model.index`) over the output layer's slice."""

    name = "index"
    legacy = (("index.", ""), ("nn.", "nn."))

    def __init__(self, model):
        self.model = model

    def state(self) -> dict:
        return {} if self.model.index is None else self.model.index.state()

    def shard_axes(self) -> dict:
        return dict(InferenceIndex.SHARD_AXES)

    def load_state(self, arrays: dict, same_layout: bool = True) -> None:
        """The index of the arrays, read after the layers (a new layout refills its buckets from
        the output layer's loaded weights); none when they are empty."""
        out = self.model.network.layers[-1]
        self.model.index = InferenceIndex.from_state(arrays, out.W, out.b, self.model.network.comm,
                                                     self.model.config.layer_lsh(out.index), index_seed(self.model),
                                                     same_layout) if arrays else None


class HiddenSection:
    """The model's hidden neighbours (`Model.hidden_neighbours`)."""

    name = "hidden_knn"
    legacy = ()

    def __init__(self, model):
        self.model = model

    def state(self) -> dict:
        store = getattr(self.model, "hidden_neighbours", None)
        return {} if store is None else store.state_arrays()

    def shard_axes(self) -> dict:
        return dict.fromkeys(HIDDEN_KEYS)

    def load_state(self, arrays: dict, same_layout: bool = True) -> None:
        """The store of the arrays (checked first, dslide.validate), or none when they are empty."""
        net = self.model.network
        self.model.hidden_neighbours = (HiddenNeighbours.from_state(arrays, net.n_labels, net.layers[-1].d_in,
                                                                    where="the hidden neighbours")
                                        if arrays else None)


def index_seed(model) -> int:
    """The seed of the inference index's hash parameters (anchors): from the run's seed and
    the output layer's position alone."""
    return rng.lsh_seed(model.config.seed, rng.INDEX, len(model.network.layers) - 1)


def sections(model) -> list:
    """The checkpoint sections of a model's inference parts."""
    return [NeighboursSection(model), IndexSection(model), HiddenSection(model)]
