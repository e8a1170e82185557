"""The output layer split by rows (`output_split`, dslide.model.layers.dense.RowDenseLayer): the rule
that chooses it, its dropout against the column split's (its initial weights:
test_network.test_init_does_not_depend_on_layout), and at one rank
the same training and predictions as the column split and as plain numpy. Its P-rank runs
against one rank: tests/mpi (test_model_parallel, test_checkpoint_and_bytes)."""

import numpy as np
import pytest
import scipy.sparse as sp

from dslide import memory
from dslide import train as T
from dslide.infer.predict import predict_topk
from dslide.comm import Comm
from dslide.config import Config
from dslide.io import checkpoint as ck
from dslide.io.data import XMCData
from dslide.model import kernels
from dslide.model.network import Network, full_parameters


@pytest.mark.parametrize("cfg,n_labels,rows", [
    (Config(hidden=(512,)), 159, True),  # BibTeX's shape under the narrow defaults
    (Config(hidden=(512,)), 512, False),  # not narrower: the all-reduce would move as much
    (Config(hidden=(128,)), 4000, False),
    (Config(hidden=(9, 20)), 13, True),
    (Config(hidden=(20, 9)), 13, False),
    (Config(hidden=(64,), kinds=("dense", "lsh")), 13, False),  # an LSH output scores a block, not all
    (Config(hidden=(64, 64), kinds=("dense", "lsh", "dense")), 13, False),  # its input: an LSH block
    (Config(hidden=(512,), output_split="columns"), 159, False),
    (Config(hidden=(16,), output_split="rows"), 4000, True),
    (Config(hidden=(512,), parallel="data"), 159, True),  # one rank's arithmetic, so checkpoints convert
])
def test_the_rule_that_splits_an_output_by_rows(cfg, n_labels, rows):
    assert cfg.output_rows(n_labels) is rows


def test_the_narrow_defaults_split_bibtex_by_rows_and_wide_outputs_by_columns():
    assert Config().resolve(159, 2.0, 4880).output_rows(159)
    assert not Config().resolve(670_091, 4.0, 490_449).output_rows(670_091)
    assert not Config().resolve(3000, 20.0, 15_000).output_rows(3000)  # narrow, but wider than 512


def test_rows_where_the_layers_cannot_take_them_and_unknown_splits_are_errors():
    with pytest.raises(ValueError, match="output_split = 'rows' cannot apply: the output layer and the last"):
        Config(hidden=(64,), kinds=("dense", "lsh"), output_split="rows").output_rows(13)
    with pytest.raises(ValueError, match="output_split = 'rows' cannot apply: the network has no hidden layer"):
        Config(hidden=(), output_split="rows").output_rows(13)
    with pytest.raises(ValueError, match="output_split.*'auto', 'columns', 'rows'"):
        Config(output_split="row")


def test_a_dropout_mask_of_some_columns_is_those_columns_of_the_whole_mask():
    ids = np.array([4, 17, 2], dtype=np.int64)
    whole = np.empty((3, 40))
    kernels.dropout_mask(99, ids, 0, 40, 0.4, whole)
    part = np.empty((3, 15))
    kernels.dropout_mask(99, ids, 11, 15, 0.4, part)
    np.testing.assert_array_equal(part, whole[:, 11:26])
    assert 0.3 < (whole == 0).mean() < 0.5 and set(np.unique(whole)) == {0.0, 1 / 0.6}


def _data(seed=0, n=200, F=50, L=11):
    rs = np.random.default_rng(seed)
    X = sp.random(n, F, density=0.15, format="csr", random_state=seed, dtype=np.float32)
    Y = (rs.random((n, L)) < 0.2).astype(np.float32)
    Y[np.arange(n), rs.integers(0, L, n)] = 1.0
    return XMCData(X, sp.csr_matrix(Y))


def test_at_one_rank_rows_train_and_predict_as_the_column_split_and_as_numpy():
    data = _data()
    base = Config(hidden=(24,), batch_size=32, epochs=2, lr=1e-2, dropout=0.3, threads=1, seed=3, knn=0)
    got = {}
    for split in ("columns", "rows"):
        model, hist = T.fit(data, base.replace(output_split=split), index=False)
        assert model.network.layers[-1].split == split
        got[split] = (full_parameters(model.network), [r["loss"] for r in hist], model)
    for (Wc, bc), (Wr, br) in zip(got["columns"][0], got["rows"][0]):
        np.testing.assert_array_equal(Wr, Wc)
        np.testing.assert_array_equal(br, bc)
    assert got["rows"][1] == got["columns"][1]
    # the predictions: numpy's top 5 of relu(x W0 + b0) W1 + b1 over the L2-normalised rows
    (W0, b0), (W1, b1) = got["rows"][0]
    X = data.X.toarray().astype(np.float64)
    X /= np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1e-30)
    z = np.maximum(X @ W0 + b0, 0) @ W1 + b1
    want = np.argsort(-z, axis=1, kind="stable")[:, :5]
    pred = predict_topk(got["rows"][2], data.X, 5)
    assert (pred == want).mean() > 0.99  # float32 against float64: a near-tie may swap


def test_the_memory_account_of_a_row_split_output_matches_its_arrays():
    cfg = Config(hidden=(40,))
    F, L = 300, 25
    net = Network(cfg, F, L, Comm())
    assert net.output_rows
    held = sum(l.W.nbytes + l.b.nbytes for l in net.layers)
    acc = memory.account(cfg, F, L)
    assert acc["weights"] == held == (F * 40 + 40 + 40 * L + L) * 4
    # over 3 ranks each holds its rows of W and every bias of the output
    parts = [memory.account(cfg, F, L, world_size=3, rank=r) for r in range(3)]
    assert sum(p["weights"] for p in parts) == held + 2 * L * 4


def test_a_checkpoint_split_by_columns_loads_into_a_run_that_keeps_its_split(tmp_path):
    """A checkpoint from before the row split (output by columns) evaluates as it was saved
    (config_of takes the split from its layers); forced into a row split, the error says how."""
    data = _data()
    cfg = Config(hidden=(24,), batch_size=32, epochs=1, threads=1, knn=0, output_split="columns")
    model, _ = T.fit(data, cfg, index=False)
    ck.save(model.network, tmp_path, Comm())
    path = ck.latest(tmp_path)
    assert ck.config_of(path).output_split == "columns"
    again = T.build_network((data.n_features, data.n_labels), ck.config_of(path), Comm())
    ck.load_into(again.network, path, Comm())
    np.testing.assert_array_equal(predict_topk(again, data.X, 5), predict_topk(model, data.X, 5))
    rows = T.build_network((data.n_features, data.n_labels), cfg.replace(output_split="auto"), Comm())
    with pytest.raises(ck.CheckpointError, match="output split by columns in the checkpoint: set "
                                                 "output_split = 'columns'"):
        ck.load_into(rows.network, path, Comm())
