"""A model saved with its neighbour store and inference index in the output layer's state
(tests/data/run_store_in_layer, from before they were model-level checkpoint sections)
still loads and predicts what it predicted then: the same ids and, bit for bit, the same
scores (the same arithmetic in the same order; only where the parts are kept has moved)."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "run_store_in_layer"


@pytest.mark.parametrize("lsh", [False, True], ids=["exact", "index"])
def test_a_run_with_the_store_in_the_layer_predicts_as_it_did(tmp_path, lsh):
    import dslide
    from dslide.comm import Comm
    from dslide.io.data import read_xmc

    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)  # reading queries.txt leaves a cache beside it
    want = json.loads((FIXTURE / "predictions.json").read_text())["index" if lsh else "exact"]
    model = dslide.Model.load(run, comm=Comm())
    ids, scores = model.predict(read_xmc(str(run / "queries.txt")).X, 5, lsh=lsh)
    np.testing.assert_array_equal(ids, np.array(want["ids"]))
    np.testing.assert_array_equal(scores, np.array([[float.fromhex(s) for s in r] for r in want["scores"]]))


def test_saved_again_the_parts_are_model_sections_and_predict_the_same(tmp_path):
    """The old run's store and index, saved again, are the model's "neighbours/" and "index/"
    sections (nothing of them in the layer's files) and load to the same predictions."""
    from dslide.comm import Comm
    from dslide.infer.parts import sections
    from dslide.infer.predict import predict_topk_scores
    from dslide.io import checkpoint as ck
    from dslide.io.data import read_xmc
    from dslide.session import load_model

    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    X = read_xmc(str(run / "queries.txt")).X
    old = load_model(str(run), Comm())
    assert old.neighbours is not None and old.neighbours.has_prototypes and old.index is not None
    again = tmp_path / "again"
    path = ck.save(old.network, again, Comm(), weights_only=True, sections=sections(old))
    names = set(ck.read_manifest(path)["ranks"][0]["arrays"])
    assert {"neighbours/post_ptr", "neighbours/y_idx", "index/anchors", "index/buckets", "index/nn.graph"} <= names
    assert not any(n.startswith(("layer1/knn.", "layer1/index.", "layer1/nn.")) for n in names)
    new = load_model(str(again), Comm())
    for exact in (True, False):
        for a, b in zip(predict_topk_scores(new, X, 5, exact), predict_topk_scores(old, X, 5, exact)):
            np.testing.assert_array_equal(a, b)
