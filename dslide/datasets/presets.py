"""The presets of the prototype generator (dslide.datasets.synthetic), and `pick_preset`, every family's.

A preset is a frozen, checked `Preset` of the model's parameters (the model:
dslide.datasets.synthetic's docstring); `get_preset` gives one by name with
fields overridden.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Preset:
    """Parameters of a synthetic data set (see the module docstring for the model).

    n_features:   F, number of features.
    n_labels:     L, number of labels.
    n_train:      default number of points of the "train" split.
    n_test:       default number of points of the "test" split.
    nnz_mean:     mean number of non-zeros per point.
    nnz_sigma:    log-normal shape of the non-zeros per point (larger: heavier tail).
    nnz_max:      cap on the non-zeros of one point.
    labels_mean:  mean number of labels per point before the cap (1 + Poisson(labels_mean - 1)).
    labels_max:   cap on the labels of one point (keep it <= cluster_size when cluster_prob = 1,
                  or the cap, not the cluster, limits the labels).
    label_zipf:   exponent of the Zipf-like label popularity (0 = uniform).
    cluster_size: labels per cluster (a random set of labels sharing a topic).
    cluster_prob: probability that a further label of a point comes from the
                  primary label's cluster rather than from global popularity.
    proto_size:   features in each label's prototype.
    topic_size:   features in each cluster's topic prototype.
    topic_share:  fraction of signal draws taken from the cluster topic rather
                  than from the label's own prototype.
    proto_zipf:   the j-th feature of a prototype has weight (j + 1)^-proto_zipf.
    proto_feature_zipf: prototype and topic features are drawn Zipf-like over the
                  background ranks with this exponent (0: uniform over the features;
                  larger: more shared, more frequent, lower-idf prototype features).
    noise:        expected fraction of a point's non-zeros drawn from the background.
    feature_zipf: exponent of the Zipf-like background feature popularity.
    idf_slope:    idf of the feature of background rank r: 1 + idf_slope * log2(1 + r).
    tf_power:     value = idf * tf ** tf_power (1: raw term counts, 0: binary-like).
    """

    n_features: int
    n_labels: int
    n_train: int
    n_test: int
    nnz_mean: float
    nnz_sigma: float
    nnz_max: int
    labels_mean: float
    labels_max: int
    label_zipf: float
    cluster_size: int
    cluster_prob: float
    proto_size: int
    topic_size: int
    topic_share: float
    proto_zipf: float
    proto_feature_zipf: float
    noise: float
    feature_zipf: float
    idf_slope: float
    tf_power: float

    def __post_init__(self):
        for name in FIELDS:
            value = getattr(self, name)
            kind = FIELD_KINDS[name]
            number_types = (int, np.integer) if kind is int else (int, float, np.number)
            ok = isinstance(value, number_types)
            if isinstance(value, bool) or not ok or (kind is float and not np.isfinite(value)):
                raise ValueError(f"{name} ({value!r}) must be a finite {kind.__name__}")
        for name in ("n_features", "n_labels", "nnz_max", "labels_max", "cluster_size",
                     "proto_size", "topic_size"):
            value = getattr(self, name)
            # int32 ids in the kernels and the csr indices.
            if not 1 <= value <= 2**31 - 1:
                raise ValueError(f"{name} ({value}) must be in [1, 2**31 - 1]")
        for name in ("n_train", "n_test"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} ({getattr(self, name)}) must be >= 0")
        if not 1.0 <= self.nnz_mean <= min(self.nnz_max, self.n_features):
            raise ValueError(f"nnz_mean ({self.nnz_mean}) must be in [1, min(nnz_max, n_features)]"
                             f" = [1, {min(self.nnz_max, self.n_features)}]")
        if not 1.0 <= self.labels_mean <= self.labels_max:
            raise ValueError(
                f"labels_mean ({self.labels_mean}) must be in [1, labels_max] = [1, {self.labels_max}]")
        if self.labels_max > self.n_labels:
            raise ValueError(f"labels_max ({self.labels_max}) must be <= n_labels ({self.n_labels})")
        for name in ("cluster_prob", "topic_share", "noise"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} ({value}) must be in [0, 1]")
        for name in ("nnz_sigma", "label_zipf", "proto_zipf", "proto_feature_zipf", "feature_zipf",
                     "idf_slope", "tf_power"):
            value = getattr(self, name)
            if value < 0.0:
                raise ValueError(f"{name} ({value}) must be >= 0")


FIELDS = tuple(f.name for f in dataclasses.fields(Preset))
FIELD_KINDS = {f.name: {"int": int, "float": float}[f.type] for f in dataclasses.fields(Preset)}

PRESETS: dict[str, Preset] = {
    # For tests: generates in a few milliseconds.
    "tiny": Preset(
        n_features=1_000, n_labels=500, n_train=2_000, n_test=500,
        nnz_mean=20.0, nnz_sigma=0.5, nnz_max=200, labels_mean=2.0, labels_max=4,
        label_zipf=1.0, cluster_size=4, cluster_prob=1.0,
        proto_size=10, topic_size=20, topic_share=0.3, proto_zipf=1.2, proto_feature_zipf=0.3,
        noise=0.5, feature_zipf=1.0, idf_slope=0.5, tf_power=0.8,
    ),
    # The demo default: the shape of SLIDE's reference benchmark.
    "small": Preset(
        n_features=50_000, n_labels=20_000, n_train=20_000, n_test=2_000,
        nnz_mean=28.0, nnz_sigma=0.7, nnz_max=500, labels_mean=2.0, labels_max=4,
        label_zipf=1.0, cluster_size=4, cluster_prob=1.0,
        proto_size=16, topic_size=32, topic_share=0.2, proto_zipf=1.5, proto_feature_zipf=0.3,
        noise=0.2, feature_zipf=1.0, idf_slope=0.4, tf_power=0.8,
    ),
    # Statistics of Amazon-670K (calibrated on 512 real test points).
    "amazon-like": Preset(
        n_features=135_909, n_labels=670_091, n_train=50_000, n_test=5_000,
        nnz_mean=64.0, nnz_sigma=0.85, nnz_max=2_000, labels_mean=5.0, labels_max=8,
        label_zipf=0.9, cluster_size=8, cluster_prob=1.0,
        proto_size=24, topic_size=48, topic_share=0.3, proto_zipf=1.2, proto_feature_zipf=0.7,
        noise=0.35, feature_zipf=0.8, idf_slope=0.45, tf_power=0.8,
    ),
}
# The same shape with a longer label tail (most frequent label in about 0.8% of the
# points instead of 2.5%; the 0.1% most frequent labels hold 8% of the label
# entries instead of 21%): judges whether a method leans on frequent labels.
PRESETS["amazon-tail"] = dataclasses.replace(PRESETS["amazon-like"], label_zipf=0.75)


def pick_preset(preset, overrides: dict, presets: dict, kind: type, fields: tuple):
    """The preset named `preset` in `presets` (or a `kind` instance) with `overrides` (fields of
    `kind`) applied and checked: every generator family's `get_preset`."""
    if isinstance(preset, kind):
        base = preset
    elif preset in presets:
        base = presets[preset]
    else:
        raise ValueError(f"unknown preset {preset!r}; valid presets: {', '.join(presets)}")
    unknown = sorted(set(overrides) - set(fields))
    if unknown:
        raise ValueError(f"unknown preset field(s) {', '.join(unknown)}; valid fields: {', '.join(fields)}")
    return dataclasses.replace(base, **overrides) if overrides else base


def get_preset(preset: str | Preset, **overrides) -> Preset:
    """The preset named `preset` (or the given Preset) with `overrides` applied and checked."""
    return pick_preset(preset, overrides, PRESETS, Preset, FIELDS)
