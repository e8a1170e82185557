"""The peers comparison's plumbing (scripts/suites/peers.py, bench_trees.py, _tree_train.py).

Nothing here installs omikuji, napkinXC or torch: result parsing, scoring and
the table run on hand-made arrays; the tree libraries themselves run only
where `.venv-baselines` already has them, and are then checked against a
numpy recount of their own predictions.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import scipy.sparse as sp

from scripts import _baselines as BL
from scripts import _tree_train as TT
from scripts import bench_trees as TR
from scripts.suites import peers as BB

# the weights and test labels of tests/unit/test_propensity.py (worked by hand there)
W_HAND = np.array([1.2795879764399811, 1.3862943611198906, 1.5116054719900802])
Y_TEST = sp.csr_matrix(np.array([[1, 0, 1], [0, 1, 0]], dtype=np.float32))


def _write_result(tmp_path, top, **over):
    res = {"system": "omikuji", "version": "0.5.2", "train_s": 1.5, "predict_s": 0.25, "load_s": 0.1, **over}
    (tmp_path / "r.json").write_text(json.dumps(res))
    np.save(tmp_path / "top.npy", np.asarray(top))
    return tmp_path / "r.json", tmp_path / "top.npy"


def test_read_result_and_score_give_hand_computed_metrics(tmp_path):
    top = [[2, 0, -1, -1, -1], [0, 2, -1, -1, -1]]  # fewer than 5 predictions: -1 pads
    r = TR.read_result(*_write_result(tmp_path, top), n_test=2, n_labels=3)
    assert r["train_s"] == 1.5 and r["topk"].dtype == np.int64
    m = TR.score(r["topk"], Y_TEST, W_HAND)
    assert m["p@1"] == 0.5 and m["p@3"] == pytest.approx(2 / 6)  # hits: t0 2/2 in its top 2, t1 none
    # PSP@1 = w2 / (w2 + w1), PSP@3 = (w2 + w0) / (w2 + w0 + w1), by hand in test_propensity.py
    assert m["psp@1"] == pytest.approx(0.5216210218, abs=1e-9)
    assert m["psp@3"] == pytest.approx(0.6681511893, abs=1e-9)


@pytest.mark.parametrize("top, message", [
    ([[0, 1, 2, -1, -1]], r"expected int \[2, 5\]"),
    ([[0, 1, 2, -1, -1], [0, 1, 3, -1, -1]], r"labels must be in \[-1, 3\)"),
    ([[0.0] * 5, [1.0] * 5], r"expected int \[2, 5\]"),
])
def test_read_result_rejects_what_it_cannot_score(tmp_path, top, message):
    with pytest.raises(ValueError, match=message):
        TR.read_result(*_write_result(tmp_path, top), n_test=2, n_labels=3)


def test_read_result_names_a_missing_field(tmp_path):
    res, top = _write_result(tmp_path, [[0, 1, 2, -1, -1]] * 2)
    res.write_text(json.dumps({"system": "omikuji", "version": "0.5.2", "predict_s": 0.1, "load_s": 0.1}))
    with pytest.raises(ValueError, match="r.json: missing train_s"):
        TR.read_result(res, top, n_test=2, n_labels=3)


def test_a_library_that_cannot_be_had_is_left_out_with_its_reason(tmp_path):
    ok, _ = BL.probe(sys.executable, "omikuji")
    if ok:
        pytest.skip(f"{sys.executable} imports omikuji")
    r = TR.run_tree("omikuji", "t.txt", "s.txt", n_test=1, n_labels=1, workdir=tmp_path / "w",
                    python=sys.executable)
    assert r["available"] is False and "omikuji" in r["reason"] and sys.executable in r["reason"]
    assert not (tmp_path / "w").exists()
    with pytest.raises(ValueError, match="'lightxml'"):
        TR.run_tree("lightxml", "t.txt", "s.txt", n_test=1, n_labels=1, workdir=tmp_path)


def test_failed_install_gives_a_reason(tmp_path):
    py, reason = BL.python_with("omikuji", tmp_path / "venv", quiet=True,
                                requirements=(str(tmp_path / "missing-0.0-py3-none-any.whl"),))
    assert py is None and reason.startswith("pip install failed (exit ") and "missing-0.0" in reason


def test_tree_child_reads_the_xmc_test_file(tmp_path):
    f = tmp_path / "t.txt"
    f.write_text("3 10 4\n1,3 0:1.5 7:2\n 2:0.25\n0\n")  # a point without labels, one without features
    assert TT.read_test(f) == [[(0, 1.5), (7, 2.0)], [(2, 0.25)], []]


def _rows():
    curve = [{"wall_s": 5.0, "p@1": 0.2, "step": 100}, {"wall_s": 12.0, "p@1": 0.5, "step": 200},
             {"wall_s": 30.0, "p@1": 0.7, "step": 300}]
    base = {"ranks": 1, "threads": 2, "predict_s": 1.0, "samples_per_s": float("nan"), "peak_rss_mb": 100.0,
            "p@3": 0.3, "p@5": 0.2, "psp@1": 0.1, "psp@3": 0.1, "psp@5": 0.1}
    return [{**base, "name": "dslide", "kind": "curve", "curve": curve, "train_s": 30.0, "p@1": 0.71,
             "ranks": 2, "threads": 1, "samples_per_s": 3000.0},
            {**base, "name": "omikuji 3 trees", "kind": "tree", "curve": [], "train_s": 15.0, "p@1": 0.6},
            {**base, "name": "napkinXC", "kind": "tree", "curve": [], "train_s": 40.0, "p@1": 0.55}]


def test_p1_at_reads_curves_and_finished_trees():
    dslide, omikuji, napkin = _rows()
    assert BB.p1_at(dslide, 15.0) == 0.5      # the last evaluation by then
    assert BB.p1_at(dslide, 4.0) is None      # none yet
    assert BB.p1_at(omikuji, 15.0) == 0.6 and BB.p1_at(napkin, 15.0) is None  # napkinXC still training


def test_peers_table_columns_at_the_reference_time():
    rows = _rows()
    text = BB.peers_table(rows, rows[1])
    head, _, *lines = text.splitlines()
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]
    cols = [c.strip() for c in head.strip("|").split("|")]
    at, to = cols.index("P@1 at 15.0 s"), cols.index("s to P@1 0.6000")
    assert [c[at] for c in cells] == ["0.5000", "0.6000", "-"]
    assert [c[to] for c in cells] == ["30.0", "15.0", "not reached"]
    assert [c[cols.index("samples/s")] for c in cells] == ["3,000", "-", "-"]
    assert cols[-7:] == ["P@1", "P@3", "P@5", "PSP@1", "PSP@3", "PSP@5", "peak MB/rank"]


def _tree_python(system):
    py, info = BL.python_with(system, install=False)
    if py is None:
        pytest.skip(f"no usable {BL.VENV} with {system} ({info}); `python -m scripts._baselines` makes it")
    return py


@pytest.mark.parametrize("system", ["omikuji", "napkinxc"])
def test_tree_libraries_on_tiny_data(system, tmp_path):
    py = _tree_python(system)
    from dslide.datasets.synthetic import generate_split
    from dslide.io.data import write_xmc

    train, test = generate_split("tiny", seed=0)
    paths = tmp_path / "train.txt", tmp_path / "test.txt"
    for p, d in zip(paths, (train, test)):
        write_xmc(p, d.X, d.Y)
    r = TR.run_tree(system, *paths, n_test=test.n_points, n_labels=test.n_labels, threads=1, trees=1,
                    workdir=tmp_path / "w", python=py)
    assert r["available"] and r["train_s"] > 0 and r["predict_s"] > 0
    m = TR.score(r["topk"], test.Y)
    Yd = test.Y.toarray() > 0
    hit1 = Yd[np.arange(test.n_points), np.maximum(r["topk"][:, 0], 0)] & (r["topk"][:, 0] >= 0)
    assert m["p@1"] == pytest.approx(hit1.mean())           # dslide.metrics against a plain recount
    prior = Yd.sum(axis=0).max() / test.n_points
    assert m["p@1"] > prior + 0.3                            # it learned (tiny: P@1 about 0.85)
