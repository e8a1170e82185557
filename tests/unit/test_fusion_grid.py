"""The fusion grid scored in one kernel pass per count (fusion.fuse_grid_hits, validation.choose_fusion)
against `fuse` and `metrics.evaluate` cell by cell: the same figures, exactly."""

import numpy as np
import pytest
import scipy.sparse as sp

from dslide import metrics
from dslide.infer import fusion
from dslide.train import validation as V

SHARES = (0.0, 0.25, 0.5, 0.75, 1.0)
WEIGHTS = (0.0, 0.1, 0.3, 0.5, 0.9, 1.0)  # 1.0: every model candidate scores 0, tied
COUNTS = (4, 1, 8)


def _labels(rng, rows, n_labels, most):
    """csr [rows, n_labels]: up to `most` distinct labels a row, some rows none."""
    per = rng.integers(0, most + 1, rows)
    cols = np.concatenate([rng.choice(n_labels, c, replace=False) for c in per]).astype(np.int32)
    Y = sp.csr_matrix((np.ones(cols.size, np.float32), cols, np.r_[0, np.cumsum(per)]), shape=(rows, n_labels))
    Y.sort_indices()
    return Y


def _grid_inputs(seed, n=150, n_points=40, n_labels=20, K=12, kn=8, kp=6):
    """A store and its queries' arrays whose values come from a few levels, so that fused scores tie:
    missing candidates (-1), queries without candidates, neighbours or prototypes, similarities
    <= 0, training points and queries without labels."""
    rng = np.random.default_rng(seed)
    X = sp.random(n_points, 8, density=0.5, format="csr", random_state=rng, dtype=np.float32)
    store = fusion.NeighbourLabels.build(X, _labels(rng, n_points, n_labels, 5))

    def pick(width, n_items, levels):
        ids = np.stack([rng.permutation(n_items)[:width] for _ in range(n)]).astype(np.int64)
        ids[rng.random(ids.shape) < 0.2] = -1
        return ids, rng.choice(levels, ids.shape)

    m_ids, m_logits = pick(K, n_labels, [0.0, 0.5, 1.0])
    m_ids[0] = -1
    m_ids[5:15, 2:] = -1  # with few neighbours below: fewer than 5 labels
    nn_ids, nn_sims = pick(kn, n_points, [-0.5, 0.0, 0.3, 0.6, 1.0])
    nn_ids[1:3] = -1
    nn_ids[5:15, 1:] = -1
    pr_ids, pr_sims = pick(kp, n_labels, [0.0, 0.4, 0.7, 1.0])
    pr_ids[3] = -1
    pr_sims[4] = 0.0
    truth = _labels(rng, n, n_labels, 3)
    return (store, truth, m_ids, m_logits.astype(np.float64), nn_ids.astype(np.int32), nn_sims.astype(np.float32),
            pr_ids.astype(np.int32), pr_sims.astype(np.float32))


def _cell_hits(store, truth, m_ids, m_logits, nn_ids, nn_sims, pr_ids, pr_sims, share, weight, power, pr_power):
    """`fuse` of one cell as choose_fusion called it (no prototypes where the share is 0), its
    labels looked up as evaluate does: (ids, scores, hits float64 [n, 5])."""
    ids, scores = store.fuse(m_ids, m_logits, nn_ids, nn_sims, weight, power, 5, pr_ids if share > 0 else None,
                             pr_sims if share > 0 else None, share, pr_power)
    return ids, scores, metrics._Prepared(truth, ids, 5).hits


