"""PSP@k means one thing: propensities from the training labels, saved with the run, read by `dslide eval`.

Expected values are worked by hand from the formula in dslide/metrics.py
(`inverse_propensity`, Jain et al. 2016) and written out below; the end-to-end
test checks that `eval` on the test file reproduces training's metrics.json
(the same model on the same file once gave PSP@1 0.305 in eval and 0.064 in
metrics.json, because eval took the propensities from the file it evaluated).
"""

import json

import numpy as np
import pytest
import scipy.sparse as sp

from dslide import cli, propensity
from dslide.io.data import read_xmc
from dslide.metrics import inverse_propensity, psprecision_at_k

# Training labels: 4 points, 3 labels; label 0 on 3 points, label 1 on 1, label 2 on none.
Y_TRAIN = sp.csr_matrix(np.array([[1, 0, 0], [1, 1, 0], [1, 0, 0], [0, 0, 0]], dtype=np.float32))
# A = 0.55, B = 1.5, N = 4:  C = (ln 4 - 1) (1.5 + 1)^0.55 = 0.3862943611 * 1.6552629900 = 0.6394187592
#   N_l = 3: 1/p = 1 + C * 4.5^-0.55 = 1 + 0.6394187592 * 0.4372533217 = 1.2795879764
#   N_l = 1: 1/p = 1 + C * 2.5^-0.55 = 1 + (ln 4 - 1)                   = 1.3862943611
#   N_l = 0: 1/p = 1 + C * 1.5^-0.55 = 1 + 0.6394187592 * 0.8001102011 = 1.5116054720
W_HAND = [1.2795879764, 1.3862943611, 1.5116054720]
# Test points: t0 has labels {0, 2}, t1 has {1}; predicted t0 -> [2, 0], t1 -> [0, 2].
Y_TEST = sp.csr_matrix(np.array([[1, 0, 1], [0, 1, 0]], dtype=np.float32))
PRED = np.array([[2, 0], [0, 2]])
# PSP@1 = w2 / (w2 + w1)                 = 1.5116054720 / 2.8979000000... = 0.5216210218
# PSP@2 = (w2 + w0) / ((w2 + w0) + w1)    = 2.7911934484 / 4.1774878096   = 0.6681511893
PSP_HAND = [0.5216210218, 0.6681511893]


def test_training_labels_give_the_hand_computed_weights_and_psp():
    props = propensity.compute(Y_TRAIN)
    np.testing.assert_allclose(props["inv_prop"], W_HAND, rtol=0, atol=1e-9)
    assert props["counts"].tolist() == [3, 1, 0] and int(props["n_points"]) == 4
    assert float(props["A"]) == 0.55 and float(props["B"]) == 1.5
    np.testing.assert_allclose(psprecision_at_k(Y_TEST, PRED, props["inv_prop"], k=2), PSP_HAND,
                               rtol=0, atol=1e-9)


def test_saved_file_round_trips_and_keeps_the_constants(tmp_path):
    props = propensity.compute(Y_TRAIN, A=0.6, B=2.6)
    path = propensity.save(tmp_path, props)
    assert path == tmp_path / "propensity.npz" and not list(tmp_path.glob("*.tmp"))
    back = propensity.load(tmp_path, 3)
    np.testing.assert_array_equal(back["inv_prop"], inverse_propensity(Y_TRAIN, A=0.6, B=2.6))
    assert (back["A"], back["B"], back["n_points"]) == (0.6, 2.6, 4)
    assert back["counts"].tolist() == [3, 1, 0]
    assert propensity.load(tmp_path / "elsewhere", 3) is None


