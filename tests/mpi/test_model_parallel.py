"""P ranks against a 1-rank recomputation in the same process.

Every rank trains the model-parallel network on COMM_WORLD and, alone, the
same network on the single-process stand-in; the gathered P-rank weights
must equal the 1-rank ones. Run at P = 1, 2 and 3 (3 gives uneven shards).
"""

import dataclasses

import numpy as np
import pytest
import scipy.sparse as sp
from mpi4py import MPI

from dslide.comm import Comm
from dslide.config import Config
from dslide.model.inputs import csr_parts, make_batch
from dslide.model.network import Network, full_parameters
from dslide.train import epoch_order


def _data(seed=0, n=96, F=40, L=13):
    rs = np.random.default_rng(seed)
    X = sp.random(n, F, density=0.2, format="csr", random_state=seed, dtype=np.float32)
    X.data = rs.uniform(0.1, 1.0, X.nnz).astype(np.float32)
    Y = (rs.random((n, L)) < 0.15).astype(np.float32)
    Y[np.arange(n), rs.integers(0, L, n)] = 1.0
    return X, sp.csr_matrix(Y)


def _train(cfg, X, Y, comm, steps):
    net = Network(cfg, X.shape[1], Y.shape[1], comm, total_steps=steps)
    xp, yp = csr_parts(X), csr_parts(Y, np.float32)
    order = epoch_order(cfg.seed, 0, X.shape[0])
    losses = []
    for step in range(1, steps + 1):
        rows = order[((step - 1) * cfg.batch_size) % X.shape[0]:][: cfg.batch_size]
        part = net.train_step(make_batch(xp, yp, rows, step))
        losses.append(float(comm.allreduce_sum(np.array([part]))[0]))
    return net, losses


def _assert_same_run(net_p, loss_p, net_1, loss_1):
    """The P-rank run's losses and gathered parameters are the one-rank run's (to float rounding)."""
    np.testing.assert_allclose(loss_p, loss_1, rtol=1e-5)
    for li, ((Wp, bp), (W1, b1)) in enumerate(zip(full_parameters(net_p), full_parameters(net_1))):
        assert np.abs(Wp - W1).max() <= 1e-5, f"layer {li} W differs by {np.abs(Wp - W1).max()}"
        assert np.abs(bp - b1).max() <= 1e-5, f"layer {li} b differs by {np.abs(bp - b1).max()}"


@pytest.mark.parametrize("hidden,loss", [((7,), "softmax"), ((9, 5), "softmax"), ((20,), "softmax"),
                                         ((9, 20), "softmax"), ((7,), "bce"), ((20,), "bce"),
                                         ((7,), "label-softmax"), ((20,), "label-softmax"),
                                         ((9, 5), "label-softmax+bce")])
def test_exact_mode_p_ranks_equal_one_rank(hidden, loss):
    """(20,) and (9, 20) over 13 labels: an output narrower than the last hidden layer,
    split by rows (output_split = "auto"); every loss (the points have 1 to 5 labels)."""
    X, Y = _data()
    cfg = Config(hidden=hidden, exact=True, batch_size=32, input_norm="none", seed=11, lr=1e-2, dropout=0.25,
                 loss=loss)
    world = Comm(MPI.COMM_WORLD)
    net_p, loss_p = _train(cfg, X, Y, world, steps=6)
    net_1, loss_1 = _train(cfg, X, Y, Comm(), steps=6)
    assert net_p.layers[-1].split == ("rows" if hidden[-1] > Y.shape[1] else "columns")
    _assert_same_run(net_p, loss_p, net_1, loss_1)
    # the weights really moved, so equality is not the trivial one of two initial states
    init = full_parameters(Network(cfg, X.shape[1], Y.shape[1], Comm()))
    assert np.abs(full_parameters(net_1)[0][0] - init[0][0]).max() > 1e-3


