"""The rule that takes settings from the data's shape (Config.resolve, knn_default), one regime per test."""

import numpy as np
import pytest
import scipy.sparse as sp

from dslide.config import (KNN, KNN_MAX_POINTS_PER_LABEL, NARROW_OUTPUT, WIDE_EPOCHS, Config, knn_default,
                           label_points)


def test_label_points_counts_occurring_labels_only():
    assert label_points([3, 0, 1, 0, 2]) == pytest.approx(2.0)
    assert label_points([0, 0]) == 0.0


@pytest.mark.parametrize("n_labels,ppl,knn", [
    (670_091, 1.3, KNN),       # Amazon-670K-like long tail: the neighbours' labels on
    (40_000, 8.7, KNN),        # a 40,000-label head-heavy set
    (500, 8.2, 0),             # narrow: the wide hidden layer's 30 epochs learn its labels
    (159, 73.1, 0),            # BibTeX: many points per label, the network alone
    (40_000, KNN_MAX_POINTS_PER_LABEL, 0),  # the boundary belongs to the network
    (670_091, None, KNN),      # no data shape given: the width decides
    (NARROW_OUTPUT, None, 0),
])
def test_knn_default_per_regime(n_labels, ppl, knn):
    assert knn_default(n_labels, ppl) == knn
    if ppl is not None:
        assert Config().resolve(n_labels, ppl).knn == knn


def test_without_the_data_shape_knn_stays_unset_and_a_store_uses_knn_neighbours():
    c = Config().resolve(670_091)
    assert c.knn is None and c.neighbours() == KNN
    assert Config(knn=0).resolve(670_091).neighbours() == 0


def test_wide_outputs_train_fewer_epochs_and_explicit_settings_win():
    assert Config().resolve(670_091, 1.3).epochs == WIDE_EPOCHS
    assert Config().resolve(159, 73.1).epochs == 30.0
    c = Config(knn=3, knn_weight=0.1, epochs=7.0).resolve(670_091, 1.3)
    assert (c.knn, c.knn_weight, c.epochs) == (3, 0.1, 7.0)


def test_fit_resolves_knn_from_the_training_labels():
    from dslide import train as T
    from dslide.data import XMCData

    rng = np.random.default_rng(0)
    X = sp.random(60, 20, density=0.3, format="csr", random_state=rng, dtype=np.float32)
    L = NARROW_OUTPUT + 1  # a wide output
    few = sp.csr_matrix((np.ones(60, np.float32), (np.arange(60), np.arange(60) % 30)), shape=(60, L))  # 2 a label
    many = sp.csr_matrix((np.ones(60, np.float32), (np.arange(60), np.arange(60) % 2)), shape=(60, L))  # 30 a label
    cfg = Config(hidden=(4,), epochs=1.0, batch_size=30)
    assert T.fit(XMCData(X, few), cfg, index=False)[0].config.knn == KNN
    assert T.fit(XMCData(X, many), cfg, index=False)[0].config.knn == 0