def test_a_file_for_other_labels_or_broken_is_a_clear_error(tmp_path):
    propensity.save(tmp_path, propensity.compute(Y_TRAIN))
    with pytest.raises(ValueError, match=r"propensity.npz: holds 3 label weights; the model has 5 labels"):
        propensity.load(tmp_path, 5)
    (tmp_path / "propensity.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="propensity.npz"):
        propensity.load(tmp_path, 3)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("psp")
    cli.main(["data", "gen", "--preset", "tiny", "--out", str(d / "tiny")])
    train, test, run_dir = d / "tiny_train.txt", d / "tiny_test.txt", d / "run"
    code = cli.main(["train", "--train", str(train), "--test", str(test), "--out", str(run_dir), "--quiet",
                     "--set", "epochs=2", "--set", "hidden=32", "--set", "lr=1e-2", "--set", "dropout=0",
                     "--set", "propensity_a=0.6", "--set", "propensity_b=2.6"])
    assert code == 0
    return train, test, run_dir


def test_eval_uses_the_training_propensities_saved_with_the_run(tiny_run, capsys):
    train, test, run_dir = tiny_run
    capsys.readouterr()
    trained = json.loads((run_dir / "metrics.json").read_text())
    saved = propensity.load(run_dir, read_xmc(train).n_labels)
    assert (saved["A"], saved["B"]) == (0.6, 2.6)
    np.testing.assert_array_equal(saved["inv_prop"], inverse_propensity(read_xmc(train).Y, A=0.6, B=2.6))

    assert cli.main(["eval", "--model", str(run_dir), "--data", str(test)]) == 0
    out = capsys.readouterr().out
    ev = json.loads((run_dir / "metrics.json").read_text())["eval"]
    for k in (1, 3, 5):  # the same model on the same file: the same PSP@k as training's metrics
        assert ev[f"psp@{k}"] == pytest.approx(trained[f"psp@{k}"], abs=1e-12)
        assert f"PSP@{k} {trained[f'psp@{k}']:.4f}" in out
    assert "A = 0.6, B = 2.6" in out
    # and not the figure the test file's own propensities give
    from dslide.infer.predict import predict_topk
    from dslide.comm import Comm
    from dslide.session import load_model

    Yt = read_xmc(test).Y
    pred = predict_topk(load_model(str(run_dir), Comm()), read_xmc(test).X, 5)
    own = psprecision_at_k(Yt, pred, inverse_propensity(Yt, A=0.6, B=2.6), k=5)
    assert abs(own[0] - ev["psp@1"]) > 1e-3


def test_eval_of_a_run_without_propensities_leaves_psp_out(tiny_run, capsys, tmp_path):
    import shutil

    _, test, run_dir = tiny_run
    old = tmp_path / "old"
    shutil.copytree(run_dir, old)
    (old / "propensity.npz").unlink()
    capsys.readouterr()
    assert cli.main(["eval", "--model", str(old), "--data", str(test)]) == 0
    out = capsys.readouterr().out
    assert "PSP@k left out" in out and "PSP@1 " not in out
    assert "psp@1" not in json.loads((old / "metrics.json").read_text())["eval"]


@pytest.mark.parametrize("sets, message", [(["propensity_b=0"], "propensity_b = 0 must be in (0.0, 1000000.0]"),
                                           (["propensity_a=-1"], "propensity_a = -1 must be in [0.0, 100.0]")])
def test_bad_propensity_constants_are_one_clear_line(tiny_run, sets, message, capsys, tmp_path):
    train = tiny_run[0]
    argv = ["train", "--train", str(train), "--out", str(tmp_path / "r")]
    for s in sets:
        argv += ["--set", s]
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


# -- presets and eval's other constants ----------------------------------------------------


def _pyxclib_psp(Y, pred, inv, k):
    """pyxclib's psprecision written out: per point the inverse propensities of the predicted
    labels that are relevant, summed over the top k, over the same for the best possible
    ranking (the point's relevant labels by weight); both averaged over the points first."""
    Yd = Y.toarray() > 0
    num = den = 0.0
    for i in range(Yd.shape[0]):
        num += sum(inv[j] for j in pred[i, :k] if j >= 0 and Yd[i, j]) / k
        den += sum(sorted((inv[j] for j in np.flatnonzero(Yd[i])), reverse=True)[:k]) / k
    return num / den


@pytest.mark.parametrize("preset, A, B", [("default", 0.55, 1.5), ("amazon", 0.6, 2.6), ("wikipedia", 0.5, 0.4)])
def test_presets_give_the_repositorys_constants_and_explicit_ones_win(preset, A, B):
    from dslide.config import Config

    assert Config(propensity=preset).propensity_constants == (A, B)
    assert Config(propensity=preset, propensity_b=7.0).propensity_constants == (A, 7.0)
    with pytest.raises(ValueError, match="propensity = 'amazon670k' is not valid; choose one of 'default', "
                                         "'amazon', 'wikipedia'"):
        Config(propensity="amazon670k")


def test_set_propensity_preset_is_what_training_saves(tiny_run, tmp_path):
    train = tiny_run[0]
    run_dir = tmp_path / "wiki"
    assert cli.main(["train", "--train", str(train), "--out", str(run_dir), "--quiet", "--set", "epochs=1",
                     "--set", "hidden=16", "--set", "propensity=wikipedia"]) == 0
    saved = propensity.load(run_dir, read_xmc(train).n_labels)
    assert (saved["A"], saved["B"]) == (0.5, 0.4)
    N = read_xmc(train).n_points
    counts = np.bincount(read_xmc(train).Y.indices, minlength=read_xmc(train).n_labels)
    hand = 1 + (np.log(N) - 1) * (0.4 + 1) ** 0.5 * (counts + 0.4) ** -0.5
    np.testing.assert_allclose(saved["inv_prop"], hand, rtol=1e-12)


@pytest.mark.parametrize("flags, A, B", [(["--propensity", "wikipedia"], 0.5, 0.4),
                                         (["--propensity-a", "0.55", "--propensity-b", "1.5"], 0.55, 1.5),
                                         (["--propensity-b", "1.0"], 0.6, 1.0)])
def test_eval_recomputes_psp_from_the_saved_counts_with_other_constants(tiny_run, flags, A, B, capsys):
    train, test, run_dir = tiny_run  # trained with A = 0.6, B = 2.6
    capsys.readouterr()
    assert cli.main(["eval", "--model", str(run_dir), "--data", str(test), *flags]) == 0
    out = capsys.readouterr().out
    ev = json.loads((run_dir / "metrics.json").read_text())["eval"]
    from dslide.infer.predict import predict_topk
    from dslide.comm import Comm
    from dslide.session import load_model

    Ytr, te = read_xmc(train).Y, read_xmc(test)
    N = Ytr.shape[0]
    counts = np.bincount(Ytr.indices, minlength=Ytr.shape[1])
    inv = 1 + (np.log(N) - 1) * (B + 1) ** A * (counts + B) ** -A  # Jain et al., pyxclib's formula
    pred = predict_topk(load_model(str(run_dir), Comm()), te.X, 5)
    for k in (1, 3, 5):
        assert ev[f"psp@{k}"] == pytest.approx(_pyxclib_psp(te.Y, pred, inv, k), rel=1e-9)
    assert f"A = {A:g}, B = {B:g}" in out
