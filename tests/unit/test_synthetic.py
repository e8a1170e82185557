"""dslide.datasets.synthetic: determinism, format, the generative model, calibration, real-data statistics.

References are computed independently here (plain numpy / Python): expected label
counts from the Poisson law, cluster membership from the world arrays, the
label-centroid P@1 with dense numpy, the Zipf mass from its integral.
"""

import math
import warnings

import numpy as np
import pytest

from dslide.datasets import draws, synthetic as syn
from dslide.datasets.stats import centroid_p_at_1
from dslide.io.data import XMCData, XMCFormatWarning, read_xmc


@pytest.fixture(scope="module")
def tiny():
    return syn.generate_split("tiny", seed=0)


# --------------------------------------------------------------------------- arguments


def test_unknown_preset_names_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown preset 'huge'.*tiny, small, amazon-like"):
        syn.generate("huge")


def test_unknown_field_names_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown preset field\(s\) nosie;.*noise"):
        syn.generate("tiny", nosie=0.1)


@pytest.mark.parametrize("overrides, match", [
    ({"noise": 1.5}, r"noise \(1.5\) must be in \[0, 1\]"),
    ({"n_features": 0}, r"n_features \(0\) must be in \[1"),
    ({"n_labels": 2.5}, r"n_labels \(2.5\) must be a finite int"),
    ({"nnz_mean": 5000.0}, r"nnz_mean \(5000.0\) must be in \[1, min\(nnz_max, n_features\)\]"),
    ({"labels_max": 600}, r"labels_max \(600\) must be <= n_labels \(500\)"),
    ({"label_zipf": float("nan")}, r"label_zipf \(nan\) must be a finite float"),
])
def test_bad_fields_are_rejected(overrides, match):
    with pytest.raises(ValueError, match=match):
        syn.generate("tiny", 10, **overrides)


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match=r"seed \(-1\) must be an integer >= 0"):
        syn.generate("tiny", 10, seed=-1)
    with pytest.raises(ValueError, match=r"n_points \(-3\) must be an integer >= 0"):
        syn.generate("tiny", -3)
    with pytest.raises(ValueError, match=r"split 'valid' has no default size.*train, test"):
        syn.generate("tiny", split="valid")


def test_every_preset_documents_its_fields():
    doc = syn.Preset.__doc__
    for name in syn.FIELDS:
        assert f"    {name}:" in doc, name


# --------------------------------------------------------------------------- determinism


def _same(a: XMCData, b: XMCData) -> bool:
    return all(np.array_equal(getattr(a, m).__getattribute__(k), getattr(b, m).__getattribute__(k))
               for m in ("X", "Y") for k in ("indptr", "indices", "data")) and a.X.shape == b.X.shape


def test_same_seed_gives_identical_data_even_after_the_world_cache_is_cleared(tiny):
    train, test = tiny
    syn.build_world.cache_clear()
    again_train, again_test = syn.generate_split("tiny", seed=0)
    assert _same(train, again_train) and _same(test, again_test)
    assert _same(syn.generate("tiny", seed=0, split="test"), test)


def test_different_seed_or_override_gives_different_data(tiny):
    train, _ = tiny
    other = syn.generate("tiny", seed=1)
    assert other.X.shape == train.X.shape
    assert not _same(other, train)
    assert (other.X != train.X).nnz > 0.9 * train.X.nnz
    changed = syn.generate("tiny", seed=0, noise=0.3)
    assert not _same(changed, train)
    assert syn.generate("tiny", 7, n_features=2_000).X.shape == (7, 2_000)


def test_splits_differ_but_share_the_label_and_feature_distributions(tiny):
    train, _ = tiny
    test = syn.generate("tiny", 2_000, seed=0, split="test")
    other_world = syn.generate("tiny", 2_000, seed=1, split="test")
    assert (train.X != test.X).nnz > 0.9 * train.X.nnz

    def tvd(a, b, col_of):
        fa = np.bincount(col_of(a), minlength=a.n_labels + a.n_features).astype(float)
        fb = np.bincount(col_of(b), minlength=a.n_labels + a.n_features).astype(float)
        return 0.5 * np.abs(fa / fa.sum() - fb / fb.sum()).sum()

    labels = lambda d: d.Y.indices  # noqa: E731
    features = lambda d: d.X.indices  # noqa: E731
    # Same world: only sampling noise between the label (and feature) histograms;
    # another seed is another world (labels and features permuted).
    assert tvd(train, test, labels) < 0.3 < 0.6 < tvd(train, other_world, labels)
    assert tvd(train, test, features) < 0.15 < 0.5 < tvd(train, other_world, features)
    # The head labels are the same ones.
    top_train = np.argsort(-np.bincount(train.Y.indices, minlength=train.n_labels))[:10]
    top_test = np.argsort(-np.bincount(test.Y.indices, minlength=test.n_labels))[:10]
    assert len(set(top_train) & set(top_test)) >= 6


