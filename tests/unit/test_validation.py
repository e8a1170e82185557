"""The validation split and the choices made on it (dslide.train.validation): the split is a
function of the seed alone and disjoint from the gradient's points; each choice keeps its
no-op on data built so that the no-op is best, and takes the other candidate on data built
so that it helps; early stopping keeps the best epoch's weights."""

import numpy as np
import pytest
import scipy.sparse as sp

from dslide.infer import fusion
from dslide.train import validation as V


def test_the_split_is_a_function_of_the_seed_and_its_size_follows_the_rule():
    assert V.validation_size(1999) == 0
    assert V.validation_size(2000) == 500  # at most a quarter
    assert V.validation_size(4000) == 1000
    assert V.validation_size(45_697) == 2285  # 5 %
    assert V.validation_size(100_000) == 5000
    assert V.validation_size(300_000) == 5000  # at most VALIDATION_MAX
    a, b = V.validation_rows(10_000, 7), V.validation_rows(10_000, 7)
    np.testing.assert_array_equal(a, b)
    assert a.size == 1000 and np.all(np.diff(a) > 0) and a[0] >= 0 and a[-1] < 10_000
    assert not np.array_equal(a, V.validation_rows(10_000, 8))
    assert V.validation_rows(1500, 7).size == 0


def test_split_parts_are_disjoint_and_cover_the_data():
    rng = np.random.default_rng(0)
    n = 3000
    X = sp.csr_matrix(np.arange(n, dtype=np.float32)[:, None] + 1)  # row i holds the value i + 1
    Y = sp.csr_matrix((np.ones(n, np.float32), rng.integers(0, 50, n), np.arange(n + 1)), shape=(n, 50))
    from dslide.io.data import XMCData

    fit, val, rows = V.split(XMCData(X, Y), seed=3)
    got_fit = set(fit.X.toarray()[:, 0].astype(int) - 1)
    got_val = set(val.X.toarray()[:, 0].astype(int) - 1)
    assert got_val == set(rows.tolist()) and not (got_fit & got_val) and len(got_fit | got_val) == n
    np.testing.assert_array_equal(val.Y.toarray(), Y[rows].toarray())


def _duplicates(n_labels=300, per=6, f=400, seed=0):
    """Clusters of near-duplicate rows, one label each: a point's nearest training points hold its label."""
    rng = np.random.default_rng(seed)
    centres = rng.random((n_labels, f)) * (rng.random((n_labels, f)) < 0.05)
    rows, labels = [], []
    for j in range(n_labels):
        for _ in range(per):
            rows.append(centres[j] + 0.01 * rng.random(f) * (centres[j] > 0))
            labels.append(j)
    X = sp.csr_matrix(np.asarray(rows, np.float32))
    Y = sp.csr_matrix((np.ones(len(labels), np.float32), labels, np.arange(len(labels) + 1)),
                      shape=(len(labels), n_labels))
    return X, Y


def _choose(store, Xq, Yq, m_ids, m_logits):
    nn_ids, nn_sims = store.neighbours(Xq, 20)
    pr_ids, pr_sims = store.prototypes(Xq, 8)
    return V.choose_fusion(store, Yq, m_ids, m_logits, nn_ids, nn_sims, pr_ids, pr_sims, counts=(10, 5, 20),
                           shares=(0.0, 0.5), weights=V.FUSION_WEIGHTS, power=4.0, pr_power=16.0,
                           temperatures=V.FUSION_TEMPERATURES, tempered_weights=V.FUSION_TEMPERED_WEIGHTS)


