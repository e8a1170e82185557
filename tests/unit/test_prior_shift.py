"""The prior shift: the output biases lowered by tau x the label log-prior at the end of training
(Network.shift_output_prior, dslide.train.infer_build.apply_prior_shift)."""

import json

import numpy as np
import pytest
import scipy.sparse as sp

from dslide import train as T
from dslide.comm import Comm
from dslide.config import Config, labels_per_point, narrow_prior_shift, points_per_label, resolve_shape
from dslide.io import checkpoint as ck
from dslide.io.checkpoint_files import CheckpointError, check_manifest
from dslide.io.data import XMCData
from dslide.train import validation as V


def _data(n=600, f=80, L=40, seed=1):
    rng = np.random.default_rng(seed)
    X = sp.random(n, f, density=0.1, format="csr", dtype=np.float32, random_state=seed)
    X.data[:] = 1.0
    labels = np.minimum(rng.zipf(1.5, n) - 1, L - 1)  # a head and a tail
    Y = sp.csr_matrix((np.ones(n, np.float32), labels, np.arange(n + 1)), shape=(n, L))
    return XMCData(X, Y)


def _log_prior(data):
    counts = np.bincount(data.Y.indices, minlength=data.n_labels).astype(np.float64)
    return np.log((counts + 1.0) / (data.n_points + data.n_labels))


def _fit(data, **kw):
    cfg = Config(hidden=(16,), epochs=2, batch_size=50, threads=1, **kw)
    cfg = cfg.resolve(data.n_labels, points_per_label(data.Y), data.n_points)
    model, _ = T.fit(data, cfg, index=False)
    return model


@pytest.mark.parametrize("kind", ["dense", "lsh"])
def test_scoring_under_several_biases_at_once_is_scoring_with_each_as_the_outputs_own(kind):
    """predict_topk_scores(biases=...) (the products made once for every vector) gives, for each
    bias vector, what the network scores with that vector as its output's biases, bit for bit:
    a dense output and an LSH one, several batches."""
    from dslide.infer.predict import predict_topk_scores

    data = _data(L=40)
    model = _fit(data, kinds=("dense", kind))
    out = model.network.layers[-1]
    assert type(out).__name__ == ("DenseLayer" if kind == "dense" else "LSHLayer")
    rng = np.random.default_rng(0)
    trained = out.b.copy()
    biases = [trained - np.float32(0.3) * _log_prior(data).astype(np.float32)[:out.b.size],
              rng.standard_normal(out.b.size).astype(out.b.dtype), trained]
    got = predict_topk_scores(model, data.X, 7, biases=biases, batch_size=256, fused=False)
    assert len(got) == 3
    for b, (ids, scores) in zip(biases, got):
        out.b[:] = b
        want_ids, want_scores = predict_topk_scores(model, data.X, 7, batch_size=256, fused=False)
        np.testing.assert_array_equal(ids, want_ids)
        np.testing.assert_array_equal(scores, want_scores)
    out.b[:] = trained


def test_the_shift_lowers_each_bias_by_tau_times_its_log_prior_and_zero_gives_the_trained_biases_back():
    data = _data()
    model = _fit(data, prior_shift=0.0)
    net = model.network
    b = net.layers[-1].b.copy()
    counts = np.bincount(data.Y.indices, minlength=data.n_labels).astype(np.float64)
    net.shift_output_prior(0.3, counts, data.n_points)
    np.testing.assert_array_equal(net.layers[-1].b, b - (0.3 * _log_prior(data)).astype(b.dtype))
    assert net.prior_shift == 0.3
    net.shift_output_prior(0.1, counts, data.n_points)  # from the trained biases, not from the shifted ones
    np.testing.assert_array_equal(net.layers[-1].b, b - (0.1 * _log_prior(data)).astype(b.dtype))
    net.shift_output_prior(0.0, counts, data.n_points)
    np.testing.assert_array_equal(net.layers[-1].b, b)  # to the bit
    assert net.prior_shift == 0.0
    # rare labels move up: the rarest label's bias gains more than the most frequent one's
    net.shift_output_prior(0.3, counts, data.n_points)
    gain = net.layers[-1].b - b
    assert gain[np.argmin(counts)] > gain[np.argmax(counts)] > 0