# --------------------------------------------------------------------------- format


@pytest.mark.parametrize("which", [0, 1])
def test_csr_format(tiny, which):
    data = tiny[which]
    p = syn.PRESETS["tiny"]
    n = (p.n_train, p.n_test)[which]
    X, Y = data.X, data.Y
    assert X.shape == (n, p.n_features) and Y.shape == (n, p.n_labels)
    assert X.dtype == np.float32 and Y.dtype == np.float32
    assert X.format == "csr" and Y.format == "csr"
    for M in (X, Y):
        assert M.indptr[0] == 0 and M.indptr[-1] == M.nnz and np.all(np.diff(M.indptr) >= 1)
        rows = np.repeat(np.arange(n), np.diff(M.indptr))
        # Strictly increasing within each row: sorted, no duplicates.
        same_row = rows[1:] == rows[:-1]
        assert np.all(np.diff(M.indices.astype(np.int64))[same_row] > 0)
        assert M.indices.min() >= 0 and M.indices.max() < M.shape[1]
    assert np.all(np.isfinite(X.data)) and np.all(X.data >= 1.0)  # no explicit zeros, no denormals
    assert np.all(Y.data == 1.0)
    assert np.diff(Y.indptr).max() <= p.labels_max


def test_zero_points():
    data = syn.generate("tiny", 0)
    assert data.X.shape == (0, 1_000) and data.Y.shape == (0, 500) and data.X.nnz == 0


# --------------------------------------------------------------------------- the model


def test_values_are_idf_times_an_integer_term_count_power(tiny):
    train, _ = tiny
    p = syn.PRESETS["tiny"]
    world = syn.build_world(p, 0)
    rank = np.empty(p.n_features, dtype=np.int64)
    rank[world.feature_of_rank] = np.arange(p.n_features)
    idf = 1.0 + p.idf_slope * np.log2(1.0 + rank)
    tf = (train.X.data / idf[train.X.indices]) ** (1.0 / p.tf_power)
    assert np.allclose(tf, np.rint(tf), rtol=1e-4, atol=1e-4)
    assert tf.min() > 0.999
    share_tf1 = np.mean(np.rint(tf) == 1)
    assert 0.5 < share_tf1 < 0.95  # most features occur once, some repeat


def test_label_and_nnz_counts_follow_their_laws(tiny):
    train, _ = tiny
    p = syn.PRESETS["tiny"]
    lam = p.labels_mean - 1.0
    expected = sum(min(1 + k, p.labels_max) * math.exp(-lam) * lam ** k / math.factorial(k)
                   for k in range(60))
    labels = np.diff(train.Y.indptr)
    assert abs(labels.mean() - expected) < 4 * labels.std() / math.sqrt(len(labels))
    nnz = np.diff(train.X.indptr)
    assert abs(nnz.mean() - p.nnz_mean) < 0.05 * p.nnz_mean
    assert np.median(nnz) < nnz.mean()  # log-normal: the tail is on the right


def test_labels_of_a_point_share_one_cluster_when_cluster_prob_is_1(tiny):
    train, _ = tiny
    p = syn.PRESETS["tiny"]
    assert p.cluster_prob == 1.0
    cluster = syn.build_world(p, 0).slot_of_label // p.cluster_size
    c = cluster[train.Y.indices]
    rows = np.repeat(np.arange(train.n_points), np.diff(train.Y.indptr))
    first = c[train.Y.indptr[:-1]]
    assert np.array_equal(c, first[rows])
    # With cluster_prob = 0 co-labels come from everywhere.
    mixed = syn.generate("tiny", 500, cluster_prob=0.0)
    cluster0 = syn.build_world(syn.get_preset("tiny", cluster_prob=0.0), 0).slot_of_label // p.cluster_size
    c0 = cluster0[mixed.Y.indices]
    rows0 = np.repeat(np.arange(mixed.n_points), np.diff(mixed.Y.indptr))
    assert np.mean(c0 != c0[mixed.Y.indptr[:-1]][rows0]) > 0.3


