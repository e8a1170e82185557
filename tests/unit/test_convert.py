"""`dslide data convert` and the commands that read its output: whatever convert writes,
`train --train OUT` (and every other reader of a data argument) reads back as the same pair,
for every pair of formats; and `--in-format` / `--out-format` named apart.

Caught: `data convert small_train.txt mydata.npz` wrote mydata.npz and mydata_Y.npz, and
`train --train mydata.npz` found no labels file ("training on ... 0 labels"); `predict
--format npz` on a text file answered with numpy's message about pickled data."""

import itertools

import numpy as np
import pytest
import scipy.sparse as sp

from dslide import cli
from dslide.io import formats
from dslide.io.data import XMCData

# the name a user would give each output format, and the name an input of it may have
OUT_NAMES = {"xmc": ["out.txt"], "libsvm": ["out.svm"], "split": ["out_X_Xf.txt", "plain.txt"],
             "npz": ["mydata.npz", "X.out.npz"]}
IN_NAMES = {"xmc": "in.txt", "libsvm": "in.svm", "split": "in_X_Xf.txt", "npz": "Xin.npz"}


def _data(n=30, n_features=20, n_labels=12, seed=0) -> XMCData:
    rng = np.random.default_rng(seed)
    X = sp.random(n, n_features, density=0.3, random_state=rng, format="csr", dtype=np.float32)
    X.data = np.round(X.data * 8) / 8 + 0.125  # exact in every text format, never 0
    Y = sp.random(n, n_labels, density=0.2, random_state=rng, format="csr", dtype=np.float32)
    X, Y = X.tolil(), Y.tolil()
    for i in range(n):  # every point has a feature and a label; the last ones are used
        X[i, i % n_features] = 1.0
        Y[i, i % n_labels] = 1.0
    Y = sp.csr_matrix(Y)
    Y.data[:] = 1.0
    return XMCData(sp.csr_matrix(X), Y)


def _same(a: XMCData, b: XMCData) -> None:
    assert a.X.shape == b.X.shape and a.Y.shape == b.Y.shape
    assert (a.X != b.X).nnz == 0 and (a.Y != b.Y).nnz == 0


@pytest.mark.parametrize("fin,fout", list(itertools.product(formats.FORMATS, formats.FORMATS)))
def test_what_convert_writes_reads_back_as_the_same_pair(tmp_path, capsys, fin, fout):
    data = _data()
    src = str(tmp_path / IN_NAMES[fin])
    formats.write_data(src, data, fin)
    for name in OUT_NAMES[fout]:
        dst = str(tmp_path / name)
        args = ["data", "convert", src, dst]
        if name == "plain.txt":  # a name that says nothing: the format given
            args += ["--out-format", fout]
        assert cli.main(args) == 0
        written = capsys.readouterr().out
        # what train does with --train OUT: the format and the labels file found from the name
        back = formats.read_data(dst)
        _same(back, data)
        assert f"{data.n_labels:,} labels" in written


def test_train_reads_the_npz_pair_convert_wrote(tmp_path, capsys):
    data = _data(n=60)
    formats.write_data(str(tmp_path / "small_train.txt"), data)
    assert cli.main(["data", "convert", str(tmp_path / "small_train.txt"), str(tmp_path / "mydata.npz")]) == 0
    assert (tmp_path / "mydata_Y.npz").exists()
    assert cli.main(["train", "--train", str(tmp_path / "mydata.npz"), "--out", str(tmp_path / "run"),
                     "--set", "epochs=1", "--set", "hidden=8", "--set", "knn=0"]) == 0
    out = capsys.readouterr().out
    assert f"{data.n_labels:,} labels" in out and " 0 labels" not in out


def test_a_text_file_read_as_npz_is_named_in_one_line(tmp_path, capsys):
    data = _data()
    formats.write_data(str(tmp_path / "d.txt"), data)
    for opt in ("--in-format", "--format"):  # --format: the old name of --in-format
        with pytest.raises(SystemExit) as e:
            cli.main(["data", "stats", str(tmp_path / "d.txt"), "--format", "npz"] if opt == "--format" else
                     ["data", "convert", str(tmp_path / "d.txt"), str(tmp_path / "o.txt"), opt, "npz"])
        assert e.value.code == cli.EXIT_USAGE
        err = capsys.readouterr().err
        assert "d.txt was read as format 'npz' but is not a scipy sparse .npz file" in err
        assert "pickle" not in err and len(err.strip().splitlines()) == 1


def test_predict_and_eval_name_the_input_format_apart_from_the_output_format(capsys):
    for cmd in ("predict", "eval"):
        with pytest.raises(SystemExit):
            cli.main([cmd, "--help"])
        text = capsys.readouterr().out
        assert "--in-format" in text and "--format is the same option" in " ".join(text.split())
        assert "\n  --format" not in text  # the old name works, unlisted
    args = cli.parser().parse_args(["predict", "--model", "m", "--data", "d", "--format", "npz", "--out", "p"])
    assert args.format == "npz" and args.out_format is None
    args = cli.parser().parse_args(["predict", "--model", "m", "--data", "d", "--in-format", "libsvm", "--out", "p",
                                    "--out-format", "npz"])
    assert (args.format, args.out_format) == ("libsvm", "npz")