def test_a_fit_with_a_shift_is_the_fit_without_it_and_the_shift_at_the_end():
    data = _data()
    off, on = _fit(data, prior_shift=0.0), _fit(data, prior_shift=0.25)
    b_off = off.network.layers[-1].b
    np.testing.assert_array_equal(on.network.layers[-1].b, b_off - (0.25 * _log_prior(data)).astype(b_off.dtype))
    np.testing.assert_array_equal(on.network.layers[0].W, off.network.layers[0].W)
    assert on.index_info["prior_shift"]["chosen"] == 0.25 and on.network.prior_shift == 0.25
    # narrow outputs take the rule's shift when it is left to the data (one label a point: 0.4)
    assert Config().resolve(*resolve_shape(data)).prior_shift == 0.4


def _with_labels(data, per_point: int, seed=2):
    """data's points, each with `per_point` distinct labels (its own first, the others drawn)."""
    rng = np.random.default_rng(seed)
    rows = []
    for own in data.Y.indices:
        others = rng.choice(np.delete(np.arange(data.n_labels), own), per_point - 1, replace=False)
        rows.append(np.sort(np.concatenate([[own], others])))
    ind = np.concatenate(rows).astype(np.int32)
    Y = sp.csr_matrix((np.ones(ind.size, np.float32), ind, np.arange(0, ind.size + 1, per_point)),
                      shape=data.Y.shape)
    return XMCData(data.X, Y)


@pytest.mark.parametrize("per_point, shift", [(1, 0.4), (4, 0.4), (5, 0.2), (8, 0.2)])
def test_a_narrow_output_shifts_more_where_its_points_carry_fewer_than_five_labels(per_point, shift):
    """The narrow outputs' rule: 0.4 under 5 labels a point on average, 0.2 from 5 on; left
    undecided where the labels per point are not known (a configuration resolved so is still
    decided by fit); a given value wins, and a fit applies the rule's shift."""
    data = _with_labels(_data(), per_point)
    assert labels_per_point(data.Y) == per_point
    shape = resolve_shape(data)
    assert shape == (data.n_labels, points_per_label(data.Y), data.n_points, per_point)
    assert Config().resolve(*shape).prior_shift == shift
    assert Config().resolve(*shape[:3]).prior_shift is None  # labels per point unknown
    assert Config(prior_shift=0.1).resolve(*shape).prior_shift == 0.1
    assert narrow_prior_shift(4.99) == 0.4 and narrow_prior_shift(5.0) == 0.2
    early = Config(hidden=(16,), epochs=1, batch_size=100, threads=1).resolve(*shape[:3])
    model, _ = T.fit(data, early, index=False)
    assert model.config.prior_shift == shift and model.network.prior_shift == shift
    assert model.index_info["prior_shift"]["chosen"] == shift
    b = model.network.layers[-1].b.copy()
    counts = np.bincount(data.Y.indices, minlength=data.n_labels).astype(np.float64)
    model.network.shift_output_prior(0.0, counts, data.n_points)  # the trained biases, shifted by the rule's tau
    np.testing.assert_allclose(b, model.network.layers[-1].b - shift * _log_prior(data), rtol=1e-6, atol=1e-6)
    # a model built without the data (as a resumed run's is) and trained on it: the same rule
    built = T.build_network((data.n_features, data.n_labels), Config(hidden=(16,), epochs=1, batch_size=100, threads=1))
    assert built.config.prior_shift is None
    T.init_from_data(built, data)
    T.fit(data, built.config, model=built, index=False)
    assert built.network.prior_shift == shift and built.index_info["prior_shift"]["why"] == "the narrow outputs' rule"
    np.testing.assert_array_equal(built.network.layers[-1].b, b)  # the same run, the same shifted biases


def test_a_run_stopped_before_its_end_is_not_shifted():
    data = _data()
    cfg = Config(hidden=(16,), epochs=2, batch_size=50, threads=1, prior_shift=0.3)
    cfg = cfg.resolve(data.n_labels, points_per_label(data.Y), data.n_points)
    model, _ = T.fit(data, cfg, index=False, stop_at=3)
    assert model.network.step == 3 and model.network.prior_shift == 0.0 and "prior_shift" not in model.index_info


