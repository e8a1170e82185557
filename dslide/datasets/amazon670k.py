"""Synthetic XMC data with the shape of Amazon-670K: items as near-duplicates of products.

Amazon-670K (full size: 490,449 training points, 135,909 features, 670,091
labels, 5.45 labels per point, 3.99 training points per label) has a very long
flat label tail: most labels have 1 to 5 training points, because a label is an
item that goes with a few others. Here a point is a noisy copy of a *product*;
its labels are the product's label set (a few tail labels of its own, some
shared with products of the same category, and optionally category and
department labels: the head). Points of one product are near-duplicates, so a
k-NN or tree method finds a test point's product among the training points,
while :mod:`dslide.datasets.synthetic` draws every point from label prototypes.

Design size. The label statistics hold at ``design_points`` training points:
the world has ``G = round(design_points / points_per_product)`` products, and
a tail label belongs to about one product, so a label seen in training has
about ``points_per_product`` points. At ``design_points = 490_449`` and the
full widths the world uses (almost) every label; at the suite's 30,000 points
only the labels the products hold are used, the others are never seen.

The world (depends on the preset and the seed only)
---------------------------------------------------
* **Background.** A permutation gives each feature a background rank r,
  ``idf = 1 + idf_slope * log2(1 + r)``; background ("noise") features are drawn
  Zipf-like over the ranks with exponent ``feature_zipf`` (the law and its O(1)
  sampler: synthetic.py).
* **Categories.** ``n_categories`` categories; category c has popularity weight
  about ``(rank_c + 1.5)^-category_zipf`` (a random rank) and a vocabulary of
  ``category_vocab`` features drawn Zipf-like over the background ranks with
  exponent ``proto_feature_zipf``; its j-th feature has weight about
  ``(j + 1.5)^-proto_zipf``. Each category belongs to one of ``n_departments``
  departments, drawn Zipf-like with exponent 1 (department d holds a share of
  the categories of about ``(d + 1.5)^-1``).
* **Products.** G products; product g has a category (by category popularity),
  a popularity weight ``LogNormal(0, product_sigma)``, a length
  ``k_g = LogNormal(mu, nnz_sigma)`` (``E[k_g] = nnz_mean``) and a prototype of
  ``min(proto_max, ceil(proto_factor * k_g) + 4)`` features drawn Zipf-like
  over the background ranks (exponent ``proto_feature_zipf``; repeats allowed),
  whose j-th has weight about ``(j + 1.5)^-proto_zipf``.
* **Labels.** Product g holds ``n_g`` labels, n_g drawn from ``labels_pmf``
  (probabilities of 1, 2, ...): its department's label with probability
  ``dept_prob``, its category's label with probability ``cat_prob``, and tail
  labels for the rest (at least one). A tail label is, with probability
  ``share_prob``, one already held by an earlier product of the same category
  (uniform among them), else a new one. Label ids: department labels, then
  category labels, then tail labels in order of creation, mapped through a
  random permutation of ``[0, L)``; creation stops when the ids run out (then
  tail labels are shared).

A point
-------
1. A product g by popularity (numpy); non-zeros ``k = clip(round(k_g *
   LogNormal(-s^2 / 2, s)), 1, min(nnz_max, F))`` with ``s = point_sigma``;
   ``k_s = Binomial(k, 1 - noise)`` signal non-zeros.
2. Labels: each of g's labels is dropped with probability ``label_drop``
   (at least one stays); sorted.
3. Signal features until the point holds k_s distinct ones (or ``4 k_s + 8``
   draws): with probability ``cat_share`` a feature of g's category vocabulary,
   else of g's prototype, by weight. A repeated feature increments its tf.
4. Background features up to k (or ``4 (k - held) + 8`` more draws).
5. Values ``x_f = idf_f * tf_f ** tf_power`` (float32, >= 1); indices sorted.

Randomness
----------
The world: ``numpy.random.default_rng(SeedSequence([seed, 0]))``. A split's
points: ``SeedSequence([seed, 1, crc32(split)])`` for the per-point choices
and the seed of the splitmix64 stream (explicit ``uint64[1]`` state) of the
serial point kernel. Nothing depends on the numba thread count.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from numba import njit

from dslide.datasets.baskets import _powerlaw_const_nb
from dslide.io.data import XMCData
from dslide.datasets.draws import _draw_features, _powerlaw_rank, _uniform, _zipf_mass
from dslide.datasets.presets import pick_preset
from dslide.datasets.synthetic import (
    Slots, _check_points, _emit_row, assemble, split_pair, _add_feature, _check_seed, _split_stream,
)


@dataclass(frozen=True)
class Preset:
    """Parameters of a product-world data set (model in the module docstring).

    n_features:   F, number of features.
    n_labels:     L, number of labels (ids).
    n_train:      default number of points of the "train" split.
    n_test:       default number of points of the "test" split.
    design_points: training-set size at which the label statistics hold.
    points_per_product: design_points / number of products.
    product_sigma: log-normal shape of the product popularity.
    nnz_mean:     mean product length (non-zeros per point).
    nnz_sigma:    log-normal shape of the product lengths.
    point_sigma:  log-normal shape of a point's length around its product's.
    nnz_max:      cap on the non-zeros of one point.
    n_categories: number of categories.
    category_zipf: exponent of the Zipf-like category popularity.
    category_vocab: features in each category's vocabulary.
    n_departments: number of departments (groups of categories).
    labels_pmf:   probabilities of 1, 2, ... labels per product.
    dept_prob:    probability that a product holds its department's label.
    cat_prob:     probability that a product holds its category's label.
    share_prob:   probability that a tail label is shared with an earlier product of the category.
    label_drop:   probability that a point drops one of its product's labels.
    proto_factor: prototype size / product length.
    proto_max:    cap on the features of a prototype.
    proto_zipf:   the j-th feature of a prototype or vocabulary has weight about (j + 1.5)^-proto_zipf.
    proto_feature_zipf: prototype and vocabulary features are drawn Zipf-like over the
                  background ranks with this exponent.
    cat_share:    fraction of signal draws taken from the category vocabulary.
    noise:        expected fraction of a point's non-zeros drawn from the background.
    feature_zipf: exponent of the Zipf-like background feature popularity.
    idf_slope:    idf of the feature of background rank r: 1 + idf_slope * log2(1 + r).
    tf_power:     value = idf * tf ** tf_power.
    """

    n_features: int
    n_labels: int
    n_train: int
    n_test: int
    design_points: int
    points_per_product: float
    product_sigma: float
    nnz_mean: float
    nnz_sigma: float
    point_sigma: float
    nnz_max: int
    n_categories: int
    category_zipf: float
    category_vocab: int
    n_departments: int
    labels_pmf: tuple
    dept_prob: float
    cat_prob: float
    share_prob: float
    label_drop: float
    proto_factor: float
    proto_max: int
    proto_zipf: float
    proto_feature_zipf: float
    cat_share: float
    noise: float
    feature_zipf: float
    idf_slope: float
    tf_power: float

    def __post_init__(self):
        for f in dataclasses.fields(self):
            if f.name == "labels_pmf":
                continue
            value = getattr(self, f.name)
            kinds = (int, np.integer) if f.type == "int" else (int, float, np.number)
            if isinstance(value, bool) or not isinstance(value, kinds) or not np.isfinite(value):
                raise ValueError(f"{f.name} ({value!r}) must be a finite {f.type}")
        for name in ("n_features", "n_labels", "design_points", "nnz_max", "n_categories",
                     "category_vocab", "n_departments", "proto_max"):
            if not 1 <= getattr(self, name) <= 2**31 - 1:
                raise ValueError(f"{name} ({getattr(self, name)}) must be in [1, 2**31 - 1]")
        for name in ("n_train", "n_test"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} ({getattr(self, name)}) must be >= 0")
        pmf = self.labels_pmf
        if (not isinstance(pmf, tuple) or not pmf or any(not np.isfinite(q) or q < 0 for q in pmf)
                or abs(sum(pmf) - 1.0) > 1e-9):
            raise ValueError(f"labels_pmf ({pmf!r}) must be a tuple of probabilities summing to 1")
        if len(pmf) > self.n_labels:
            raise ValueError(f"labels_pmf allows {len(pmf)} labels per product > n_labels ({self.n_labels})")
        if self.n_departments > self.n_categories:
            raise ValueError(f"n_departments ({self.n_departments}) must be <= n_categories ({self.n_categories})")
        if self.n_departments + self.n_categories >= self.n_labels:
            raise ValueError(f"n_departments + n_categories ({self.n_departments + self.n_categories}) "
                             f"must be < n_labels ({self.n_labels})")
        if self.points_per_product <= 0.0:
            raise ValueError(f"points_per_product ({self.points_per_product}) must be > 0")
        if not 1.0 <= self.nnz_mean <= min(self.nnz_max, self.n_features):
            raise ValueError(f"nnz_mean ({self.nnz_mean}) must be in [1, min(nnz_max, n_features)]")
        for name in ("dept_prob", "cat_prob", "share_prob", "label_drop", "cat_share", "noise"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} ({getattr(self, name)}) must be in [0, 1]")
        for name in ("product_sigma", "nnz_sigma", "point_sigma", "category_zipf", "proto_factor",
                     "proto_zipf", "proto_feature_zipf", "feature_zipf", "idf_slope", "tf_power"):
            if getattr(self, name) < 0.0:
                raise ValueError(f"{name} ({getattr(self, name)}) must be >= 0")


FIELDS = tuple(f.name for f in dataclasses.fields(Preset))

# Labels per product: the shape of the real sample (most points have 6 labels),
# mean about 5.45 after the drops.
_LABELS_PMF = (0.04, 0.03, 0.04, 0.04, 0.08, 0.50, 0.15, 0.12)

_WIDE = dict(
    n_features=135_909, n_labels=670_091, n_train=30_000, n_test=3_000, design_points=30_000,
    points_per_product=3.0, product_sigma=0.7,
    nnz_mean=76.0, nnz_sigma=0.85, point_sigma=0.35, nnz_max=2_000,
    n_categories=2_000, category_vocab=200, n_departments=20,
    labels_pmf=_LABELS_PMF, share_prob=0.15, label_drop=0.05,
    proto_factor=1.5, proto_max=1_000, proto_zipf=1.1, proto_feature_zipf=0.7, cat_share=0.5,
    noise=0.5, feature_zipf=0.8, idf_slope=0.5, tf_power=1.0,
)
_NARROW = dict(_WIDE, n_features=30_000, n_labels=40_000, n_categories=500)

PRESETS: dict[str, Preset] = {
    "a670k-head": Preset(**_WIDE, category_zipf=1.0, dept_prob=0.6, cat_prob=0.5),
    "a670k-tail": Preset(**_WIDE, category_zipf=0.8, dept_prob=0.0, cat_prob=0.5),
    "a670k-head-40k": Preset(**_NARROW, category_zipf=1.0, dept_prob=0.8, cat_prob=0.5),
    "a670k-tail-40k": Preset(**_NARROW, category_zipf=0.7, dept_prob=0.0, cat_prob=0.5),
}


def get_preset(preset: str | Preset, **overrides) -> Preset:
    """The preset named `preset` (or the given Preset) with `overrides` applied and checked."""
    return pick_preset(preset, overrides, PRESETS, Preset, FIELDS)


# --------------------------------------------------------------------------- the world


class World(NamedTuple):
    """What train and test points share (read-only arrays; G products, C categories).

    feature_of_rank: int32 [F]    feature id of background rank r.
    idf:             float32 [F]  idf of each feature id.
    cat_vocab:       int32 [C, category_vocab]  each category's features, by weight.
    product_cat:     int32 [G]    category of each product.
    product_weight:  float64 [G]  popularity of each product (sums to 1).
    product_len:     float64 [G]  length k_g of each product.
    proto_ptr:       int64 [G + 1]  product g's prototype is proto_feat[proto_ptr[g]:proto_ptr[g+1]].
    proto_feat:      int32 [proto_ptr[G]]
    label_ptr:       int64 [G + 1]  product g's labels are label_ids[label_ptr[g]:label_ptr[g+1]] (sorted).
    label_ids:       int32 [label_ptr[G]]
    """

    feature_of_rank: np.ndarray
    idf: np.ndarray
    cat_vocab: np.ndarray
    product_cat: np.ndarray
    product_weight: np.ndarray
    product_len: np.ndarray
    proto_ptr: np.ndarray
    proto_feat: np.ndarray
    label_ptr: np.ndarray
    label_ids: np.ndarray


@njit(cache=True)
def _product_labels(product_cat, n_lab, has_dept, has_cat, dept_of_cat, n_dept, n_cat, n_ids,
                    share_prob, label_ptr, out, cat_pool, cat_pool_ptr, state):
    """Label slots of every product (ids before the permutation), in product order.

    product_cat: int32 [G]; n_lab: int64 [G] labels wanted; has_dept, has_cat: bool [G];
    dept_of_cat: int32 [C]; label_ptr: int64 [G + 1] (cumsum of n_lab); out: int64 [label_ptr[G]],
    filled with ids (departments 0..n_dept-1, categories n_dept.., tail labels after);
    cat_pool: int64 [label_ptr[G]] scratch; cat_pool_ptr: int64 [C + 1] the pool's slots per
    category (cumsum of its products' n_lab). Returns the number of ids used.
    """
    G = product_cat.shape[0]
    pool_fill = np.zeros(n_cat, dtype=np.int64)
    next_id = n_dept + n_cat
    for g in range(G):
        c = product_cat[g]
        s = label_ptr[g]
        m = 0
        want = n_lab[g]
        if has_dept[g] and m < want - 1:
            out[s + m] = dept_of_cat[c]
            m += 1
        if has_cat[g] and m < want - 1:
            out[s + m] = n_dept + c
            m += 1
        p0 = cat_pool_ptr[c]
        while m < want:
            lab = -1
            held = pool_fill[c]
            if held > 0 and (_uniform(state) < share_prob or next_id >= n_ids):
                for _attempt in range(8):
                    cand = cat_pool[p0 + min(np.int64(_uniform(state) * held), held - 1)]
                    dup = False
                    for q in range(m):
                        if out[s + q] == cand:
                            dup = True
                    if not dup:
                        lab = cand
                        break
            if lab < 0 and next_id < n_ids:
                lab = next_id
                next_id += 1
                cat_pool[p0 + pool_fill[c]] = lab
                pool_fill[c] += 1
            if lab < 0:
                break  # no id left and nothing to share: a shorter label set
            out[s + m] = lab
            m += 1
        for q in range(m, want):
            out[s + q] = -1
    return next_id


@functools.lru_cache(maxsize=8)
def build_world(p: Preset, seed: int) -> World:
    """The world of preset `p` and `seed` (cached: train and test reuse it)."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0]))
    F, L, C = p.n_features, p.n_labels, p.n_categories
    G = max(1, int(round(p.design_points / p.points_per_product)))
    feature_of_rank = rng.permutation(F).astype(np.int32)
    rank_of_feature = np.empty(F, dtype=np.int64)
    rank_of_feature[feature_of_rank] = np.arange(F)
    idf = (1.0 + p.idf_slope * np.log2(1.0 + rank_of_feature)).astype(np.float32)

    cat_vocab = _draw_features(rng, (C, p.category_vocab), feature_of_rank, p.proto_feature_zipf)
    cat_w = _zipf_mass(C, p.category_zipf)[rng.permutation(C)]
    product_cat = rng.choice(C, size=G, p=cat_w / cat_w.sum()).astype(np.int32)
    w = rng.lognormal(0.0, p.product_sigma, size=G)
    product_weight = w / w.sum()
    mu = np.log(p.nnz_mean) - 0.5 * p.nnz_sigma ** 2
    product_len = rng.lognormal(mu, p.nnz_sigma, size=G)
    proto_len = np.minimum(p.proto_max, np.ceil(p.proto_factor * product_len).astype(np.int64) + 4)
    proto_ptr = np.zeros(G + 1, dtype=np.int64)
    np.cumsum(proto_len, out=proto_ptr[1:])
    proto_feat = _draw_features(rng, int(proto_ptr[-1]), feature_of_rank, p.proto_feature_zipf)

    pmf = np.asarray(p.labels_pmf, dtype=np.float64)
    n_lab = 1 + rng.choice(len(pmf), size=G, p=pmf / pmf.sum()).astype(np.int64)
    has_dept = rng.random(G) < p.dept_prob
    has_cat = rng.random(G) < p.cat_prob
    dept_w = _zipf_mass(p.n_departments, 1.0)
    dept_of_cat = rng.choice(p.n_departments, size=C, p=dept_w / dept_w.sum()).astype(np.int32)
    label_ptr = np.zeros(G + 1, dtype=np.int64)
    np.cumsum(n_lab, out=label_ptr[1:])
    raw = np.empty(label_ptr[-1], dtype=np.int64)
    pool = np.empty(label_ptr[-1], dtype=np.int64)
    pool_ptr = np.zeros(C + 1, dtype=np.int64)
    np.cumsum(np.bincount(product_cat, weights=n_lab, minlength=C).astype(np.int64), out=pool_ptr[1:])
    state = np.array([rng.integers(0, 2 ** 63, dtype=np.int64)], dtype=np.uint64)
    _product_labels(product_cat, n_lab, has_dept, has_cat, dept_of_cat, p.n_departments, C, L,
                    float(p.share_prob), label_ptr, raw, pool, pool_ptr, state)
    id_of = rng.permutation(L).astype(np.int32)
    keep = raw >= 0
    ids = id_of[raw[keep]]
    row = np.repeat(np.arange(G), n_lab)[keep]
    order = np.lexsort((ids, row))
    label_ids = ids[order]
    label_ptr = np.zeros(G + 1, dtype=np.int64)
    np.cumsum(np.bincount(row, minlength=G), out=label_ptr[1:])

    world = World(feature_of_rank, idf, cat_vocab, product_cat, product_weight, product_len,
                  proto_ptr, proto_feat, label_ptr, label_ids)
    for a in world:
        a.flags.writeable = False
    return world


# --------------------------------------------------------------------------- the points


@njit(cache=True)
def _draw_points(prod, n_nnz, n_sig, state, label_drop,
                 product_cat, label_ptr, label_ids, proto_ptr, proto_feat, proto_zipf,
                 cat_vocab, cat_share, feature_zipf, feature_of_rank, idf, tf_power,
                 lab_ptr, lab_out, lab_cnt, feat_ptr, feat_out, val_out, feat_cnt, mark):
    """Draw the labels and features of n points (model in the module docstring).

    prod, n_nnz, n_sig: int64 [n]  product, non-zeros, signal non-zeros of each point.
    state:              uint64 [1] splitmix64 state, advanced in place.
    lab_ptr, feat_ptr:  int64 [n+1] slot ranges in lab_out / feat_out.
    lab_out:            int32 [lab_ptr[n]]  labels, sorted (first lab_cnt[i] slots used).
    feat_out, val_out:  int32 / float32 [feat_ptr[n]]  features (sorted) and values.
    lab_cnt, feat_cnt:  int64 [n]  slots used per point.
    mark:               int64 [F] scratch, initialised to -1 (see synthetic._add_feature).
    """
    n = prod.shape[0]
    F = feature_of_rank.shape[0]
    V = cat_vocab.shape[1]
    c_feat = _powerlaw_const_nb(F, feature_zipf)
    c_voc = _powerlaw_const_nb(V, proto_zipf)
    max_k = 1
    for i in range(n):
        max_k = max(max_k, n_nnz[i])
    keys = np.empty(max_k, dtype=np.int64)
    tmp = np.empty(max_k, dtype=np.int64)
    counts = np.empty(2 * max_k + 1, dtype=np.int64)
    for i in range(n):
        g = prod[i]
        # --- labels: the product's (sorted), each dropped with probability label_drop
        a0 = lab_ptr[i]
        m = 0
        for s in range(label_ptr[g], label_ptr[g + 1]):
            if _uniform(state) >= label_drop:
                lab_out[a0 + m] = label_ids[s]
                m += 1
        if m == 0:
            n_g = label_ptr[g + 1] - label_ptr[g]
            lab_out[a0] = label_ids[label_ptr[g] + min(np.int64(_uniform(state) * n_g), n_g - 1)]
            m = 1
        lab_cnt[i] = m

        # --- signal features: the product's prototype and its category's vocabulary
        c = product_cat[g]
        p0 = proto_ptr[g]
        P = proto_ptr[g + 1] - p0
        c_pro = _powerlaw_const_nb(P, proto_zipf)
        k = n_nnz[i]
        ks = n_sig[i]
        d = 0
        draws = 0
        limit = 4 * ks + 8
        while d < ks and draws < limit:
            draws += 1
            if _uniform(state) < cat_share:
                f = cat_vocab[c, _powerlaw_rank(_uniform(state), V, proto_zipf, c_voc)]
            else:
                f = proto_feat[p0 + _powerlaw_rank(_uniform(state), P, proto_zipf, c_pro)]
            d = _add_feature(f, i, d, mark, keys)

        # --- background features up to k non-zeros
        draws = 0
        limit = 4 * (k - d) + 8
        while d < k and draws < limit:
            draws += 1
            f = feature_of_rank[_powerlaw_rank(_uniform(state), F, feature_zipf, c_feat)]
            d = _add_feature(f, i, d, mark, keys)

        _emit_row(keys, d, F, tmp, counts, idf, tf_power, feat_out, val_out, feat_ptr[i])
        feat_cnt[i] = d


def _draw(p: Preset, world: World, n: int, seed: int, split: str) -> XMCData:
    rng = np.random.default_rng(np.random.SeedSequence([seed, 1, _split_stream(split)]))
    G = len(world.product_cat)
    cdf = np.cumsum(world.product_weight)
    prod = np.minimum(np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right"), G - 1).astype(np.int64)
    s = p.point_sigma
    n_nnz = np.rint(world.product_len[prod] * rng.lognormal(-0.5 * s * s, s, size=n)).astype(np.int64)
    np.clip(n_nnz, 1, min(p.nnz_max, p.n_features), out=n_nnz)
    n_sig = rng.binomial(n_nnz, 1.0 - p.noise).astype(np.int64)
    state = np.array([rng.integers(0, 2 ** 63, dtype=np.int64)], dtype=np.uint64)

    lab_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.diff(world.label_ptr)[prod], out=lab_ptr[1:])
    slots = Slots.alloc(p.n_features, lab_ptr, n_nnz)
    w = world
    _draw_points(prod, n_nnz, n_sig, state, float(p.label_drop),
                 w.product_cat, w.label_ptr, w.label_ids, w.proto_ptr, w.proto_feat, float(p.proto_zipf),
                 w.cat_vocab, float(p.cat_share), float(p.feature_zipf), w.feature_of_rank, w.idf,
                 float(p.tf_power),
                 *slots)
    return assemble(p, slots)


def generate(preset: str | Preset = "a670k-tail", n_points: int | None = None, seed: int = 0, *,
             split: str = "train", **overrides) -> XMCData:
    """`n_points` points of the `split` split of data set (preset, overrides, seed).

    n_points: default: the preset's n_train for split "train", n_test for "test".
    Returns XMCData with X csr float32 [n_points, n_features] (sorted indices, values >= 1)
    and Y csr float32 [n_points, n_labels] (ones).
    """
    p = get_preset(preset, **overrides)
    seed = _check_seed(seed)
    n_points = _check_points(p, n_points, split)
    return _draw(p, build_world(p, seed), n_points, seed, split)


def generate_split(preset: str | Preset = "a670k-tail", n_train: int | None = None,
                   n_test: int | None = None, seed: int = 0, **overrides) -> tuple[XMCData, XMCData]:
    """(train, test) of one world: `generate(..., split="train")` and `split="test"`."""
    return split_pair(generate, preset, n_train, n_test, seed, overrides)
