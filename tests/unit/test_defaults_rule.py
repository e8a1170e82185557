"""The rule that takes settings from the data's shape (Config.resolve, knn_default), one regime per test."""

import numpy as np
import pytest
import scipy.sparse as sp

from dslide.config import (KNN, KNN_CHOICES, KNN_MAX_POINTS_PER_LABEL, NARROW_OUTPUT, PROTO_CHOICES, PROTO_P1_TOLERANCE,
                           PROTO_WEIGHT, NARROW_BATCH, NARROW_EPOCHS, NARROW_HIDDEN, NARROW_MIN_STEPS, WIDE_EPOCHS, Config,
                           knn_default, label_points)


def test_label_points_counts_occurring_labels_only():
    assert label_points([3, 0, 1, 0, 2]) == pytest.approx(2.0)
    assert label_points([0, 0]) == 0.0


@pytest.mark.parametrize("n_labels,ppl,knn", [
    (670_091, 1.3, KNN),       # Amazon-670K-like long tail: the neighbours' labels on
    (40_000, 8.7, KNN),        # a 40,000-label head-heavy set
    (500, 8.2, 0),             # narrow: the wide hidden layer learns its labels
    (159, 73.1, 0),            # BibTeX: many points per label, the network alone
    (40_000, KNN_MAX_POINTS_PER_LABEL, 0),  # the boundary belongs to the network
    (670_091, None, KNN),      # no data shape given: the width decides
    (NARROW_OUTPUT, None, 0),
])
def test_knn_default_per_regime(n_labels, ppl, knn):
    assert knn_default(n_labels, ppl) == knn
    if ppl is not None:  # on: the count is left to training (KNN_CHOICES); off: 0
        assert Config().resolve(n_labels, ppl).knn == (None if knn else 0)


def test_without_the_data_shape_knn_stays_unset_and_a_store_uses_knn_neighbours():
    c = Config().resolve(670_091)
    assert c.knn is None and c.neighbours() == KNN
    assert Config(knn=0).resolve(670_091).neighbours() == 0


def test_where_the_neighbours_are_fused_training_chooses_the_prototypes_share():
    assert PROTO_CHOICES == (0.0, 0.25, 0.5, 0.75) and PROTO_CHOICES[0] == 0.0  # the points alone: the reference
    assert PROTO_P1_TOLERANCE == 0.005 and PROTO_WEIGHT == 0.5
    assert Config().resolve(670_091, 1.3).proto_weight is None
    assert Config().resolve(40_000, 8.7).proto_weight is None
    assert Config(proto_weight=0.0).resolve(40_000, 8.7).proto_weight == 0.0
    with pytest.raises(ValueError, match="proto_weight = 1.5"):
        Config(proto_weight=1.5)


def test_wide_outputs_train_fewer_epochs_and_explicit_settings_win():
    assert Config().resolve(670_091, 1.3).epochs == WIDE_EPOCHS
    assert WIDE_EPOCHS == 1.5
    wide = Config().resolve(670_091, 1.3, 30_000)
    assert (wide.batch_size, wide.lr, wide.hidden) == (128, 5e-3, (128,))  # WIDE_LR
    # with a validation split: up to EARLY_STOP_MAX_EPOCHS, stopped early on it
    from dslide.train.validation import EARLY_STOP_MAX_EPOCHS

    assert wide.early_stop and wide.epochs == EARLY_STOP_MAX_EPOCHS
    assert not Config(epochs=2.0).resolve(670_091, 1.3, 30_000).early_stop  # epochs given: trained as asked
    assert Config(epochs=2.0, early_stop=True).resolve(670_091, 1.3, 30_000).epochs == 2.0
    assert not Config().resolve(670_091, 1.3, 1_000).early_stop  # no split
    assert not Config().resolve(159, 73.1, 30_000).early_stop  # narrow outputs train their epochs
    c = Config(knn=3, knn_weight=0.1, epochs=7.0).resolve(670_091, 1.3)
    assert (c.knn, c.knn_weight, c.epochs) == (3, 0.1, 7.0)


def test_the_loss_follows_the_output_width_and_an_explicit_one_wins():
    """Narrow outputs (every label a negative of every point) add one binary cross-entropy per
    label to the per-label softmax; wide ones, whose negatives are sampled, keep the softmax
    alone; either gives each of a point's labels its own softmax."""
    from dslide.config import NARROW_LOSS, NARROW_OUTPUT, WIDE_LOSS

    assert NARROW_LOSS == "label-softmax+bce"
    assert Config().resolve(NARROW_OUTPUT).loss == "label-softmax+bce"
    assert Config().resolve(NARROW_OUTPUT + 1).loss == WIDE_LOSS == "label-softmax"
    assert Config(loss="softmax").resolve(159).loss == "softmax"
    assert Config(loss="bce").resolve(670_091).loss == "bce"
    assert Config().loss is None and "loss" in Config.FROM_DATA
    with pytest.raises(ValueError, match="loss.*'softmax', 'bce', 'softmax\\+bce'"):
        Config(loss="hinge")


