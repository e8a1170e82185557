"""The held-out validation split, and the choices training makes on it.

Every choice a run makes from its data (when to stop training; whether the
neighbours' labels are fused, how many, with what share of label prototypes
and what weight) is judged on points that no gradient of that choice has
seen: a validation split drawn from the training file by the seed,

    n_val = min(clip(round(VALIDATION_SHARE * n), VALIDATION_MIN, VALIDATION_MAX_SHARE * n), VALIDATION_MAX),

the rows `validation_rows(n, seed)`: a function of the number of points and
the seed alone, so the same at any number of ranks. The network trains on the
other rows. Data of fewer than VALIDATION_MIN_POINTS points gets no split, and
every choice then takes its no-op (no fusion; the epochs the rule gives).

Each choice has the no-op among its candidates and keeps it unless another
candidate's score (P@1 + P@5 on the validation points) is higher by more than
a margin: a few thousand points measure a P@k to about a point, and a choice
that only matches the no-op must not change the model.

Early stopping (`EarlyStop`): with `early_stop` on, training runs for up to
`epochs` (EARLY_STOP_MAX_EPOCHS when the epochs are left to the data) and
scores the model after every epoch on `check_rows` of the validation points:
the network alone, or, where the neighbours' labels will be fused, the best of
a small fusion grid (`FusionProbe`), so that training stops when the model as
it will be used stops gaining. On the first plateau the best epoch's weights
come back at a lower learning rate; EARLY_STOP_AFTER_DECAY epochs later
training stops with the best weights seen. Before the EARLY_STOP_FIRST_PLATEAU-th
check, one that scores above the best by less than the margin is no plateau yet.

Fusion (`choose_fusion`): before training, the neighbour store is built from
the gradient's points and each validation point's nearest training points and
label prototypes are found once (`FusionProbe`: by the exact search while it reads
at most PROBE_EXACT_READS posting entries, else by the bounded search of `--lsh`
prediction, whose cost does not grow with the training points); after training the network's
top candidates are scored once and every (count, share, weight, temperature) of
the grid is scored by fusing those arrays (dslide.infer.fusion), one kernel pass per
count and temperature for all its (share, weight) cells. Weight 0 is the network alone.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from dslide import metrics, rng
from dslide.config.rules import (EARLY_STOP_MAX_EPOCHS, PROBE_EXACT_READS, VALIDATION_MAX, VALIDATION_MAX_SHARE,  # noqa: F401
                                 VALIDATION_MIN, VALIDATION_MIN_POINTS, VALIDATION_SHARE, validation_size)
from dslide.infer.approx import Bound
from dslide.infer.fusion import NeighbourLabels, tempered
from dslide.model.sharding import row_share

#: a candidate replaces the no-op only when its P@1 + P@5 is higher by more than this
CHOICE_MARGIN = 0.004
#: the fusion weights tried (0: the network alone, always a candidate)
FUSION_WEIGHTS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
#: the label prototypes' shares of the neighbour term tried (0: the points alone; 1: the prototypes alone)
FUSION_SHARES = (0.0, 0.25, 0.5, 0.75, 1.0)
#: the neighbour counts tried
FUSION_COUNTS = (10, 5, 20)
#: the temperatures of the network's softmax in the fused score tried (1: as trained; fusion's
#: docstring), and the weights tried at those above 1: a flatter softmax wants fewer votes
#: (where the wide real members' best cells lay: docs/accuracy.md, item 13)
FUSION_TEMPERATURES = (1.0, 2.0, 4.0)
FUSION_TEMPERED_WEIGHTS = (0.01, 0.02, 0.03, 0.05, 0.1, 0.2, 0.3)
#: the hidden neighbours' counts, powers and weights tried (dslide.infer.hidden_knn; weight 0,
#: none, always a candidate)
HIDDEN_COUNTS = (10, 25)
HIDDEN_POWERS = (4.0, 16.0)
HIDDEN_WEIGHTS = (0.0, 0.03, 0.06, 0.1, 0.2, 0.3)
EARLY_STOP_PATIENCE = 1
EARLY_STOP_MIN_GAIN = CHOICE_MARGIN  # below it an epoch is a plateau: the checks measure no finer
#: on a plateau the best epoch's weights are put back and the learning rate scaled by this
#: (EARLY_STOP_DECAYS times at most; a plateau after them stops training)
EARLY_STOP_DECAY = 0.25
EARLY_STOP_DECAYS = 1
#: after the last decay training runs this many epochs and stops (None: until the next plateau).
#: On both wide real members the lowered rate's first epoch gave what the test points showed;
#: waiting for the plateau trained one or two more that they did not (docs/accuracy.md, item 12)
EARLY_STOP_AFTER_DECAY = 1
#: the first epoch check at which a gain smaller than the margin counts as a plateau: before it, a
#: check that scores above the best, by however little, keeps training at the same rate from the
#: weights it reached (the best ones still kept); a check that scores below the best is a plateau
#: at any time. A young network's gain from one epoch to the next can cross the margin with no
#: more than another CPU's rounding of its products, and a decay that early cost a wide real member
#: half its epochs and points of P@5 and PSP@5 (docs/accuracy.md, item 21)
EARLY_STOP_FIRST_PLATEAU = 4
#: the epoch checks score at most this many (point, label) pairs: clip(it / n_labels,
#: EARLY_STOP_MIN_POINTS, the split) of the validation points, the same ones every check
EARLY_STOP_LABEL_SCORES = 1e8
EARLY_STOP_MIN_POINTS = 500
#: where the neighbours' labels are fused, each epoch check scores the best of this small grid
#: (count 10; the network alone among them), so training stops when the model as it will be
#: used stops gaining
PROBE_WEIGHTS = (0.0, 0.2, 0.4, 0.6, 0.8)
PROBE_SHARES = (0.0, 0.5)
PROBE_COUNT = 10


def check_rows(n_val: int, n_labels: int) -> np.ndarray:
    """The validation rows (of n_val) the epoch checks score: evenly spaced, a function of the
    data's shape alone, so that every rank and every run scores the same ones."""
    m = int(min(n_val, max(EARLY_STOP_MIN_POINTS, EARLY_STOP_LABEL_SCORES // max(1, n_labels))))
    return np.unique(np.linspace(0, n_val - 1, m).round().astype(np.int64)) if n_val else np.empty(0, np.int64)


class FusionProbe:
    """What scoring a model fused on the validation points needs, computed once before training:
    the neighbour store of the gradient's points (`fusion.NeighbourLabels`), each validation
    point's `max(counts)` nearest of them and `pr_k` nearest label prototypes (None without)."""

    def __init__(self, store, truth, nn_ids, nn_sims, pr_ids, pr_sims, comm=None, search: dict | None = None):
        self.store, self.truth = store, sp.csr_matrix(truth)
        self.nn_ids, self.nn_sims, self.pr_ids, self.pr_sims = nn_ids, nn_sims, pr_ids, pr_sims
        self.comm = comm
        #: how the neighbours were found: {"search": "exact" | "bounded", "exact_reads": int}
        self.search = search or {}

    @classmethod
    def build(cls, fit_data, val, counts, prototypes: bool, pr_k: int, comm=None, bound=None,
              max_exact_reads: int = PROBE_EXACT_READS) -> "FusionProbe":
        """The store of fit_data and val's `max(counts)` nearest points and `pr_k` nearest
        prototypes, by the exact search while it reads at most `max_exact_reads` posting
        entries (points and prototypes together), else by the bounded search `bound` (an
        approx.Bound; None: the default one). The reads are a function of the data alone, so
        every rank takes the same search."""
        store = NeighbourLabels.build(fit_data.X, fit_data.Y, prototypes=prototypes, comm=comm)
        reads = store.search_reads(val.X) + (store.search_reads(val.X, "prototypes") if prototypes else 0)
        approx = (bound or Bound()) if reads > max_exact_reads else False
        nn_ids, nn_sims = store.neighbours(val.X, max(counts), comm, approx=approx)
        pr_ids, pr_sims = store.prototypes(val.X, pr_k, comm, approx=approx) if prototypes else (None, None)
        store.drop_derived()  # searched once: the choices read its labels, not its rows
        search = {"search": "bounded" if approx else "exact", "exact_reads": reads}
        return cls(store, val.Y, nn_ids, nn_sims, pr_ids, pr_sims, comm, search)

    def best(self, m_ids, m_logits, rows, power: float, pr_power: float) -> tuple[float, float]:
        """(P@1, P@5) of the best of the probe's small grid on validation rows `rows`, from the
        network's candidates of those rows (m_ids, m_logits)."""
        pr = (self.pr_ids[rows], self.pr_sims[rows]) if self.pr_ids is not None else (None, None)
        k = min(PROBE_COUNT, self.nn_ids.shape[1])
        _, figures = choose_fusion(self.store, self.truth[rows], m_ids, m_logits, self.nn_ids[rows][:, :k],
                                   self.nn_sims[rows][:, :k], *pr, counts=(k,), shares=PROBE_SHARES,
                                   weights=PROBE_WEIGHTS, power=power, pr_power=pr_power, comm=self.comm)
        return max(figures.values(), key=sum)


def validation_rows(n_points: int, seed: int) -> np.ndarray:
    """The validation rows of n_points training points: int64, sorted; empty when the data is too
    small for a split. A function of (n_points, seed) alone."""
    m = validation_size(n_points)
    if m == 0:
        return np.empty(0, np.int64)
    pick = np.random.default_rng(rng.lsh_seed(seed, rng.VALIDATION))
    return np.sort(pick.choice(int(n_points), m, replace=False)).astype(np.int64)


def split(data, seed: int):
    """(the gradient's part, the validation part, the validation rows) of an XMCData; the
    validation part is None when the data gets no split."""
    from dslide.io.data import XMCData

    rows = validation_rows(data.n_points, seed)
    if rows.size == 0:
        return data, None, rows
    keep = np.ones(data.n_points, bool)
    keep[rows] = False
    X, Y = sp.csr_matrix(data.X), sp.csr_matrix(data.Y)
    return XMCData(X[keep], Y[keep]), XMCData(X[rows], Y[rows]), rows


def score(metrics: dict) -> float:
    """What the choices maximise: P@1 + P@5."""
    return float(metrics["p@1"]) + float(metrics["p@5"])


def pick(scores: dict, noop, margin: float = CHOICE_MARGIN):
    """The key of `scores` ({candidate: score}) with the highest score, or `noop` unless that
    score beats the no-op's by more than `margin` (ties: the earlier key)."""
    keys = list(scores)
    best = max(keys, key=lambda c: (scores[c], -keys.index(c)))
    return best if scores[best] > scores[noop] + margin else noop


def choose_prior_shift(score, shifts) -> tuple[float, dict]:
    """The shift of the output biases (Network.shift_output_prior) that best predicts the
    validation points: score(tau) -> (P@1, P@5) of the network with the shift tau, for 0 and then
    `shifts` in their order (ascending); 0, the no-op, wins unless another beats it by more than
    CHOICE_MARGIN. The walk stops at a shift whose P@1 + P@5 falls more than CHOICE_MARGIN below
    the best before it: past it the shifts only lower the prior further.
    (tau, {tau: (P@1, P@5)} of the shifts scored)."""
    figures = {0.0: score(0.0)}
    best = sum(figures[0.0])
    for tau in shifts:
        if float(tau) != 0.0:
            figures[float(tau)] = score(float(tau))
            here = sum(figures[float(tau)])
            if here < best - CHOICE_MARGIN:
                break
            best = max(best, here)
    return pick({t: sum(v) for t, v in figures.items()}, 0.0), figures


def grid_key(count: int, share: float, weight: float, temperature: float = 1.0) -> str:
    """How a cell of the fusion grid is named in the run's records ("knn 10 share 0.5 weight
    0.05 temperature 2"; a temperature of 1 left out)."""
    key = f"knn {count} share {float(share)} weight {float(weight)}"
    return key if float(temperature) == 1.0 else f"{key} temperature {float(temperature):g}"


def choose_fusion(store, truth: sp.csr_matrix, m_ids, m_logits, nn_ids, nn_sims, pr_ids, pr_sims, *,
                  counts, shares, weights, power: float, pr_power: float, comm=None,
                  temperatures=(1.0,), tempered_weights=None) -> tuple[tuple, dict]:
    """The (count, share, weight, temperature) of the fused scores that best predicts `truth`
    (csr [n, L]), from the network's candidates (m_ids int64 [n, c], m_logits float64 [n, c]),
    the points' nearest training points (nn_ids int32 [n, max(counts)], best first) and their
    nearest prototypes (pr_ids, pr_sims; None without prototypes). At a temperature of 1 the
    weights tried are `weights`, at the others `tempered_weights` (None: `weights`). The no-op
    (weight 0) wins unless another at a temperature of 1 beats it by more than CHOICE_MARGIN, and
    a cell at another temperature only where it beats that choice by more than the margin
    (`pick_tempered`): ((count, share, weight, temperature), {(count, share, weight,
    temperature): (P@1, P@5)}), the no-op under the key (0, 0.0, 0.0, 1.0).

    comm: ranks that hold the same arrays share the points (each scores every cell on its block
    of them, the hits gathered): every rank gets the figures one rank would."""
    figures = {}
    r = metrics.evaluate(truth, np.ascontiguousarray(m_ids[:, :5]), k=5)  # the network alone
    noop = (0, 0.0, 0.0, 1.0)
    figures[noop] = (float(r["p@1"]), float(r["p@5"]))
    temps = list(dict.fromkeys(float(t) for t in temperatures))
    grid = [(int(c), float(a), float(w), t) for c in counts for t in temps
            for a in (shares if pr_ids is not None else (0.0,))
            for w in (weights if t == 1.0 or tempered_weights is None else tempered_weights) if w != 0]
    labels = metrics._binary_labels(truth)  # the true labels as evaluate reads them
    # one kernel pass per count for every temperature, each rank on its share of the points
    n = m_ids.shape[0]
    per, lo, hi = row_share(n, *((0, 1) if comm is None else (comm.rank, comm.size)))
    own_logits = np.stack([tempered(m_logits[lo:hi], t) for t in temps])  # [T, hi - lo, K]
    own_pr = (pr_ids[lo:hi], pr_sims[lo:hi]) if pr_ids is not None else (None, None)
    for c in dict.fromkeys(key[0] for key in grid):
        at = [key for key in grid if key[0] == c]
        cells = np.array([(a, w, temps.index(t)) for _, a, w, t in at], np.float64).reshape(len(at), 3)
        own = store.fuse_grid_hits(m_ids[lo:hi], own_logits, nn_ids[lo:hi, :c], nn_sims[lo:hi, :c], power, *own_pr,
                                   pr_power, cells, labels[lo:hi], 5)
        for key, h in zip(at, gather_points(own, per, n, comm)):
            figures[key] = _p1_p5(h)
    best = pick_tempered({key: sum(v) for key, v in figures.items()}, noop)
    return best, figures


def gather_points(own: np.ndarray, per: int, n: int, comm) -> np.ndarray:
    """[m, n, ...] from each rank's [m, n_r, ...] of its share of n points (rank r's rows r * per ..,
    the last shares short or empty), all gathered."""
    if comm is None or comm.size == 1:
        return own
    pad = np.zeros((own.shape[0], per) + own.shape[2:], own.dtype)
    pad[:, :own.shape[1]] = own
    every = comm.allgather_rows(pad, kind="evaluation")  # [P, m, per, ...]
    return np.moveaxis(every, 0, 1).reshape((own.shape[0], comm.size * per) + own.shape[2:])[:, :n]


def share_cells(cells: list, score, comm, shape: tuple) -> np.ndarray:
    """Every cell's figures, float64 [len(cells), *shape], the cells shared over comm's ranks (cell
    i scored by rank i mod P, the figures all gathered): score(own) -> [len(own), *shape] for this
    rank's cells, cells[rank::P]. Ranks that hold the same arrays get the figures one rank would."""
    size, rank = (1, 0) if comm is None else (comm.size, comm.rank)
    per = -(-len(cells) // size)
    mine = np.full((per, *shape), np.nan)
    own = cells[rank::size]
    if own:
        mine[:len(own)] = score(own)
    every = mine[None] if size == 1 else comm.allgather_rows(mine, kind="evaluation")
    return np.array([every[i % size, i // size] for i in range(len(cells))]).reshape(len(cells), *shape)


def _p1_p5(hits) -> tuple[float, float]:
    """(P@1, P@5) of a cell's hits uint8 [n, 5], as dslide.metrics.evaluate computes them."""
    p = metrics.precision_from_hits(hits.astype(np.float64))
    return float(p[0]), float(p[4])


def choose_hidden(store, truth: sp.csr_matrix, b_ids, b_p, nn_ids, nn_sims, *, counts, powers, weights,
                  comm=None) -> tuple[tuple, dict]:
    """The (count, power, weight) of the hidden neighbours' votes (dslide.infer.hidden_knn) that
    best predicts `truth` (csr [n, L]) from the base scores (b_ids int64 [n, K], b_p float64 [n, K]:
    the fused scores, or the network's softmax) and the points' nearest stored points (nn_ids
    [n, max(counts)], best first). The no-op (weight 0, the base alone) wins unless another beats
    it by more than CHOICE_MARGIN: ((count, power, weight), {(count, power, weight): (P@1, P@5)}),
    the no-op under the key (0, 0.0, 0.0).

    comm: ranks that hold the same arrays share the grid ((count, power) pair i is scored by rank
    i mod P, the figures gathered): every rank gets the figures one rank would."""
    r = metrics.evaluate(truth, np.ascontiguousarray(b_ids[:, :5]), k=5)
    noop = (0, 0.0, 0.0)
    figures = {noop: (float(r["p@1"]), float(r["p@5"]))}
    pairs = [(int(c), float(a)) for c in counts for a in powers]
    ws = [float(w) for w in weights if w != 0]
    labels = metrics._binary_labels(truth)

    def score(own):  # one kernel pass per (count, power) for all its weights
        return [[_p1_p5(h) for h in store.grid_hits(b_ids, b_p, nn_ids[:, :c], nn_sims[:, :c], a, ws, labels, 5)]
                for c, a in own]

    if ws:
        for (c, a), v in zip(pairs, share_cells(pairs, score, comm, (len(ws), 2))):
            for w, (p1, p5) in zip(ws, v):
                figures[(c, a, w)] = (float(p1), float(p5))
    return pick({key: sum(v) for key, v in figures.items()}, noop), figures


def hidden_key(count: int, power: float, weight: float) -> str:
    """How a cell of the hidden neighbours' grid is named in the run's records."""
    return f"hidden_knn {count} power {float(power):g} weight {float(weight):g}"


def pick_tempered(scores: dict, noop, margin: float = CHOICE_MARGIN):
    """`pick` over the cells (count, share, weight, temperature) at a temperature of 1, the no-op
    among them; then the best cell at another temperature replaces that choice only if it scores
    more than `margin` above it (ties: the earlier key). A temperature is a choice of its own,
    with 1 its no-op: a cell that only matches the best at 1 is no evidence for it (without
    this rule the synthetic scale member lost P@1 on its test points; docs/accuracy.md, item 13)."""
    plain = {key: s for key, s in scores.items() if key[3] == 1.0}  # the no-op among them
    best = pick(plain, noop, margin)
    other = None
    for key, s in scores.items():
        if key not in plain and (other is None or s > scores[other]):
            other = key
    return other if other is not None and scores[other] > scores[best] + margin else best


class EarlyStop:
    """Scores the model on validation points after every epoch (a "step" callback of
    `train.fit`), keeps the best epoch's weights, lowers the learning rate on a first plateau
    and asks to stop `after_decay` epochs after the last decay (None: at the next plateau).
    scorer(model) -> (P@1, P@5): the network alone, or where the neighbours' labels are fused
    the best of a small fusion grid (`FusionProbe`). Every rank calls it at the same steps (the
    scoring is collective) and gets the same answer.

    An epoch gains when its score beats the best by more than `min_gain` (the checks measure
    no finer); only a gain replaces the best weights. Before the `first_plateau`-th check a check
    that scores above the best by less than `min_gain` is no plateau: training goes on at its
    rate (a young network's epoch gains are too noisy to judge it saturated); one that scores
    below the best is."""

    def __init__(self, scorer, steps_per_epoch: int, patience: int = EARLY_STOP_PATIENCE,
                 min_gain: float = EARLY_STOP_MIN_GAIN, decay: float = EARLY_STOP_DECAY,
                 decays: int = EARLY_STOP_DECAYS, after_decay: int | None = EARLY_STOP_AFTER_DECAY,
                 first_plateau: int = EARLY_STOP_FIRST_PLATEAU):
        self.scorer, self.every = scorer, max(1, int(steps_per_epoch))
        self.first_plateau = max(1, int(first_plateau))
        self.patience, self.min_gain = int(patience), float(min_gain)
        self.decay, self.decays_left = float(decay), int(decays)
        self.after_decay = None if after_decay is None else max(1, int(after_decay))
        self.left = None  # epochs left once the last decay is done (with after_decay)
        self.decayed_at = []
        self.best, self.best_step, self.bad = -np.inf, 0, 0
        self.snapshot = None
        self.curve = []  # (step, P@1, P@5) of every check

    def check(self, model, step: int) -> bool:
        """Score the model at `step`; True when training should stop."""
        p1, p5 = self.scorer(model)
        s = float(p1) + float(p5)
        self.curve.append((int(step), float(p1), float(p5)))
        gain = s > self.best + self.min_gain or self.snapshot is None
        rising = s > self.best and len(self.curve) < self.first_plateau  # too young to call it a plateau
        if gain:
            self.best, self.best_step = max(s, self.best), int(step)
            self.snapshot = [(layer.W.copy(), layer.b.copy()) for layer in model.network.layers]
        if self.left is not None:
            self.left -= 1
            if self.left <= 0:
                return True
        if gain or rising:
            self.bad = 0
            return False
        self.bad += 1
        if self.bad < self.patience:
            return False
        if self.decays_left > 0:  # a plateau: back to the best epoch, at a lower learning rate
            self.decays_left -= 1
            self.bad = 0
            self._restore(model)
            model.network.lr_scale *= self.decay
            self.decayed_at.append(int(step))
            if self.decays_left == 0 and self.after_decay is not None:
                self.left = self.after_decay
            return False
        return True

    def _restore(self, model) -> None:
        for layer, (W, b) in zip(model.network.layers, self.snapshot):
            layer.W[...] = W
            layer.b[...] = b
        for layer in model.network.layers:
            if hasattr(layer, "maintain"):
                layer.maintain(0)  # tables that rank by the weights see the ones put back

    def callback(self, inner=None):
        """A `fit` callback: `inner`'s, with a check at every epoch's end."""

        def cb(event, model, info):
            out = inner(event, model, info) if inner is not None else None
            if event == "step" and info % self.every == 0 and self.check(model, info):
                return "stop"
            return out

        return cb

    def finish(self, model) -> dict:
        """At the end of training: score the last weights if unscored, put back the best epoch's,
        and return what the run records (the curve and the step kept)."""
        step = model.network.step
        if not self.curve or self.curve[-1][0] != step:
            self.check(model, step)
        if self.snapshot is not None and self.best_step != step:
            self._restore(model)
        self.snapshot = None
        model.network.lr_scale = 1.0
        return {"kept_step": self.best_step, "curve": [list(c) for c in self.curve],
                "lr_lowered_at": self.decayed_at}
