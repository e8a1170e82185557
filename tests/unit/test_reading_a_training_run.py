"""eval and predict of a run that is still training: the checkpoint they resolved may be
replaced (a newer one saved, the old one deleted) before they read it; they then read the
newest instead of failing. The replacement is made, deterministically, between resolving
and loading."""

import shutil

import pytest

from dslide import cli
from dslide.io import checkpoint as ck

from tests.conftest import TINY as S, tiny_run  # noqa: E402


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tiny_run(tmp_path_factory, "live_run")
    return d


def _replace_before_reading(monkeypatch, times=1):
    """ck.config_of (the first read of a resolved checkpoint) that first does what a training
    run does at a save: a newer checkpoint, LATEST naming it, the old one deleted."""
    real = ck.config_of
    done = []

    def config_of(path):
        if len(done) < times:
            done.append(path)
            newer = path.parent / f"step-{999000 + len(done):09d}"
            shutil.copytree(path, newer)
            (path.parent / "LATEST").write_text(newer.name + "\n")
            shutil.rmtree(path)
        return real(path)

    monkeypatch.setattr(ck, "config_of", config_of)
    return done


@pytest.mark.parametrize("command", ["eval", "predict"])
def test_a_replaced_checkpoint_is_read_again_from_the_newest(world, tmp_path, capsys, monkeypatch, command):
    run = tmp_path / "run"
    shutil.copytree(world / "run", run)
    done = _replace_before_reading(monkeypatch, times=2)
    argv = [command, "--model", str(run), "--data", str(world / "t_test.txt")]
    if command == "predict":
        argv += ["--k", "3", "--out", str(tmp_path / "p.txt")]
    capsys.readouterr()
    code = cli.main(argv)
    out, err = capsys.readouterr()
    assert code == 0, err
    assert len(done) == 2
    assert "P@1" in out if command == "eval" else (tmp_path / "p.txt").read_text().splitlines()[0] == "60 500"


def test_a_broken_checkpoint_that_was_not_replaced_is_still_an_error(world, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(world / "run", run)
    ckpt = run / "checkpoints" / (run / "checkpoints" / "LATEST").read_text().strip()
    (ckpt / "rank-0000" / "layer0.W.npy").unlink()
    with pytest.raises(SystemExit) as e:
        cli.main(["eval", "--model", str(run), "--data", str(world / "t_test.txt")])
    assert e.value.code == 2 and "layer0.W.npy, which is missing" in capsys.readouterr().err