def test_a_saved_shift_is_read_back_and_training_goes_on_from_the_trained_biases(tmp_path):
    data = _data()
    model = _fit(data, prior_shift=0.3)
    shifted = model.network.layers[-1].b.copy()
    ck.save(model.network, tmp_path, Comm.world())
    manifest = json.loads((ck.latest(tmp_path) / "manifest.json").read_text())
    assert manifest["prior_shift"] == 0.3
    again = T.build_network((data.n_features, data.n_labels), model.config)
    ck.load_into(again.network, ck.latest(tmp_path), Comm.world())
    assert again.network.prior_shift == 0.3
    np.testing.assert_array_equal(again.network.layers[-1].b, shifted)
    # a finished run fitted again trains nothing more: its biases are unshifted, then shifted once (not twice)
    again, _ = T.fit(data, model.config, model=again, index=False)
    assert again.network.prior_shift == 0.3
    np.testing.assert_allclose(again.network.layers[-1].b, shifted, rtol=0, atol=1e-6)


@pytest.mark.parametrize("value", [float("nan"), 2.5, -0.1, "0.2"])
def test_a_manifest_with_a_bad_shift_is_refused(value, tmp_path):
    data = _data()
    model = _fit(data, prior_shift=0.3)
    ck.save(model.network, tmp_path, Comm.world())
    m = json.loads((ck.latest(tmp_path) / "manifest.json").read_text())
    m["prior_shift"] = value
    with pytest.raises(CheckpointError, match="prior_shift"):
        check_manifest(m, tmp_path / "manifest.json")


def test_the_choice_keeps_off_unless_a_shift_gains_more_than_the_margin():
    calls = []

    def flat(tau):
        calls.append(tau)
        return (0.50, 0.30)

    assert V.choose_prior_shift(flat, (0.0, 0.1, 0.2))[0] == 0.0
    assert calls == [0.0, 0.1, 0.2]  # every candidate scored, off once
    worse = {0.0: (0.50, 0.30), 0.1: (0.49, 0.30), 0.2: (0.47, 0.29)}
    assert V.choose_prior_shift(worse.get, (0.0, 0.1, 0.2))[0] == 0.0
    small = {0.0: (0.50, 0.30), 0.1: (0.502, 0.301), 0.2: (0.503, 0.300)}  # gains within the margin
    assert V.choose_prior_shift(small.get, (0.0, 0.1, 0.2))[0] == 0.0
    helps = {0.0: (0.50, 0.30), 0.1: (0.505, 0.302), 0.2: (0.51, 0.305)}
    tau, figures = V.choose_prior_shift(helps.get, (0.0, 0.1, 0.2))
    assert tau == 0.2 and figures == helps


def test_the_walk_over_the_shifts_stops_where_they_fall_past_the_margin():
    """A shift more than the margin below the best before it ends the walk (those after it are not
    scored); a dip within the margin does not, and the shifts after it still win."""
    falls = {0.0: (0.50, 0.30), 0.1: (0.499, 0.2985), 0.2: (0.496, 0.2985), 0.3: (0.60, 0.40)}  # 0, -0.25, -0.55
    calls = []
    tau, figures = V.choose_prior_shift(lambda t: calls.append(t) or falls[t], (0.0, 0.1, 0.2, 0.3))
    assert tau == 0.0 and calls == [0.0, 0.1, 0.2] and list(figures) == [0.0, 0.1, 0.2]
    # past a peak: 0.2 is the best, 0.3 falls more than the margin below it (not below 0)
    peak = {0.0: (0.50, 0.30), 0.1: (0.505, 0.302), 0.2: (0.52, 0.31), 0.3: (0.512, 0.31), 0.4: (0.9, 0.9)}
    calls = []
    tau, _ = V.choose_prior_shift(lambda t: calls.append(t) or peak[t], (0.0, 0.1, 0.2, 0.3, 0.4))
    assert tau == 0.2 and calls == [0.0, 0.1, 0.2, 0.3]
    dips = {0.0: (0.50, 0.30), 0.1: (0.499, 0.2985), 0.2: (0.51, 0.30)}  # -0.25 points, then +1
    calls = []
    assert V.choose_prior_shift(lambda t: calls.append(t) or dips[t], (0.0, 0.1, 0.2))[0] == 0.2
    assert calls == [0.0, 0.1, 0.2]


