"""Synthetic XMC data from topics and label baskets: labels share features and co-occur.

Where :mod:`dslide.datasets.synthetic` gives every label its own prototype, here
a label's features are mostly its *topic's*: labels are hard to tell apart from
the features alone, and which labels come together (baskets) carries much of
the information.

The world (F features, L labels; depends on the preset and the seed only)
-------------------------------------------------------------------------
* **Background.** As in synthetic.py: a permutation gives each feature a
  background rank r, ``idf = 1 + idf_slope * log2(1 + r)``, and background
  ("noise") features are drawn Zipf-like over the ranks with exponent
  ``feature_zipf`` (Zipf-like law and its O(1) sampler: see synthetic.py).
* **Topic hierarchy.** ``n_parents`` parent topics with ``topics_per_parent``
  leaf topics each (``T = n_parents * topics_per_parent`` leaves; leaf t has
  parent ``t // topics_per_parent``). A parent owns a vocabulary of
  ``parent_vocab`` features, a leaf one of ``leaf_vocab`` features, drawn
  Zipf-like over the background ranks with exponent ``vocab_feature_zipf``;
  the j-th feature of a vocabulary has weight about ``(j + 1.5)^-vocab_zipf``.
  Leaf topics have a popularity order (a permutation), Zipf-like with
  exponent ``topic_zipf``.
* **Labels.** Every label belongs to one leaf topic: a random permutation of
  the labels is cut into T runs whose lengths are multinomial with log-normal
  weights (sigma 0.5), at least 2 labels each. Within its topic a label has a
  rank (its position in the run). Each label owns ``own_size`` features drawn
  uniformly from all features: its only discriminative features.
* **Baskets.** Topic t with n_t labels has n_t baskets; basket j holds the
  label of rank j (its anchor) and ``1 + Poisson(basket_mean - 2)`` (capped at
  ``basket_max - 1`` and ``n_t - 1``) further labels of the same topic: with
  probability ``window_share`` the label of rank ``j + o`` (o uniform among
  the non-zero integers in ``[-basket_window, basket_window]``, reflected into
  the topic), else drawn Zipf-like over the topic's ranks with exponent
  ``label_zipf`` (distinct; at most 16 tries each). So every label anchors
  one basket, neighbouring ranks share baskets and the topic's first labels
  sit in many. Basket j of a topic is drawn Zipf-like over j with exponent
  ``basket_zipf``.

A point
-------
1. Counts (numpy): its number of topics m = 1, 2 or 3 with probabilities
   ``(1 - p2 - p3, p2, p3)``; ``k = clip(round(LogNormal(mu, nnz_sigma)), 1,
   min(nnz_max, F))`` non-zeros (``E[k] ≈ nnz_mean``) of which
   ``k_s = Binomial(k, 1 - noise)`` are signal.
2. Topics: the first by popularity; the other m - 1 uniformly among the first
   one's ``n_related`` related topics (siblings under the same parent, drawn
   once per topic in the world), distinct (redrawn while repeated, at most 16
   times). Which topics come together is part of the world, like baskets.
3. Labels: one basket of each topic, and with probability ``extra_basket`` a
   second basket of the first topic; the first topic's baskets give all their
   labels, a further topic's basket its first ``secondary_max``; the union in
   that order, stopping at ``labels_max``; sorted.
4. Signal features, until the point holds k_s distinct features (or
   ``4 k_s + 8`` draws were made): a label of the point (uniform), then with
   probability ``own_share`` one of its own features (uniform), otherwise with
   probability ``parent_share`` a feature of its topic's parent vocabulary,
   else of its topic's vocabulary, by vocabulary weight. A repeated feature
   increments its term count tf.
5. Background features up to k (or ``4 (k - held) + 8`` more draws).
6. Values ``x_f = idf_f * tf_f ** tf_power`` (float32, >= 1); indices sorted.

Randomness
----------
The world: ``numpy.random.default_rng(SeedSequence([seed, 0]))`` and a
splitmix64 stream seeded from it for the basket kernel. A split's points:
``SeedSequence([seed, 1, crc32(split)])`` for the counts and the seed of the
splitmix64 stream (explicit ``uint64[1]`` state) of the serial point kernel.
Nothing depends on the numba thread count.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from numba import njit

from dslide.io.data import XMCData
from dslide.datasets.draws import _draw_features, _next, _powerlaw_rank, _uniform
from dslide.datasets.presets import pick_preset
from dslide.datasets.synthetic import (
    Slots, _check_points, _emit_row, assemble, split_pair, _add_feature, _check_seed, _holds, _split_stream,
)


@dataclass(frozen=True)
class Preset:
    """Parameters of a topics-and-baskets data set (model in the module docstring).

    n_features:   F, number of features.
    n_labels:     L, number of labels.
    n_train:      default number of points of the "train" split.
    n_test:       default number of points of the "test" split.
    nnz_mean:     mean number of non-zeros per point.
    nnz_sigma:    log-normal shape of the non-zeros per point.
    nnz_max:      cap on the non-zeros of one point.
    n_parents:    number of parent topics.
    topics_per_parent: leaf topics under each parent.
    topic_zipf:   exponent of the Zipf-like leaf topic popularity.
    p2:           probability that a point mixes 2 topics.
    p3:           probability that a point mixes 3 topics.
    n_related:    related topics of each leaf topic (siblings), where a point's further topics come from.
    basket_mean:  mean labels per basket (anchor + 1 + Poisson(basket_mean - 2)).
    basket_max:   cap on the labels of a basket.
    label_zipf:   exponent of the Zipf-like within-topic law of a basket's global co-labels.
    basket_window: a local co-label of basket j has within-topic rank j + o, 0 < |o| <= basket_window.
    window_share: probability that a co-label is local rather than global.
    basket_zipf:  exponent of the Zipf-like within-topic basket popularity.
    extra_basket: probability of a second basket from the point's first topic.
    labels_max:   cap on the labels of one point.
    secondary_max: cap on the labels taken from the basket of a second or third topic.
    parent_vocab: features in each parent topic's vocabulary.
    leaf_vocab:   features in each leaf topic's vocabulary.
    vocab_zipf:   the j-th feature of a vocabulary has weight about (j + 1.5)^-vocab_zipf.
    vocab_feature_zipf: vocabulary features are drawn Zipf-like over the background ranks
                  with this exponent (0: uniform over the features).
    parent_share: fraction of topic draws taken from the parent's vocabulary.
    own_size:     own (discriminative) features of each label.
    own_share:    fraction of signal draws taken from the labels' own features.
    noise:        expected fraction of a point's non-zeros drawn from the background.
    feature_zipf: exponent of the Zipf-like background feature popularity.
    idf_slope:    idf of the feature of background rank r: 1 + idf_slope * log2(1 + r).
    tf_power:     value = idf * tf ** tf_power.
    """

    n_features: int
    n_labels: int
    n_train: int
    n_test: int
    nnz_mean: float
    nnz_sigma: float
    nnz_max: int
    n_parents: int
    topics_per_parent: int
    topic_zipf: float
    p2: float
    p3: float
    n_related: int
    basket_mean: float
    basket_max: int
    label_zipf: float
    basket_window: int
    window_share: float
    basket_zipf: float
    extra_basket: float
    labels_max: int
    secondary_max: int
    parent_vocab: int
    leaf_vocab: int
    vocab_zipf: float
    vocab_feature_zipf: float
    parent_share: float
    own_size: int
    own_share: float
    noise: float
    feature_zipf: float
    idf_slope: float
    tf_power: float

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            kinds = (int, np.integer) if f.type == "int" else (int, float, np.number)
            if isinstance(value, bool) or not isinstance(value, kinds) or not np.isfinite(value):
                raise ValueError(f"{f.name} ({value!r}) must be a finite {f.type}")
        for name in ("n_features", "n_labels", "nnz_max", "n_parents", "topics_per_parent",
                     "n_related", "basket_max", "basket_window", "labels_max", "secondary_max", "parent_vocab", "leaf_vocab", "own_size"):
            if not 1 <= getattr(self, name) <= 2**31 - 1:
                raise ValueError(f"{name} ({getattr(self, name)}) must be in [1, 2**31 - 1]")
        for name in ("n_train", "n_test"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} ({getattr(self, name)}) must be >= 0")
        n_topics = self.n_parents * self.topics_per_parent
        if self.n_labels < 2 * n_topics:
            raise ValueError(f"n_labels ({self.n_labels}) must be >= 2 labels per leaf topic "
                             f"(2 * n_parents * topics_per_parent = {2 * n_topics})")
        if not 1.0 <= self.nnz_mean <= min(self.nnz_max, self.n_features):
            raise ValueError(f"nnz_mean ({self.nnz_mean}) must be in [1, min(nnz_max, n_features)]")
        if not 2.0 <= self.basket_mean <= self.basket_max:
            raise ValueError(f"basket_mean ({self.basket_mean}) must be in [2, basket_max = {self.basket_max}]")
        for name in ("p2", "p3", "extra_basket", "window_share", "parent_share", "own_share", "noise"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} ({getattr(self, name)}) must be in [0, 1]")
        if self.p2 + self.p3 > 1.0:
            raise ValueError(f"p2 + p3 ({self.p2} + {self.p3}) must be <= 1")
        for name in ("nnz_sigma", "topic_zipf", "label_zipf", "basket_zipf", "vocab_zipf",
                     "vocab_feature_zipf", "feature_zipf", "idf_slope", "tf_power"):
            if getattr(self, name) < 0.0:
                raise ValueError(f"{name} ({getattr(self, name)}) must be >= 0")


FIELDS = tuple(f.name for f in dataclasses.fields(Preset))

_WIDE = dict(
    n_features=135_909, n_labels=670_091, n_train=30_000, n_test=3_000,
    nnz_mean=64.0, nnz_sigma=0.85, nnz_max=2_000,
    n_parents=2_000, topics_per_parent=34, p2=0.35, p3=0.15, n_related=3,
    basket_mean=3.5, basket_max=8, label_zipf=1.0, basket_window=3, window_share=0.8, basket_zipf=1.0, extra_basket=0.3, labels_max=10, secondary_max=3,
    parent_vocab=400, leaf_vocab=80, vocab_zipf=0.8, vocab_feature_zipf=0.5, parent_share=0.4,
    own_size=3, own_share=0.25, noise=0.3, feature_zipf=0.8, idf_slope=0.45, tf_power=0.8,
)
_NARROW = dict(_WIDE, n_features=30_000, n_labels=40_000, n_parents=200, topics_per_parent=20,
               parent_vocab=300, leaf_vocab=60)

# Leaf topics of about 10 labels; the topic law sets the top label's share of the points
# (head-heavy: roughly 10-20 %, long tail: 1-3 %; docs/datasets.md has the measured table).
PRESETS: dict[str, Preset] = {
    "baskets-head": Preset(**_WIDE, topic_zipf=1.25),
    "baskets-tail": Preset(**_WIDE, topic_zipf=0.9),
    "baskets-head-40k": Preset(**_NARROW, topic_zipf=1.2),
    "baskets-tail-40k": Preset(**_NARROW, topic_zipf=0.7),
}


def get_preset(preset: str | Preset, **overrides) -> Preset:
    """The preset named `preset` (or the given Preset) with `overrides` applied and checked."""
    return pick_preset(preset, overrides, PRESETS, Preset, FIELDS)


# --------------------------------------------------------------------------- the world


class World(NamedTuple):
    """What train and test points share (read-only arrays; T leaf topics, B = L baskets).

    feature_of_rank: int32 [F]    feature id of background rank r.
    idf:             float32 [F]  idf of each feature id.
    topic_of_rank:   int32 [T]    leaf topic of popularity rank r.
    related:         int32 [T, n_related]  each leaf topic's related topics (siblings).
    parent_vocab:    int32 [n_parents, parent_vocab]  features of each parent, by weight.
    leaf_vocab:      int32 [T, leaf_vocab]            features of each leaf topic, by weight.
    topic_ptr:       int64 [T + 1]  topic t's labels are topic_labels[topic_ptr[t]:topic_ptr[t+1]]
                     in within-topic rank order; its baskets are basket ids topic_ptr[t]..topic_ptr[t+1]-1.
    topic_labels:    int32 [L]    labels grouped by topic.
    topic_of_label:  int32 [L]    leaf topic of each label.
    own:             int32 [L, own_size]  each label's own features.
    basket_ptr:      int64 [B + 1]  basket b holds basket_labels[basket_ptr[b]:basket_ptr[b+1]]
                     (its anchor first).
    basket_labels:   int32 [basket_ptr[B]]
    """

    feature_of_rank: np.ndarray
    idf: np.ndarray
    topic_of_rank: np.ndarray
    related: np.ndarray
    parent_vocab: np.ndarray
    leaf_vocab: np.ndarray
    topic_ptr: np.ndarray
    topic_labels: np.ndarray
    topic_of_label: np.ndarray
    own: np.ndarray
    basket_ptr: np.ndarray
    basket_labels: np.ndarray


@njit(cache=True)
def _fill_baskets(topic_ptr, topic_labels, extra, label_zipf, window, window_share,
                  basket_ptr, basket_labels, state):
    """basket_labels of every basket: anchor (rank j of its topic), then extra[b] co-labels.

    A co-label is, with probability window_share, the label of rank j + o (o uniform in
    [-window, window] without 0, reflected into [0, n_t)), else drawn Zipf-like over the ranks.

    topic_ptr: int64 [T + 1]; topic_labels: int32 [L]; extra: int64 [L] (co-labels wanted);
    basket_ptr: int64 [L + 1] slots per basket (1 + extra[b]); basket_labels: int32 [basket_ptr[L]],
    filled; unfilled slots (repeated draws) are -1. state: uint64 [1] splitmix64 state.
    """
    T = topic_ptr.shape[0] - 1
    for t in range(T):
        lo = topic_ptr[t]
        n_t = topic_ptr[t + 1] - lo
        c = _powerlaw_const_nb(n_t, label_zipf)
        for j in range(n_t):
            b = lo + j
            s = basket_ptr[b]
            basket_labels[s] = topic_labels[b]
            m = 1
            for _ in range(extra[b]):
                basket_labels[s + m] = -1
                for _attempt in range(16):
                    if _uniform(state) < window_share:
                        o = np.int64(_uniform(state) * 2 * window)
                        r = j + (o - window if o < window else o - window + 1)
                        if r < 0:
                            r = -r
                        if r >= n_t:
                            r = max(2 * (n_t - 1) - r, 0)
                    else:
                        r = _powerlaw_rank(_uniform(state), n_t, label_zipf, c)
                    lab = topic_labels[lo + r]
                    if not _holds(basket_labels, s, m, lab):
                        basket_labels[s + m] = lab
                        break
                if basket_labels[s + m] >= 0:
                    m += 1
            for q in range(m, basket_ptr[b + 1] - s):
                basket_labels[s + q] = -1


@njit(cache=True)
def _powerlaw_const_nb(n, a):
    """draws._powerlaw_const inside kernels (n varies per topic / product there)."""
    if a == 1.0:
        return np.log(n + 1.0)
    return (n + 1.0) ** (1.0 - a) - 1.0


@functools.lru_cache(maxsize=8)
def build_world(p: Preset, seed: int) -> World:
    """The world of preset `p` and `seed` (cached: train and test reuse it)."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0]))
    F, L = p.n_features, p.n_labels
    T = p.n_parents * p.topics_per_parent
    feature_of_rank = rng.permutation(F).astype(np.int32)
    rank_of_feature = np.empty(F, dtype=np.int64)
    rank_of_feature[feature_of_rank] = np.arange(F)
    idf = (1.0 + p.idf_slope * np.log2(1.0 + rank_of_feature)).astype(np.float32)
    topic_of_rank = rng.permutation(T).astype(np.int32)
    # Related topics: siblings under the same parent (never the topic itself when it has any).
    tpp = p.topics_per_parent
    own_pos = np.arange(T) % tpp
    off = rng.integers(1, max(tpp, 2), size=(T, p.n_related))
    related = ((np.arange(T) // tpp)[:, None] * tpp + (own_pos[:, None] + off) % tpp).astype(np.int32)
    parent_vocab = _draw_features(rng, (p.n_parents, p.parent_vocab), feature_of_rank, p.vocab_feature_zipf)
    leaf_vocab = _draw_features(rng, (T, p.leaf_vocab), feature_of_rank, p.vocab_feature_zipf)

    # Topic sizes: 2 each, the rest multinomial with log-normal weights.
    w = rng.lognormal(0.0, 0.5, size=T)
    sizes = 2 + rng.multinomial(L - 2 * T, w / w.sum())
    topic_ptr = np.zeros(T + 1, dtype=np.int64)
    np.cumsum(sizes, out=topic_ptr[1:])
    topic_labels = rng.permutation(L).astype(np.int32)
    topic_of_label = np.empty(L, dtype=np.int32)
    topic_of_label[topic_labels] = np.repeat(np.arange(T, dtype=np.int32), sizes)
    own = rng.integers(0, F, size=(L, p.own_size), dtype=np.int32)

    extra = np.minimum(1 + rng.poisson(p.basket_mean - 2.0, size=L), p.basket_max - 1).astype(np.int64)
    extra = np.minimum(extra, sizes[np.repeat(np.arange(T), sizes)] - 1)  # a basket stays inside its topic
    slots = np.zeros(L + 1, dtype=np.int64)
    np.cumsum(1 + extra, out=slots[1:])
    raw = np.empty(slots[-1], dtype=np.int32)
    state = np.array([rng.integers(0, 2 ** 63, dtype=np.int64)], dtype=np.uint64)
    _fill_baskets(topic_ptr, topic_labels, extra, float(p.label_zipf), p.basket_window,
                  float(p.window_share), slots, raw, state)
    keep = raw >= 0
    basket_ptr = np.zeros(L + 1, dtype=np.int64)
    np.cumsum(np.add.reduceat(keep.astype(np.int64), slots[:-1]), out=basket_ptr[1:])
    basket_labels = raw[keep]

    world = World(feature_of_rank, idf, topic_of_rank, related, parent_vocab, leaf_vocab, topic_ptr,
                  topic_labels, topic_of_label, own, basket_ptr, basket_labels)
    for a in world:
        a.flags.writeable = False
    return world


# --------------------------------------------------------------------------- the points


@njit(cache=True)
def _draw_points(n_top, n_nnz, n_sig, state,
                 topic_zipf, topic_of_rank, basket_zipf, extra_basket, labels_max, secondary_max,
                 related, topic_ptr, topic_of_label, basket_ptr, basket_labels,
                 parent_vocab, leaf_vocab, topics_per_parent, vocab_zipf, parent_share,
                 own, own_share, feature_zipf, feature_of_rank, idf, tf_power,
                 lab_ptr, lab_out, lab_cnt, feat_ptr, feat_out, val_out, feat_cnt, mark):
    """Draw the labels and features of n points (model in the module docstring).

    n_top, n_nnz, n_sig: int64 [n]  topics, non-zeros, signal non-zeros per point.
    state:               uint64 [1] splitmix64 state, advanced in place.
    lab_ptr, feat_ptr:   int64 [n+1] slot ranges (labels_max per point; n_nnz[i] per point).
    lab_out:             int32 [lab_ptr[n]]  labels, sorted (first lab_cnt[i] slots of a point used).
    feat_out, val_out:   int32 / float32 [feat_ptr[n]]  features (sorted) and values.
    lab_cnt, feat_cnt:   int64 [n]  slots used per point.
    mark:                int64 [F] scratch, initialised to -1 (see synthetic._add_feature).
    """
    n = n_top.shape[0]
    T = topic_of_rank.shape[0]
    R = related.shape[1]
    F = feature_of_rank.shape[0]
    Vp = parent_vocab.shape[1]
    Vl = leaf_vocab.shape[1]
    S = own.shape[1]
    c_topic = _powerlaw_const_nb(T, topic_zipf)
    c_feat = _powerlaw_const_nb(F, feature_zipf)
    c_vp = _powerlaw_const_nb(Vp, vocab_zipf)
    c_vl = _powerlaw_const_nb(Vl, vocab_zipf)
    max_k = 1
    for i in range(n):
        max_k = max(max_k, n_nnz[i])
    keys = np.empty(max_k, dtype=np.int64)
    tmp = np.empty(max_k, dtype=np.int64)
    counts = np.empty(2 * max_k + 1, dtype=np.int64)
    tops = np.empty(3, dtype=np.int64)
    for i in range(n):
        # --- topics
        nt = 0
        for q in range(n_top[i]):
            for _attempt in range(16):
                if q == 0:
                    t = topic_of_rank[_powerlaw_rank(_uniform(state), T, topic_zipf, c_topic)]
                else:
                    t = related[tops[0], min(np.int64(_uniform(state) * R), R - 1)]
                dup = False
                for q in range(nt):
                    if tops[q] == t:
                        dup = True
                if not dup:
                    tops[nt] = t
                    nt += 1
                    break
        # --- labels: baskets of the topics
        a0 = lab_ptr[i]
        m = 0
        for q in range(nt + 1):
            if q == nt:
                if _uniform(state) >= extra_basket:
                    break
                t = tops[0]
            else:
                t = tops[q]
            lo = topic_ptr[t]
            n_t = topic_ptr[t + 1] - lo
            b = lo + _powerlaw_rank(_uniform(state), n_t, basket_zipf, _powerlaw_const_nb(n_t, basket_zipf))
            s1 = basket_ptr[b + 1] if q == 0 or q == nt else min(basket_ptr[b + 1], basket_ptr[b] + secondary_max)
            for s in range(basket_ptr[b], s1):
                lab = basket_labels[s]
                if m < labels_max and not _holds(lab_out, a0, m, lab):
                    lab_out[a0 + m] = lab
                    m += 1
        lab_out[a0:a0 + m].sort()
        lab_cnt[i] = m

        # --- signal features: labels' own features and the topics' vocabularies
        k = n_nnz[i]
        ks = n_sig[i]
        d = 0
        draws = 0
        limit = 4 * ks + 8
        while d < ks and draws < limit:
            draws += 1
            r = _next(state)
            lab = lab_out[a0 + np.int64(((r >> np.uint64(32)) * np.uint64(m)) >> np.uint64(32))]
            if _uniform(state) < own_share:
                f = own[lab, np.int64(((r & np.uint64(0xFFFFFFFF)) * np.uint64(S)) >> np.uint64(32))]
            else:
                t = topic_of_label[lab]
                if _uniform(state) < parent_share:
                    f = parent_vocab[t // topics_per_parent,
                                     _powerlaw_rank(_uniform(state), Vp, vocab_zipf, c_vp)]
                else:
                    f = leaf_vocab[t, _powerlaw_rank(_uniform(state), Vl, vocab_zipf, c_vl)]
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
    n_top = 1 + rng.choice(3, size=n, p=[1.0 - p.p2 - p.p3, p.p2, p.p3]).astype(np.int64)
    mu = np.log(p.nnz_mean) - 0.5 * p.nnz_sigma ** 2
    n_nnz = np.rint(rng.lognormal(mu, p.nnz_sigma, size=n)).astype(np.int64)
    np.clip(n_nnz, 1, min(p.nnz_max, p.n_features), out=n_nnz)
    n_sig = rng.binomial(n_nnz, 1.0 - p.noise).astype(np.int64)
    state = np.array([rng.integers(0, 2 ** 63, dtype=np.int64)], dtype=np.uint64)

    lab_ptr = np.arange(n + 1, dtype=np.int64) * p.labels_max
    slots = Slots.alloc(p.n_features, lab_ptr, n_nnz)
    w = world
    _draw_points(n_top, n_nnz, n_sig, state,
                 float(p.topic_zipf), w.topic_of_rank, float(p.basket_zipf), float(p.extra_basket),
                 p.labels_max, p.secondary_max, w.related, w.topic_ptr, w.topic_of_label, w.basket_ptr, w.basket_labels,
                 w.parent_vocab, w.leaf_vocab, p.topics_per_parent, float(p.vocab_zipf),
                 float(p.parent_share), w.own, float(p.own_share), float(p.feature_zipf),
                 w.feature_of_rank, w.idf, float(p.tf_power),
                 *slots)
    return assemble(p, slots)


def generate(preset: str | Preset = "baskets-head", n_points: int | None = None, seed: int = 0, *,
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


def generate_split(preset: str | Preset = "baskets-head", n_train: int | None = None,
                   n_test: int | None = None, seed: int = 0, **overrides) -> tuple[XMCData, XMCData]:
    """(train, test) of one world: `generate(..., split="train")` and `split="test"`."""
    return split_pair(generate, preset, n_train, n_test, seed, overrides)