def test_adams_second_moment_decay_follows_the_output_width_and_an_explicit_one_wins():
    """Narrow outputs, which train about a thousand steps, forget Adam's second moments faster
    (NARROW_BETA2); wide ones keep 0.999. The network's Adam constants are the resolved ones:
    its step size is lr sqrt(1 - beta2^t) / (1 - beta1^t)."""
    from dslide.comm import Comm
    from dslide.config.rules import NARROW_BETA2, WIDE_BETA2
    from dslide.model.network import Network

    assert (NARROW_BETA2, WIDE_BETA2) == (0.99, 0.999)
    assert Config().beta2 is None and "beta2" in Config.FROM_DATA
    assert Config().resolve(NARROW_OUTPUT).beta2 == 0.99
    assert Config().resolve(NARROW_OUTPUT + 1).beta2 == 0.999
    assert Config(beta2=0.9).resolve(159).beta2 == 0.9
    assert Config(beta2=0.95).resolve(670_091).beta2 == 0.95
    for n_labels, beta2 in ((40, 0.99), (NARROW_OUTPUT + 1, 0.999)):
        net = Network(Config(hidden=(4,), exact=True, lr=0.01, lr_schedule="constant", threads=1), 6, n_labels, Comm())
        hp = net.adam_params(3)
        assert net.config.beta2 == beta2
        assert hp[2] == pytest.approx(beta2) and hp[4] == pytest.approx(0.01 * np.sqrt(1 - beta2**3) / (1 - 0.9**3))


def test_wide_outputs_of_one_replica_decay_their_weights_and_an_explicit_value_wins():
    """Weight decay is on (WIDE_WEIGHT_DECAY) for outputs wider than NARROW_OUTPUT trained by one
    replica whose rows a step samples often enough; off for narrow ones, with replicas and for
    very wide outputs; a value given is kept, and one outside [0, 1] is refused by name."""
    from dslide.config import NARROW_OUTPUT, WIDE_WEIGHT_DECAY, LSHConfig

    assert WIDE_WEIGHT_DECAY > 0
    assert Config().resolve(NARROW_OUTPUT + 1, 3.0, 50_000).weight_decay == WIDE_WEIGHT_DECAY
    assert Config().resolve(NARROW_OUTPUT, 3.0, 50_000).weight_decay == 0.0
    assert Config(replicas=2).resolve(20_000, 1.3, 50_000).weight_decay == 0.0
    # only where a step's uniform negatives reach DECAY_MIN_SAMPLED of the labels: 8,192 of 81,920
    assert Config().resolve(81_920, 1.3, 50_000).weight_decay == WIDE_WEIGHT_DECAY
    assert Config().resolve(81_921, 1.3, 50_000).weight_decay == 0.0
    assert Config().resolve(670_091, 1.3, 300_000).weight_decay == 0.0
    assert Config(lsh=LSHConfig(min_active=70_000)).resolve(670_091, 1.3).weight_decay == WIDE_WEIGHT_DECAY
    assert Config(weight_decay=0.2).resolve(NARROW_OUTPUT).weight_decay == 0.2
    assert Config(weight_decay=0.0).resolve(670_091).weight_decay == 0.0
    assert Config().weight_decay is None and "weight_decay" in Config.FROM_DATA
    with pytest.raises(ValueError, match="weight_decay"):
        Config(weight_decay=-0.1)


@pytest.mark.parametrize("n_points,batch", [
    (4_880, NARROW_BATCH),     # BibTeX: 20 steps an epoch
    (15_000, NARROW_BATCH),
    (None, NARROW_BATCH),      # no data shape given
    (1_600, 200),              # fewer than 8 steps of 256: 8 steps an epoch
    (NARROW_BATCH * NARROW_MIN_STEPS, NARROW_BATCH),
    (5, 1),
])
def test_narrow_outputs_train_large_batches_for_a_few_epochs(n_points, batch):
    assert (NARROW_HIDDEN, NARROW_EPOCHS, NARROW_BATCH, NARROW_MIN_STEPS) == (512, 12.0, 256, 8)
    narrow = Config().resolve(159, 73.1, n_points)
    assert (narrow.epochs, narrow.batch_size, narrow.lr, narrow.hidden) == (NARROW_EPOCHS, batch, 1e-2, (NARROW_HIDDEN,))
    explicit = Config(batch_size=64, lr=1e-3, epochs=30.0).resolve(159, 73.1, n_points)
    assert (explicit.batch_size, explicit.lr, explicit.epochs) == (64, 1e-3, 30.0)