def test_weight_decay_at_p_ranks_equals_one_rank(monkeypatch):
    """Decoupled weight decay scales each rank's slice by the one factor of its step: P ranks
    give the one-rank weights (decaying every 2nd step here), and the decay did something."""
    import dslide.model.network as network

    monkeypatch.setattr(network, "DECAY_EVERY", 2)
    X, Y = _data()
    cfg = Config(hidden=(9, 5), exact=True, batch_size=32, input_norm="none", seed=11, lr=1e-2, weight_decay=0.3)
    net_p, loss_p = _train(cfg, X, Y, Comm(MPI.COMM_WORLD), steps=6)
    net_1, loss_1 = _train(cfg, X, Y, Comm(), steps=6)
    _assert_same_run(net_p, loss_p, net_1, loss_1)
    plain, _ = _train(dataclasses.replace(cfg, weight_decay=0.0), X, Y, Comm(), steps=6)
    assert np.abs(full_parameters(plain)[0][0] - full_parameters(net_1)[0][0]).max() > 1e-4


def test_each_rank_holds_only_its_slice():
    X, Y = _data()
    cfg = Config(hidden=(9,), exact=True)
    world = Comm(MPI.COMM_WORLD)
    net = Network(cfg, X.shape[1], Y.shape[1], world)
    sizes = world.allgather_object([layer.W.shape[1] for layer in net.layers])
    assert [sum(s[i] for s in sizes) for i in range(2)] == [9, 13]
    assert max(s[1] for s in sizes) - min(s[1] for s in sizes) <= 1


@pytest.mark.parametrize("split", ["columns", "rows"])
def test_the_prior_shift_at_p_ranks_is_the_one_rank_shift_bit_for_bit(split):
    """Each rank shifts its own labels' biases by tau times their log-prior: gathered, the
    P-rank biases are the 1-rank ones, and a shift of 0 gives back the trained biases."""
    X, Y = _data(seed=4)
    cfg = Config(hidden=(20,), exact=True, output_split=split, seed=6)
    counts = np.asarray(Y.sum(axis=0)).ravel().astype(np.float64)
    nets = [Network(cfg, X.shape[1], Y.shape[1], c) for c in (Comm(MPI.COMM_WORLD), Comm())]
    for net in nets:
        net.init_output_bias(counts, X.shape[0])
        net.shift_output_prior(0.3, counts, X.shape[0])
    (_, b_p), (_, b_1) = full_parameters(nets[0])[-1], full_parameters(nets[1])[-1]
    np.testing.assert_array_equal(b_p, b_1)
    log_prior = np.log((counts + 1.0) / (X.shape[0] + Y.shape[1]))
    np.testing.assert_array_equal(b_1, log_prior.astype(np.float32) - (0.3 * log_prior).astype(np.float32))
    nets[0].shift_output_prior(0.0, counts, X.shape[0])
    np.testing.assert_array_equal(full_parameters(nets[0])[-1][1], log_prior.astype(np.float32))


def test_data_parallel_p_ranks_equal_one_rank():
    """parallel = "data": each rank the whole model and a slice of every batch; the
    all-reduced gradients make every rank's model equal the 1-rank run's."""
    X, Y = _data()
    cfg = Config(hidden=(7,), exact=True, batch_size=32, input_norm="none", seed=5, lr=1e-2, parallel="data")
    world = Comm(MPI.COMM_WORLD)
    net_p, loss_p = _train_dp(cfg, X, Y, world, steps=5)
    net_1, loss_1 = _train_dp(cfg, X, Y, Comm(), steps=5)
    np.testing.assert_allclose(loss_p, loss_1, rtol=1e-5)
    for lp, l1 in zip(net_p.layers, net_1.layers):
        assert np.abs(lp.W - l1.W).max() <= 1e-5
        assert np.abs(lp.b - l1.b).max() <= 1e-5
    if world.size > 1:
        W = world.allgather_object(net_p.layers[0].W.copy())
        assert all(np.array_equal(W[0], w) for w in W), "every rank holds the same whole model"
        expected = 2 * (world.size - 1) * net_p.n_params * 4 // world.size * 5
        assert world.bytes_sent["gradients"] == pytest.approx(expected, rel=1e-3)


