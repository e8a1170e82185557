"""A short run's figures for a seed, pinned: the losses of its steps, a checksum of its
weights and its top-5 predictions (exact scoring and, for an LSH output layer, the
inference index), for a dense output layer and three LSH ones (anchor candidates
shared by the batch, anchor candidates per sample, item hashing in a hidden layer
and the output). The numbers were recorded from the code before the layout moves
of issue 26; a change in them is a change of behaviour, not of layout.

The pinned figures come from another CPU: float32 reductions vectorise
differently with another SIMD width and move a loss by about 1e-9 relative.
So losses and checksums are compared at rtol 1e-6 (far above that drift, far
below what a change of behaviour does to them), and a pinned top-5 may differ
from this machine's only by swapping labels whose scores tie to 1e-6. The
exact top-5 is also recomputed in the same run by an independent path: numpy's
forward pass over the trained weights.

Record again (only after a change meant to alter behaviour):
    python tests/unit/test_pinned_run.py
"""

import functools

import numpy as np
import pytest

from dslide.config import Config, LSHConfig

_SMALL_INDEX = dict(index_anchors=16, index_points=300, index_neighbors=3, index_search=8, index_degree=4)

CASES = {
    "dense": dict(hidden=(32,), kinds=("dense", "dense"), dropout=0.2),
    "lsh-anchor": dict(hidden=(32,), kinds=("dense", "lsh"), adam_dtype="bfloat16",
                       lsh=LSHConfig(anchors=8, max_active=24, min_active=40, rehash_every=3, **_SMALL_INDEX)),
    "lsh-anchor-sample": dict(hidden=(32,), kinds=("dense", "lsh"),
                              lsh=LSHConfig(anchors=8, max_active=24, min_active=40, rehash_every=3, scope="sample",
                                            **_SMALL_INDEX)),
    "lsh-dwta": dict(hidden=(32, 24), kinds=("dense", "lsh", "lsh"),
                     lsh=LSHConfig(family="dwta", K=3, L=6, range_pow=5, max_active=16, min_active=30,
                                   rehash_every=2, rebuild_every=5, **_SMALL_INDEX)),
}


@functools.lru_cache(maxsize=None)
def run(name: str) -> dict:
    """Train case `name` for 12 steps on one rank; its figures."""
    from dslide.datasets.synthetic import generate_split
    from dslide.infer.predict import predict_topk
    from dslide.train import fit

    train, test = generate_split("tiny", seed=11)
    # knn=0: the network's own top-5 (the neighbours' labels are pinned by tests/unit/test_fusion.py)
    # loss: the one the figures were recorded with (narrow outputs now default to softmax+bce)
    cfg = Config(threads=1, seed=5, batch_size=64, epochs=12 * 64 / train.n_points, lr=1e-2, log_every=1, knn=0,
                 loss="softmax", **CASES[name])
    model, history = fit(train, cfg)
    out = {"losses": [r["loss"] for r in history],
           "checksum": [float(np.sum(layer.W, dtype=np.float64)) + float(np.sum(layer.b, dtype=np.float64))
                        for layer in model.network.layers],
           "exact": predict_topk(model, test.X[:40], 5, exact=True).tolist()}
    if model.network.layers[-1].kind == "lsh":
        out["index"] = predict_topk(model, test.X[:40], 5, exact=False).tolist()
    out["logits"] = numpy_logits(model, test.X[:40])
    return out


def numpy_logits(model, X) -> np.ndarray:
    """The output logits float64 [n, n_labels] by numpy alone: rows L2-normalised, relu hidden layers."""
    x = np.asarray(X.todense(), dtype=np.float64)
    x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-300)
    layers = model.network.layers
    for i, layer in enumerate(layers):
        W = np.asarray(layer.W, dtype=np.float64)
        x = x @ (W if layer.neuron_axis == 1 else W.T) + np.asarray(layer.b, dtype=np.float64)
        if i < len(layers) - 1:
            x = np.maximum(x, 0.0)
    return x


