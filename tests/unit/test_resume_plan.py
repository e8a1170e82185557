"""A resume says what it will do when its settings or its data differ from the run's (the
data compared by a checksum kept in every checkpoint); one that would train no step is
refused before anything is rewritten (tests/unit/test_bad_inputs.py, run-resume-0-steps)."""

import shutil

import pytest

from dslide import cli
from dslide.io.data import checksum, read_xmc

from tests.conftest import TINY as S, tiny_run  # noqa: E402


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tiny_run(tmp_path_factory, "resume_plan")
    lines = (d / "t_train.txt").read_text().split("\n")
    first = lines[1].split(" ")
    first[1] = first[1].split(":")[0] + ":0.123"  # one value changed: the same shape, other content
    lines[1] = " ".join(first)
    (d / "other.txt").write_text("\n".join(lines))
    return d


def _resume(world, tmp_path, capsys, data, *sets):
    run = tmp_path / "run"
    shutil.copytree(world / "run", run)
    capsys.readouterr()
    code = cli.main(["train", "--train", str(world / data), "--resume", str(run), "--quiet", *sets])
    out, err = capsys.readouterr()
    assert code == 0, err
    return err


def test_other_data_of_the_same_shape_is_named(world, tmp_path, capsys):
    err = _resume(world, tmp_path, capsys, "other.txt", "--set", "epochs=2")
    assert "other.txt has the run's shape but not the content it was trained on" in err
    assert "resuming trains the saved model further on this data" in err


def test_changed_settings_are_listed_and_the_same_data_says_nothing(world, tmp_path, capsys):
    err = _resume(world, tmp_path, capsys, "t_train.txt", "--set", "epochs=2", "--set", "log_every=3")
    assert "with changed settings: epochs 1 -> 2, log_every" in err
    assert "content" not in err


def test_the_checksum_is_of_the_content_not_the_file():
    import numpy as np
    import scipy.sparse as sp

    from dslide.io.data import XMCData

    X = sp.csr_matrix(np.array([[0, 1.5, 0], [2, 0, 0]], np.float32))
    Y = sp.csr_matrix(np.array([[1, 0], [0, 1]], np.float32))
    wide = XMCData(sp.csr_matrix((X.data, X.indices.astype(np.int64), X.indptr.astype(np.int64)), X.shape), Y)
    assert checksum(XMCData(X, Y)) == checksum(wide)
    X2 = X.copy()
    X2.data[0] = 1.25
    assert checksum(XMCData(X2, Y)) != checksum(XMCData(X, Y))
