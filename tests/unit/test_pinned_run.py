"""A short run's figures for a seed, pinned: the losses of its steps, a checksum of its
weights and its top-5 predictions (exact scoring and, for an LSH output layer, the
inference index), for a dense output layer and three LSH ones (anchor candidates
shared by the batch, anchor candidates per sample, item hashing in a hidden layer
and the output). The numbers were recorded from the code before the layout moves
of issue 26, and again when the softmax's row sums took their fixed lanes (a deliberate
change of rounding); a change in them is a change of behaviour, not of layout.

The pinned figures come from another CPU: float32 reductions vectorise
differently with another SIMD width and move a loss by about 1e-9 relative.
So losses are compared at rtol 1e-6 (far above that drift, far below what a
change of behaviour does to them), each weight checksum within 1e-6 of the sum of
the magnitudes it adds (a near-cancelling sum drifts by more than 1e-6 of itself:
on an AVX-512 CPU layer 0 of "lsh-dwta" moved by 1.4e-6 relative), and a pinned top-5 may differ
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

# index_min_labels=0: buckets of index_share alone, as the figures were recorded; index_min_width=0:
# an index over these few labels
_SMALL_INDEX = dict(index_anchors=16, index_points=300, index_neighbors=3, index_search=8, index_degree=4,
                    index_min_labels=0, index_min_width=0)

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
    # loss, prior_shift and beta2: the ones the figures were recorded with (narrow outputs now
    # default to label-softmax+bce, a shift of 0.2 and beta2 0.99)
    cfg = Config(threads=1, seed=5, batch_size=64, epochs=12 * 64 / train.n_points, lr=1e-2, log_every=1, knn=0,
                 loss="softmax", prior_shift=0.0, beta2=0.999, **CASES[name])
    model, history = fit(train, cfg)
    out = {"losses": [r["loss"] for r in history],
           "checksum": [float(np.sum(layer.W, dtype=np.float64)) + float(np.sum(layer.b, dtype=np.float64))
                        for layer in model.network.layers],
           # the checksums' own scale: a sum's rounding drift grows with the magnitudes it adds,
           # not with its result (layer 0 of "lsh-dwta" sums to 0.32 from terms adding to ~1e3)
           "scale": [float(np.sum(np.abs(layer.W), dtype=np.float64)) + float(np.sum(np.abs(layer.b), dtype=np.float64))
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


def assert_checksums_close(got, want, scale, rtol=1e-6):
    """Each layer's checksum within rtol of its scale (the sum of the magnitudes it adds): a
    near-cancelling sum moves by more than rtol of itself under another SIMD width's rounding."""
    got, want, scale = (np.asarray(a, dtype=np.float64) for a in (got, want, scale))
    assert got.shape == want.shape == scale.shape
    bad = np.abs(got - want) > rtol * scale
    assert not bad.any(), f"checksums {got.tolist()} against {want.tolist()} (scales {scale.tolist()})"


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
    assert_checksums_close(got["checksum"], want["checksum"], got["scale"])
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


def test_the_checksum_tolerance_refuses_a_change_of_behaviour():
    """The checksums' tolerance passes this machine's run (every case) and refuses one Adam
    step's worth of change in a single weight (lr 1e-2), whatever the case."""
    for name in sorted(CASES):
        got = run(name)
        scale = np.asarray(got["scale"])
        assert (1e-6 * scale < 1e-2).all(), f"{name}: the tolerance {1e-6 * scale} would hide one step"
        assert_checksums_close(got["checksum"], got["checksum"], scale)
        for i in range(scale.size):
            moved = np.array(got["checksum"])
            moved[i] += 1e-2
            with pytest.raises(AssertionError):
                assert_checksums_close(moved, got["checksum"], scale)


# recorded after e411e40 (the softmax's row sums in fixed lanes; before it, at 4888c03)
PINNED = {'dense': {'checksum': [17.440792689900263, -3838.142705299855],
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
           'losses': [5.584590560130108, 5.206949048914294, 5.463209962560963, 5.418006883434782,
                      5.415387067733183, 5.256261544088908, 5.461595278968386, 5.303574955464054,
                      5.137846566677092, 5.53038351328433, 5.359181642549598, 5.095771311869747]},
 'lsh-anchor': {'checksum': [10.779526615389841, -3185.1639280034215],
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
                'losses': [5.537129330667691, 5.108508160376776, 5.397563531767714, 5.34556917311343,
                           5.503531470179598, 5.342694368129049, 5.394185826245888, 5.3003872173820294,
                           5.182339582087975, 5.437320642974489, 5.337318058353718, 5.186783937505392]},
 'lsh-anchor-sample': {'checksum': [12.53354987498642, -3184.6573250031142],
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
                       'losses': [5.53712932210865, 5.108508183463128, 5.4854898681046205, 5.345572098318095,
                                  5.562403442139204, 5.337513495545269, 5.39406433309153, 5.299729152264556,
                                  5.1818843076523855, 5.517546668064602, 5.487263150017656,
                                  5.245010096718522]},
 'lsh-dwta': {'checksum': [0.3199547868080117, 2.007858237280743, -3404.6246851093383],
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
              'losses': [5.618915843099683, 5.236875832774107, 5.455011044315103, 5.413779403435132,
                         5.357373472286593, 5.401920191254571, 5.38108902894974, 5.3184232114976675,
                         5.265511173976454, 5.538168945607139, 5.387644087612634, 5.097355300358557]}}

if __name__ == "__main__":
    import pprint

    pinned = {name: {k: v for k, v in run(name).items() if k != "logits"} for name in sorted(CASES)}
    print("PINNED = " + pprint.pformat(pinned, width=110, compact=True))