def test_signal_features_come_from_the_prototypes():
    # noise = 0 and 4 non-zeros per point (never more than the prototypes can give in
    # 4 k_s + 8 draws): every feature is in the prototype of one of the point's
    # labels or in its cluster's topic.
    p = syn.get_preset("tiny", noise=0.0, nnz_mean=4.0, nnz_sigma=0.0)
    data = syn.generate(p, 300, seed=3)
    world = syn.build_world(p, 3)
    assert np.all(np.diff(data.X.indptr) == 4)
    for i in range(data.n_points):
        labs = data.Y.indices[data.Y.indptr[i]:data.Y.indptr[i + 1]]
        allowed = set(world.protos[labs].ravel())
        allowed |= set(world.topics[world.slot_of_label[labs] // p.cluster_size].ravel())
        feats = set(data.X.indices[data.X.indptr[i]:data.X.indptr[i + 1]])
        assert feats <= allowed, i


@pytest.mark.parametrize("a", [0.0, 0.8, 1.0, 1.3])
def test_zipf_mass_matches_its_integral(a):
    n = 50
    r = np.arange(n, dtype=np.float64)
    if a == 1.0:
        ref = np.log((r + 2) / (r + 1))
    else:
        ref = ((r + 2) ** (1 - a) - (r + 1) ** (1 - a)) / (1 - a)
    assert np.allclose(draws._zipf_mass(n, a), ref, rtol=1e-12)
    # Continuous in a around 1 (the stable form has no cancellation there).
    assert np.allclose(draws._zipf_mass(n, 1.0 - 1e-9), draws._zipf_mass(n, 1.0), rtol=1e-8)


@pytest.mark.parametrize("a", [0.8, 1.0])
def test_powerlaw_rank_inverts_the_cdf_of_the_zipf_mass(a):
    n = 30
    mass = draws._zipf_mass(n, a)
    c = draws._powerlaw_const(n, a)
    m = 200_000
    u = (np.arange(m) + 0.5) / m  # a uniform grid: frequencies equal the masses up to O(1/m)
    ranks = np.array([draws._powerlaw_rank(x, n, a, c) for x in u])
    freq = np.bincount(ranks, minlength=n) / m
    assert np.allclose(freq, mass / mass.sum(), atol=2e-5)


def test_alias_table_reproduces_its_weights():
    w = np.random.default_rng(5).random(37) ** 3
    w[[3, 11]] = 0.0
    prob, alias = draws._alias_table(w)
    m = 400_000
    u = (np.arange(m) + 0.5) / m
    picks = np.array([draws._alias_pick(x, prob, alias) for x in u])
    freq = np.bincount(picks, minlength=len(w)) / m
    assert np.allclose(freq, w / w.sum(), atol=1e-4)
    assert freq[3] == 0 and freq[11] == 0


# --------------------------------------------------------------------------- learnability


def _centroid_p_at_1_dense(train, test):
    X = train.X.toarray().astype(np.float64)
    X /= np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1e-300)
    Y = train.Y.toarray().astype(np.float64)
    count = Y.sum(axis=0)
    C = (Y.T @ X) / np.where(count > 0, count, 1.0)[:, None]
    S = test.X.toarray().astype(np.float64) @ C.T
    best = S.argmax(axis=1)  # first maximum: the lowest label id
    hit = test.Y.toarray()[np.arange(test.n_points), best] > 0
    hit &= S.max(axis=1) > 0
    return hit.mean()


def test_tiny_is_learnable_but_not_trivial(tiny):
    train, test = tiny
    p1 = centroid_p_at_1(train, test)
    assert p1 == pytest.approx(_centroid_p_at_1_dense(train, test), abs=1.5 / test.n_points)
    top = np.argmax(np.bincount(train.Y.indices, minlength=train.n_labels))
    baseline = np.mean(test.Y[:, top].toarray().ravel() > 0)
    print(f"tiny: label-centroid P@1 {p1:.3f}, most-frequent-label P@1 {baseline:.3f}")
    assert 0.5 <= p1 <= 0.95
    assert p1 > baseline + 0.4 and p1 > 3 * baseline


# --------------------------------------------------------------------------- the real sample


def test_amazon_like_matches_the_real_amazon670k_sample(shared_data):
    path = shared_data("amazon670k_sample_512.txt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XMCFormatWarning)  # its header claims 153025 points
        real = read_xmc(path, strict=False, cache=False)
    assert real.n_points == 512
    synth = syn.generate("amazon-like", 4_000, seed=0)
    assert (synth.n_features, synth.n_labels) == (real.n_features, real.n_labels)

    def describe(d):
        nnz = np.diff(d.X.indptr)
        return {
            "nnz_mean": nnz.mean(), "nnz_median": np.median(nnz), "nnz_p90": np.quantile(nnz, 0.9),
            "labels_mean": np.diff(d.Y.indptr).mean(),
            "value_p10": np.quantile(d.X.data, 0.1), "value_median": np.median(d.X.data),
            "value_p90": np.quantile(d.X.data, 0.9), "value_p99": np.quantile(d.X.data, 0.99),
        }

    r, s = describe(real), describe(synth)
    print("\n".join(f"{k:13s} real {r[k]:8.2f}  synthetic {s[k]:8.2f}" for k in r))
    assert abs(s["nnz_mean"] / r["nnz_mean"] - 1) < 0.25
    assert abs(s["nnz_median"] / r["nnz_median"] - 1) < 0.25
    assert abs(s["labels_mean"] / r["labels_mean"] - 1) < 0.25
    assert 0.5 < s["value_median"] / r["value_median"] < 2.0
    for k in ("nnz_p90", "value_p10", "value_p90", "value_p99"):
        assert 0.5 < s[k] / r[k] < 2.0, k
    assert synth.X.data.min() >= 1.0 and real.X.data.min() >= 1.0


def test_amazon_like_label_frequencies_are_heavy_tailed():
    data = syn.generate("amazon-like", 20_000, seed=0)
    freq = np.sort(np.bincount(data.Y.indices, minlength=data.n_labels))[::-1]
    share = freq[:data.n_labels // 1000].sum() / freq.sum()
    assert share > 0.1  # the top 0.1 % of labels: 100 times their uniform share
    # Rank-frequency slope on log-log axes over ranks 10..1000: Zipf-like.
    r = np.arange(10, 1000)
    slope = np.polyfit(np.log(r + 1.0), np.log(freq[r]), 1)[0]
    assert -1.3 < slope < -0.5


# --------------------------------------------------------------------------- output


def test_write_round_trips_through_read_xmc(tmp_path, tiny):
    train, test = tiny
    paths = syn.write(str(tmp_path / "tiny"), train, test)
    assert paths == (str(tmp_path / "tiny_train.txt"), str(tmp_path / "tiny_test.txt"))
    for path, data in zip(paths, (train, test)):
        back = read_xmc(path, cache=False)
        assert _same(back, data)


def test_command_line_prints_statistics_and_writes_files(tmp_path, capsys):
    assert syn.main(["--preset", "tiny", "--points", "300", "--test-points", "100", "--stats",
                     "--seed", "2", "--set", "noise=0.4", "--out", str(tmp_path / "d")]) == 0
    out = capsys.readouterr().out
    assert "points 300  features 1,000  labels 500" in out
    assert "points 100  features 1,000  labels 500" in out
    assert "nnz/point     mean" in out and "top 1% of labels carry" in out
    back = read_xmc(tmp_path / "d_test.txt", cache=False)
    assert _same(back, syn.generate("tiny", 100, seed=2, split="test", noise=0.4))


def test_amazon_tail_has_a_longer_tail_than_amazon_like():
    """The tail variant differs from amazon-like only in label_zipf, and its most frequent
    label covers a smaller share of the points (measured 2.5% against 0.8% at 20,000 points)."""
    import dataclasses

    import scipy.sparse as sp

    like, tail = syn.PRESETS["amazon-like"], syn.PRESETS["amazon-tail"]
    assert dataclasses.replace(tail, label_zipf=like.label_zipf) == like
    shares = []
    for name in ("amazon-like", "amazon-tail"):
        Y = sp.csr_matrix(syn.generate(name, 5000, seed=0, split="train").Y)
        shares.append(np.bincount(Y.indices).max() / Y.shape[0])
    assert shares[1] < 0.5 * shares[0], shares