def _train_dp(cfg, X, Y, comm, steps):
    from dslide.model.sharding import shard_range
    from dslide.train import batch_rows

    net = Network(cfg, X.shape[1], Y.shape[1], comm, total_steps=steps)
    xp, yp = csr_parts(X), csr_parts(Y, np.float32)
    losses = []
    for step in range(1, steps + 1):
        rows = batch_rows(cfg, X.shape[0], step)
        lo, hi = shard_range(rows.size, comm.rank, comm.size)
        part = net.train_step(make_batch(xp, yp, rows[lo:hi], step, rows.size))
        losses.append(float(comm.allreduce_sum(np.array([part]))[0]))
    return net, losses


def test_sparse_hidden_layer_exchange_equals_one_rank_when_all_active():
    """An LSH hidden layer with every neuron active: its (id, value) pairs are
    all-gathered and their gradients reduce-scattered; P ranks equal 1 rank."""
    from dslide.config import LSHConfig

    X, Y = _data()
    lc = LSHConfig(K=2, L=4, bin_size=4, range_pow=4, min_active=11, min_active_share=1.0, max_active=4)
    cfg = Config(hidden=(7, 11), kinds=("dense", "lsh", "dense"), lsh_layers=(None, lc, None),
                 batch_size=32, input_norm="none", seed=4, lr=1e-2, dropout=0.0)
    net_p, loss_p = _train(cfg, X, Y, Comm(MPI.COMM_WORLD), steps=4)
    net_1, loss_1 = _train(cfg, X, Y, Comm(), steps=4)
    _assert_same_run(net_p, loss_p, net_1, loss_1)


def test_softmax_normaliser_merges_over_ranks_with_rows_empty_on_some():
    """Comm.allreduce_logsumexp (the user op _lse_merge under MPI_Allreduce) against the
    statistics of every rank gathered and merged by hand. Row r is empty (-inf, 0) on rank r
    only, the last row on every rank."""
    world = Comm(MPI.COMM_WORLD)
    B = 6
    rs = np.random.default_rng(100 + world.rank)
    m, s = rs.uniform(-5, 5, B), rs.uniform(0.5, 3.0, B)
    m[world.rank % (B - 1)], s[world.rank % (B - 1)] = -np.inf, 0.0
    m[B - 1], s[B - 1] = -np.inf, 0.0
    M, S = world.allreduce_logsumexp(m, s)
    all_m, all_s = world.allgather_rows(m), world.allgather_rows(s)
    for i in range(B):
        live = np.isfinite(all_m[:, i])
        if not live.any():
            assert M[i] == -np.inf and S[i] == 0.0
            continue
        ref_M = all_m[live, i].max()
        assert M[i] == ref_M
        assert S[i] == pytest.approx(float(np.sum(all_s[live, i] * np.exp(all_m[live, i] - ref_M))), rel=1e-12)


