"""dslide.io.formats: the split XMC files, headerless libsvm, .npz CSR pairs, prediction files.

Expected matrices are written out by hand from the files' text; round trips go through
every format and back to the XMC text."""

import numpy as np
import pytest
import scipy.sparse as sp

from dslide import cli
from dslide.io import formats
from dslide.io.data import XMCData, XMCFormatError, read_xmc

# the same three points in each format: features [3, 5], labels [3, 4]
X_DENSE = np.array([[1.5, 0, 0, 2, 0], [0, 0, 0, 0, 0.25], [0, 0, 1, 0, 0]], np.float32)
Y_DENSE = np.array([[0, 1, 0, 1], [0, 0, 0, 0], [1, 0, 0, 0]], np.float32)


def _check(data, x=X_DENSE, y=Y_DENSE):
    np.testing.assert_array_equal(data.X.toarray(), x)
    np.testing.assert_array_equal(data.Y.toarray(), y)
    assert data.X.dtype == np.float32 and data.Y.dtype == np.float32


def test_split_files_as_the_repository_ships_them(tmp_path):
    (tmp_path / "trn_X_Xf.txt").write_text("3 5\n0:1.5 3:2\n4:0.25\n2:1\n")
    (tmp_path / "trn_X_Y.txt").write_text("3 4\n1:1 3:1\n\n0:1\n")
    for arg in (tmp_path / "trn_X_Xf.txt", f"{tmp_path / 'trn_X_Xf.txt'},{tmp_path / 'trn_X_Y.txt'}"):
        assert formats.detect(str(arg)) == "split"
        _check(formats.read_data(str(arg)))
    # features alone (what predict needs): no labels
    (tmp_path / "alone_X_Xf.txt").write_text("3 5\n0:1.5 3:2\n4:0.25\n2:1\n")
    alone = formats.read_data(str(tmp_path / "alone_X_Xf.txt"), n_labels=4)
    _check(alone, y=np.zeros((3, 4), np.float32))


def test_split_files_that_disagree_are_named(tmp_path):
    (tmp_path / "a_X_Xf.txt").write_text("2 5\n0:1\n1:1\n")
    (tmp_path / "a_X_Y.txt").write_text("3 4\n0:1\n1:1\n2:1\n")
    with pytest.raises(ValueError, match="has 2 points but .*a_X_Y.txt has 3"):
        formats.read_data(str(tmp_path / "a_X_Xf.txt"))
    (tmp_path / "b_X_Xf.txt").write_text("3 5\n0:1\n1:1\n")
    with pytest.raises(XMCFormatError, match="header says 3 rows but the file has 2"):
        formats.read_sparse_file(str(tmp_path / "b_X_Xf.txt"))
    (tmp_path / "c_X_Xf.txt").write_text("1 5\n7:1\n")
    with pytest.raises(XMCFormatError, match=r"c_X_Xf.txt:2: feature index 7 out of range \[0, 5\)"):
        formats.read_sparse_file(str(tmp_path / "c_X_Xf.txt"))


def test_headerless_libsvm_multilabel(tmp_path):
    p = tmp_path / "d.svm"
    p.write_text("1,3 0:1.5 3:2\n 4:0.25\n0 2:1\n")
    assert formats.detect(str(p)) == "libsvm"
    _check(formats.read_data(str(p)))
    # widths are the largest index + 1, or what the model has (predict pads to them)
    wide = formats.read_data(str(p), n_features=9, n_labels=6)
    assert wide.X.shape == (3, 9) and wide.Y.shape == (3, 6)
    # a .txt without a header is libsvm by its first line
    q = tmp_path / "d.txt"
    q.write_text(p.read_text())
    assert formats.detect(str(q)) == "libsvm"


def test_npz_pairs_as_pecos_saves_them(tmp_path):
    sp.save_npz(tmp_path / "X.trn.npz", sp.csr_matrix(X_DENSE.astype(np.float64)))
    sp.save_npz(tmp_path / "Y.trn.npz", sp.csr_matrix(Y_DENSE * 1))
    assert formats.detect(str(tmp_path / "X.trn.npz")) == "npz"
    _check(formats.read_data(str(tmp_path / "X.trn.npz")))
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="not a scipy sparse .npz file"):
        formats.read_data(str(tmp_path / "bad.npz"))


