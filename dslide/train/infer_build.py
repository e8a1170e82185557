"""Building the model's inference parts at the end of training.

`build_index`: the inference index of an output layer that can have one
(dslide.infer.index), from its final weights and the hidden vectors of some
training points. `build_neighbours`: the neighbour store (dslide.infer.fusion)
of the training data, with what is left to choose about fusing it (the count,
the prototypes' share, the weight) chosen on the validation split
(dslide.train.validation.choose_fusion). `epoch_scorer` scores the model through
the pipeline for the epoch checks of early stopping. Both parts are kept on
the model (`Model.index`, `Model.neighbours`), never on a layer.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time

import numpy as np
import scipy.sparse as sp

from dslide import metrics
from dslide.config import (NARROW_OUTPUT, PRIOR_SHIFTS, Config, knn_default, labels_per_point, narrow_prior_shift,
                           points_per_label)
from dslide.config.rules import hidden_store_fits
from dslide.infer.approx import Bound
from dslide.infer.fusion import NeighbourLabels, tempered
from dslide.infer.hidden_knn import HiddenNeighbours, softmax_rows
from dslide.infer.index import InferenceIndex
from dslide.infer.parts import index_seed
from dslide.infer.predict import predict_topk_scores
from dslide.model.inputs import csr_parts, input_norms, make_batch
from dslide.train import validation


def fusion_counts(cfg: Config) -> tuple:
    return validation.FUSION_COUNTS if cfg.knn is None else (cfg.knn,)


def fusion_probe(model, fit_data, val) -> validation.FusionProbe:
    """The neighbour store of the gradient's points and the validation points' neighbours and
    prototypes, for the epoch checks and the fusion choice (dslide.train.validation)."""
    cfg = model.config
    t0 = time.perf_counter()
    probe = validation.FusionProbe.build(fit_data, val, fusion_counts(cfg), cfg.proto_weight != 0,
                                         cfg.proto_candidates, model.comm, Bound.of(cfg))
    model.index_info["probe_s"] = time.perf_counter() - t0
    model.index_info["probe_search"] = probe.search
    return probe


def label_counts(train) -> np.ndarray:
    """Training points per label, float64 [n_labels] (the output biases' prior)."""
    return np.bincount(sp.csr_matrix(train.Y).indices, minlength=train.n_labels).astype(np.float64)


def apply_prior_shift(model, train, val, probe=None, scorer=None, kept=None):
    """Shift the output biases by `prior_shift` (Network.shift_output_prior, the prior of the
    training labels `train`): the configured value; else chosen on the validation points `val`
    (the epoch checks' rows, `validation.check_rows`) from rules.PRIOR_SHIFTS by the model's
    P@1 + P@5 as the epoch checks score it (`EpochScorer`: the network alone, or with a
    fusion probe the best of its small fusion grid, so that the shift suits the model as it
    will be used; validation.choose_prior_shift, 0, the no-op, unless another gains); without
    validation points, the narrow outputs' rule on `train`'s labels for a narrow output
    (rules.narrow_prior_shift: a configuration resolved without them, as `build_network`
    resolves one, leaves the shift to this), else 0. model.index_info gets the choice
    ("prior_shift") and its figures.

    scorer: the epoch checks' EpochScorer (None: a new one); kept: what they found for the
    weights as they are, unshifted ((P@1, P@5), the network's candidates or None: `kept_scoring`),
    taken for the shift 0 instead of scoring it again. Returns the network's candidates on every
    validation point at the shift chosen ((ids, logits), what `build_neighbours` scores) where
    the scorings had them, else None."""
    cfg, net = model.config, model.network
    counts = label_counts(train)
    if cfg.prior_shift is not None:
        net.shift_output_prior(cfg.prior_shift, counts, train.n_points)
        model.index_info["prior_shift"] = {"chosen": float(cfg.prior_shift),
                                           "why": "fixed by the setting or the narrow outputs' rule"}
        return None
    if val is None and train.n_labels <= NARROW_OUTPUT:  # resolved without the training labels
        tau = narrow_prior_shift(labels_per_point(train.Y))
        net.shift_output_prior(tau, counts, train.n_points)
        model.index_info["prior_shift"] = {"chosen": tau, "why": "the narrow outputs' rule"}
        return None
    if val is None:
        model.index_info["prior_shift"] = {"chosen": 0.0, "why": "no validation split to check it on"}
        return None
    if scorer is None:
        scorer = EpochScorer(model, val, probe)
    scored = {}
    # the network's candidates at every shift the walk may score, from one pass of products
    shifts = [float(t) for t in PRIOR_SHIFTS if float(t) != 0.0]
    biases = net.shifted_output_biases(shifts, counts, train.n_points)
    ready = dict(zip(shifts, scorer.candidates(model, biases))) if biases is not None else {}

    def score(tau: float) -> tuple[float, float]:
        if tau == 0.0 and kept is not None and net.prior_shift == 0.0:
            scored[tau] = kept[1]
            return kept[0]
        if tau in ready:
            ids, logits = ready[tau]
            scored[tau] = (ids, logits) if scorer.every and scorer.probe is not None else None
            return scorer.figures(model, ids, logits)
        net.shift_output_prior(tau, counts, train.n_points)
        figures = scorer(model)
        scored[tau] = scorer.last
        return figures

    tau, figures = validation.choose_prior_shift(score, PRIOR_SHIFTS)
    net.shift_output_prior(tau, counts, train.n_points)
    model.index_info["prior_shift"] = {
        "chosen": tau, "validation_points": int(validation.check_rows(val.n_points, val.n_labels).size),
        "scored": "network alone" if probe is None else "the best of the epoch checks' fusion grid",
        "p@1/p@5": {f"{t:g}": list(v) for t, v in figures.items()}}
    return scored.get(tau)


class EpochScorer:
    """scorer(model) -> (P@1, P@5) on the validation rows the epoch checks score
    (`validation.check_rows`): the network alone, or with a probe the best of its fusion grid.

    last: with a probe, where those rows are every validation point, the network's candidates
    of the last call ((ids, logits) of predict_topk_scores, exact, unfused: what the fusion
    choice scores), else None."""

    def __init__(self, model, val, probe):
        self.rows = validation.check_rows(val.n_points, val.n_labels)
        self.X, self.truth = sp.csr_matrix(val.X)[self.rows], sp.csr_matrix(val.Y)[self.rows]
        self.probe, self.every = probe, self.rows.size == val.n_points
        self.k = max(5, model.config.knn_candidates)
        self.last = None

    def __call__(self, m) -> tuple[float, float]:
        ids, logits = predict_topk_scores(m, self.X, self.scored_k, exact=True, fused=False)
        if self.probe is not None:
            self.last = (ids, logits) if self.every else None
        return self.figures(m, ids, logits)

    @property
    def scored_k(self) -> int:
        """The network's labels a check scores per point: the probe's candidates, else 5."""
        return 5 if self.probe is None else self.k

    def candidates(self, m, biases) -> list:
        """The network's (ids, logits) on the check rows under each output bias vector of
        `biases` (Network.shifted_output_biases), the products made once for all of them."""
        return predict_topk_scores(m, self.X, self.scored_k, biases=biases, fused=False)

    def figures(self, m, ids, logits) -> tuple[float, float]:
        """(P@1, P@5) of the network's candidates (ids, logits) on the check rows, as a check
        scores them."""
        cfg = m.config
        if self.probe is None:
            r = metrics.evaluate(self.truth, ids[:, :5], k=5)
            return float(r["p@1"]), float(r["p@5"])
        return self.probe.best(ids, logits, self.rows, cfg.knn_power, cfg.proto_power)


def kept_scoring(early_info: dict, scorer: EpochScorer):
    """What the epoch checks found for the weights early stopping kept (its `finish` record):
    ((P@1, P@5), the network's candidates where the kept epoch was the last scored, else None)."""
    steps = [c[0] for c in early_info["curve"]]
    at = steps.index(early_info["kept_step"])
    p1, p5 = early_info["curve"][at][1:]
    return (float(p1), float(p5)), (scorer.last if at == len(steps) - 1 else None)


def fusion_pending(config: Config, train) -> bool:
    """Whether the end of training fuses the neighbours' labels with something left to choose
    (the count, the prototypes' share or the weight)."""
    k = config.knn if config.knn is not None else knn_default(train.n_labels, points_per_label(train.Y))
    return bool(k) and (config.knn is None or config.knn_weight is None or config.proto_weight is None)


def build_neighbours(model, train, progress: bool = False, val=None, fit_data=None, probe=None,
                     scored=None):
    """The model's neighbour store (`Model.neighbours`, dslide.infer.fusion) from the training data, when
    `knn` > 0 or left to the data and on: every rank builds the same store, a function of
    the data alone, with the label prototypes unless proto_weight is 0.

    What is left at None (the count from FUSION_COUNTS, the prototypes' share from
    FUSION_SHARES, the weight from FUSION_WEIGHTS, or FUSION_TEMPERED_WEIGHTS at a softmax
    temperature from FUSION_TEMPERATURES above 1) is chosen on the validation points `val`
    (dslide.train.validation.choose_fusion) with a store of the gradient's points `fit_data`; the
    no-op, weight 0 (the network alone), is always a candidate and, when chosen, no store
    is kept. Otherwise the store is rebuilt from every training point with the choice kept
    in it. Without validation points nothing can be checked: a store whose settings are
    all given is built, and one with anything left to choose is not (the network alone).
    model.index_info gets the figures behind the choice and the seconds taken.
    progress: a progress bar (tqdm, stderr) of its stages. scored: the network's candidates on
    every validation point, the model as it is ((ids, logits): `apply_prior_shift`'s), else
    scored here.

    Returns the validation points' scores as the model will have them before its hidden
    neighbours (`build_hidden_neighbours`): (ids int64 [n, K], scores float64 [n, K]), the fused
    scores at the choice (from the gradient's points' store) or the network's softmax over its
    `knn_candidates` best labels; None without validation points, with hidden_knn 0, or where
    the fused score's settings were all given (nothing scored them on the split)."""
    t0 = time.perf_counter()
    cfg = model.config
    k = cfg.knn if cfg.knn is not None else knn_default(train.n_labels, points_per_label(train.Y))
    model.neighbours = None
    wanted = val is not None and cfg.hidden_knn != 0  # the hidden neighbours' choice takes the base
    if not k:
        if not wanted:
            return None
        m_ids, m_logits = scored if scored is not None else _network_candidates(model, val)
        return m_ids, softmax_rows(m_ids, m_logits)
    choosing = cfg.knn is None or cfg.proto_weight is None or cfg.knn_weight is None
    if choosing and val is None:
        model.index_info["fusion_choice"] = {"chosen": "off", "why": "no validation split to check it on"}
        return None
    bar = _stage_bar(["store"] + ["validation choice", "store of every point"] * choosing,
                     "neighbour labels") if progress else None
    protos = cfg.proto_weight != 0
    if choosing:
        if probe is None:
            probe = fusion_probe(model, fit_data, val)
        _advance(bar)
        counts = fusion_counts(cfg)
        shares = validation.FUSION_SHARES if cfg.proto_weight is None else (cfg.proto_weight,)
        weights = validation.FUSION_WEIGHTS if cfg.knn_weight is None else (0.0, cfg.knn_weight)
        temps = validation.FUSION_TEMPERATURES if cfg.knn_temperature is None else (cfg.knn_temperature,)
        tempered_weights = validation.FUSION_TEMPERED_WEIGHTS if cfg.knn_weight is None else None
        if scored is not None:  # the prior shift's scoring of every validation point, as trained
            m_ids, m_logits = scored
        else:
            with _busy("neighbour labels: scoring the validation points", bar is not None):
                m_ids, m_logits = _network_candidates(model, val)
        (c, a, w, t), figures = validation.choose_fusion(
            probe.store, probe.truth, m_ids, m_logits, probe.nn_ids, probe.nn_sims, probe.pr_ids, probe.pr_sims,
            counts=counts, shares=shares, weights=weights, power=cfg.knn_power, pr_power=cfg.proto_power,
            comm=model.comm, temperatures=temps, tempered_weights=tempered_weights)
        _advance(bar)
        model.index_info["fusion_choice"] = {
            "chosen": "off" if w == 0 else {"knn": c, "proto_weight": a, "knn_weight": w, "knn_temperature": t},
            "validation_points": val.n_points,
            "p@1/p@5": {validation.grid_key(*key): list(v) for key, v in figures.items()}}
        if w == 0:
            if bar is not None:
                bar.close()
            model.index_info["neighbours_s"] = time.perf_counter() - t0
            return (m_ids, softmax_rows(m_ids, m_logits)) if wanted else None
        base = None
        if wanted:  # the validation points' fused scores at the choice, as prediction will fuse them
            pr = (probe.pr_ids, probe.pr_sims) if probe.pr_ids is not None and a > 0 else (None, None)
            base = probe.store.fuse(m_ids, tempered(m_logits, t), probe.nn_ids[:, :c], probe.nn_sims[:, :c], w,
                                    cfg.knn_power, max(5, cfg.knn_candidates), *pr, a, cfg.proto_power)
        store = NeighbourLabels.build(train.X, train.Y, prototypes=protos and a > 0, comm=model.comm)
        store.k, store.share, store.weight, store.temperature = c, a, w, t
    else:
        base = None
        store = NeighbourLabels.build(train.X, train.Y, prototypes=protos, comm=model.comm)
        store.k, store.share, store.weight = k, cfg.proto_share(), cfg.fusion_weight()  # as given, kept with it
        store.temperature = cfg.fusion_temperature()
    _advance(bar)
    if bar is not None:
        bar.close()
    model.neighbours = store
    model.index_info["neighbours_s"] = time.perf_counter() - t0
    return base


def _network_candidates(model, val):
    """The network's best max(5, knn_candidates) labels of every validation point, unfused:
    (ids int64 [n, K], logits float64 [n, K])."""
    return predict_topk_scores(model, val.X, max(5, model.config.knn_candidates), exact=True, fused=False)


def hidden_vectors(model, X, rows=None, progress=None) -> np.ndarray:
    """float32 [m, h]: the network's last hidden vectors of the rows `rows` of X (int64, default
    all), inference (no dropout), every rank with all of them, 4,096 rows at a time; collective.
    progress(m): called with the rows of each block done."""
    net = model.network
    X = sp.csr_matrix(X)
    rows = np.arange(X.shape[0], dtype=np.int64) if rows is None else rows
    parts = csr_parts(X, net.dtype)
    norms = input_norms(X, model.config.input_norm)
    H = np.empty((rows.size, net.layers[-1].d_in), np.float32)  # filled in place: no blocks to concatenate
    for s in range(0, rows.size, 4096):
        H[s:s + 4096] = net.hidden(make_batch(parts, None, rows[s:s + 4096], net.step, norms=norms)).dense()
        if progress is not None:
            progress(min(rows.size, s + 4096) - s)
    return H


def build_hidden_neighbours(model, train, val=None, fit_data=None, base=None) -> None:
    """The model's hidden neighbours (`Model.hidden_neighbours`, dslide.infer.hidden_knn): the
    unit hidden vectors and labels of every training point, when `hidden_knn` > 0 or left to the
    data and chosen. What is left at None (the count from HIDDEN_COUNTS, the power from
    HIDDEN_POWERS, the weight from HIDDEN_WEIGHTS) is chosen on the validation points `val`
    (validation.choose_hidden) with a store of the gradient's points `fit_data`, against `base`,
    the validation points' scores before this stage (`build_neighbours`' return); weight 0, none,
    is always a candidate. Without a hidden layer, with a weight of 0 given, or with something to
    choose and no validation points or base, or a store above HIDDEN_STORE_MAX_BYTES, none.
    model.index_info gets the choice ("hidden_choice") and its figures."""
    t0 = time.perf_counter()
    cfg, net = model.config, model.network
    model.hidden_neighbours = None
    if cfg.hidden_knn == 0:
        return
    info = model.index_info
    if len(net.layers) < 2:
        info["hidden_choice"] = {"chosen": "off", "why": "the network has no hidden layer"}
        return
    given = (cfg.hidden_knn, cfg.hidden_knn_power, cfg.hidden_knn_weight)
    if cfg.hidden_knn_weight == 0:  # the votes count for nothing: no store
        return
    if None in given:
        if not hidden_store_fits(train.n_points, net.layers[-1].d_in):
            size = 4 * train.n_points * net.layers[-1].d_in
            info["hidden_choice"] = {"chosen": "off", "why": f"their store would hold {size / 2**30:.1f} GiB a rank, "
                                     f"above rules.HIDDEN_STORE_MAX_BYTES (give hidden_knn, hidden_knn_power and "
                                     f"hidden_knn_weight to keep it anyway)"}
            return
        if val is None or base is None:
            info["hidden_choice"] = {"chosen": "off", "why": "no validation split to check it on" if val is None else
                                     "the fused score's settings were all given: nothing scored it on the split"}
            return
        probe = HiddenNeighbours.build(hidden_vectors(model, fit_data.X), fit_data.Y, inplace=True)
        counts = validation.HIDDEN_COUNTS if cfg.hidden_knn is None else (cfg.hidden_knn,)
        powers = validation.HIDDEN_POWERS if cfg.hidden_knn_power is None else (cfg.hidden_knn_power,)
        weights = validation.HIDDEN_WEIGHTS if cfg.hidden_knn_weight is None else (0.0, cfg.hidden_knn_weight)
        nn_ids, nn_sims = probe.search(hidden_vectors(model, val.X), max(counts), model.comm)
        (c, a, w), figures = validation.choose_hidden(probe, sp.csr_matrix(val.Y), base[0], base[1], nn_ids, nn_sims,
                                                      counts=counts, powers=powers, weights=weights, comm=model.comm)
        info["hidden_choice"] = {
            "chosen": "off" if w == 0 else {"hidden_knn": c, "hidden_knn_power": a, "hidden_knn_weight": w},
            "validation_points": val.n_points,
            "p@1/p@5": {validation.hidden_key(*key): list(v) for key, v in figures.items()}}
        del probe
        if w == 0:
            info["hidden_s"] = time.perf_counter() - t0
            return
    else:
        c, a, w = given
    store = HiddenNeighbours.build(hidden_vectors(model, train.X), train.Y, inplace=True)
    store.k, store.power, store.weight = int(c), float(a), float(w)
    model.hidden_neighbours = store
    info["hidden_s"] = time.perf_counter() - t0


@contextlib.contextmanager
def _busy(what: str, on: bool, every: float = 6.0):
    """While the block runs (when `on`), a line on stderr every `every` seconds saying `what` is
    still going: a stage with no progress of its own never leaves a log silent for long."""
    if not on:
        yield
        return
    stop, t0 = threading.Event(), time.perf_counter()

    def beat():
        while not stop.wait(every):
            print(f"[dslide] {what} ({time.perf_counter() - t0:.0f}s)", file=sys.stderr, flush=True)

    thread = threading.Thread(target=beat, name="dslide-busy", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _bar_stays() -> bool:
    """tqdm's `leave` for the build's bars: on a terminal the bar is cleared when done; elsewhere
    (a log file, a pipe) its last state stays and ends its line, so what follows starts a line."""
    return not sys.stderr.isatty()


def _stage_bar(stages: list[str], desc: str):
    """A tqdm bar (stderr) of named stages, the current one's name beside it; `_advance` it."""
    from tqdm import tqdm

    bar = tqdm(total=len(stages), unit="stage", desc=desc, dynamic_ncols=True, leave=_bar_stays())
    bar.stages = stages
    bar.set_postfix_str(stages[0])
    return bar


def _advance(bar) -> None:
    """One stage of a `_stage_bar` done (None: no bar)."""
    if bar is None:
        return
    bar.update(1)
    if bar.n < len(bar.stages):
        bar.set_postfix_str(bar.stages[bar.n])


def build_index(model, train, progress: bool = False) -> dict:
    """The model's inference index (`Model.index`) over an output layer that can have one,
    from its final weights: anchors from the hidden vectors of at most `lsh.index_points`
    training points (a sample chosen by the seed, the same on every rank). Returns (and adds
    to model.index_info) its timings; {} when the output layer has no index
    (`Layer.index_points` 0: a dense one, or lsh.index_anchors = 0). progress: a tqdm bar of
    its two stages (the hidden vectors of the points, then anchors, buckets and graph)."""
    net = model.network
    out = net.layers[-1]
    n = train.n_points
    m = min(n, out.index_points())
    if m == 0:
        return {}
    t0 = time.perf_counter()
    rows = np.sort(np.random.default_rng([model.config.seed, 0x1DE]).choice(n, m, replace=False))
    bar = None
    if progress:
        from tqdm import tqdm

        # the second stage, anchors, buckets and the neighbour graph, counted as much as the first
        bar = tqdm(total=2 * m, unit="point", desc="inference index", dynamic_ncols=True, leave=_bar_stays())
    H = hidden_vectors(model, train.X, rows, None if bar is None else bar.update)
    Y = sp.csr_matrix(train.Y)[rows]
    labels = (Y.indptr.astype(np.int64), Y.indices.astype(np.int32))
    if bar is not None:
        bar.set_postfix_str("anchors, buckets, neighbour graph")
    with _busy("inference index: anchors, buckets, neighbour graph", bar is not None):
        model.index, info = InferenceIndex.build(H, out.W, out.b, net.comm, model.config.layer_lsh(out.index), out.n,
                                                 index_seed(model), labels)
    # the share of the layer its buckets keep, summed over ranks
    kept = net.comm.allreduce_sum(np.array([float(np.mean(model.index.tables.fill_count))]), kind="index")[0]
    share = float(kept) / out.n
    t1 = time.perf_counter()
    if bar is not None:  # a line between the two stages: their heartbeats' silences never add up
        bar.set_postfix_str("its query kernels")
    with _busy("inference index: loading its query kernels", bar is not None):
        warm_index(model)
    info["warm_s"] = time.perf_counter() - t1
    if bar is not None:
        bar.update(m)
        bar.close()
    info.update({"points": m, "index_s": time.perf_counter() - t0, "share": share})
    model.index_info.update(info)
    return info


def warm_index(model) -> None:
    """Compile the inference index's query kernels (numba, into its on-disk cache) on a
    tiny query of this rank's slice; nothing without an inference index.

    Called at the end of `build_index`, so that the first `predict --lsh` of a run finds
    them in the cache: compiled cold they take long enough to dominate a small
    `predict --lsh` on a shared machine (docs/lsh.md). The query goes through the kernels
    with the output layer's own arrays and the argument types scoring uses
    (`InferenceIndex.topk`), so the compiled signatures are those scoring looks up.
    """
    if model.index is None:
        return
    out = model.network.layers[-1]
    x = np.zeros((2, out.d_in), np.float32)
    x[:, 0] = 1.0
    # the scoring call itself (collective: every rank warms up together)
    model.index.topk(x, out.W, out.b, 1, out.lo, model.network.comm, model.config.layer_lsh(out.index))
