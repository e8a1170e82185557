"""One clear line where a raw errno or a layer's arithmetic used to speak: data from a pipe,
an output that cannot be written (checked before scoring), training data without labels."""

import errno
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp

from dslide import cli
from dslide.cli import common

from tests.conftest import TINY as S, tiny_run  # noqa: E402


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tiny_run(tmp_path_factory, "messages")
    return d


def test_data_from_a_pipe_is_one_line_saying_so(world, tmp_path):
    p = subprocess.run([sys.executable, "-m", "dslide", "eval", "--model", str(world / "run"), "--data", "/dev/stdin"],
                       input=(world / "t_test.txt").read_text(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip().splitlines() == ["dslide: error: --data /dev/stdin is not a regular file (a pipe or a "
                                             "device); dslide reads data files more than once: save it to a file "
                                             "first"]


def test_predict_into_a_read_only_directory_is_refused_before_the_model_is_loaded(world, tmp_path, capsys,
                                                                                   monkeypatch):
    import tempfile

    real = tempfile.mkstemp

    def read_only(*a, dir=None, **k):
        if dir is not None and str(dir) == str(tmp_path):
            raise OSError(errno.EROFS, "Read-only file system")
        return real(*a, dir=dir, **k)

    def never(*a, **k):
        raise AssertionError("the model was loaded (and the data scored) before --out was checked")

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    monkeypatch.setattr(common, "load_model", never)
    with pytest.raises(SystemExit) as e:
        cli.main(["predict", "--model", str(world / "run"), "--data", str(world / "t_test.txt"), "--k", "3",
                  "--out", str(tmp_path / "p.txt")])
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert f"--out {tmp_path / 'p.txt'} cannot be written: {tmp_path}: Read-only file system" in err


@pytest.mark.parametrize("Y", [[[] for _ in range(20)], sp.csr_matrix((20, 0), dtype=np.float32)],
                         ids=["empty-lists", "no-columns"])
def test_the_api_names_labels_missing_not_a_layer_of_0_neurons(Y):
    import dslide

    X = sp.random(20, 30, density=0.3, format="csr", dtype=np.float32, random_state=0)
    with pytest.raises(ValueError, match="Y has 0 labels"):
        dslide.Model(hidden=[8], epochs=1).fit(X, Y)
