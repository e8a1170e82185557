"""dslide.Model, the Python interface: the same model as the command line on the same data
and seed, run directories that either side reads, predictions as arrays or a CSR."""

import numpy as np
import pytest
import scipy.sparse as sp

import dslide
from dslide import cli
from dslide.io import formats
from dslide.io.data import read_xmc

SETTINGS = {"epochs": 2, "hidden": 32, "lr": 1e-2, "batch_size": 64, "dropout": 0.0, "seed": 3}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("api")
    cli.main(["data", "gen", "--preset", "tiny", "--points", "600", "--test-points", "200", "--out", str(d / "t")])
    return d, read_xmc(d / "t_train.txt"), read_xmc(d / "t_test.txt")


@pytest.fixture(scope="module")
def cli_run(tiny):
    d = tiny[0]
    sets = [x for k, v in SETTINGS.items() for x in ("--set", f"{k}={v}")]
    assert cli.main(["train", "--train", str(d / "t_train.txt"), "--out", str(d / "cli_run"), "--quiet", *sets]) == 0
    return d / "cli_run"


@pytest.fixture(scope="module")
def fitted(tiny):
    _, train, _ = tiny
    return dslide.Model(**SETTINGS).fit(train.X, train.Y)


def _cli_predictions(run_dir, data_path, out, k=5):
    assert cli.main(["predict", "--model", str(run_dir), "--data", str(data_path), "--k", str(k),
                     "--out", str(out)]) == 0
    ids, scores = formats.read_predictions(str(out))  # pairs in label order: ranked again by score
    return out.read_text().splitlines()[0], ids, scores


def test_the_public_surface_is_named():
    assert set(dslide.__all__) >= {"Model", "read_data", "XMCData", "__version__"}
    for name in dslide.__all__:
        assert getattr(dslide, name) is not None


def test_fit_predicts_what_the_command_line_model_predicts(tiny, cli_run, fitted, tmp_path):
    d, _, test = tiny
    header, ids_cli, scores_cli = _cli_predictions(cli_run, d / "t_test.txt", tmp_path / "p.txt")
    assert header == f"{test.n_points} {test.n_labels}"
    ids, scores = fitted.predict(test.X, k=5)
    assert ids.shape == (test.n_points, 5) and ids.dtype == np.int64
    np.testing.assert_array_equal(ids, ids_cli)
    np.testing.assert_array_equal(scores, scores_cli)  # the text keeps every digit


def test_save_and_load_round_trip_both_ways(tiny, cli_run, fitted, tmp_path):
    d, _, test = tiny
    fitted.save(tmp_path / "api_run")
    for f in ("config.toml", "propensity.npz", "checkpoints/LATEST"):
        assert (tmp_path / "api_run" / f).exists(), f
    ids, scores = fitted.predict(test.X, k=5)
    # the command line reads the API's run directory ...
    _, ids_cli, _ = _cli_predictions(tmp_path / "api_run", d / "t_test.txt", tmp_path / "p.txt")
    np.testing.assert_array_equal(ids_cli, ids)
    # ... and the API both
    for run_dir in (tmp_path / "api_run", cli_run):
        again = dslide.Model.load(run_dir)
        ids2, scores2 = again.predict(test.X, k=5)
        np.testing.assert_array_equal(ids2, ids)
        np.testing.assert_allclose(scores2, scores, rtol=1e-6)


def test_evaluate_matches_the_command_line_and_numpy(tiny, cli_run, fitted, capsys):
    d, _, test = tiny
    m = fitted.evaluate(test.X, test.Y, k=5)
    ids, _ = fitted.predict(test.X, k=5)
    Y = test.Y.toarray() > 0
    p1 = np.mean([Y[i, ids[i, 0]] for i in range(test.n_points)])
    p5 = np.mean([Y[i, ids[i]].sum() / 5 for i in range(test.n_points)])
    assert m["p@1"] == pytest.approx(p1) and m["p@5"] == pytest.approx(p5)
    capsys.readouterr()
    assert cli.main(["eval", "--model", str(cli_run), "--data", str(d / "t_test.txt")]) == 0
    out = capsys.readouterr().out
    assert f"P@1 {m['p@1']:.4f}" in out and f"PSP@5 {m['psp@5']:.4f}" in out


def test_label_lists_and_a_sparse_prediction_matrix(tiny, fitted):
    _, train, test = tiny
    lists = [list(train.Y.indices[train.Y.indptr[i]:train.Y.indptr[i + 1]]) for i in range(train.n_points)]
    from_lists = dslide.Model(**SETTINGS).fit(train.X, lists, n_labels=train.n_labels)
    ids, scores = fitted.predict(test.X, k=3)
    np.testing.assert_array_equal(from_lists.predict(test.X, k=3)[0], ids)
    P = fitted.predict(test.X, k=3, sparse=True)
    assert sp.isspmatrix_csr(P) and P.shape == (test.n_points, test.n_labels) and P.nnz == 3 * test.n_points
    for i in (0, 7, test.n_points - 1):
        row = P.getrow(i)
        order = np.argsort(-row.data, kind="stable")
        np.testing.assert_array_equal(row.indices[order], ids[i])
        np.testing.assert_allclose(row.data[order], scores[i], rtol=1e-6)


def test_settings_are_validated_like_set_and_misuse_is_named(tiny, fitted):
    _, train, test = tiny
    with pytest.raises(ValueError, match=r"lr = -1 must be in \(0.0, 10.0\]"):
        dslide.Model(lr=-1)
    with pytest.raises(ValueError, match="unknown configuration key 'epoch'; did you mean 'epochs'"):
        dslide.Model(epoch=3)
    assert dslide.Model(**{"lsh.K": 8}).config.lsh.K == 8
    with pytest.raises(ValueError, match="not trained"):
        dslide.Model().predict(test.X)
    with pytest.raises(ValueError, match=r"k = 0 must be an integer in \[1, "):
        fitted.predict(test.X, k=0)
    with pytest.raises(ValueError, match="output layer is dense"):
        fitted.predict(test.X, lsh=True)
    with pytest.raises(ValueError, match="label lists"):
        dslide.Model(**SETTINGS).fit(train.X, train.Y.toarray())
