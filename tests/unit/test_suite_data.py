"""The suite's generator families (dslide.datasets.baskets, .amazon670k) and registry (.suite).

Every statistic is recomputed here with plain numpy from the CSR arrays (or from the
world's arrays), never taken from the generators' own summaries. Tolerances:

* format: X csr float32, indices sorted and distinct within a row, values >= 1 (so no
  explicit zeros and no denormals); Y csr float32 ones; the shapes of the preset.
* non-zeros per point: mean within 6 % of the preset's nnz_mean.
* top-label share (points holding the most frequent label, 10,000 points): head presets
  in [0.10, 0.20], tail presets in [0.01, 0.03].
* baskets: labels per point in [5.0, 6.5]; the rank-frequency slope of the labels on
  log-log axes over ranks 10..1000 is in [-1.3, -0.9] for head presets and in
  [-0.9, -0.4] for tail presets (10,000 points); every point's labels come from one
  topic and that topic's related topics.
* amazon670k at its design size (30,000 points): labels per point 5.45 +- 0.15; points
  per label among the labels seen in [3.5, 5.0] (about 4 for the tail presets); at least
  70 % of the seen labels seen 1-5 times and 15-35 % seen once; each point's labels are a
  subset of one product's label set; the real Amazon-670K sample's non-zeros, labels
  per point and value quantiles within a factor of 2 (mean non-zeros within 25 %).
* centroid P@1 (dslide.datasets.stats.centroid_p_at_1) on baskets-tail-40k and a670k-tail-40k with
  8,000 train / 1,000 test points in [0.25, 0.60], at least 8 times the most-frequent-
  label P@1.
* determinism: the same (preset, seed, split) gives the same bytes after the world cache
  is cleared and in a fresh process at another numba thread count; another split or seed
  gives other points.
"""

import hashlib
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

from dslide.datasets import amazon670k as az
from dslide.datasets import baskets as bk
from dslide.datasets import suite
from dslide.datasets import synthetic as syn
from dslide.datasets.stats import centroid_p_at_1
from dslide.io.data import XMCFormatWarning, read_xmc

NEW_PRESETS = [(bk, name) for name in bk.PRESETS] + [(az, name) for name in az.PRESETS]
HEAD_BAND, TAIL_BAND = (0.10, 0.20), (0.01, 0.03)


def _band(name):
    return HEAD_BAND if "-head" in name else TAIL_BAND


def _digest(data) -> str:
    h = hashlib.sha256()
    for m in (data.X, data.Y):
        for a in (m.indptr, m.indices, m.data):
            h.update(np.ascontiguousarray(a).tobytes())
        h.update(repr(m.shape).encode())
    return h.hexdigest()


def _label_freq(data):
    return np.bincount(data.Y.indices, minlength=data.n_labels)


@pytest.fixture(scope="module")
def design():
    """a670k presets at their design size (30,000 train points)."""
    return {name: az.generate(name, seed=0) for name in az.PRESETS}


@pytest.fixture(scope="module")
def ten_k():
    """baskets presets at 10,000 points."""
    return {name: bk.generate(name, 10_000, seed=0) for name in bk.PRESETS}


# --------------------------------------------------------------------------- registry


def test_suite_members_and_families():
    assert list(suite.MEMBERS) == [
        "amazon-like", "amazon-tail", "baskets-head", "baskets-tail", "baskets-head-40k",
        "baskets-tail-40k", "a670k-head", "a670k-tail", "a670k-head-40k", "a670k-tail-40k"]
    for name, (family, preset) in suite.MEMBERS.items():
        assert preset in family.PRESETS and suite.family_of(name) is family
    assert suite.family_of("tiny") is syn
    with pytest.raises(ValueError, match=r"unknown preset 'huge'; valid presets: amazon-like, .*tiny"):
        suite.family_of("huge")
    with pytest.raises(ValueError, match=r"unknown suite member 'tiny'; valid members: amazon-like"):
        suite.generate_member("tiny")


