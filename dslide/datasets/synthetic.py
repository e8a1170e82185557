"""Synthetic extreme-classification data with learnable, realistic structure.

How a data set is generated
===========================
A data set has a *world* and *points*. The world depends only on
``(preset fields, seed)``; the points depend also on the split name, so
``split="test"`` draws fresh points from the same distribution as
``split="train"`` (same labels, label frequencies, prototypes, feature weights).

Zipf-like law. Below, "Zipf-like with exponent a over n items" means
``P(rank = r) = ∫_{r+1}^{r+2} x^-a dx / Z`` for ``r = 0..n-1``, i.e. about
``(r + 1.5)^-a``; it is sampled in O(1) by inverting its CDF
(`dslide.datasets.draws._powerlaw_rank`) or with an alias table.

The world (F features, L labels)
--------------------------------
* **Background.** A random permutation gives each feature a background rank.
  Background ("noise") features are drawn Zipf-like over these ranks with
  exponent ``feature_zipf``: a few features are stop-word-like.
* **idf.** The feature of background rank ``r`` has
  ``idf = 1 + idf_slope * log2(1 + r)`` (frequent features are worth little,
  rare ones a lot; under Zipf's law ``log(N / df)`` grows like ``log(rank)``).
* **Label popularity.** Another permutation gives each label a popularity rank;
  a point's primary label is drawn Zipf-like over it with exponent ``label_zipf``.
* **Clusters.** A third permutation ``members`` cuts the labels into clusters
  of ``cluster_size`` random labels (the last one may be smaller); labels of a
  cluster co-occur and share a topic.
* **Prototypes.** Each label owns ``proto_size`` features and each cluster a
  topic of ``topic_size`` features, each drawn independently, Zipf-like over the
  background ranks with exponent ``proto_feature_zipf`` (0: uniform over the
  features; larger: prototypes share more frequent, lower-idf features). The
  j-th feature of a prototype or topic has weight ``w_j = (j + 1)^-proto_zipf``.

A point
-------
1. Counts (numpy): ``n_labels = min(1 + Poisson(labels_mean - 1), labels_max)``;
   a target number of non-zeros ``k = clip(round(LogNormal(mu, nnz_sigma)), 1,
   min(nnz_max, F))`` with ``mu = ln(nnz_mean) - nnz_sigma^2 / 2`` (so
   ``E[k] ≈ nnz_mean``, with a heavy tail); a signal count
   ``k_s = Binomial(k, 1 - noise)``.
2. Labels: the primary label by popularity. Each further label, with
   probability ``cluster_prob``, is drawn uniformly from the primary's cluster
   members the point does not hold yet (if any remain), otherwise by global
   popularity (redrawn while it repeats, at most 16 times). Labels are sorted.
3. Signal features: until the point holds ``k_s`` distinct features (or
   ``4 k_s + 8`` draws were made), pick one of its labels uniformly, then a
   position: prototype feature ``j`` with probability
   ``(1 - topic_share) w_j / sum(w)``, topic feature ``j`` with probability
   ``topic_share w_j / sum(w')``. A feature drawn again increments its term
   count ``tf`` instead of adding a non-zero.
4. Background features: draw by background popularity the same way until the
   point holds ``k`` distinct features (or ``4 (k - held) + 8`` more draws).
5. Values: ``x_f = idf_f * tf_f ** tf_power`` (float32, always >= 1, so no
   explicit zeros and no denormals); indices sorted within the row.

A label is predictable from the features its prototype makes frequent; labels
of a cluster share topic features and co-occur, so they are harder to tell
apart; ``noise`` dilutes every point.

Calibration
-----------
* ``tiny`` and ``small``: the label-centroid classifier (`dslide.datasets.stats.centroid_p_at_1`:
  score labels by ``x @ C.T`` with ``C`` the mean L2-normalised train row of
  each label) reaches P@1 of about 0.82 and 0.83 (means over 10 and 5 seeds;
  0.81 and 0.84 at seed 0), far above predicting the most frequent label
  (about 0.12 and 0.07). Global (random) co-labels hurt this classifier badly
  (a rare label seen once next to a popular one scores as high as the popular
  one: P@1 drops to about 0.65 on ``small`` with ``cluster_prob = 0.9``), hence
  ``cluster_prob = 1``.
* ``amazon-like``: matched to 512 real Amazon-670K test points
  (``tests/unit/test_synthetic.py`` checks it): about 64 non-zeros per point
  (median about 45, 99th percentile about 320; real: 42 and 283), about 4.9
  labels per point (real: 5.1), values from about 1 to several hundred with
  median about 7.6 (real: 7.5), the most frequent feature in about 40 % of the
  points (real: 39 %). Label-centroid P@1 with 50,000 train / 5,000 test points:
  about 0.49 (most frequent label: 0.03).

Speed: about 150,000 ``amazon-like`` points per second on one core (the kernel is
serial; building the ``amazon-like`` world takes about 1 s and is cached).

Randomness
----------
The world is drawn with ``numpy.random.default_rng(SeedSequence([seed, 0]))``;
the per-point counts with ``SeedSequence([seed, 1, crc32(split)])``, which also
seeds the splitmix64 stream (an explicit ``uint64[1]`` state argument) of the
numba kernel for the per-draw choices. Nothing depends on the clock, on a
global random state or on the numba thread count.

Command line
------------
``python -m dslide.datasets.synthetic --preset small --stats [--points N]
[--test-points N] [--seed S] [--set FIELD=VALUE ...] [--centroid] [--out PREFIX]``
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
import zlib
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp
from numba import njit

from dslide.datasets.draws import (
    _INV32, _LO32, _S32, _alias_pick, _alias_table, _compact_alias, _draw_features, _next,
    _powerlaw_const, _powerlaw_rank, _uniform, _zipf_mass,
)
from dslide.datasets.presets import FIELD_KINDS, FIELDS, PRESETS, Preset, get_preset
from dslide.datasets.stats import centroid_p_at_1, format_stats, stats
from dslide.io.data import XMCData, write_xmc


# --------------------------------------------------------------------------- the world


class World(NamedTuple):
    """What train and test points share. All arrays are read-only.

    feature_of_rank: int32 [F]   feature id of background popularity rank r.
    idf:             float32 [F] idf of each feature id.
    label_of_rank:   int32 [L]   label id of popularity rank r.
    members:         int32 [L]   labels in cluster order: cluster c is members[c*cs:(c+1)*cs].
    slot_of_label:   int32 [L]   position of each label in `members` (its cluster: slot // cs).
    protos:          int32 [L, proto_size]  each label's prototype features.
    topics:          int32 [n_clusters, topic_size]  each cluster's topic features.
    pos_prob, pos_alias: float64 / int64 [proto_size + topic_size]  alias table of the
                     position drawn by a signal draw: j < proto_size is the label's
                     prototype feature j, else the topic feature j - proto_size, with
                     probabilities (1 - topic_share) w_j / sum(w) and topic_share w_j' / sum(w').
    bg_prob, bg_alias: float32 / int32 [F]  alias table of the background law over feature ids.
    """

    feature_of_rank: np.ndarray
    idf: np.ndarray
    label_of_rank: np.ndarray
    members: np.ndarray
    slot_of_label: np.ndarray
    protos: np.ndarray
    topics: np.ndarray
    pos_prob: np.ndarray
    pos_alias: np.ndarray
    bg_prob: np.ndarray
    bg_alias: np.ndarray


def _position_weights(p: Preset) -> np.ndarray:
    wp = (np.arange(p.proto_size) + 1.0) ** -p.proto_zipf
    wt = (np.arange(p.topic_size) + 1.0) ** -p.proto_zipf
    return np.concatenate(((1.0 - p.topic_share) * wp / wp.sum(), p.topic_share * wt / wt.sum()))


@functools.lru_cache(maxsize=2)
def build_world(p: Preset, seed: int) -> World:
    """The world of preset `p` and `seed` (cached: train and test reuse it)."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0]))
    F, L = p.n_features, p.n_labels
    feature_of_rank = rng.permutation(F).astype(np.int32)
    rank_of_feature = np.empty(F, dtype=np.int64)
    rank_of_feature[feature_of_rank] = np.arange(F)
    idf = (1.0 + p.idf_slope * np.log2(1.0 + rank_of_feature)).astype(np.float32)

    label_of_rank = rng.permutation(L).astype(np.int32)
    rank_of_label = np.empty(L, dtype=np.int64)
    rank_of_label[label_of_rank] = np.arange(L)
    # Clusters are random sets of labels: cluster c holds members[c*cs:(c+1)*cs].
    members = rng.permutation(L).astype(np.int32)
    slot_of_label = np.empty(L, dtype=np.int32)
    slot_of_label[members] = np.arange(L, dtype=np.int32)
    starts = np.arange(0, L, p.cluster_size)
    n_clusters = len(starts)
    protos = _draw_features(rng, (L, p.proto_size), feature_of_rank, p.proto_feature_zipf)
    topics = _draw_features(rng, (n_clusters, p.topic_size), feature_of_rank, p.proto_feature_zipf)
    world = World(feature_of_rank, idf, label_of_rank, members, slot_of_label, protos, topics,
                  *_alias_table(_position_weights(p)),
                  *_compact_alias(*_alias_table(_zipf_mass(F, p.feature_zipf)[rank_of_feature])))
    for a in world:
        a.flags.writeable = False
    return world