@pytest.mark.parametrize("chunk,neighbors,cells", [(256, 0, 24), (5, 0, 24), (256, 5, 0), (256, 5, 3)])
def test_lsh_inference_index_gives_the_same_topk_and_share_at_p_ranks_as_at_one(chunk, neighbors, cells,
                                                                                 monkeypatch):
    """The inference index keeps, per anchor, the labels of the whole layer above one threshold
    agreed across ranks, and re-ranks exactly: P ranks retrieve and return what 1 rank does,
    with the same scores bit for bit (a label sits elsewhere in another rank's bucket),
    whether the 16 anchors are filled at once or 5 at a time (chunks of 5, 5, 5, 1), and with
    the nearest training points' labels added (a graph whose rows the ranks share out: exact,
    cells 0, or from each point's 3 nearest cells and their neighbours' neighbours)."""
    from dslide import train as T
    from dslide.infer.predict import predict_topk, predict_topk_scores
    from dslide.train.infer_build import build_index
    from dslide.infer import index as I

    monkeypatch.setattr(I, "INDEX_CHUNK", chunk)
    from dslide.config import LSHConfig
    from dslide.io.data import XMCData

    X, Y = _data(n=160, F=40, L=300)
    if neighbors:  # at most 2 labels a point (45 here), as in extreme classification
        Y = sp.csr_matrix((np.ones(160 * 2, np.float32), Y.indices[np.add.outer(Y.indptr[:-1], [0, 1]).ravel()],
                           np.arange(0, 321, 2)), shape=Y.shape)
        Y.sum_duplicates()
    lc = LSHConfig(min_active=30, max_active=10, anchors=8, index_anchors=16, index_share=0.1, index_min_labels=0,
                   index_min_width=0, index_neighbors=neighbors, index_degree=4, index_search=8,
                   index_graph_cells=cells)
    cfg = Config(hidden=(16,), kinds=("dense", "lsh"), input_norm="none", seed=3, lr_schedule="constant",
                 dropout=0.0, lsh=lc)
    data = XMCData(X, Y)
    out = {}
    for name, comm in (("p", Comm(MPI.COMM_WORLD)), ("1", Comm())):
        net = Network(cfg, X.shape[1], Y.shape[1], comm)
        net.init_output_bias(np.asarray(Y.sum(axis=0)).ravel(), X.shape[0])
        model = T.Model(net, net.config, comm)
        info = build_index(model, data)
        stats = {}
        ids, scores = predict_topk_scores(model, X, 5, exact=False, stats=stats)
        exact = predict_topk(model, X, 5, exact=True)
        out[name] = (ids, stats["scored_share"], exact, info, model.index.neighbors, scores)
    ids_p, share_p, exact_p, info_p, nn_p, scores_p = out["p"]
    ids_1, share_1, exact_1, _, nn_1, scores_1 = out["1"]
    np.testing.assert_array_equal(ids_p, ids_1)
    np.testing.assert_array_equal(scores_p, scores_1)  # the scores too, bit for bit
    assert share_p == pytest.approx(share_1, rel=1e-12)
    # about index_share of the labels (ties may add a few); the neighbours' labels are budgeted
    # at their count, and some of them are in the bucket already
    assert (0.06 if neighbors else 0.09) <= share_1 <= 0.12
    per_point = Y.nnz / Y.shape[0]
    assert info_p["anchors"] == 16 and info_p["bucket"] == 30 - int(np.ceil(neighbors * per_point))
    if neighbors:
        np.testing.assert_array_equal(nn_p.graph, nn_1.graph)
        assert share_1 > info_p["bucket"] / 300  # the neighbours' labels were scored too
    else:
        assert nn_p is None
    # a sanity floor: the exact top-1 is retrieved for most points (measured 0.8 on this random model)
    assert (ids_1[:, 0] == exact_1[:, 0]).mean() >= 0.6


def test_kmeans_with_its_blocks_shared_over_ranks_is_the_one_rank_kmeans_bit_for_bit():
    """The inference index's anchors: each rank computes some blocks' nearest anchors and all
    gather them (dslide.infer.index._blocks_shared); blocks of 7 rows, the last one short, so
    every rank computes several and some one fewer."""
    from dslide.infer.index import _blocks_shared
    from dslide.lsh.kmeans import kmeans

    world = Comm(MPI.COMM_WORLD)
    X = np.maximum(np.random.default_rng(8).normal(size=(101, 6)), 0).astype(np.float32)
    one = kmeans(X, 9, 5, iters=4, block=7)
    shared = kmeans(X, 9, 5, iters=4, block=7, share=lambda n, block, rows: _blocks_shared(n, block, world, rows))
    np.testing.assert_array_equal(shared, one)
    calls = []
    _blocks_shared(101, 7, world, lambda lo, hi: calls.append((lo, hi)) or np.zeros(hi - lo, np.int32))
    mine = [(j * 7, min(101, j * 7 + 7)) for j in range(world.rank, 15, world.size)]
    assert calls == mine  # each block once, on one rank