def assert_same_ranking(got, want, logits, what, rtol=1e-6):
    """got and want (int [n, k] ids, -1 for none) agree, except that labels whose logits tie
    within rtol may come in either order or be swapped at the cut."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, what
    for r, (g, w) in enumerate(zip(got, want)):
        if np.array_equal(g, w):
            continue
        assert np.array_equal(g < 0, w < 0), f"{what}: row {r}: {g.tolist()} against {w.tolist()}"
        sg, sw = logits[r, g[g >= 0]], logits[r, w[w >= 0]]
        np.testing.assert_allclose(sg, sw, rtol=rtol, atol=1e-9,
                                   err_msg=f"{what}: row {r}: {g.tolist()} against {w.tolist()}")


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_short_run_gives_the_recorded_figures(name):
    got, want = run(name), PINNED[name]
    assert len(got["losses"]) == len(want["losses"]) == 12
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-6, atol=0)
    np.testing.assert_allclose(got["checksum"], want["checksum"], rtol=1e-6, atol=0)
    logits = got["logits"]
    assert_same_ranking(got["exact"], want["exact"], logits, "exact top-5 against the pinned one")
    assert ("index" in got) == ("index" in want)
    if "index" in want:
        assert_same_ranking(got["index"], want["index"], logits, "index top-5 against the pinned one")


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_exact_top5_is_numpys(name):
    """The same run's exact top-5 against numpy's forward pass over its trained weights."""
    got = run(name)
    logits = got["logits"]
    want = np.argsort(-logits, axis=1, kind="stable")[:, :5]
    assert_same_ranking(got["exact"], want, logits, "exact top-5 against numpy's", rtol=1e-5)
    # and the check has teeth: the reverse order is refused
    with pytest.raises(AssertionError):
        assert_same_ranking(np.asarray(got["exact"])[:, ::-1], want, logits, "reversed")


def test_the_tolerance_refuses_a_change_of_behaviour():
    """A perturbed loss (what a change of the step or the data order does) fails the comparison."""
    want = np.asarray(PINNED["dense"]["losses"])
    drifted = want * (1 + 2e-9)  # another SIMD width: passes
    np.testing.assert_allclose(drifted, want, rtol=1e-6, atol=0)
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(want * (1 + 1e-4), want, rtol=1e-6, atol=0)


# recorded at 4888c03
PINNED = {'dense': {'checksum': [17.440793446730822, -3838.142695597191],
           'exact': [[483, 457, 65, 478, 421], [483, 457, 65, 478, 421], [483, 457, 65, 478, 421],
                     [483, 457, 65, 421, 478], [483, 457, 65, 478, 421], [483, 457, 65, 478, 144],
                     [483, 457, 65, 478, 144], [483, 457, 478, 65, 421], [483, 457, 65, 478, 421],
                     [483, 457, 65, 478, 421], [483, 457, 65, 478, 421], [483, 457, 65, 478, 421],
                     [483, 457, 478, 65, 421], [483, 457, 65, 478, 421], [483, 457, 478, 65, 421],
                     [483, 457, 65, 478, 421], [483, 457, 65, 478, 421], [483, 457, 478, 65, 421],
                     [483, 457, 65, 478, 421], [483, 457, 65, 478, 421], [483, 457, 65, 478, 421],
                     [483, 457, 65, 478, 421], [483, 457, 65, 478, 144], [483, 457, 65, 478, 144],
                     [483, 457, 65, 478, 421], [483, 457, 65, 478, 144], [483, 457, 478, 65, 421],
                     [483, 457, 65, 478, 421], [483, 457, 65, 478, 144], [483, 457, 65, 478, 421],
                     [483, 457, 65, 478, 421], [483, 457, 65, 478, 421], [483, 457, 65, 478, 421],
                     [483, 457, 65, 478, 421], [483, 457, 65, 478, 421], [483, 457, 65, 421, 478],
                     [483, 457, 65, 478, 421], [483, 457, 65, 478, 421], [483, 457, 478, 65, 421],
                     [483, 457, 65, 478, 421]],
           'losses': [5.584590560130108, 5.206949048948677, 5.463209962674573, 5.418006883641574,
                      5.415387071456354, 5.256261539910202, 5.461595279141994, 5.303574958722688,
                      5.137846566442941, 5.530383517108009, 5.359181646527292, 5.095771312211175]},
 'lsh-anchor': {'checksum': [10.77953778500705, -3185.1639271723616],
                'exact': [[483, 457, 65, 421, 478], [483, 457, 65, 478, 421], [483, 457, 65, 478, 421],
                          [483, 457, 65, 421, 478], [483, 457, 65, 478, 421], [483, 457, 65, 478, 421],
                          [483, 457, 65, 478, 421], [483, 457, 478, 65, 421], [483, 457, 65, 478, 421],
                          [483, 457, 65, 478, 421], [483, 457, 65, 421, 478], [483, 457, 65, 478, 421],
                          [483, 457, 478, 65, 421], [483, 457, 65, 478, 421], [483, 457, 65, 478, 421],
                          [483, 457, 65, 478, 421], [483, 457, 65, 478, 421], [483, 457, 478, 65, 421],
                          [483, 457, 65, 478, 421], [483, 457, 65, 478, 421], [483, 457, 65, 478, 421],
                          [483, 457, 65, 478, 421], [483, 457, 65, 478, 421], [483, 457, 65, 478, 421],
                          [483, 457, 65, 478, 421], [483, 457, 65, 478, 421], [483, 457, 65, 478, 421],
                          [483, 457, 65, 478, 421], [483, 457, 65, 478, 421], [483, 457, 65, 478, 421],
                          [483, 457, 65, 421, 478], [483, 457, 65, 478, 421], [483, 457, 65, 478, 421],
                          [483, 457, 65, 478, 421], [483, 457, 65, 421, 478], [483, 457, 65, 421, 478],
                          [483, 457, 65, 478, 421], [483, 457, 65, 478, 421], [483, 457, 65, 478, 421],
                          [483, 457, 65, 478, 421]],
                'index': [[483, 457, 65, 421, -1], [483, 457, 65, 478, 128], [483, 457, 65, 478, 386],
                          [483, 457, 65, 421, 235], [483, 457, 65, 478, 144], [483, 457, 65, 478, 419],
                          [483, 457, 65, 478, 294], [483, 457, 65, 421, -1], [483, 457, 65, 478, 444],
                          [483, 457, 65, 421, -1], [483, 457, 65, 421, -1], [483, 457, 65, 421, 55],
                          [483, 457, 478, 65, 258], [483, 457, 65, 478, 398], [483, 457, 65, 478, 444],
                          [483, 457, 65, 478, 277], [483, 457, 65, 478, 477], [483, 457, 478, 65, 487],
                          [483, 457, 65, 478, 144], [483, 457, 65, 478, 419], [483, 457, 65, 478, 169],
                          [483, 457, 65, 478, 419], [483, 457, 65, 478, 419], [483, 457, 65, 478, 144],
                          [483, 457, 65, 421, -1], [483, 457, 65, 478, 144], [483, 457, 65, 478, 258],
                          [483, 457, 65, 478, 364], [483, 457, 65, 478, 294], [483, 457, 65, 478, 487],
                          [483, 457, 65, 478, 2], [483, 457, 65, 478, 144], [483, 457, 65, 478, 218],
                          [483, 457, 65, 421, 487], [483, 457, 65, 421, -1], [483, 457, 65, 421, 235],
                          [483, 457, 65, 478, 306], [483, 457, 65, 478, 458], [483, 457, 65, 478, 258],
                          [483, 457, 65, 478, 398]],
                'losses': [5.53712932210865, 5.1085081834268165, 5.397563521520061, 5.345569170846703,
                           5.50353147626498, 5.342694372349996, 5.394185809245725, 5.300387217596662,
                           5.182339587316898, 5.437320644772669, 5.337318047232206, 5.186783940683562]},
 'lsh-anchor-sample': {'checksum': [12.533549591253177, -3184.6573235394535],
                       'exact': [[483, 457, 65, 421, 478], [483, 457, 65, 478, 421], [483, 457, 65, 478, 421],
                                 [483, 457, 65, 421, 478], [483, 457, 65, 478, 421], [483, 457, 65, 478, 421],
                                 [483, 457, 65, 478, 421], [483, 457, 478, 65, 421], [483, 457, 65, 478, 421],
                                 [483, 457, 65, 478, 421], [483, 457, 65, 421, 478], [483, 457, 65, 478, 421],
                                 [483, 457, 478, 65, 421], [483, 457, 65, 478, 421], [483, 457, 65, 478, 421],
                                 [483, 457, 65, 478, 421], [483, 457, 65, 478, 421], [483, 457, 478, 65, 421],
                                 [483, 457, 65, 478, 421], [483, 457, 65, 478, 421], [483, 457, 65, 478, 421],
                                 [483, 457, 65, 478, 421], [483, 457, 65, 478, 421], [483, 457, 65, 478, 421],
                                 [483, 457, 65, 478, 421], [483, 457, 65, 478, 421], [483, 457, 65, 478, 421],
                                 [483, 457, 65, 478, 421], [483, 457, 65, 478, 421], [483, 457, 65, 478, 421],
                                 [483, 457, 65, 421, 478], [483, 457, 65, 478, 421], [483, 457, 65, 478, 421],
                                 [483, 457, 65, 478, 421], [483, 457, 65, 421, 478], [483, 457, 65, 421, 478],
                                 [483, 457, 65, 478, 421], [483, 457, 65, 478, 421], [483, 457, 65, 478, 421],
                                 [483, 457, 65, 478, 421]],
                       'index': [[483, 457, 65, 421, -1], [483, 457, 65, 478, 128], [483, 457, 65, 478, 386],
                                 [483, 457, 65, 421, 235], [483, 457, 65, 478, 144], [483, 457, 65, 478, 419],
                                 [483, 457, 65, 478, 294], [483, 457, 478, 65, -1], [483, 457, 65, 478, 444],
                                 [483, 457, 65, 421, -1], [483, 457, 65, 421, -1], [483, 457, 65, 478, 55],
                                 [483, 457, 478, 65, 258], [483, 457, 65, 478, 398], [483, 457, 65, 478, 444],
                                 [483, 457, 65, 478, 277], [483, 457, 65, 478, 477], [483, 457, 478, 65, 54],
                                 [483, 457, 65, 478, 144], [483, 457, 65, 478, 419], [483, 457, 65, 478, 128],
                                 [483, 457, 65, 478, 320], [483, 457, 65, 478, 419], [483, 457, 65, 478, 144],
                                 [483, 457, 65, 421, -1], [483, 457, 65, 478, 144], [483, 457, 65, 478, 258],
                                 [483, 457, 65, 478, 364], [483, 457, 65, 421, 294], [483, 457, 65, 421, 487],
                                 [483, 457, 65, 421, 2], [483, 457, 65, 478, 144], [483, 457, 65, 478, 218],
                                 [483, 457, 65, 421, 487], [483, 457, 65, 421, -1], [483, 457, 65, 421, 235],
                                 [483, 457, 65, 478, 144], [483, 457, 65, 478, 458], [483, 457, 65, 478, 258],
                                 [483, 457, 65, 478, 398]],
                       'losses': [5.53712932210865, 5.108508183367484, 5.485489868153462, 5.345572097970395,
                                  5.562403446092344, 5.337513492079721, 5.394064333530071, 5.299729151973614,
                                  5.181884307766503, 5.517546669006355, 5.487263153455218,
                                  5.245010096613624]},
 'lsh-dwta': {'checksum': [0.3199538516000757, 2.007857880613301, -3404.6246812717873],
              'exact': [[483, 457, 65, 478, 421], [483, 457, 65, 478, 421], [483, 457, 65, 478, 421],
                        [483, 457, 65, 478, 421], [483, 457, 65, 478, 421], [483, 457, 65, 478, 421],
                        [483, 457, 65, 478, 421], [483, 457, 65, 478, 421], [483, 457, 65, 478, 421],
                        [483, 457, 65, 478, 421], [483, 457, 65, 478, 421], [483, 457, 65, 478, 421],
                        [483, 457, 65, 478, 421], [483, 457, 65, 478, 421], [483, 457, 65, 478, 421],
                        [483, 457, 65, 478, 421], [483, 457, 65, 478, 421], [483, 457, 65, 478, 421],
                        [483, 457, 65, 478, 421], [483, 457, 65, 478, 421], [483, 457, 65, 478, 421],
                        [483, 457, 65, 478, 421], [483, 457, 65, 478, 421], [483, 457, 65, 478, 421],
                        [483, 457, 65, 478, 421], [483, 457, 65, 478, 421], [483, 457, 65, 478, 421],
                        [483, 457, 65, 478, 421], [483, 457, 65, 478, 421], [483, 457, 65, 478, 421],
                        [483, 457, 65, 478, 421], [483, 457, 65, 478, 421], [483, 457, 65, 478, 421],
                        [483, 457, 65, 478, 421], [483, 457, 65, 478, 421], [483, 457, 65, 478, 421],
                        [483, 457, 65, 478, 421], [483, 457, 65, 478, 421], [483, 457, 65, 478, 421],
                        [483, 457, 65, 478, 421]],
              'index': [[483, 457, 65, 478, 421], [483, 457, 65, 478, 128], [483, 457, 65, 421, 386],
                        [483, 457, 65, 478, 421], [483, 457, 65, 478, 487], [483, 457, 65, 478, 419],
                        [483, 457, 65, 478, 177], [483, 457, 65, 478, 144], [483, 457, 65, 478, 444],
                        [483, 457, 65, 478, -1], [483, 457, 65, 478, -1], [483, 457, 65, 478, -1],
                        [483, 457, 65, 478, 54], [483, 457, 65, 478, 477], [483, 457, 65, 478, 144],
                        [483, 457, 65, 478, 150], [483, 457, 65, 478, 376], [483, 457, 65, 478, 258],
                        [483, 457, 65, 478, 144], [483, 457, 65, 478, 144], [483, 457, 65, 421, 144],
                        [483, 457, 65, 478, 320], [483, 457, 65, 478, 419], [483, 457, 65, 478, 144],
                        [483, 457, 65, 478, 421], [483, 457, 65, 478, 320], [483, 457, 65, 478, 487],
                        [483, 457, 65, 478, 54], [483, 457, 65, 478, 144], [483, 457, 65, 478, 429],
                        [483, 457, 65, 478, 444], [483, 457, 65, 478, 171], [483, 457, 65, 478, 421],
                        [483, 457, 65, 478, 421], [483, 457, 65, 478, -1], [483, 457, 65, 478, -1],
                        [483, 457, 65, 478, 444], [483, 457, 65, 478, 294], [483, 457, 65, 478, 235],
                        [483, 457, 65, 478, 245]],
              'losses': [5.618915841775664, 5.236875831414818, 5.455011041558608, 5.413779403357566,
                         5.357373473806148, 5.401920196417269, 5.381089024803527, 5.318423208972588,
                         5.2655111699805675, 5.538168938016129, 5.387644091310781, 5.097355296301923]}}

if __name__ == "__main__":
    import pprint

    pinned = {name: {k: v for k, v in run(name).items() if k != "logits"} for name in sorted(CASES)}
    print("PINNED = " + pprint.pformat(pinned, width=110, compact=True))