def test_fusion_is_chosen_where_the_neighbours_know_and_the_network_does_not():
    X, Y = _duplicates()
    n = X.shape[0]
    q = np.arange(0, n, 6)  # one point of every cluster held out
    keep = np.setdiff1d(np.arange(n), q)
    store = fusion.NeighbourLabels.build(X[keep], Y[keep], prototypes=True)
    rng = np.random.default_rng(1)
    m_ids = np.stack([rng.permutation(Y.shape[1])[:20] for _ in q]).astype(np.int64)  # a network that knows nothing
    m_logits = np.sort(rng.random(m_ids.shape))[:, ::-1].copy()
    (c, a, w, t), figures = _choose(store, X[q], Y[q], m_ids, m_logits)
    assert w > 0
    assert sum(figures[(c, a, w, t)]) > sum(figures[(0, 0.0, 0.0, 1.0)]) + V.CHOICE_MARGIN
    assert figures[(c, a, w, t)][0] > 0.9  # the held-out points' clusters vote their label


def test_the_network_alone_is_chosen_where_the_labels_are_independent_of_the_neighbours():
    X, Y = _duplicates()
    n, L = Y.shape
    rng = np.random.default_rng(2)
    shuffled = sp.csr_matrix((np.ones(n, np.float32), rng.integers(0, L, n), np.arange(n + 1)), shape=(n, L))
    q = np.arange(0, n, 6)
    keep = np.setdiff1d(np.arange(n), q)
    store = fusion.NeighbourLabels.build(X[keep], shuffled[keep], prototypes=True)
    truth = shuffled[q]
    # a network whose first candidate is the true label, the rest random
    m_ids = np.stack([np.r_[t, rng.permutation(np.setdiff1d(np.arange(L), [t]))[:19]]
                      for t in truth.indices]).astype(np.int64)
    m_logits = np.tile(np.r_[3.0, np.linspace(1, 0, 19)], (len(q), 1))
    choice, figures = _choose(store, X[q], truth, m_ids, m_logits)
    assert choice == (0, 0.0, 0.0, 1.0)
    assert figures[(0, 0.0, 0.0, 1.0)][0] == 1.0
    assert {k[3] for k in figures} == set(V.FUSION_TEMPERATURES)  # every temperature was tried
    assert all(v[0] < 1.0 for k, v in figures.items() if k[2] >= 0.6)  # heavy fusion would cost P@1


def test_a_temperature_replaces_the_choice_at_1_only_by_more_than_the_margin():
    m = V.CHOICE_MARGIN
    off, plain, hot, hotter = (0, 0.0, 0.0, 1.0), (10, 0.5, 0.3, 1.0), (10, 0.5, 0.02, 4.0), (5, 0.5, 0.05, 2.0)
    assert V.pick_tempered({off: 1.0, plain: 1.0 + 2 * m, hot: 1.0 + 2.5 * m}, off) == plain  # within the margin
    assert V.pick_tempered({off: 1.0, plain: 1.0 + 2 * m, hot: 1.0 + 3.5 * m}, off) == hot
    # the fused cell at 1 within the margin of the network alone: a temperature must beat the network alone
    assert V.pick_tempered({off: 1.0, plain: 1.0 + m / 2, hot: 1.0 + 0.8 * m}, off) == off
    assert V.pick_tempered({off: 1.0, plain: 1.0 + m / 2, hot: 1.0 + 1.5 * m}, off) == hot
    # the highest of the other temperatures, the first of equals
    assert V.pick_tempered({off: 1.0, hot: 1.1, hotter: 1.2}, off) == hotter
    assert V.pick_tempered({off: 1.0, hotter: 1.2, hot: 1.2}, off) == hotter
    # every cell at a temperature given by the setting: the plain pick among them
    assert V.pick_tempered({off: 1.0, hot: 1.0 + m / 2}, off) == off
    assert V.pick_tempered({off: 1.0, hot: 1.0 + 2 * m}, off) == hot


def test_pick_keeps_the_noop_within_the_margin():
    assert V.pick({"off": 1.0, "on": 1.0 + V.CHOICE_MARGIN / 2}, "off") == "off"
    assert V.pick({"off": 1.0, "on": 1.0 + 2 * V.CHOICE_MARGIN}, "off") == "on"
    assert V.pick({"off": 1.0, "a": 0.5}, "off") == "off"