@pytest.mark.parametrize("family, name", NEW_PRESETS)
def test_presets_have_the_suite_shape(family, name):
    p = family.PRESETS[name]
    assert (p.n_train, p.n_test) == (suite.SUITE_TRAIN, suite.SUITE_TEST)
    wide = not name.endswith("-40k")
    assert p.n_labels == (670_091 if wide else 40_000)
    assert p.n_features == 135_909 if wide else 20_000 <= p.n_features <= 50_000


def test_generate_member_uses_the_family_and_sizes():
    train, test = suite.generate_member("a670k-tail-40k", 200, 50, seed=4)
    assert (train.n_points, test.n_points) == (200, 50)
    assert _digest(train) == _digest(az.generate("a670k-tail-40k", 200, 4))
    assert _digest(test) == _digest(az.generate("a670k-tail-40k", 50, 4, split="test"))


def test_every_field_is_documented_and_checked():
    for family in (bk, az):
        for name in family.FIELDS:
            assert f"    {name}:" in family.Preset.__doc__, (family.__name__, name)
    with pytest.raises(ValueError, match=r"unknown preset field\(s\) nosie"):
        bk.generate("baskets-tail-40k", 5, nosie=0.1)
    with pytest.raises(ValueError, match=r"noise \(1.5\) must be in \[0, 1\]"):
        az.generate("a670k-tail-40k", 5, noise=1.5)
    with pytest.raises(ValueError, match=r"labels_pmf .* summing to 1"):
        az.get_preset("a670k-tail-40k", labels_pmf=(0.5, 0.4))
    with pytest.raises(ValueError, match=r"n_labels \(100\) must be >= 2 labels per leaf topic"):
        bk.get_preset("baskets-tail-40k", n_labels=100)
    with pytest.raises(ValueError, match=r"split 'valid' has no default size"):
        bk.generate("baskets-tail-40k", split="valid")


# --------------------------------------------------------------------------- format


@pytest.mark.parametrize("family, name", NEW_PRESETS)
def test_csr_format(family, name):
    p = family.PRESETS[name]
    data = family.generate(name, 300, seed=1, split="test")
    X, Y = data.X, data.Y
    assert X.shape == (300, p.n_features) and Y.shape == (300, p.n_labels)
    assert X.dtype == np.float32 and Y.dtype == np.float32 and X.format == Y.format == "csr"
    for M in (X, Y):
        assert M.indptr[0] == 0 and M.indptr[-1] == M.nnz and np.all(np.diff(M.indptr) >= 1)
        rows = np.repeat(np.arange(300), np.diff(M.indptr))
        same_row = rows[1:] == rows[:-1]
        assert np.all(np.diff(M.indices.astype(np.int64))[same_row] > 0)
        assert M.indices.min() >= 0 and M.indices.max() < M.shape[1]
    assert np.all(np.isfinite(X.data)) and X.data.min() >= 1.0
    assert np.all(Y.data == 1.0)
    assert family.generate(name, 0).X.shape == (0, p.n_features)


# --------------------------------------------------------------------------- determinism


def test_same_seed_same_bytes_other_split_or_seed_other_points():
    for family, name in ((bk, "baskets-tail-40k"), (az, "a670k-tail-40k")):
        a = family.generate(name, 500, seed=3)
        family.build_world.cache_clear()
        assert _digest(family.generate(name, 500, seed=3)) == _digest(a)
        test = family.generate(name, 500, seed=3, split="test")
        other = family.generate(name, 500, seed=4)
        for b in (test, other):
            assert (a.X != b.X).nnz > 0.9 * a.X.nnz