def test_kth_largest_across_ranks_equals_numpy_on_the_concatenation():
    from dslide.model.topk import kth_largest
    from dslide.model.topk import order_keys as _order_keys

    world = Comm(MPI.COMM_WORLD)
    rs = np.random.default_rng(100 + world.rank)
    scores = rs.normal(size=(6, 9)).astype(np.float32)
    scores[0, :3] = 0.0  # ties
    scores[1] = -np.abs(scores[1])  # negative floats order correctly too
    everything = np.concatenate(world.allgather_object(scores), axis=1)
    for k in (1, 5, everything.shape[1]):
        got = kth_largest(_order_keys(np.sort(scores, axis=1)[:, ::-1]), k, world)
        want = _order_keys(np.sort(everything, axis=1)[:, everything.shape[1] - k])
        np.testing.assert_array_equal(got, want)


def test_fused_predictions_at_p_ranks_equal_one_rank():
    """knn > 0: exact-mode training, the neighbours' votes and the label prototypes' give every
    rank the 1-rank top-k."""
    from dslide import train as T
    from dslide.infer.predict import predict_topk, predict_topk_scores
    from dslide.io.data import XMCData

    X, Y = _data(n=120, L=17)
    cfg = Config(hidden=(8,), exact=True, batch_size=32, seed=4, lr=1e-2, epochs=2.0, knn=3, knn_weight=0.5,
                 knn_candidates=6, proto_weight=0.5)
    world = Comm(MPI.COMM_WORLD)
    model_p, _ = T.fit(XMCData(X[:90], Y[:90]), cfg, comm=world, index=False)
    model_1, _ = T.fit(XMCData(X[:90], Y[:90]), cfg, comm=Comm(), index=False)
    ids_p, s_p = predict_topk_scores(model_p, X[90:], 5)
    ids_1, s_1 = predict_topk_scores(model_1, X[90:], 5)
    np.testing.assert_allclose(s_p, s_1, rtol=1e-4, atol=1e-6)
    assert (ids_p == ids_1).mean() >= 0.95  # float ties at the k-th place aside
    assert model_p.config.proto_weight == 0.5 and model_p.neighbours.has_prototypes
    pr_p = model_p.neighbours.prototypes(X[90:], 6, world)
    pr_1 = model_1.neighbours.prototypes(X[90:], 6)
    np.testing.assert_array_equal(pr_p[0], pr_1[0])
    np.testing.assert_array_equal(pr_p[1], pr_1[1])
    # --lsh: the approximate searches (dslide.infer.approx), each rank a share of the queries
    for approx in (False, True):
        nn_p = model_p.neighbours.neighbours(X[90:], 3, world, approx=approx)
        nn_1 = model_1.neighbours.neighbours(X[90:], 3, approx=approx)
        np.testing.assert_array_equal(nn_p[0], nn_1[0])
        np.testing.assert_array_equal(nn_p[1], nn_1[1])
    pr_p = model_p.neighbours.prototypes(X[90:], 6, world, approx=True)
    pr_1 = model_1.neighbours.prototypes(X[90:], 6, approx=True)
    np.testing.assert_array_equal(pr_p[0], pr_1[0])
    np.testing.assert_array_equal(pr_p[1], pr_1[1])
    lids_p, ls_p = predict_topk_scores(model_p, X[90:], 5, exact=False)
    lids_1, ls_1 = predict_topk_scores(model_1, X[90:], 5, exact=False)
    np.testing.assert_allclose(ls_p, ls_1, rtol=1e-4, atol=1e-6)
    assert (lids_p == lids_1).mean() >= 0.95
    # the votes count: the model alone ranks otherwise
    model_1.config = model_1.config.replace(knn=0)
    assert not np.array_equal(predict_topk(model_1, X[90:], 5), ids_1)


