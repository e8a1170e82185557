"""A model saved with its neighbour store and inference index in the output layer's state
(tests/data/run_store_in_layer, from before they were model-level checkpoint sections)
still loads and predicts what it predicted then: the same ids and the same scores.

The recorded scores came from one CPU. The hidden layer's float32 products run through
OpenBLAS, whose kernel (and so its order of summation) depends on the CPU's vector width:
on another CPU a score may differ in its last digits (seen: 1.6e-8 relative on an AVX2
machine against the AVX-512 one that recorded them). The scores are compared to a relative
1e-5, far below any change of the model's arithmetic (a weight read wrongly moves a
softmax probability by whole percents), and labels whose recorded scores lie that close
together are compared as a set. On one machine the old layout and the same parts saved
again predict the same bits (the second test)."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "run_store_in_layer"
#: what another CPU's float32 products may move a recorded score by, relatively
SCORE_RTOL = 1e-5


def assert_same_ranking(ids, scores, want_ids, want_scores, rtol=SCORE_RTOL):
    """ids and scores [n, k] are the recorded ones: scores to `rtol`, ids position by position
    except within a run of recorded scores that lie within `rtol` of each other (their order
    is the rounding's), which must hold the same labels."""
    np.testing.assert_allclose(scores, want_scores, rtol=rtol, atol=0)
    for r in range(want_ids.shape[0]):
        j = 0
        while j < want_ids.shape[1]:
            e = j + 1
            while e < want_ids.shape[1] and want_scores[r, e - 1] - want_scores[r, e] <= rtol * want_scores[r, e - 1]:
                e += 1
            assert sorted(ids[r, j:e]) == sorted(want_ids[r, j:e]), (r, ids[r], want_ids[r])
            j = e


def test_the_ranking_check_fails_on_a_moved_score_or_label():
    want_ids = np.array([[5, 3, 9, 1]])
    want = np.array([[0.5, 0.2, 0.2, 0.1]])
    assert_same_ranking(np.array([[5, 9, 3, 1]]), want * (1 + 1e-8), want_ids, want)  # a tie's order
    with pytest.raises(AssertionError):
        assert_same_ranking(want_ids, want * (1 + 1e-4), want_ids, want)
    with pytest.raises(AssertionError):
        assert_same_ranking(np.array([[3, 5, 9, 1]]), want, want_ids, want)
    with pytest.raises(AssertionError):
        assert_same_ranking(np.array([[5, 3, 9, 2]]), want, want_ids, want)


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
    assert_same_ranking(np.asarray(ids), np.asarray(scores), np.array(want["ids"]),
                        np.array([[float.fromhex(s) for s in r] for r in want["scores"]]))


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