class _Layer:
    def __init__(self):
        self.W, self.b = np.zeros((2, 2), np.float32), np.zeros(2, np.float32)


class _Net:
    def __init__(self):
        self.layers, self.step, self.lr_scale = [_Layer()], 0, 1.0


class _Model:
    def __init__(self):
        self.network = _Net()


def test_early_stopping_stops_after_patience_and_puts_back_the_best_weights():
    # the validation score rises, peaks at the second epoch, then falls
    script = iter([(0.30, 0.10), (0.40, 0.15), (0.35, 0.12), (0.20, 0.05)])
    model = _Model()
    early = V.EarlyStop(lambda m: next(script), steps_per_epoch=10, patience=1, decays=0, first_plateau=1)
    cb = early.callback()
    stopped_at = None
    for step in range(1, 100):
        model.network.step = step
        model.network.layers[0].W[:] = step  # the weights of each step
        if cb("step", model, step) == "stop":
            stopped_at = step
            break
    assert stopped_at == 30  # epoch 3 did not beat epoch 2
    info = early.finish(model)
    assert info["kept_step"] == 20 and len(info["curve"]) == 3
    assert np.all(model.network.layers[0].W == 20)  # epoch 2's weights are back


def _drive(early, scores):
    """Run `early` over the scripted (P@1, P@5) `scores` of each epoch (10 steps, weights = the
    step): (the step it stopped at, {step: (lr_scale, W after the check)}, the model)."""
    script = iter(scores)
    early.scorer = lambda m: next(script)
    model = _Model()
    cb, seen = early.callback(), {}
    for step in range(1, 10 * len(scores) + 1):
        model.network.step = step
        model.network.layers[0].W[:] = step
        out = cb("step", model, step)
        seen[step] = (model.network.lr_scale, model.network.layers[0].W[0, 0])
        if out == "stop":
            break
    return step, seen, model


def _run_early(scores, **kw):
    """EarlyStop (patience 1, one decay to a quarter) over scripted scores (`_drive`): (the step it
    stopped at, {step: (lr_scale, W after the check)}, finish's record, model). A plateau may
    come at any check unless `first_plateau` is given."""
    early = V.EarlyStop(None, steps_per_epoch=10, patience=1, decay=0.25, decays=1, **{"first_plateau": 1, **kw})
    step, seen, model = _drive(early, scores)
    return step, seen, early.finish(model), model


@pytest.mark.parametrize("after_decay, stop", [(None, 50), (1, 40), (2, 50)])
def test_a_plateau_first_lowers_the_learning_rate_from_the_best_epoch(after_decay, stop):
    scores = [(0.30, 0.10), (0.40, 0.15), (0.35, 0.12), (0.45, 0.16), (0.44, 0.16), (0.50, 0.20)]
    step, seen, info, model = _run_early(scores, after_decay=after_decay)
    assert seen[30] == (0.25, 20)  # epoch 3 lost: epoch 2's weights back, a quarter of the learning rate
    # epoch 4 (after the decay) gained; None: epoch 5 did not, stop there; 1: stop after epoch 4;
    # 2: stop after epoch 5 whatever it scored
    assert step == stop
    assert info["kept_step"] == 40 and info["lr_lowered_at"] == [30]
    assert model.network.lr_scale == 1.0 and np.all(model.network.layers[0].W == 40)


def test_a_plateau_within_the_margin_does_not_replace_the_best_weights():
    # epoch 3 scores above epoch 2 but by less than the margin (the checks measure no finer):
    # the lower rate goes on from epoch 2's weights, and one epoch later (it lost) they are kept
    gain = V.EARLY_STOP_MIN_GAIN / 2
    step, seen, info, model = _run_early([(0.30, 0.10), (0.40, 0.15), (0.40 + gain, 0.15), (0.30, 0.10)],
                                         after_decay=1)
    assert seen[30] == (0.25, 20)
    assert step == 40  # one epoch after the decay, though it lost
    assert info["kept_step"] == 20 and np.all(model.network.layers[0].W == 20)
    assert [c[0] for c in info["curve"]] == [10, 20, 30, 40]