def test_a_wide_output_chooses_its_shift_on_the_validation_points_and_keeps_off_on_independent_labels():
    """Labels independent of the features: the prior is the best a model can do, and lowering it
    only loses; the choice is scored on the epoch checks' validation rows."""
    rng = np.random.default_rng(5)
    n, f, L = 2400, 300, 5000
    X = sp.random(n, f, density=0.03, format="csr", dtype=np.float32, random_state=5)
    X.data[:] = 1.0
    labels = (np.minimum(rng.zipf(1.3, n), 999) * 5).astype(np.int64)
    Y = sp.csr_matrix((np.ones(n, np.float32), labels, np.arange(n + 1)), shape=(n, L))
    cfg = Config(hidden=(16,), batch_size=100, threads=1, knn=0).resolve(L, points_per_label(Y), n)
    assert cfg.prior_shift is None and cfg.early_stop
    model, _ = T.fit(XMCData(X, Y), cfg, index=False)
    choice = model.index_info["prior_shift"]
    assert choice["chosen"] == 0.0 and model.network.prior_shift == 0.0
    assert set(choice["p@1/p@5"]) == {"0", "0.1", "0.2", "0.3"}
    assert choice["validation_points"] == V.check_rows(V.validation_size(n), L).size
    off = choice["p@1/p@5"]["0"]
    assert all(sum(v) <= sum(off) + V.CHOICE_MARGIN for v in choice["p@1/p@5"].values())


def test_the_choice_takes_a_shift_where_the_prior_overrules_what_the_features_say():
    """A linear model whose features name each point's label with a fixed margin s, and
    whose biases are the training labels' log-prior (falling by 0.51 a label): at shift 0 a
    label more than s below the most frequent one never comes first. On validation points
    whose labels are uniform, lowering the prior brings more of them first, and the
    choice takes the largest shift."""
    import dataclasses

    from dslide.train.infer_build import apply_prior_shift

    L, s = 20, 3.0
    counts = np.round(1000 * 0.6 ** np.arange(L)).astype(int) + 1
    labels = np.repeat(np.arange(L), counts)
    eye = sp.identity(L, dtype=np.float32, format="csr")
    onehot = sp.csr_matrix((np.ones(labels.size, np.float32), labels, np.arange(labels.size + 1)), shape=(labels.size, L))
    train = XMCData(onehot, onehot)
    val_labels = np.repeat(np.arange(L), 50)
    val_rows = sp.csr_matrix(eye[val_labels])
    val = XMCData(val_rows, val_rows)
    cfg = Config(hidden=(), threads=1, knn=0).resolve(L, points_per_label(train.Y), train.n_points)
    model = T.build_network((L, L), cfg)
    model.config = dataclasses.replace(model.config, prior_shift=None)  # left to the choice (narrow: 0.2)
    T.init_from_data(model, train)
    out = model.network.layers[-1]
    assert out.W.shape == (L, L)
    out.W[:] = s * np.eye(L, dtype=out.W.dtype)
    apply_prior_shift(model, train, val)
    choice = model.index_info["prior_shift"]
    figures = choice["p@1/p@5"]
    # label j comes first while (1 - tau) * 0.51 * j < s: 6 labels of 20 at 0, 9 at 0.3
    assert figures["0"][0] == pytest.approx(6 / 20) and figures["0.3"][0] == pytest.approx(9 / 20)
    assert choice["chosen"] == 0.3 and model.network.prior_shift == 0.3


def _wide_fused_data(n=2400, f=300, L=5000):
    """A wide output (early stopping, the fusion and the shift chosen on the split) whose
    validation points all fit the epoch checks."""
    rng = np.random.default_rng(3)
    X = sp.random(n, f, density=0.03, format="csr", dtype=np.float32, random_state=3)
    labels = (np.minimum(rng.zipf(1.3, n), 999) * 5).astype(np.int64)
    data = XMCData(X, sp.csr_matrix((np.ones(n, np.float32), labels, np.arange(n + 1)), shape=(n, L)))
    cfg = Config(hidden=(16,), batch_size=100, threads=1).resolve(L, points_per_label(data.Y), n)
    assert cfg.early_stop and cfg.knn is None and cfg.prior_shift is None
    assert V.check_rows(V.validation_size(n), L).size == V.validation_size(n)
    return data, cfg