@pytest.mark.parametrize("out", ["r_X_Xf.txt", "X.r.npz", "r.svm", "r.txt"])
def test_every_format_round_trips_through_convert(out, tmp_path, capsys):
    cli.main(["data", "gen", "--preset", "tiny", "--points", "60", "--test-points", "10", "--out", str(tmp_path / "g")])
    src = read_xmc(tmp_path / "g_train.txt")
    assert cli.main(["data", "convert", str(tmp_path / "g_train.txt"), str(tmp_path / out)]) == 0
    back = formats.read_data(str(tmp_path / out), n_features=src.n_features, n_labels=src.n_labels)
    assert (back.X != src.X).nnz == 0 and (back.Y != src.Y).nnz == 0
    assert cli.main(["data", "convert", str(tmp_path / out), str(tmp_path / "again.txt")]) == 0
    again = read_xmc(tmp_path / "again.txt", cache=False)
    if not out.endswith(".svm"):  # libsvm has no header: its widths are the largest index + 1
        assert again.X.shape == src.X.shape and again.Y.shape == src.Y.shape
    assert (again.X != src.X[:, :again.X.shape[1]]).nnz == 0


def _pyxclib_read_sparse_file(path):
    """pyxclib's read_sparse_file(header=True), written out: a header 'n_rows n_cols', then
    per line the 'index:value' tokens of one row."""
    with open(path) as f:
        n, m = (int(t) for t in f.readline().split())
        rows, cols, vals = [], [], []
        for r, line in enumerate(f):
            for tok in line.split():
                i, v = tok.split(":")
                rows.append(r), cols.append(int(i)), vals.append(float(v))
    return sp.csr_matrix((vals, (rows, cols)), shape=(n, m))


def test_prediction_files_text_with_header_and_csr(tmp_path):
    ids = np.array([[3, 0, -1], [1, 2, 0]])
    scores = np.array([[2.5, -1.0, 0.0], [0.75, 0.5, -3.0]])
    formats.write_predictions(str(tmp_path / "p.txt"), ids, scores, 4)
    # pairs in label order (pyxclib's read_sparse_file wants them sorted), scores to full precision
    assert (tmp_path / "p.txt").read_text().splitlines() == ["2 4", "0:-1.0 3:2.5", "0:-3.0 1:0.75 2:0.5"]
    want = np.array([[-1.0, 0, 0, 2.5], [-3.0, 0.75, 0.5, 0]])
    np.testing.assert_array_equal(_pyxclib_read_sparse_file(tmp_path / "p.txt").toarray(), want)
    formats.write_predictions(str(tmp_path / "p.npz"), ids, scores, 4, fmt="npz")
    P = sp.load_npz(tmp_path / "p.npz")
    assert P.format == "csr" and P.nnz == 5
    np.testing.assert_array_equal(P.toarray(), want)
    with pytest.raises(ValueError, match="'csv' is not valid; choose one of 'text', 'npz'"):
        formats.write_predictions(str(tmp_path / "p.csv"), ids, scores, 4, fmt="csv")


def test_train_and_predict_on_split_files_match_the_xmc_file(tmp_path, capsys):
    cli.main(["data", "gen", "--preset", "tiny", "--points", "300", "--test-points", "50", "--out", str(tmp_path / "g")])
    for part in ("train", "test"):
        cli.main(["data", "convert", str(tmp_path / f"g_{part}.txt"), str(tmp_path / f"{part}_X_Xf.txt")])
    sets = ["--set", "epochs=1", "--set", "hidden=16", "--quiet"]
    for name, tr, te in (("a", "g_train.txt", "g_test.txt"), ("b", "train_X_Xf.txt", "test_X_Xf.txt")):
        assert cli.main(["train", "--train", str(tmp_path / tr), "--out", str(tmp_path / name), *sets]) == 0
        assert cli.main(["predict", "--model", str(tmp_path / name), "--data", str(tmp_path / te), "--k", "3",
                         "--out", str(tmp_path / f"{name}.npz")]) == 0
    a, b = sp.load_npz(tmp_path / "a.npz"), sp.load_npz(tmp_path / "b.npz")
    assert a.shape == (50, read_xmc(tmp_path / "g_test.txt").n_labels) and a.nnz == 150
    assert (a != b).nnz == 0