def _kernel_scores(store, truth, m_ids, m_logits, nn_ids, nn_sims, pr_ids, pr_sims, power, pr_power, cells):
    """The kernel's top-5 scores of every cell (what choose_fusion does not ask for): float64 [m, n, 5]."""
    n = len(m_ids)
    scores = np.empty((len(cells), n, 5))
    cells = np.c_[cells, np.zeros(len(cells))]  # (share, weight, temperature 0: m_logits as given)
    fusion.fuse_grid_hits(m_ids, m_logits[None], nn_ids, nn_sims, store.arrays["y_ptr"], store.arrays["y_idx"], power,
                          pr_ids, pr_sims, pr_power, cells, truth.indptr.astype(np.int64), truth.indices,
                          np.empty((len(cells), n, 5), np.uint8), scores)
    return scores


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_grid_kernel_scores_every_cell_as_fuse_and_evaluate_do(seed):
    store, truth, m_ids, m_logits, nn_ids, nn_sims, pr_ids, pr_sims = _grid_inputs(seed)
    cells = np.array([(a, w) for a in SHARES for w in WEIGHTS], np.float64)
    ties = short = 0
    for c in COUNTS:
        nn = np.ascontiguousarray(nn_ids[:, :c]), np.ascontiguousarray(nn_sims[:, :c])
        hits = store.fuse_grid_hits(m_ids, m_logits, *nn, 2.0, pr_ids, pr_sims, 3.0, cells, truth, 5)
        assert hits.shape == (len(cells), len(m_ids), 5) and hits.dtype == np.uint8
        scores = _kernel_scores(store, truth, m_ids, m_logits, *nn, pr_ids, pr_sims, 2.0, 3.0, cells)
        for g, (a, w) in enumerate(cells):
            where = f"count {c}, share {a}, weight {w}"
            ids, fused, expected = _cell_hits(store, truth, m_ids, m_logits, *nn, pr_ids, pr_sims, a, w, 2.0, 3.0)
            np.testing.assert_array_equal(scores[g], fused, err_msg=where)  # bit for bit, -inf where no label
            np.testing.assert_array_equal(hits[g], expected, err_msg=where)
            r = metrics.evaluate(truth, ids, k=5)
            p = metrics.precision_from_hits(hits[g].astype(np.float64))
            assert (float(p[0]), float(p[4])) == (r["p@1"], r["p@5"]), where
            ties += int((fused[:, 1:] == fused[:, :-1]).any(axis=1).sum())
            short += int((ids == -1).any(axis=1).sum())
    # the data exercise what the kernel must get right: tied scores and fewer than 5 labels
    assert ties > 100 and short > 100
    assert truth.getnnz(axis=1).min() == 0
    with pytest.raises(ValueError, match="sorted, unique"):  # reversed columns: indices descending
        store.fuse_grid_hits(m_ids, m_logits, *nn, 2.0, pr_ids, pr_sims, 3.0, cells, truth[:, ::-1].tocsr(), 5)


def test_the_prototypes_are_left_out_where_the_share_is_0():
    """Labels only the prototypes hold appear at share > 0 and are absent (not scored 0) at share 0."""
    store, truth, m_ids, m_logits, nn_ids, nn_sims, pr_ids, pr_sims = _grid_inputs(3)
    m_ids[:] = -1
    nn_ids[:] = -1
    truth = sp.csr_matrix(np.where(pr_ids[:, :1] >= 0, 1, 0) * (np.arange(20) == np.maximum(pr_ids[:, :1], 0)))
    hits = store.fuse_grid_hits(m_ids, m_logits, nn_ids, nn_sims, 2.0, pr_ids, pr_sims, 3.0,
                                np.array([(0.0, 0.5), (0.5, 0.5)]), truth, 5)
    assert hits[0].sum() == 0 and hits[1].sum() > 0
    assert hits[1].sum() == _cell_hits(store, truth, m_ids, m_logits, nn_ids, nn_sims, pr_ids, pr_sims, 0.5, 0.5,
                                       2.0, 3.0)[2].sum()