def test_label_prototypes_summed_over_p_ranks_are_the_one_rank_store_bit_for_bit():
    """Each rank sums the prototypes of a range of the labels and all gather them; the
    ranges are cut by row entries, so the skewed labels (the first 100 points twice) leave
    some narrow."""
    from dslide.infer import fusion

    X, Y = _data(n=300, F=60, L=23)
    X = sp.csr_matrix(X.multiply(np.linspace(3.0, 0.1, 60)[None, :] ** 2))  # more weight, not more entries
    X = sp.vstack([X, sp.csr_matrix(np.tile(np.r_[np.ones(5), np.zeros(55)], (100, 1)).astype(np.float32))]).tocsr()
    Y = sp.vstack([Y, sp.csr_matrix(Y[:100])]).tocsr()  # features 0-4 hold most entries
    world = Comm(MPI.COMM_WORLD)
    got = fusion.NeighbourLabels.build(X, Y, prototypes=True, comm=world).arrays
    want = fusion.NeighbourLabels.build(X, Y, prototypes=True).arrays
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    # against numpy: label j's sum of its L2-normalised rows, and its norm
    Xn = sp.csr_matrix(X.multiply(1.0 / np.sqrt(X.multiply(X).sum(axis=1))))
    S = (Y.T @ Xn).toarray()
    np.testing.assert_allclose(got["pr_norm"], np.linalg.norm(S, axis=1), rtol=1e-5)
    if world.size > 1:
        assert world.bytes_sent.get("neighbours", 0) > 0


def test_the_validation_choices_at_p_ranks_are_the_one_rank_choices():
    """Fusion and early stopping left to the data on a wide output: the validation split is
    drawn by the seed alone, so P ranks hold out the 1-rank points, score them alike (the
    1-rank figures, float ties aside) and make the 1-rank choices (or, where a tie of the
    sharded sums flips a validation point, one as good on the 1-rank table), every rank the same."""
    import json

    from dslide import train as T
    from dslide.config import NARROW_OUTPUT
    from dslide.io.data import XMCData

    rng = np.random.default_rng(8)
    n, L = 2400, NARROW_OUTPUT + 1
    X = sp.random(n, 40, density=0.12, format="csr", random_state=rng, dtype=np.float32)
    labels = np.where(rng.random(n) < 0.5, rng.integers(0, 5, n), rng.integers(0, 800, n))
    Y = sp.csr_matrix((np.ones(n, np.float32), (np.arange(n), labels)), shape=(n, L))
    cfg = Config(hidden=(4,), batch_size=200, seed=2, epochs=3.0, early_stop=True, exact=True)
    world = Comm(MPI.COMM_WORLD)
    model_p, _ = T.fit(XMCData(X, Y), cfg, comm=world, index=False)
    model_1, _ = T.fit(XMCData(X, Y), cfg, comm=Comm(), index=False)
    a, b = model_p.index_info["fusion_choice"], model_1.index_info["fusion_choice"]
    assert a["validation_points"] == b["validation_points"] == 600
    assert a["p@1/p@5"].keys() == b["p@1/p@5"].keys()
    for key, v in a["p@1/p@5"].items():
        # a flattened softmax (temperature 4) at a weight of a few hundredths leaves this
        # near-uniform model's fused scores within rounding of each other, and the sharded
        # products' rounding flips a few more of them: 3 of the 600 points seen
        tol = (2.5 if "temperature" not in key else 4.5) / 600
        np.testing.assert_allclose(v, b["p@1/p@5"][key], atol=tol, err_msg=key)

    from dslide.train.validation import grid_key

    def cell(c):
        return grid_key(c["knn"], c["proto_weight"], c["knn_weight"], c["knn_temperature"])

    # the same choice, or (a float tie of the sharded sums flipping a point) one the 1-rank
    # table scores within a validation point or two of its own, and never "off" for "on"
    if a["chosen"] != b["chosen"]:
        assert a["chosen"]["knn_weight"] > 0 and b["chosen"]["knn_weight"] > 0, (a["chosen"], b["chosen"])
        assert sum(b["p@1/p@5"][cell(a["chosen"])]) >= sum(b["p@1/p@5"][cell(b["chosen"])]) - 4.5 / 600
    ea, eb = model_p.index_info["early_stop"], model_1.index_info["early_stop"]
    assert [c[0] for c in ea["curve"]] == [c[0] for c in eb["curve"]]
    np.testing.assert_allclose(np.array(ea["curve"])[:, 1:], np.array(eb["curve"])[:, 1:], atol=2.5 / 600)
    assert len(set(world.allgather_object(json.dumps(a, sort_keys=True)))) == 1
    # the prior shift, chosen on the same points before the fusion
    sa, sb = model_p.index_info["prior_shift"], model_1.index_info["prior_shift"]
    assert sa["validation_points"] == sb["validation_points"] == 600
    from dslide.train import validation as V

    # the walk over the shifts stops where they fall past the margin: each run scores 0 and the
    # shifts in order up to where its own figures stop it (a float tie may stop one a shift later)
    walk = ["0", "0.1", "0.2", "0.3"]
    for s in (sa, sb):
        keys = list(s["p@1/p@5"])
        assert keys == walk[:len(keys)] and len(keys) >= 2, keys
        last = sum(s["p@1/p@5"][keys[-1]])
        best = max(sum(s["p@1/p@5"][t]) for t in keys[:-1])
        assert len(keys) == len(walk) or last < best - V.CHOICE_MARGIN, (keys, s["p@1/p@5"])
    for key in set(sa["p@1/p@5"]) & set(sb["p@1/p@5"]):
        np.testing.assert_allclose(sa["p@1/p@5"][key], sb["p@1/p@5"][key], atol=2.5 / 600)
    if sa["chosen"] != sb["chosen"]:
        ka, kb = f"{sa['chosen']:g}", f"{sb['chosen']:g}"
        table = sb if ka in sb["p@1/p@5"] else sa  # the 1-rank run's, unless it stopped before ka
        assert sum(table["p@1/p@5"][ka]) >= sum(table["p@1/p@5"][kb]) - 2.5 / 600
    assert len(set(world.allgather_object(json.dumps(sa, sort_keys=True)))) == 1
    # the hidden neighbours, chosen on the same points after the fusion: against the fused scores at
    # the fusion chosen (their no-op's figures are that cell's), so alike where the fusion is
    ha, hb = model_p.index_info["hidden_choice"], model_1.index_info["hidden_choice"]
    assert ha["validation_points"] == hb["validation_points"] == 600
    assert ha["p@1/p@5"].keys() == hb["p@1/p@5"].keys() and len(ha["p@1/p@5"]) == 21
    for h, f in ((ha, a), (hb, b)):
        fig = f["p@1/p@5"][grid_key(0, 0.0, 0.0) if f["chosen"] == "off" else cell(f["chosen"])]
        np.testing.assert_allclose(h["p@1/p@5"]["hidden_knn 0 power 0 weight 0"], fig, rtol=1e-12)
    if a["chosen"] == b["chosen"] and sa["chosen"] == sb["chosen"]:
        for key, v in ha["p@1/p@5"].items():
            np.testing.assert_allclose(v, hb["p@1/p@5"][key], atol=4.5 / 600, err_msg=key)
    assert len(set(world.allgather_object(json.dumps(ha, sort_keys=True)))) == 1


