"""eval of a run still training, under mpiexec -n P: the checkpoint rank 0 resolved is replaced
(a newer one saved, the old one deleted) before the ranks read it. They learn it together and
all read the newest, whose figures eval prints: those of a 1-rank eval of that checkpoint. The
replacement is made, deterministically, by one rank between resolving and reading
(tests/faults.py, at dslide.hooks.LOAD)."""

import shutil
from pathlib import Path

import pytest
from mpi4py import MPI

from dslide import session
from dslide.comm import Comm
from dslide.datasets import synthetic
from dslide.datasets.synthetic import generate_split
from dslide.io import checkpoint as ck

from tests import faults
from tests.conftest import TINY, run_cli

WORLD = MPI.COMM_WORLD
LAST = WORLD.size - 1  # the rank that replaces the checkpoint (not the one that resolved it, with P > 1)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """`old` and `new`: runs of 1 and 2 epochs over the same data, trained on every rank."""
    d = Path(WORLD.bcast(str(tmp_path_factory.mktemp("live_mpi")) if WORLD.rank == 0 else None))
    if WORLD.rank == 0:
        synthetic.write(str(d / "t"), *generate_split("tiny", n_train=300, n_test=60, seed=3))
    WORLD.Barrier()
    for name, epochs in (("old", 1), ("new", 2)):
        argv = ["train", "--train", str(d / "t_train.txt"), "--out", str(d / name), *TINY, "--set", f"epochs={epochs}"]
        assert run_cli(argv, _Quiet())[0] == 0
    return d


class _Quiet:
    """capsys's readouterr for run_cli where the output does not matter (a module fixture)."""

    def readouterr(self):
        return "", ""


def _copy(runs, name) -> Path:
    """A copy of run `old` that this test may change, the same path on every rank."""
    dst = runs / name
    if WORLD.rank == 0:
        shutil.copytree(runs / "old", dst)
    WORLD.Barrier()
    return dst


def _figures(out: str) -> list:
    return [line for line in out.splitlines() if line.startswith(("P@", "nDCG@"))]


def test_eval_prints_the_figures_of_the_checkpoint_that_replaced_the_one_resolved(runs, monkeypatch, capsys):
    run = _copy(runs, "replaced")
    monkeypatch.setenv(faults.NEWER, str(ck.latest(runs / "new")))
    faults.inject(monkeypatch, f"replace-rank{LAST}-times2")  # the newest is replaced too, once
    code, out, err = run_cli(["eval", "--model", str(run), "--data", str(runs / "t_test.txt")], capsys)
    assert code == 0, err
    assert len(faults.replaced) == (2 if WORLD.rank == LAST else 0)
    assert not any(path.exists() for path in faults.replaced)
    expected = None
    if WORLD.rank == 0:
        assert len(_figures(out)) == 2, out
        monkeypatch.setattr(Comm, "world", classmethod(lambda cls: cls(None)))  # this rank alone
        code, alone, err = run_cli(["eval", "--model", str(runs / "new"), "--data", str(runs / "t_test.txt")],
                                   capsys)
        assert code == 0, err
        assert _figures(out) == _figures(alone)
        old = run_cli(["eval", "--model", str(runs / "old"), "--data", str(runs / "t_test.txt")], capsys)[1]
        expected = _figures(old) != _figures(alone)  # (the test tells the two checkpoints apart)
    assert WORLD.bcast(expected)


def test_a_run_that_replaces_every_checkpoint_read_fails_on_every_rank_with_one_line(runs, monkeypatch):
    run = _copy(runs, "racing")
    faults.inject(monkeypatch, f"replace-rank{LAST}-times{session.LOAD_TRIES}")
    with pytest.raises(ck.CheckpointError) as e:
        session.load_model(str(run), Comm(WORLD))
    message = str(e.value)
    assert str(run) in message and "\n" not in message and f"{session.LOAD_TRIES} times" in message
    assert len(faults.replaced) == (session.LOAD_TRIES if WORLD.rank == LAST else 0)


def test_a_file_missing_on_one_rank_fails_on_every_rank_without_a_retry(runs, monkeypatch):
    run = _copy(runs, "broken")
    path = ck.latest(run)
    WORLD.Barrier()
    if WORLD.rank == 0:
        (path / f"rank-{LAST:04d}" / "layer0.W.npy").unlink()
    WORLD.Barrier()
    with pytest.raises(ck.ReadFailed) as e:
        session.load_model(str(run), Comm(WORLD))
    if WORLD.rank == LAST:
        assert "layer0.W.npy, which is missing" in str(e.value)
    else:
        assert str(e.value) == f"{path}: rank {LAST} of {WORLD.size} could not read its part of it"
    assert ck.latest(run) == path