# --------------------------------------------------------------------------- the points


@njit(cache=True)
def _holds(out, a0, m, lab):
    """Whether lab is among out[a0:a0+m]."""
    for j in range(m):
        if out[a0 + j] == lab:
            return True
    return False


@njit(cache=True)
def _add_feature(f, i, d, mark, keys):
    """Count one draw of feature f for point i, holding d distinct features; return the new d.

    mark[f] = i << 32 | slot once point i holds f in keys[slot] = f << 32 | tf, so a
    repeated draw is found in O(1) without clearing anything between points.
    """
    m = mark[f]
    if (m >> 32) == i:
        keys[m & 0xFFFFFFFF] += 1
        return d
    mark[f] = (i << 32) | d
    keys[d] = (np.int64(f) << 32) | 1
    return d + 1


@njit(cache=True)
def _sort_row(keys, d, n_features, tmp, counts):
    """Sort keys[:d] (int64, f << 32 | tf, distinct f < n_features) in place.

    One bucket pass by f (2d buckets, so about one key per bucket) and then an
    insertion sort of the nearly sorted result: about 6 ns a key at d = 64, where
    np.sort takes about 40 (it dominated the kernel). tmp: int64 [>= d];
    counts: int64 [>= 2d + 1], scratch.
    """
    if d > 16:
        nb = 2 * d
        counts[:nb + 1] = 0
        for j in range(d):
            counts[((keys[j] >> 32) * nb) // n_features + 1] += 1
        for q in range(nb):
            counts[q + 1] += counts[q]
        for j in range(d):
            q = ((keys[j] >> 32) * nb) // n_features
            tmp[counts[q]] = keys[j]
            counts[q] += 1
        keys[:d] = tmp[:d]
    for i in range(1, d):
        x = keys[i]
        j = i - 1
        while j >= 0 and keys[j] > x:
            keys[j + 1] = keys[j]
            j -= 1
        keys[j + 1] = x


@njit(cache=True)
def _emit_row(keys, d, F, tmp, counts, idf, tf_power, feat_out, val_out, b0):
    """Sort a point's d (feature << 32 | tf) keys and write its features and tf-idf-like values
    (idf_f * tf ** tf_power) from slot b0 of feat_out / val_out: every family's last step of a point."""
    _sort_row(keys, d, F, tmp, counts)
    for j in range(d):
        f = keys[j] >> 32
        tf = keys[j] & 0xFFFFFFFF
        feat_out[b0 + j] = f
        # Most counts are 1: skip the pow.
        val_out[b0 + j] = idf[f] if tf == 1 else idf[f] * np.float64(tf) ** tf_power


@njit(cache=True)
def _draw_points(n_lab, n_nnz, n_sig, state,
                 label_zipf, label_c, label_of_rank, members, slot_of_label, cluster_size, cluster_prob,
                 protos, topics, pos_prob, pos_alias,
                 bg_prob, bg_alias, idf, tf_power,
                 lab_ptr, lab_out, lab_cnt, feat_ptr, feat_out, val_out, feat_cnt, mark):
    """Draw the labels and features of n points (model in the module docstring).

    n_lab, n_nnz, n_sig: int64 [n]  labels, non-zeros, signal non-zeros wanted per point.
    state:               uint64 [1] splitmix64 state, advanced in place.
    lab_ptr, feat_ptr:   int64 [n+1] where each point's slots start in lab_out / feat_out.
    lab_out:             int32 [lab_ptr[n]]   labels, sorted within a point (first lab_cnt[i] slots used).
    feat_out, val_out:   int32 / float32 [feat_ptr[n]]  features (sorted) and values (first feat_cnt[i] used).
    lab_cnt, feat_cnt:   int64 [n]  slots used per point.
    mark:                int64 [F] scratch, initialised to -1 (see _add_feature).
    """
    n = n_lab.shape[0]
    L = label_of_rank.shape[0]
    P = protos.shape[1]
    max_k = 1
    for i in range(n):
        max_k = max(max_k, n_nnz[i])
    keys = np.empty(max_k, dtype=np.int64)
    tmp = np.empty(max_k, dtype=np.int64)
    counts = np.empty(2 * max_k + 1, dtype=np.int64)
    F = mark.shape[0]
    for i in range(n):
        # --- labels
        a0 = lab_ptr[i]
        first = label_of_rank[_powerlaw_rank(_uniform(state), L, label_zipf, label_c)]
        lab_out[a0] = first
        m = 1
        c0 = (slot_of_label[first] // cluster_size) * cluster_size
        c1 = min(c0 + cluster_size, L)
        for _ in range(n_lab[i] - 1):
            avail = 0
            for s in range(c0, c1):
                if not _holds(lab_out, a0, m, members[s]):
                    avail += 1
            if avail > 0 and _uniform(state) < cluster_prob:
                pick = min(np.int64(_uniform(state) * avail), avail - 1)
                for s in range(c0, c1):
                    if not _holds(lab_out, a0, m, members[s]):
                        if pick == 0:
                            lab_out[a0 + m] = members[s]
                            m += 1
                            break
                        pick -= 1
                continue
            for _attempt in range(16):
                lab = label_of_rank[_powerlaw_rank(_uniform(state), L, label_zipf, label_c)]
                if not _holds(lab_out, a0, m, lab):
                    lab_out[a0 + m] = lab
                    m += 1
                    break
        lab_out[a0:a0 + m].sort()
        lab_cnt[i] = m

        # --- signal features from the labels' prototypes and topics; one 64-bit draw
        # gives both the label (high half) and the position (low half).
        k = n_nnz[i]
        ks = n_sig[i]
        um = np.uint64(m)
        d = 0
        draws = 0
        limit = 4 * ks + 8
        while d < ks and draws < limit:
            draws += 1
            r = _next(state)
            lab = lab_out[a0 + np.int64(((r >> _S32) * um) >> _S32)]
            pos = _alias_pick(np.float64(r & _LO32) * _INV32, pos_prob, pos_alias)
            if pos < P:
                f = protos[lab, pos]
            else:
                f = topics[slot_of_label[lab] // cluster_size, pos - P]
            d = _add_feature(f, i, d, mark, keys)

        # --- background features up to k non-zeros
        draws = 0
        limit = 4 * (k - d) + 8
        while d < k and draws < limit:
            draws += 1
            f = _alias_pick(_uniform(state), bg_prob, bg_alias)
            d = _add_feature(f, i, d, mark, keys)

        # --- sorted row (keys sort by feature first), tf-idf-like values
        _emit_row(keys, d, F, tmp, counts, idf, tf_power, feat_out, val_out, feat_ptr[i])
        feat_cnt[i] = d


def _compact(ptr: np.ndarray, used: np.ndarray, *arrays: np.ndarray):
    """CSR (indptr, arrays...) keeping the first used[i] slots of each row's slot range."""
    indptr = np.zeros(len(used) + 1, dtype=np.int64)
    np.cumsum(used, out=indptr[1:])
    if indptr[-1] == ptr[-1]:
        return (indptr,) + arrays
    # Offset of each kept entry inside its row: position minus the row's start in the output.
    row = np.repeat(np.arange(len(used)), used)
    src = ptr[:-1][row] + (np.arange(indptr[-1]) - indptr[:-1][row])
    return (indptr,) + tuple(a[src] for a in arrays)


class Slots(NamedTuple):
    """The arrays every family's drawing kernel (`_draw_points`) fills, in the order its last
    arguments take them: point i's labels go to lab_out[lab_ptr[i]:], its features and values
    to feat_out / val_out[feat_ptr[i]:]; lab_cnt, feat_cnt: how many it wrote; mark: the
    kernel's scratch, one int64 per feature."""

    lab_ptr: np.ndarray
    lab_out: np.ndarray
    lab_cnt: np.ndarray
    feat_ptr: np.ndarray
    feat_out: np.ndarray
    val_out: np.ndarray
    feat_cnt: np.ndarray
    mark: np.ndarray

    @classmethod
    def alloc(cls, n_features: int, lab_ptr: np.ndarray, n_nnz: np.ndarray) -> "Slots":
        """Slots for points with label slot ranges `lab_ptr` and n_nnz[i] feature slots each."""
        n = len(n_nnz)
        feat_ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(n_nnz, out=feat_ptr[1:])
        return cls(lab_ptr, np.empty(lab_ptr[-1], dtype=np.int32), np.empty(n, dtype=np.int64), feat_ptr,
                   np.empty(feat_ptr[-1], dtype=np.int32), np.empty(feat_ptr[-1], dtype=np.float32),
                   np.empty(n, dtype=np.int64), np.full(n_features, -1, dtype=np.int64))


def assemble(p, slots: Slots) -> XMCData:
    """XMCData of a drawing kernel's output: the first `*_cnt[i]` slots of each point's label and
    feature slot ranges (`*_ptr`), as CSR [n, p.n_features] features and [n, p.n_labels] ones."""
    lab_ptr, lab_out, lab_cnt, feat_ptr, feat_out, val_out, feat_cnt, _ = slots
    n = len(lab_cnt)
    x_ptr, x_idx, x_val = _compact(feat_ptr, feat_cnt, feat_out, val_out)
    y_ptr, y_idx = _compact(lab_ptr, lab_cnt, lab_out)
    X = _csr(x_ptr, x_idx, x_val, (n, p.n_features))
    Y = _csr(y_ptr, y_idx, np.ones(len(y_idx), dtype=np.float32), (n, p.n_labels))
    return XMCData(X, Y)


def _csr(indptr, indices, data, shape) -> sp.csr_matrix:
    m = sp.csr_matrix((data, indices, indptr), shape=shape)
    m.has_sorted_indices = True
    return m


def _split_stream(split: str) -> int:
    return zlib.crc32(split.encode("utf-8"))


def _check_seed(seed) -> int:
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed ({seed!r}) must be an integer >= 0")
    return int(seed)


def _draw(p: Preset, world: World, n_points: int, seed: int, split: str) -> XMCData:
    rng = np.random.default_rng(np.random.SeedSequence([seed, 1, _split_stream(split)]))
    n = n_points
    n_lab = 1 + rng.poisson(p.labels_mean - 1.0, size=n)
    np.minimum(n_lab, p.labels_max, out=n_lab)
    mu = np.log(p.nnz_mean) - 0.5 * p.nnz_sigma ** 2
    n_nnz = np.rint(rng.lognormal(mu, p.nnz_sigma, size=n)).astype(np.int64)
    np.clip(n_nnz, 1, min(p.nnz_max, p.n_features), out=n_nnz)
    n_sig = rng.binomial(n_nnz, 1.0 - p.noise).astype(np.int64)
    state = np.array([rng.integers(0, 2 ** 63, dtype=np.int64)], dtype=np.uint64)

    lab_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(n_lab, out=lab_ptr[1:])
    slots = Slots.alloc(p.n_features, lab_ptr, n_nnz)
    _draw_points(n_lab.astype(np.int64), n_nnz, n_sig, state,
                 float(p.label_zipf), _powerlaw_const(p.n_labels, p.label_zipf), world.label_of_rank,
                 world.members, world.slot_of_label, p.cluster_size, float(p.cluster_prob),
                 world.protos, world.topics, world.pos_prob, world.pos_alias,
                 world.bg_prob, world.bg_alias, world.idf, float(p.tf_power),
                 *slots)
    return assemble(p, slots)


def generate(preset: str | Preset = "small", n_points: int | None = None, seed: int = 0, *,
             split: str = "train", **overrides) -> XMCData:
    """`n_points` points of the `split` split of data set (preset, overrides, seed).

    preset:    a name in PRESETS (or a Preset); overrides: any Preset field.
    n_points:  default: the preset's n_train for split "train", n_test for "test".
    split:     any name; each gives independent points of the same world.
    Returns XMCData with X csr float32 [n_points, n_features] (sorted indices, no
    duplicates, values >= 1) and Y csr float32 [n_points, n_labels] (ones).
    """
    p = get_preset(preset, **overrides)
    seed = _check_seed(seed)
    return _draw(p, build_world(p, seed), _check_points(p, n_points, split), seed, split)


def _check_points(p, n_points, split: str) -> int:
    """The number of points to draw: n_points, or the preset's default for `split`."""
    if not isinstance(split, str) or not split:
        raise ValueError(f"split ({split!r}) must be a non-empty string such as 'train' or 'test'")
    if n_points is None:
        defaults = {"train": p.n_train, "test": p.n_test}
        if split not in defaults:
            raise ValueError(f"split {split!r} has no default size: give n_points "
                             f"(defaults exist for {', '.join(defaults)})")
        n_points = defaults[split]
    if not isinstance(n_points, (int, np.integer)) or isinstance(n_points, bool) or n_points < 0:
        raise ValueError(f"n_points ({n_points!r}) must be an integer >= 0")
    return int(n_points)


def generate_split(preset: str | Preset = "small", n_train: int | None = None,
                   n_test: int | None = None, seed: int = 0, **overrides) -> tuple[XMCData, XMCData]:
    """(train, test) of one world: `generate(..., split="train")` and `split="test"`."""
    return split_pair(generate, preset, n_train, n_test, seed, overrides)


def split_pair(generate, preset, n_train, n_test, seed: int, overrides: dict) -> tuple[XMCData, XMCData]:
    """(generate(..., split="train"), generate(..., split="test")): every family's generate_split."""
    return (generate(preset, n_train, seed, split="train", **overrides),
            generate(preset, n_test, seed, split="test", **overrides))


def write(prefix: str, train: XMCData, test: XMCData) -> tuple[str, str]:
    """Write `<prefix>_train.txt` and `<prefix>_test.txt` in the XMC text format; return the paths.

    The prefix's directory is created if missing (`--out data/amz` on a fresh clone)."""
    os.makedirs(os.path.dirname(os.fspath(prefix)) or ".", exist_ok=True)
    paths = (f"{prefix}_train.txt", f"{prefix}_test.txt")
    for path, data in zip(paths, (train, test)):
        write_xmc(path, data.X, data.Y)
    return paths


# --------------------------------------------------------------------------- command line


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dslide.datasets.synthetic", description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="small", help=f"one of {', '.join(PRESETS)}")
    ap.add_argument("--points", type=int, default=None, help="train points (default: the preset's)")
    ap.add_argument("--test-points", type=int, default=None, help="test points (default: the preset's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stats", action="store_true", help="print statistics of both splits")
    ap.add_argument("--centroid", action="store_true", help="print the label-centroid P@1 (slow on big sets)")
    ap.add_argument("--out", default=None, help="write PREFIX_train.txt and PREFIX_test.txt")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help=f"override a preset field; fields: {', '.join(FIELDS)}")
    args = ap.parse_args(argv)
    overrides = {}
    try:
        for item in args.set:
            name, sep, value = item.partition("=")
            if not sep or name not in FIELDS:
                raise ValueError(f"--set {item!r}: expected FIELD=VALUE with FIELD one of "
                                 f"{', '.join(FIELDS)}")
            try:
                overrides[name] = FIELD_KINDS[name](value)
            except ValueError:
                raise ValueError(f"--set {item!r}: {name} takes a {FIELD_KINDS[name].__name__}") from None
        p = get_preset(args.preset, **overrides)
        _check_seed(args.seed)
    except ValueError as e:
        ap.error(str(e))

    t0 = time.perf_counter()
    build_world(p, args.seed)
    t1 = time.perf_counter()
    generate(p, 8, args.seed, split="warm-up")  # loads (or compiles) the kernels outside the timing
    t2 = time.perf_counter()
    train, test = generate_split(p, args.points, args.test_points, args.seed)
    t3 = time.perf_counter()
    n = train.n_points + test.n_points
    print(f"preset {args.preset}  seed {args.seed}: world {t1 - t0:.2f} s, kernels {t2 - t1:.2f} s, "
          f"{n:,} points {t3 - t2:.2f} s ({n / max(t3 - t2, 1e-9):,.0f} points/s, one core)")
    if args.stats:
        for name, data in (("train", train), ("test", test)):
            print(f"--- {name}")
            print(format_stats(stats(data)))
    if args.centroid:
        t4 = time.perf_counter()
        p1 = centroid_p_at_1(train, test)
        freq = np.bincount(train.Y.indices, minlength=train.n_labels)
        top = int(np.argmax(freq))
        base = float(np.mean(np.diff(test.Y[:, top].tocsr().indptr) > 0)) if test.n_points else 0.0
        print(f"label-centroid P@1 {p1:.4f}  (most-frequent-label P@1 {base:.4f}; "
              f"{time.perf_counter() - t4:.1f} s)")
    if args.out:
        for path in write(args.out, train, test):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