def _default_early(scores):
    """EarlyStop with fit's defaults over scripted scores (`_drive`): (the step it stopped at,
    {step: (lr_scale, W after the check)}, the EarlyStop)."""
    early = V.EarlyStop(None, steps_per_epoch=10)
    step, seen, _ = _drive(early, scores)
    return step, seen, early


def test_a_young_networks_small_gain_is_no_plateau_but_a_loss_is():
    """By default (EARLY_STOP_FIRST_PLATEAU = 4) a check before the 4th that scores above the best by
    less than the margin keeps training at its rate from the weights it reached (the best not
    replaced); from the 4th on the same small gain is the plateau (the best epoch's weights back at
    a quarter of the rate). A check that loses is a plateau at any time. With first_plateau 1 the
    small gain at check 2 is already the plateau."""
    assert V.EARLY_STOP_FIRST_PLATEAU == 4
    small = V.EARLY_STOP_MIN_GAIN / 2
    scores = [(0.40, 0.15), (0.40 + small, 0.15), (0.40 + 1.5 * small, 0.15), (0.40 + small, 0.15),
              (0.50, 0.20), (0.55, 0.20)]
    step, seen, early = _default_early(scores)
    assert seen[20] == (1.0, 20) and seen[30] == (1.0, 30)  # no plateau: on from the weights reached
    assert seen[40] == (0.25, 10) and early.decayed_at == [40]  # the 4th check: epoch 1's weights back
    assert step == 50  # one epoch after the decay
    assert early.best_step == 50
    step, seen, info, _ = _run_early(scores)  # first_plateau 1
    assert seen[20] == (0.25, 10) and step == 30 and info["lr_lowered_at"] == [20]
    # a loss at the second check is the plateau by default too
    step, seen, early = _default_early([(0.40, 0.15), (0.39, 0.15), (0.45, 0.16), (0.30, 0.10)])
    assert seen[20] == (0.25, 10) and early.decayed_at == [20] and step == 30


def test_the_default_stops_one_epoch_after_the_decay():
    assert V.EARLY_STOP_AFTER_DECAY == 1
    step, _, info, _ = _run_early([(0.30, 0.10), (0.40, 0.15), (0.35, 0.12), (0.45, 0.16), (0.50, 0.20)])
    assert step == 40 and info["kept_step"] == 40


