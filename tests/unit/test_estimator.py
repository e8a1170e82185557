"""dslide.Model in the conventions of the field: `top_k` (napkinXC, omikuji), `n_features_in_`,
scikit-learn's get_params / set_params / clone, a CSR of scores as PECOS returns, and a
second `fit` that resolves the settings from its own data.

Caught: `predict(X, top_k=5)` was a TypeError; `fit` overwrote the settings with the first
data's resolved values, so a second fit on other data kept them."""

import copy

import numpy as np
import pytest
import scipy.sparse as sp

import dslide
from dslide import cli, metrics
from dslide.io.data import read_xmc

SETTINGS = {"epochs": 1, "hidden": 16, "seed": 3, "lsh": {"K": 4}}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("estimator")
    cli.main(["data", "gen", "--preset", "tiny", "--points", "400", "--test-points", "100", "--out", str(d / "t")])
    return read_xmc(d / "t_train.txt"), read_xmc(d / "t_test.txt")


@pytest.fixture(scope="module")
def fitted(tiny):
    train, _ = tiny
    return dslide.Model(**SETTINGS).fit(train.X, train.Y)


def test_top_k_is_k(tiny, fitted):
    _, test = tiny
    ids, scores = fitted.predict(test.X, k=3)
    for other in (fitted.predict(test.X, top_k=3), fitted.predict(test.X, 3), fitted.predict(test.X, k=3, top_k=3)):
        np.testing.assert_array_equal(other[0], ids)
        np.testing.assert_array_equal(other[1], scores)
    assert fitted.predict(test.X)[0].shape == (test.n_points, 5)
    with pytest.raises(ValueError, match="k = 2 and top_k = 3: they are the same setting"):
        fitted.predict(test.X, k=2, top_k=3)
    with pytest.raises(ValueError, match=r"must be an integer in \[1, "):
        fitted.predict(test.X, top_k=0)


def test_predict_csr_is_the_top_k_as_pecos_returns_it(tiny, fitted):
    _, test = tiny
    ids, scores = fitted.predict(test.X, top_k=4)
    P = fitted.predict_csr(test.X, top_k=4)
    assert sp.isspmatrix_csr(P) and P.dtype == np.float64 and P.shape == (test.n_points, test.n_labels)
    assert P.has_sorted_indices and P.nnz == int((ids >= 0).sum())
    assert (P != fitted.predict(test.X, k=4, sparse=True)).nnz == 0
    np.testing.assert_array_equal(P[np.arange(test.n_points)[:, None], ids].toarray(), scores)
    assert metrics.evaluate(test.Y, P, k=4) == metrics.evaluate(test.Y, ids, k=4)


def test_n_features_in_(tiny, fitted, tmp_path):
    train, _ = tiny
    assert not hasattr(dslide.Model(**SETTINGS), "n_features_in_")
    assert fitted.n_features_in_ == train.n_features
    fitted.save(tmp_path / "m")
    assert dslide.Model.load(tmp_path / "m").n_features_in_ == train.n_features


def test_get_params_gives_the_settings_as_given_and_fit_leaves_them(fitted):
    params = fitted.get_params()
    assert params == SETTINGS and params["lsh"] is SETTINGS["lsh"]  # the very objects passed
    assert fitted.get_params(deep=False) == params
    assert fitted.config.knn is None and fitted.config.batch_size is None  # unset: taken from the data in fit
    assert fitted.config_.batch_size is not None  # the resolved ones fit trained with
    assert fitted.config_ is fitted._model.config


def test_set_params_checks_like_model_and_returns_self():
    m = dslide.Model(**SETTINGS)
    assert m.set_params(hidden=32, lr=1e-3) is m
    assert m.get_params() == {**SETTINGS, "hidden": 32, "lr": 1e-3}
    assert m.config.hidden == (32,) and m.config.lr == 1e-3
    with pytest.raises(ValueError, match=r"lr = -1 must be in"):
        m.set_params(lr=-1)
    with pytest.raises(ValueError, match="unknown configuration key 'epoch'"):
        m.set_params(epoch=2)
    assert m.get_params() == {**SETTINGS, "hidden": 32, "lr": 1e-3}  # a refused change changes nothing


def test_clone_semantics_without_scikit_learn(fitted):
    # what sklearn.base.clone does: the class called with deep copies of get_params(deep=False),
    # then each parameter of the new object checked to be the very object passed
    passed = {k: copy.deepcopy(v) for k, v in fitted.get_params(deep=False).items()}
    new = type(fitted)(**passed)
    assert all(new.get_params(deep=False)[k] is v for k, v in passed.items())
    assert new.get_params() == SETTINGS and not hasattr(new, "n_features_in_")
    twin = fitted.__sklearn_clone__()  # scikit-learn >= 1.3 calls this
    assert twin.get_params() == SETTINGS and twin.comm is fitted.comm and twin._model is None
    assert twin.get_params()["lsh"] is not SETTINGS["lsh"]


def test_clone_with_scikit_learn(fitted):
    base = pytest.importorskip("sklearn.base")
    new = base.clone(fitted)
    assert isinstance(new, dslide.Model) and new.get_params() == SETTINGS and new._model is None


def test_a_second_fit_resolves_the_settings_from_its_own_data(tiny):
    train, _ = tiny
    half = slice(0, train.n_points // 2)
    m = dslide.Model(**SETTINGS).fit(train.X, train.Y)
    first = m.config_
    m.fit(train.X[half], train.Y[half])
    fresh = dslide.Model(**SETTINGS).fit(train.X[half], train.Y[half])
    assert m.config_ == fresh.config_
    # the narrow output's batch follows the points (dslide.config.narrow_batch)
    assert m.config_.batch_size != first.batch_size
    assert m.get_params() == SETTINGS
