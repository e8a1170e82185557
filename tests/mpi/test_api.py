"""dslide.Model under mpiexec -n P: every rank runs the same script; the results equal a
1-rank recomputation, every rank gets all of them, and a save by P ranks loads on P and on 1."""

import numpy as np
import pytest
from mpi4py import MPI

import dslide
from dslide.comm import Comm
from dslide.datasets.synthetic import generate_split

WORLD = MPI.COMM_WORLD
SETTINGS = {"hidden": 16, "epochs": 2, "batch_size": 64, "lr": 1e-2, "dropout": 0.0, "seed": 5, "threads": 1,
            "exact": True}


@pytest.fixture(scope="module")
def tiny():
    return generate_split("tiny", n_train=400, n_test=120, seed=4)


def test_fit_predict_save_load_under_mpi_equal_one_rank(tiny, tmp_path_factory):
    train, test = tiny
    model = dslide.Model(**SETTINGS).fit(train.X, train.Y)
    assert model.comm.size == WORLD.size
    ids, scores = model.predict(test.X, k=5)
    # every rank holds the whole result
    all_ids = WORLD.allgather(ids)
    for other in all_ids:
        np.testing.assert_array_equal(other, ids)
    # the same model on one rank: the same scores up to the order of float sums
    one = dslide.Model(comm=Comm(), **SETTINGS).fit(train.X, train.Y)
    ids1, scores1 = one.predict(test.X, k=5)
    np.testing.assert_allclose(scores, scores1, rtol=1e-4, atol=1e-5)
    clear = np.diff(scores1[:, :2], axis=1)[:, 0] < -1e-3  # no near tie between the first two
    np.testing.assert_array_equal(ids[clear, 0], ids1[clear, 0])
    m = model.evaluate(test.X, test.Y)
    assert WORLD.allgather(m["p@1"]) == [m["p@1"]] * WORLD.size

    run_dir = WORLD.bcast(str(tmp_path_factory.mktemp("api_mpi")) if WORLD.rank == 0 else None)
    model.save(run_dir)
    again = dslide.Model.load(run_dir)
    np.testing.assert_array_equal(again.predict(test.X, k=5)[0], ids)
    alone = dslide.Model.load(run_dir, comm=Comm())  # saved by P ranks, loaded by one
    np.testing.assert_array_equal(alone.predict(test.X, k=5)[0], ids)
    assert again.evaluate(test.X, test.Y) == m