def test_a_rank_waiting_in_an_all_reduce_counts_the_wait_as_exchange_time():
    """Comm.seconds holds the time inside the exchanges, the others' lateness included (what
    shard_weights = "auto" subtracts from a step to find a rank's own speed)."""
    import time

    world = Comm(MPI.COMM_WORLD)
    if world.size == 1:
        pytest.skip("one rank: nothing to wait for")
    world.barrier()
    if world.rank == 1:
        time.sleep(0.3)
    t0 = time.perf_counter()
    got = world.allreduce_sum(np.array([float(world.rank)]), kind="waited")
    spent = time.perf_counter() - t0
    assert got[0] == world.size * (world.size - 1) / 2
    assert world.seconds["waited"] == pytest.approx(spent, abs=0.05)
    if world.rank == 0:
        assert world.seconds["waited"] > 0.2


def test_the_ranks_share_the_fusion_grid_and_each_gets_every_figure():
    """choose_fusion with a communicator: each rank scores a share of the (count, share, weight)
    grid, and every rank ends with the figures and the choice of one process scoring it all."""
    from dslide.infer import fusion
    from dslide.train import validation as V

    rng = np.random.default_rng(5)
    n, L, q = 300, 40, 60
    X = sp.random(n, 30, density=0.2, format="csr", random_state=rng, dtype=np.float32)
    Y = sp.csr_matrix((np.ones(n, np.float32), (np.arange(n), rng.integers(0, L, n))), shape=(n, L))
    store = fusion.NeighbourLabels.build(X[q:], Y[q:], prototypes=True)
    nn_ids, nn_sims = store.neighbours(X[:q], 20)
    pr_ids, pr_sims = store.prototypes(X[:q], 8)
    m_ids = np.stack([rng.permutation(L)[:20] for _ in range(q)]).astype(np.int64)
    m_logits = np.sort(rng.random(m_ids.shape))[:, ::-1].copy()
    args = (store, Y[:q], m_ids, m_logits, nn_ids, nn_sims, pr_ids, pr_sims)
    kw = dict(counts=(10, 5, 20), shares=V.FUSION_SHARES, weights=V.FUSION_WEIGHTS, power=4.0, pr_power=16.0,
              temperatures=V.FUSION_TEMPERATURES, tempered_weights=V.FUSION_TEMPERED_WEIGHTS)
    world = Comm(MPI.COMM_WORLD)
    shared = V.choose_fusion(*args, comm=world, **kw)
    alone = V.choose_fusion(*args, **kw)
    assert shared == alone  # the choice and every figure, in the same order
    assert list(shared[1]) == list(alone[1])
    per_count = len(V.FUSION_SHARES) * (len(V.FUSION_WEIGHTS) - 1 +
                                        (len(V.FUSION_TEMPERATURES) - 1) * len(V.FUSION_TEMPERED_WEIGHTS))
    assert len(alone[1]) == 1 + 3 * per_count
    if world.size > 1:
        assert world.bytes_sent.get("evaluation", 0) > 0