def _choose_fusion_per_cell(store, truth, m_ids, m_logits, nn_ids, nn_sims, pr_ids, pr_sims, *, counts, shares,
                            weights, power, pr_power, temperatures=(1.0,), tempered_weights=None):
    """choose_fusion as it was: `fuse` of the logits divided by the temperature and `evaluate`
    for every cell."""
    figures = {}
    r = metrics.evaluate(truth, np.ascontiguousarray(m_ids[:, :5]), k=5)
    noop = (0, 0.0, 0.0, 1.0)
    figures[noop] = (float(r["p@1"]), float(r["p@5"]))
    for c in counts:
        for t in temperatures:
            for a in (shares if pr_ids is not None else (0.0,)):
                for w in (weights if t == 1 or tempered_weights is None else tempered_weights):
                    if w == 0:
                        continue
                    pred, _ = store.fuse(m_ids, m_logits / t, nn_ids[:, :c], nn_sims[:, :c], w, power, 5,
                                         pr_ids if a > 0 else None, pr_sims if a > 0 else None, a, pr_power)
                    r = metrics.evaluate(truth, pred, k=5)
                    figures[(int(c), float(a), float(w), float(t))] = (float(r["p@1"]), float(r["p@5"]))
    scores = {key: sum(v) for key, v in figures.items()}
    best = V.pick({key: s for key, s in scores.items() if key[3] == 1.0}, noop)  # the no-op's temperature first
    tempered = [key for key in scores if key[3] != 1.0]
    if tempered:  # then the first of the highest at another temperature, if above the margin over it
        top = max(scores[key] for key in tempered)
        if top > scores[best] + V.CHOICE_MARGIN:
            best = next(key for key in tempered if scores[key] == top)
    return best, figures


@pytest.mark.parametrize("temperatures", [(1.0,), (1.0, 2.5, 0.5)])
@pytest.mark.parametrize("prototypes", [True, False])
@pytest.mark.parametrize("seed", [0, 4])
def test_choose_fusion_gives_the_figures_and_choice_of_the_per_cell_loop(seed, prototypes, temperatures):
    store, truth, m_ids, m_logits, nn_ids, nn_sims, pr_ids, pr_sims = _grid_inputs(seed)
    # a stored zero (no label to evaluate) and a label stored twice (one label): choose_fusion reads them so too
    t = truth.tocoo()
    rows, cols, vals = np.r_[t.row, 5, 6, 6], np.r_[t.col, 7, 8, 8], np.r_[t.data, 0.0, 1.0, 1.0]
    o = np.lexsort((cols, rows))
    truth = sp.csr_matrix((vals[o], cols[o], np.r_[0, np.cumsum(np.bincount(rows, minlength=truth.shape[0]))]),
                          shape=truth.shape)
    assert not truth.has_canonical_format
    if not prototypes:
        pr_ids = pr_sims = None
    args = (store, truth, m_ids, m_logits, nn_ids, nn_sims, pr_ids, pr_sims)
    kw = dict(counts=COUNTS, shares=SHARES, weights=WEIGHTS, power=2.0, pr_power=3.0, temperatures=temperatures,
              tempered_weights=(0.05, 0.3) if len(temperatures) > 1 else None)
    got = V.choose_fusion(*args, **kw)
    expected = _choose_fusion_per_cell(*args, **kw)
    assert got == expected
    assert list(got[1]) == list(expected[1])
    assert len({v for key, v in got[1].items() if key[2] > 0}) > 5  # the cells differ: a mix-up would show
    for t in temperatures[1:]:  # the temperature moves the figures: a cell scored at another would show
        assert any(got[1][(c, a, w, t)] != got[1][(c, a, w, 1.0)] for c, a, w, tt in got[1]
                   if tt == t and (c, a, w, 1.0) in got[1])