def test_thread_count_is_irrelevant():
    code = ("import hashlib, numpy as np\n"
            "from dslide.datasets import baskets, amazon670k\n"
            "for f, n in ((baskets, 'baskets-head-40k'), (amazon670k, 'a670k-head-40k')):\n"
            "    d = f.generate(n, 400, seed=2, split='test')\n"
            "    h = hashlib.sha256()\n"
            "    for m in (d.X, d.Y):\n"
            "        for a in (m.indptr, m.indices, m.data):\n"
            "            h.update(np.ascontiguousarray(a).tobytes())\n"
            "        h.update(repr(m.shape).encode())\n"
            "    print(h.hexdigest())\n")
    env = dict(os.environ, NUMBA_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    expected = [_digest(f.generate(n, 400, seed=2, split="test"))
                for f, n in ((bk, "baskets-head-40k"), (az, "a670k-head-40k"))]
    assert out.stdout.split() == expected


def test_train_and_test_come_from_one_world():
    for family, name in ((bk, "baskets-tail-40k"), (az, "a670k-tail-40k")):
        train, test = family.generate_split(name, 8_000, 2_000, seed=0)
        other = family.generate(name, 2_000, seed=1, split="test")
        seen = _label_freq(train) > 0
        # Same world: most test labels occur in training; another world's (a random
        # permutation of the label ids) only by the chance of hitting a seen id.
        same, chance = np.mean(seen[test.Y.indices]), np.mean(seen[other.Y.indices])
        assert same > 0.6 and same > chance + 0.15, (name, same, chance)
        ft, fs = np.bincount(train.X.indices, minlength=train.n_features), np.bincount(
            test.X.indices, minlength=train.n_features)
        fo = np.bincount(other.X.indices, minlength=train.n_features)

        def tvd(a, b):
            return 0.5 * np.abs(a / a.sum() - b / b.sum()).sum()

        assert tvd(ft, fs) < 0.3 < tvd(ft, fo), name


# --------------------------------------------------------------------------- baskets


@pytest.mark.parametrize("name", list(bk.PRESETS))
def test_baskets_statistics(ten_k, name):
    data = ten_k[name]
    p = bk.PRESETS[name]
    nnz = np.diff(data.X.indptr)
    assert abs(nnz.mean() / p.nnz_mean - 1) < 0.06
    assert 5.0 <= np.diff(data.Y.indptr).mean() <= 6.5
    assert np.diff(data.Y.indptr).max() <= p.labels_max
    freq = np.sort(_label_freq(data))[::-1]
    lo, hi = _band(name)
    assert lo <= freq[0] / data.n_points <= hi, freq[0] / data.n_points
    r = np.arange(10, 1000)
    slope = np.polyfit(np.log(r + 1.0), np.log(np.maximum(freq[r], 0.5)), 1)[0]
    assert (-1.3 <= slope <= -0.9) if "-head" in name else (-0.9 <= slope <= -0.4), slope


def test_baskets_labels_come_from_a_topic_and_its_related_topics(ten_k):
    name = "baskets-tail-40k"
    data = ten_k[name]
    w = bk.build_world(bk.PRESETS[name], 0)
    for i in range(2_000):
        labs = data.Y.indices[data.Y.indptr[i]:data.Y.indptr[i + 1]]
        topics = set(w.topic_of_label[labs].tolist())
        assert any(topics <= {t} | set(w.related[t].tolist()) for t in topics), i


def test_baskets_labels_share_their_topics_features():
    # noise = 0, own_share = 0: every feature is in a vocabulary of a label's topic or its parent.
    p = bk.get_preset("baskets-tail-40k", noise=0.0, own_share=0.0, nnz_mean=6.0, nnz_sigma=0.0)
    data = bk.generate(p, 300, seed=5)
    w = bk.build_world(p, 5)
    for i in range(300):
        labs = data.Y.indices[data.Y.indptr[i]:data.Y.indptr[i + 1]]
        t = w.topic_of_label[labs]
        allowed = set(w.leaf_vocab[t].ravel()) | set(w.parent_vocab[t // p.topics_per_parent].ravel())
        assert set(data.X.indices[data.X.indptr[i]:data.X.indptr[i + 1]]) <= allowed, i


# --------------------------------------------------------------------------- amazon670k


@pytest.mark.parametrize("name", list(az.PRESETS))
def test_a670k_statistics_at_design_size(design, name):
    data = design[name]
    p = az.PRESETS[name]
    assert data.n_points == p.design_points
    labels = np.diff(data.Y.indptr)
    assert abs(labels.mean() - 5.45) <= 0.15, labels.mean()
    nnz = np.diff(data.X.indptr)
    assert abs(nnz.mean() / 76.0 - 1) < 0.06, nnz.mean()
    freq = _label_freq(data)
    seen = freq[freq > 0]
    assert 3.5 <= seen.mean() <= 5.0, seen.mean()
    if "-tail" in name and not name.endswith("-40k"):
        assert abs(seen.mean() - 3.99) < 0.3
    assert np.mean(seen <= 5) >= 0.70
    assert 0.15 <= np.mean(seen == 1) <= 0.35
    lo, hi = _band(name)
    assert lo <= freq.max() / data.n_points <= hi, freq.max() / data.n_points


def test_a670k_points_are_copies_of_a_product(design):
    name = "a670k-tail"
    data = design[name]
    w = az.build_world(az.PRESETS[name], 0)
    G = len(w.product_cat)
    rows = np.repeat(np.arange(G), np.diff(w.label_ptr))
    sets = {}
    for g in range(G):
        sets[g] = set(w.label_ids[w.label_ptr[g]:w.label_ptr[g + 1]].tolist())
    products_of = {}
    for lab, g in zip(w.label_ids.tolist(), rows.tolist()):
        products_of.setdefault(lab, []).append(g)
    for i in range(1_000):
        labs = set(data.Y.indices[data.Y.indptr[i]:data.Y.indptr[i + 1]].tolist())
        first = min(labs)
        assert any(labs <= sets[g] for g in products_of[first]), i


def test_a670k_matches_the_real_amazon670k_sample(shared_data, design):
    path = shared_data("amazon670k_sample_512.txt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XMCFormatWarning)  # its header claims 153025 points
        real = read_xmc(path, strict=False, cache=False)
    synth = design["a670k-tail"]
    assert (synth.n_features, synth.n_labels) == (real.n_features, real.n_labels)

    def describe(d):
        nnz = np.diff(d.X.indptr)
        v = d.X.data
        return {"nnz_mean": nnz.mean(), "nnz_median": np.median(nnz), "nnz_p90": np.quantile(nnz, 0.9),
                "labels_mean": np.diff(d.Y.indptr).mean(), "value_p10": np.quantile(v, 0.1),
                "value_median": np.median(v), "value_p90": np.quantile(v, 0.9),
                "value_p99": np.quantile(v, 0.99)}

    r, s = describe(real), describe(synth)
    print("\n".join(f"{k:13s} real {r[k]:8.2f}  a670k-tail {s[k]:8.2f}" for k in r))
    assert abs(s["nnz_mean"] / r["nnz_mean"] - 1) < 0.25
    for k in r:
        assert 0.5 < s[k] / r[k] < 2.0, k


# --------------------------------------------------------------------------- learnability


@pytest.mark.parametrize("family, name", [(bk, "baskets-tail-40k"), (az, "a670k-tail-40k")])
def test_centroid_p_at_1_is_in_its_band(family, name):
    train, test = family.generate_split(name, 8_000, 1_000, seed=0)
    p1 = centroid_p_at_1(train, test)
    top = int(np.argmax(_label_freq(train)))
    baseline = np.mean(np.diff(test.Y[:, top].tocsr().indptr) > 0)
    print(f"{name}: centroid P@1 {p1:.3f}, most-frequent-label P@1 {baseline:.3f}")
    assert 0.25 <= p1 <= 0.60 and p1 >= 8 * baseline
