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
    from dslide.data import read_xmc

    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)  # reading queries.txt leaves a cache beside it
    want = json.loads((FIXTURE / "predictions.json").read_text())["index" if lsh else "exact"]
    model = dslide.Model.load(run, comm=Comm())
    ids, scores = model.predict(read_xmc(str(run / "queries.txt")).X, 5, lsh=lsh)
    np.testing.assert_array_equal(ids, np.array(want["ids"]))
    np.testing.assert_array_equal(scores, np.array([[float.fromhex(s) for s in r] for r in want["scores"]]))