def _wide_inputs(seed, n=200, n_points=30, n_labels=400, K=60, kn=3, kp=4):
    """Queries with many more model candidates than neighbours' labels, so that most candidates are
    held by the model alone and the grid kernel drops the ones no cell can rank (`_outranked_floor`).
    Their logits sit on levels 1e-16 apart around the top, on bases one ulp apart (whose fused
    scores tie or not depending on the weight), at -745 (a base that rounds to a subnormal or zero) and
    at a few far levels; each query's candidates are distinct labels."""
    rng = np.random.default_rng(seed)
    X = sp.random(n_points, 8, density=0.5, format="csr", random_state=rng, dtype=np.float32)
    store = fusion.NeighbourLabels.build(X, _labels(rng, n_points, n_labels, 2))
    m_ids = np.stack([rng.permutation(n_labels)[:K] for _ in range(n)]).astype(np.int64)
    m_ids[rng.random(m_ids.shape) < 0.1] = -1
    m_ids[20:30, 0] = np.arange(20, 30)  # held: the one base of 1 in the rows of tiny ones below
    m_ids[20:30, 1:][np.isin(m_ids[20:30, 1:], np.arange(20, 30))] = -1
    levels = [0.0, -1e-16, -2e-16, -3e-16, -0.5, -0.5 - 1e-16, -3.0, -745.0, -746.0]
    m_logits = rng.choice(levels, m_ids.shape).astype(np.float64)
    m_logits[:20, :8] = 0.0  # more than k candidates tied at the top
    # more than k bases tied below the top and bases one ulp under them, whose fused scores tie
    # with theirs after rounding under some weights: were those dropped, a lower id would show
    below = np.nextafter(np.exp(-0.3 - 0.5), 0.0)
    under = next(v for v in -0.3 - np.arange(1, 200) * 1e-17 if np.exp(v - 0.5) == below)
    m_logits[30:130, 0], m_logits[30:130, 1:9], m_logits[30:130, 9:15] = 0.5, -0.3, under
    m_logits[30:130, 15:] = rng.choice([-3.0, -745.0], (100, K - 15))
    # every base but one tiny (5e-324 or 0): their products round to 0 and tie, so nothing may go
    m_logits[20:30] = rng.choice([-745.0, -746.0], (10, K))
    m_logits[20:30, 0] = 0.0
    nn_ids = rng.integers(0, n_points, (n, kn)).astype(np.int32)
    nn_sims = rng.choice([0.3, 0.6, 1.0], (n, kn)).astype(np.float32)
    pr_ids = rng.integers(0, n_labels, (n, kp)).astype(np.int32)
    nn_ids[20:30] = pr_ids[20:30] = -1  # the tiny ones fill the top 5
    pr_sims = rng.choice([0.4, 0.7, 1.0], (n, kp)).astype(np.float32)
    truth = _labels(rng, n, n_labels, 3).tolil()
    for q in range(20, 30):  # the true labels are the zero bases: the hits tell which of the tied went in
        truth[q, :] = 0
        truth[q, m_ids[q][(m_logits[q] == -746.0) & (m_ids[q] >= 0)]] = 1
    return store, sp.csr_matrix(truth), m_ids, m_logits, nn_ids, nn_sims, pr_ids, pr_sims