def test_fit_holds_the_validation_points_out_and_picks_the_noop_on_independent_labels():
    """A wide output (5,000 labels) whose labels are independent of the features: the
    neighbours' labels cannot help, so training keeps the network alone; the network's
    gradient steps cover only the points outside the validation split."""
    from dslide import train as T
    from dslide.config import Config, points_per_label
    from dslide.io.data import XMCData

    rng = np.random.default_rng(5)
    n, f, L = 2400, 300, 5000
    X = sp.random(n, f, density=0.03, format="csr", dtype=np.float32, random_state=5)
    X.data[:] = 1.0
    labels = (np.minimum(rng.zipf(1.3, n), 999) * 5).astype(np.int64)  # a long tail, few points per label
    Y = sp.csr_matrix((np.ones(n, np.float32), labels, np.arange(n + 1)), shape=(n, L))
    cfg = Config(hidden=(16,), batch_size=100, threads=1)
    resolved = cfg.resolve(L, points_per_label(Y), n)
    assert resolved.early_stop and resolved.knn is None and resolved.knn_weight is None
    model = T.build_network((f, L), resolved)
    model, history = T.fit(XMCData(X, Y), resolved, model=model, index=False)
    n_val = V.validation_size(n)
    steps_per_epoch = -(-(n - n_val) // 100)
    assert model.index_info["early_stop"]["curve"][0][0] == steps_per_epoch
    choice = model.index_info["fusion_choice"]
    assert choice["validation_points"] == n_val and choice["chosen"] == "off"
    assert model.neighbours is None


def test_the_summary_names_what_its_figures_are_and_the_choices_behind_them():
    from dslide.cli.train import choice_lines

    info = {"fusion_choice": {"chosen": {"knn": 20, "proto_weight": 0.25, "knn_weight": 0.2},
                              "validation_points": 2285,
                              "p@1/p@5": {"knn 0 share 0.0 weight 0.0": [0.68, 0.34],
                                          "knn 20 share 0.25 weight 0.2": [0.70, 0.36]}},
            "early_stop": {"kept_step": 680, "curve": [[340, 0.61, 0.31], [680, 0.68, 0.34], [1020, 0.67, 0.35]]}}
    lines = choice_lines(info)
    assert lines[0] == "with neighbour labels: knn 20, prototypes' share 0.25, weight 0.2"
    assert "network alone P@1 0.6800 P@5 0.3400; chosen P@1 0.7000 P@5 0.3600" in lines[1]
    assert "2,285 validation points" in lines[1]
    assert lines[2].startswith("early stopping: kept step 680 of 1020 (validation P@1 0.6800 P@5 0.3400")
    assert "bounded" not in lines[1]
    info["probe_search"] = {"search": "bounded", "exact_reads": 2_300_000_000}
    assert ("2,285 validation points (their neighbours by the bounded search: the exact one would read "
            "2,300,000,000 posting entries): network alone") in choice_lines(info)[1]
    # a temperature above 1: named, and its cell's figures are the chosen ones
    info["fusion_choice"]["chosen"] = {"knn": 10, "proto_weight": 0.5, "knn_weight": 0.02, "knn_temperature": 4.0}
    info["fusion_choice"]["p@1/p@5"]["knn 10 share 0.5 weight 0.02 temperature 4"] = [0.71, 0.37]
    lines = choice_lines(info)
    assert lines[0] == "with neighbour labels: knn 10, prototypes' share 0.5, weight 0.02, softmax temperature 4"
    assert "chosen P@1 0.7100 P@5 0.3700" in lines[1]
    info["fusion_choice"]["chosen"] = "off"
    assert choice_lines(info)[0] == "network alone"
    assert choice_lines({}) == []
    # the hidden neighbours: the figures of the scores before them and of the cell chosen, or why they are off
    hidden = {"chosen": {"hidden_knn": 10, "hidden_knn_power": 4.0, "hidden_knn_weight": 0.06}, "validation_points": 2285,
              "p@1/p@5": {"hidden_knn 0 power 0 weight 0": [0.7365, 0.3749],
                          "hidden_knn 10 power 4 weight 0.06": [0.7514, 0.3812]}}
    assert choice_lines({"hidden_choice": hidden}) == [
        "hidden neighbours (10 of them, cosine^4, weight 0.06) chosen on 2,285 validation points: off P@1 0.7365 "
        "P@5 0.3749; chosen P@1 0.7514 P@5 0.3812"]
    hidden["chosen"] = "off"
    assert choice_lines({"hidden_choice": hidden})[0].startswith("hidden neighbours (off) chosen on 2,285 validation "
                                                                  "points: off P@1 0.7365 P@5 0.3749; chosen P@1 0.7365")
    assert choice_lines({"hidden_choice": {"chosen": "off", "why": "no validation split to check it on"}}) == [
        "hidden neighbours off: no validation split to check it on"]
    # the prior shift: its validation figures where chosen, its reason where fixed, nothing when off and fixed
    chosen = {"chosen": 0.2, "validation_points": 2285, "p@1/p@5": {"0": [0.61, 0.31], "0.1": [0.615, 0.312],
                                                                     "0.2": [0.62, 0.315], "0.3": [0.618, 0.31]}}
    assert choice_lines({"prior_shift": chosen}) == [
        "prior shift 0.2 chosen on 2,285 validation points: off P@1 0.6100 P@5 0.3100; chosen P@1 0.6200 P@5 0.3150"]
    fixed = {"chosen": 0.2, "why": "fixed by the setting or the narrow outputs' rule"}
    assert choice_lines({"prior_shift": fixed}) == ["prior shift 0.2, fixed by the setting or the narrow outputs' rule"]
    assert choice_lines({"prior_shift": {"chosen": 0.0, "why": "no validation split to check it on"}}) == []


def test_the_epoch_checks_score_a_budget_of_the_validation_points_chosen_by_shape():
    assert V.check_rows(2285, 41_488).size == 2285  # 1e8 label scores cover the whole split
    rows = V.check_rows(1500, 670_091)
    assert rows.size == V.EARLY_STOP_MIN_POINTS and rows[0] == 0 and rows[-1] == 1499
    np.testing.assert_array_equal(rows, V.check_rows(1500, 670_091))
    assert np.all(np.diff(rows) > 0)


def test_the_probe_scores_the_best_of_its_grid_the_network_alone_included():
    X, Y = _duplicates()
    n = X.shape[0]
    q = np.arange(0, n, 6)
    keep = np.setdiff1d(np.arange(n), q)
    from dslide.io.data import XMCData

    probe = V.FusionProbe.build(XMCData(X[keep], Y[keep]), XMCData(X[q], Y[q]), (10, 5, 20), True, 8)
    rng = np.random.default_rng(1)
    m_ids = np.stack([rng.permutation(Y.shape[1])[:20] for _ in q]).astype(np.int64)
    m_logits = np.sort(rng.random(m_ids.shape))[:, ::-1].copy()
    rows = np.arange(len(q))
    best = probe.best(m_ids, m_logits, rows, 4.0, 16.0)
    alone = V.choose_fusion(probe.store, probe.truth, m_ids, m_logits, probe.nn_ids[:, :10], probe.nn_sims[:, :10],
                            None, None, counts=(10,), shares=(0.0,), weights=(0.0,), power=4.0, pr_power=16.0)[1]
    assert sum(best) > sum(alone[(0, 0.0, 0.0, 1.0)]) + 0.5  # the neighbours know the clusters, the network does not
    half = np.arange(0, len(q), 2)
    assert probe.best(m_ids[half], m_logits[half], half, 4.0, 16.0)[0] > 0.9


def test_search_reads_counts_the_posting_entries_of_every_query_feature():
    rng = np.random.default_rng(3)
    X = sp.csr_matrix(rng.random((60, 30)) * (rng.random((60, 30)) < 0.2), dtype=np.float32)
    Y = sp.csr_matrix((rng.random((60, 12)) < 0.15).astype(np.float32))
    Xq = sp.csr_matrix(rng.random((9, 30)) * (rng.random((9, 30)) < 0.3), dtype=np.float32)
    store = fusion.NeighbourLabels.build(X, Y, prototypes=True)
    # by brute force: for each query and each of its features, the training points (the labels
    # with a point) holding that feature
    held = X.toarray() != 0
    lab_held = (Y.T.toarray() @ held) > 0
    qd = Xq.toarray() != 0
    assert store.search_reads(Xq) == sum(int(held[:, f].sum()) for q in qd for f in np.flatnonzero(q)) > 0
    assert store.search_reads(Xq, "prototypes") == sum(int(lab_held[:, f].sum()) for q in qd for f in np.flatnonzero(q))
    with pytest.raises(ValueError, match="'labels'.*'points' or 'prototypes'"):
        store.search_reads(Xq, "labels")
    with pytest.raises(ValueError, match="queries have 29 features but the neighbour store holds 30"):
        store.search_reads(Xq[:, :29])


def test_the_probe_searches_exactly_within_its_read_budget_and_bounded_past_it():
    from dslide.infer.approx import Bound
    from dslide.io.data import XMCData

    X, Y = _duplicates()
    n = X.shape[0]
    q = np.arange(0, n, 6)
    keep = np.setdiff1d(np.arange(n), q)
    fit, val = XMCData(X[keep], Y[keep]), XMCData(X[q], Y[q])
    tight = Bound(postings=2, query_features=2, candidates=20)  # misses neighbours the exact search finds
    store = fusion.NeighbourLabels.build(fit.X, fit.Y, prototypes=True)
    reads = store.search_reads(val.X) + store.search_reads(val.X, "prototypes")
    exact = V.FusionProbe.build(fit, val, (10, 5, 20), True, 8, bound=tight, max_exact_reads=reads)
    bounded = V.FusionProbe.build(fit, val, (10, 5, 20), True, 8, bound=tight, max_exact_reads=reads - 1)
    assert exact.search == {"search": "exact", "exact_reads": reads}
    assert bounded.search == {"search": "bounded", "exact_reads": reads}
    e_ids, e_sims = store.neighbours(val.X, 20)
    b_ids, b_sims = store.neighbours(val.X, 20, approx=tight)
    assert not np.array_equal(e_ids, b_ids)  # the two searches differ on this data
    np.testing.assert_array_equal(exact.nn_ids, e_ids)
    np.testing.assert_array_equal(exact.nn_sims, e_sims)
    np.testing.assert_array_equal(bounded.nn_ids, b_ids)
    np.testing.assert_array_equal(bounded.nn_sims, b_sims)
    np.testing.assert_array_equal(exact.pr_ids, store.prototypes(val.X, 8)[0])
    np.testing.assert_array_equal(bounded.pr_ids, store.prototypes(val.X, 8, approx=tight)[0])
    # searched once, the probes keep no rows or pruned lists (the store searched here does)
    assert exact.store._derived == {} and bounded.store._derived == {} and store._derived


def test_a_busy_stage_says_so_every_few_seconds(capsys):
    import time

    from dslide.train.infer_build import _busy

    with _busy("building something", True, every=0.2):
        time.sleep(0.5)
    err = capsys.readouterr().err
    assert err.count("[dslide] building something (") >= 1
    with _busy("quiet", False, every=0.1):
        time.sleep(0.25)
    assert capsys.readouterr().err == ""


def test_the_index_build_keeps_what_training_recorded():
    """build_index adds its timings to model.index_info; the early-stopping record stays."""
    from dslide import train as T
    from dslide.config import Config, LSHConfig, points_per_label
    from dslide.io.data import XMCData

    rng = np.random.default_rng(6)
    n, f, L = 2400, 200, 5000
    X = sp.random(n, f, density=0.05, format="csr", dtype=np.float32, random_state=6)
    Y = sp.csr_matrix((np.ones(n, np.float32), rng.integers(0, 2000, n), np.arange(n + 1)), shape=(n, L))
    lsh = LSHConfig(anchors=8, index_anchors=16, index_points=300, index_neighbors=3, index_search=8, index_degree=4,
                    index_min_width=0)
    cfg = Config(hidden=(8,), kinds=("dense", "lsh"), batch_size=200, epochs=2.0, early_stop=True, knn=0, lsh=lsh)
    model, _ = T.fit(XMCData(X, Y), cfg.resolve(L, points_per_label(Y), n), index=True)
    assert "index_s" in model.index_info and len(model.index_info["early_stop"]["curve"]) >= 1


def test_the_middle_epochs_draw_a_share_of_the_negatives_until_the_decay():
    """negative_share: every negative in the first epoch, `middle` of them from the second until
    early stopping lowers the learning rate, every one from the step after it; without early
    stopping the share holds to the end, and 1 (or a model resolved before the setting) changes
    nothing."""
    from dslide.train.loop import negative_share

    script = iter([(0.30, 0.10), (0.40, 0.15), (0.35, 0.12), (0.45, 0.16), (0.50, 0.20)])
    model = _Model()
    early = V.EarlyStop(lambda m: next(script), steps_per_epoch=10, patience=1, decay=0.25, decays=1,
                        first_plateau=1)
    share, cb = negative_share(0.25, 10, early), early.callback()
    seen = {}
    for step in range(1, 51):
        seen[step] = share(step)  # what the loop gives the step before training it
        model.network.step = step
        if cb("step", model, step) == "stop":
            break
    assert early.decayed_at == [30]  # epoch 3 lost: the decay
    assert {s for s, v in seen.items() if v == 0.25} == set(range(11, 31))
    assert all(seen[s] == 1.0 for s in list(range(1, 11)) + list(range(31, step + 1)))
    alone = negative_share(0.5, 10)
    assert [alone(s) for s in (1, 10, 11, 500)] == [1.0, 1.0, 0.5, 0.5]
    assert {negative_share(m, 10)(s) for m in (1.0, None) for s in (1, 11, 99)} == {1.0}


def test_a_fit_draws_the_middle_epochs_share_of_its_uniform_negatives():
    """A wide LSH output stopped early: the blocks of the first epoch and of the epochs after
    the decay hold the full 400 uniform negatives but the batch's labels among them (at least
    300 here), those between a quarter of them (100 but the labels among them); the middle share is the default
    where early stopping is on, and every negative where it is off."""
    from dslide import train as T
    from dslide.config import MIDDLE_NEGATIVES, Config, LSHConfig, points_per_label
    from dslide.io.data import XMCData

    rng = np.random.default_rng(7)
    n, f, L = 2400, 200, 5000
    X = sp.random(n, f, density=0.05, format="csr", dtype=np.float32, random_state=7)
    labels = rng.integers(0, L, n)  # independent of the features: the validation score plateaus
    Y = sp.csr_matrix((np.ones(n, np.float32), labels, np.arange(n + 1)), shape=(n, L))
    cfg = Config(hidden=(8,), batch_size=100, threads=1, knn=0, kinds=("dense", "lsh"),
                 lsh=LSHConfig(min_active=400, min_active_share=1.0, max_active=0))
    resolved = cfg.resolve(L, points_per_label(Y), n)
    assert MIDDLE_NEGATIVES == 0.25 and resolved.early_stop and resolved.middle_negatives == MIDDLE_NEGATIVES
    assert cfg.replace(epochs=3.0).resolve(L, points_per_label(Y), n).middle_negatives == 1.0
    # narrow outputs, replicas and data without a split do not stop early: every negative
    assert Config().resolve(500, 8.2, 30_000).middle_negatives == 1.0
    assert Config(replicas=2).resolve(L, 1.3, 30_000).middle_negatives == 1.0
    assert Config().resolve(L, 1.3, 1_000).middle_negatives == 1.0
    assert Config(middle_negatives=0.5, epochs=3.0).resolve(L, 1.3, 30_000).middle_negatives == 0.5
    with pytest.raises(ValueError, match="middle_negatives"):
        Config(middle_negatives=0.0)
    model = T.build_network((f, L), resolved)
    drawn = []
    model.network.layers[-1].block_hook = lambda b: drawn.append(b.random)
    model, _ = T.fit(XMCData(X, Y), resolved, model=model, index=False)
    info = model.index_info["early_stop"]
    per_epoch = info["curve"][0][0]
    assert len(info["lr_lowered_at"]) == 1, info
    decay = info["lr_lowered_at"][0]
    assert len(drawn) == model.network.step > decay > per_epoch
    steps = np.arange(1, len(drawn) + 1)
    middle = (steps > per_epoch) & (steps <= decay)
    drawn = np.array(drawn)
    assert (drawn[middle] <= 100).all() and (drawn[middle] > 50).all()
    assert (drawn[~middle] >= 300).all()
    assert model.network.layers[-1].n_random == 400  # every one again once the run is over
