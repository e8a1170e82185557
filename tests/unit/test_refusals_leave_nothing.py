"""A command refused after it has begun writing leaves nothing behind, and a rerun works.

Errors raised once the run directory is made (a layout the network refuses, an
output name the terminal cannot print) used to leave config.toml,
propensity.npz, the data's cache and the lock, so that a rerun was refused as
"already holds a run"; a failed export or Model.save left a half-built
directory that blocked a retry.
"""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp

from tests import faults

from tests.conftest import TINY as S, run_cli as _main, tiny_run  # noqa: E402


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tiny_run(tmp_path_factory, "leave_nothing")
    return d


def _entries(d):
    return sorted(os.listdir(d))


@pytest.mark.parametrize("out_exists", [False, True], ids=["new-out", "empty-out"])
def test_an_error_after_the_run_directory_is_made_leaves_nothing_and_a_rerun_works(
        world, tmp_path, capsys, monkeypatch, out_exists):
    from dslide import train as T

    data = tmp_path / "d.txt"
    shutil.copy(world / "t_train.txt", data)  # no cache yet: this run would write it
    out = tmp_path / "r"
    if out_exists:
        out.mkdir()
    before = _entries(tmp_path)

    def refuse(*a, **k):
        raise ValueError("refused by the network")

    monkeypatch.setattr(T, "build_network", refuse)
    code, _, err = _main(["train", "--train", str(data), "--out", str(out), *S], capsys)
    assert code == 2 and "refused by the network" in err
    assert _entries(tmp_path) == before  # no run files, no cache, no temporary
    if out_exists:
        assert _entries(out) == []  # the user's empty directory is kept, empty
    monkeypatch.undo()
    code, _, err = _main(["train", "--train", str(data), "--out", str(out), *S], capsys)
    assert code == 0, err


def test_an_error_after_the_first_step_keeps_the_run(world, tmp_path, capsys, monkeypatch):
    """Once training has begun, its log and config are the record of what happened: kept."""
    faults.inject(monkeypatch, "raise-rank0-step2")
    out = tmp_path / "r"
    code, _, err = _main(["train", "--train", str(world / "t_train.txt"), "--out", str(out), *S], capsys)
    assert code != 0 and "injected fault" in err
    assert {"config.toml", "log.jsonl", "dslide-run.json"} <= set(_entries(out))
    assert "dslide.lock" not in _entries(out)


def test_an_output_name_the_terminal_cannot_encode_is_escaped_not_an_error(world, tmp_path):
    out = tmp_path / "r\u00e4"
    env = {**os.environ, "PYTHONIOENCODING": "ascii"}
    p = subprocess.run([sys.executable, "-m", "dslide", "train", "--train", str(world / "t_train.txt"),
                        "--out", str(out), "--set", "hidden=16", "--set", "epochs=1"],
                       capture_output=True, text=True, timeout=300, env=env, errors="replace")
    assert p.returncode == 0, p.stderr
    assert "r\\xe4" in p.stdout
    assert (out / "checkpoints" / "LATEST").is_file()


def test_a_failed_export_leaves_no_directory_and_a_retry_works(world, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(world / "run", run)
    ckpt = run / "checkpoints" / (run / "checkpoints" / "LATEST").read_text().strip()
    w = ckpt / "rank-0000" / "layer1.W.npy"
    good = w.read_bytes()
    w.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))  # one bit: the copy fails on its hash, midway
    out = tmp_path / "sub" / "exported"
    code, _, err = _main(["export", "--model", str(run), "--out", str(out)], capsys)
    assert code == 2 and "layer1.W.npy" in err, err
    assert not out.exists() and _entries(tmp_path / "sub") == []  # no half-built export, no temporary
    w.write_bytes(good)
    code, _, err = _main(["export", "--model", str(run), "--out", str(out)], capsys)
    assert code == 0, err
    assert _entries(out) == ["checkpoints", "config.toml", "metrics.json"]


def _failing_save(monkeypatch):
    """ck.save that writes a checkpoint and then fails (a disk filling up at its end)."""
    from dslide.io import checkpoint as ck

    real = ck.save

    def save(*a, **k):
        real(*a, **k)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ck, "save", save)


def test_a_failed_save_leaves_no_directory_and_an_old_run_as_it_was(world, tmp_path, monkeypatch):
    import dslide

    model = dslide.Model.load(world / "run")
    _failing_save(monkeypatch)
    with pytest.raises(OSError, match="No space left"):
        model.save(tmp_path / "new")
    assert _entries(tmp_path) == []
    old = tmp_path / "old"
    shutil.copytree(world / "run", old)
    before = {p: p.read_bytes() for p in old.rglob("*") if p.is_file()}
    with pytest.raises(OSError, match="No space left"):
        model.save(old, overwrite=True)
    assert {p: p.read_bytes() for p in old.rglob("*") if p.is_file()} == before
    assert _entries(tmp_path) == ["old"]
    monkeypatch.undo()
    model.save(tmp_path / "new")
    model.save(old, overwrite=True)
    X = sp.csr_matrix(np.eye(2, model.n_features_in_, dtype=np.float32))
    np.testing.assert_array_equal(dslide.Model.load(old).predict(X, k=3)[0], model.predict(X, k=3)[0])