def test_the_hidden_neighbours_search_and_choice_at_p_ranks_are_the_one_rank_ones(monkeypatch):
    """The query blocks shared over the ranks: the same neighbours and similarities bit for bit
    (blocks of 4 rows: the last rank's share short or empty at 3 ranks), and the grid of the
    hidden neighbours' choice shared out gives every rank the 1-rank figures."""
    from dslide.infer import hidden_knn as HK
    from dslide.train import validation as V

    monkeypatch.setattr(HK, "QUERY_BLOCK", 4)
    rng = np.random.default_rng(11)
    N, L, n = 90, 12, 23
    H = rng.standard_normal((N, 5)).astype(np.float32)
    Y = sp.csr_matrix((rng.random((N, L)) < 0.2).astype(np.float32))
    store = HK.HiddenNeighbours.build(H, Y)
    Q = rng.standard_normal((n, 5)).astype(np.float32)
    world = Comm(MPI.COMM_WORLD)
    ids_p, sims_p = store.search(Q, 6, world)
    ids_1, sims_1 = store.search(Q, 6)
    np.testing.assert_array_equal(ids_p, ids_1)
    np.testing.assert_array_equal(sims_p, sims_1)
    truth = sp.csr_matrix((rng.random((n, L)) < 0.25).astype(np.float32))
    b_ids = np.array([rng.choice(L, 6, replace=False) for _ in range(n)])
    b_p = rng.dirichlet(np.ones(6), n)
    kw = dict(counts=(3, 6), powers=(1.0, 4.0), weights=V.HIDDEN_WEIGHTS)
    got = V.choose_hidden(store, truth, b_ids, b_p, ids_p, sims_p, comm=world, **kw)
    want = V.choose_hidden(store, truth, b_ids, b_p, ids_1, sims_1, **kw)
    assert got == want
    # --lsh: the cells of the store, the same at any number of ranks
    ids_p, sims_p = store.search(Q, 6, world, probes=3)
    ids_1, sims_1 = store.search(Q, 6, probes=3)
    np.testing.assert_array_equal(ids_p, ids_1)
    np.testing.assert_array_equal(sims_p, sims_1)