def _model_only_dropped(store, m_ids, m_logits, nn_ids, pr_ids, k=5):
    """Per query, how many candidates held by the model alone lie below the k-th largest such base by
    more than PRUNE_MARGIN (what the kernel may drop), computed here in numpy."""
    y_ptr, y_idx = store.arrays["y_ptr"], store.arrays["y_idx"]
    out = np.zeros(len(m_ids), np.int64)
    for q in range(len(m_ids)):
        ok = m_ids[q] >= 0
        if not ok.any():
            continue
        base = np.full(ok.size, -np.inf)
        base[ok] = np.exp(m_logits[q][ok] - m_logits[q][ok].max())
        others = set(pr_ids[q][pr_ids[q] >= 0].tolist())
        for p in nn_ids[q][nn_ids[q] >= 0]:
            others.update(y_idx[y_ptr[p]:y_ptr[p + 1]].tolist())
        only = np.array([b for j, b in zip(m_ids[q][ok], base[ok]) if j not in others])
        if only.size > k and np.sort(only)[-k] >= fusion.PRUNE_MIN_BASE:
            out[q] = int((only < np.sort(only)[-k] * (1 - fusion.PRUNE_MARGIN)).sum())
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_candidates_no_cell_can_rank_are_dropped_without_changing_a_cell(seed):
    """Every cell of a grid under PRUNE_MAX_WEIGHT, where the kernel drops model-only candidates, is
    still `fuse`'s top 5 bit for bit, its ties at the 5th place broken by the label id as there."""
    store, truth, m_ids, m_logits, nn_ids, nn_sims, pr_ids, pr_sims = _wide_inputs(seed)
    dropped = _model_only_dropped(store, m_ids, m_logits, nn_ids, pr_ids)
    assert (dropped > 10).sum() > 100  # the pruning is at work on most queries
    assert (dropped[20:30] == 0).all()  # not where every base but one is tiny
    cells = np.array([(a, w) for a in (0.0, 0.5, 1.0) for w in (0.1, 0.3, 0.5, 0.7, 0.9, fusion.PRUNE_MAX_WEIGHT)])
    for power, temperature in ((2.0, 1.0), (4.0, 1e-16)):  # a temperature of 1e-16: bases 1/e apart
        logits = m_logits / temperature
        hits = store.fuse_grid_hits(m_ids, logits, nn_ids, nn_sims, power, pr_ids, pr_sims, 3.0, cells, truth, 5)
        scores = _kernel_scores(store, truth, m_ids, logits, nn_ids, nn_sims, pr_ids, pr_sims, power, 3.0, cells)
        ties = 0
        for g, (a, w) in enumerate(cells):
            where = f"power {power}, share {a}, weight {w}"
            ids, fused, expected = _cell_hits(store, truth, m_ids, logits, nn_ids, nn_sims, pr_ids, pr_sims, a, w,
                                              power, 3.0)
            np.testing.assert_array_equal(scores[g], fused, err_msg=where)
            np.testing.assert_array_equal(hits[g], expected, err_msg=where)
            ties += int((fused[:, 4] == fused[:, 5 - 2]).sum())
        assert ties > 50  # ties at the 5th place, where a label dropped too eagerly would show


@pytest.mark.parametrize("seed", [0, 1])
def test_several_temperatures_in_one_pass_give_each_temperatures_own_pass(seed):
    """The kernel given T temperatures' logits and cells naming them (one sort of the labels for all)
    scores every cell bit for bit as a pass of that temperature alone, where the pruning at one
    temperature would drop candidates another keeps."""
    store, truth, m_ids, m_logits, nn_ids, nn_sims, pr_ids, pr_sims = _wide_inputs(seed)
    temps = (1.0, 1e-16, 4.0)
    cells = [(a, w) for a in (0.0, 0.5, 1.0) for w in (0.1, 0.5, 0.9, fusion.PRUNE_MAX_WEIGHT)]
    stacked = np.stack([fusion.tempered(m_logits, t) for t in temps])
    mixed = np.array([(a, w, i) for i in (2, 0, 1) for a, w in cells])  # the temperatures out of order
    n = len(m_ids)
    hits = np.empty((len(mixed), n, 5), np.uint8)
    scores = np.empty((len(mixed), n, 5))
    fusion.fuse_grid_hits(m_ids, stacked, nn_ids, nn_sims, store.arrays["y_ptr"], store.arrays["y_idx"], 2.0,
                          pr_ids, pr_sims, 3.0, mixed, truth.indptr.astype(np.int64), truth.indices, hits, scores)
    assert len({scores[g].tobytes() for g in range(len(mixed))}) == len(mixed)  # every cell its own
    for g, (a, w, i) in enumerate(mixed):
        logits = stacked[int(i)]
        alone = _kernel_scores(store, truth, m_ids, logits, nn_ids, nn_sims, pr_ids, pr_sims, 2.0, 3.0,
                               np.array([(a, w)]))[0]
        np.testing.assert_array_equal(scores[g], alone, err_msg=f"temperature {temps[int(i)]}, share {a}, weight {w}")
        np.testing.assert_array_equal(
            hits[g], store.fuse_grid_hits(m_ids, logits, nn_ids, nn_sims, 2.0, pr_ids, pr_sims, 3.0,
                                          np.array([(a, w)]), truth, 5)[0])