def _counting(monkeypatch, IB):
    """The sizes of the batches IB.predict_topk_scores scores from now on."""
    calls, scores = [], IB.predict_topk_scores
    monkeypatch.setattr(IB, "predict_topk_scores", lambda *a, **kw: calls.append(a[1].shape[0]) or scores(*a, **kw))
    return calls


def test_fit_scores_the_kept_weights_and_the_chosen_shift_once(monkeypatch):
    """A fused wide output stopped early: the prior shift takes the epoch checks' figures of the
    kept weights for the shift 0, and the fusion choice the prior shift's candidates at the shift
    it chose, instead of scoring either again; both records equal a fresh scoring of the model."""
    from dslide.config import PRIOR_SHIFTS
    from dslide.train import infer_build as IB

    data, cfg = _wide_fused_data()
    n = data.n_points
    calls = _counting(monkeypatch, IB)
    model, _ = T.fit(data, cfg, index=False)
    early, shift, fusion = (model.index_info[k] for k in ("early_stop", "prior_shift", "fusion_choice"))
    fresh_zero = shift["chosen"] == 0.0 and early["kept_step"] != early["curve"][-1][0]
    n_val = V.validation_size(n)
    # every scoring covers every validation point: the checks, one pass for the shifts but 0, no other
    assert 2 <= len(shift["p@1/p@5"]) <= len(PRIOR_SHIFTS)  # the walk may stop before the last
    assert calls == [n_val] * (len(early["curve"]) + 1 + fresh_zero)
    fit_data, val, _ = V.split(data, cfg.seed)
    probe = IB.fusion_probe(model, fit_data, val)
    scorer, counts = IB.EpochScorer(model, val, probe), IB.label_counts(data)
    for tau, figures in shift["p@1/p@5"].items():
        model.network.shift_output_prior(float(tau), counts, n)
        assert list(scorer(model)) == figures, tau
    model.network.shift_output_prior(shift["chosen"], counts, n)
    IB.build_neighbours(model, data, val=val, fit_data=fit_data, probe=probe)
    assert model.index_info["fusion_choice"] == fusion


@pytest.mark.parametrize("chosen", [0.0, 0.2])
def test_the_shift_chosen_hands_on_its_candidates_and_the_shift_0_takes_what_was_kept(monkeypatch, chosen):
    """apply_prior_shift given the kept weights' scoring does not score the shift 0 again, scores
    the other shifts in one pass, and returns the network's candidates at the shift it chose:
    those of the kept scoring at 0, else those of a fresh exact scoring of every validation point
    with the biases shifted."""
    from dslide.train import infer_build as IB

    data, cfg = _wide_fused_data()
    model, _ = T.fit(data, cfg.replace(epochs=1.0, early_stop=False, prior_shift=0.0), index=False)
    model.config = cfg
    fit_data, val, _ = V.split(data, cfg.seed)
    probe = IB.fusion_probe(model, fit_data, val)
    scorer = IB.EpochScorer(model, val, probe)
    kept = (scorer(model), scorer.last)
    assert kept[1] is not None and kept[1][0].shape == (val.n_points, scorer.k)
    # the choice itself stubbed: every shift scored, `chosen` taken
    monkeypatch.setattr(IB.validation, "choose_prior_shift", lambda score, shifts: (chosen, {t: score(t) for t in shifts}))
    calls = _counting(monkeypatch, IB)
    got = IB.apply_prior_shift(model, data, val, probe, scorer, kept)
    # the three shifts but 0 in one pass of products; 0 from what was kept
    assert calls == [val.n_points] and model.network.prior_shift == chosen
    assert model.index_info["prior_shift"]["p@1/p@5"]["0"] == list(kept[0])
    want = IB.predict_topk_scores(model, val.X, scorer.k, exact=True, fused=False)
    if chosen == 0.0:
        assert got is kept[1]
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