def _wide(n, per_label, seed=0):
    r = np.random.default_rng(seed)
    X = sp.random(n, 50, density=0.1, format="csr", random_state=r, dtype=np.float32)
    Y = sp.csr_matrix((np.ones(n, np.float32), (np.arange(n), np.arange(n) % max(1, n // per_label))),
                      shape=(n, NARROW_OUTPUT + 1))
    return X, Y


def test_fit_resolves_knn_from_the_training_labels_and_the_split():
    from dslide import train as T
    from dslide.config import points_per_label
    from dslide.io.data import XMCData

    cfg = Config(hidden=(4,), epochs=1.0, batch_size=200)
    # too few points for a validation split: nothing can be checked, the network alone
    X, Y = _wide(60, 2)
    small = cfg.resolve(Y.shape[1], points_per_label(Y), 60)
    assert small.knn == 0 and not small.early_stop
    # a split, few points per label: fusion is chosen on it (the no-op among the candidates)
    X, Y = _wide(2400, 2)
    model = T.fit(XMCData(X, Y), cfg.resolve(Y.shape[1], points_per_label(Y), 2400), index=False)[0]
    assert model.config.knn is None and model.config.knn_weight is None
    choice = model.index_info["fusion_choice"]
    assert choice["validation_points"] == 600 and "knn 0 share 0.0 weight 0.0" in choice["p@1/p@5"]
    # many points per label: no neighbours
    X, Y = _wide(2400, 30)
    many = T.fit(XMCData(X, Y), cfg, index=False)[0]
    assert many.config.knn == 0 and many.neighbours is None
    # every fusion setting given: the store is built as asked, and no choice is made
    fixed = T.fit(XMCData(*_wide(60, 2)), cfg.replace(knn=3, knn_weight=0.5, proto_weight=0.0), index=False)[0]
    store = fixed.neighbours
    assert store is not None and fixed.config.knn == 3 and "fusion_choice" not in fixed.index_info


def test_the_neighbour_store_shows_its_stages_and_chooses_alike_with_a_bar(capsys):
    from dslide import train as T
    from dslide.io.data import XMCData

    X, Y = _wide(2400, 2)
    cfg = Config(hidden=(4,), epochs=1.0, batch_size=200, early_stop=False)
    quiet = T.fit(XMCData(X, Y), cfg, index=False)[0]
    assert "neighbour labels" not in capsys.readouterr().err
    shown = T.fit(XMCData(X, Y), cfg, index=False, index_progress=True)[0]
    err = capsys.readouterr().err
    assert "neighbour labels" in err and "/3 " in err
    for stage in ("store", "validation choice", "store of every point"):
        assert stage in err
    # stderr is no terminal here: the bar's last state stays and ends its line, so what is printed
    # next (the end of training's summary) starts a line of its own
    assert err.endswith("\n") and err.rstrip("\n").split("\r")[-1].strip().startswith("neighbour labels")
    assert quiet.index_info["fusion_choice"] == shown.index_info["fusion_choice"]


def test_the_fusion_choice_depends_on_the_seed_and_data_only():
    """The validation points behind the choice are drawn by the seed: two fits agree, and
    another seed draws other points."""
    from dslide import train as T
    from dslide.io.data import XMCData

    X, Y = _wide(2400, 2, seed=1)
    cfg = Config(hidden=(4,), epochs=1.0, batch_size=200, seed=3, early_stop=False)
    a = T.fit(XMCData(X, Y), cfg, index=False)[0].index_info["fusion_choice"]
    b = T.fit(XMCData(X, Y), cfg, index=False)[0].index_info["fusion_choice"]
    assert a == b
    c = T.fit(XMCData(X, Y), cfg.replace(seed=4), index=False)[0].index_info["fusion_choice"]
    assert c["p@1/p@5"] != a["p@1/p@5"]


def test_where_the_neighbours_are_fused_the_output_takes_uniform_negatives_only():
    """knn on (left to the data, or explicit): lsh.max_active 0 unless given; the network alone
    (knn 0: narrow, many points per label, or asked) keeps the candidates of its width."""
    from dslide.config import CANDIDATES_MIN_WIDTH, FUSED_MAX_ACTIVE, MAX_ACTIVE, LSHConfig

    wide = max(670_091, CANDIDATES_MIN_WIDTH)
    assert FUSED_MAX_ACTIVE == 0
    assert Config().resolve(wide, 1.3).lsh.max_active == 0
    assert Config().resolve(wide).lsh.max_active == 0  # no data shape: the width turns knn on
    assert Config(knn=5).resolve(wide, 30.0).lsh.max_active == 0
    for c in (Config().resolve(wide, 30.0), Config(knn=0).resolve(wide, 1.3)):
        assert c.lsh.max_active is None and c.lsh.active_count(wide) == MAX_ACTIVE
    assert Config(lsh=LSHConfig(max_active=64)).resolve(wide, 1.3).lsh.max_active == 64  # explicit wins
    c = Config().resolve(wide, 1.3)
    assert c.resolve(wide, 1.3) == c  # resolving twice changes nothing
