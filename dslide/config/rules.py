"""Every rule that takes a setting from the data, and every constant the settings are checked against.

A setting left at None (or "auto") is resolved here from the data's shape:
the number of labels (narrow outputs, at most NARROW_OUTPUT, against wide
ones), the training points, the training points per label and the layer
widths. `from_data` is `Config.resolve`'s table of those rules; `active_count`,
`layer_kind` and `output_rows` are the per-layer ones; `validation_size` the
held-out split's, which both `from_data` and dslide.train.validation read.
Adding a data rule touches this module and tests/unit/test_defaults_rule.py.
The measurements behind each value are in docs/accuracy.md, docs/lsh.md and
docs/benchmarks.md.
"""

from __future__ import annotations

import dataclasses

# -- the valid choices of the settings that take one of a few names ---------------------

POLICIES = ("fifo", "reservoir")
SELECT_MODES = ("topk", "threshold", "union")
LAYER_KINDS = ("auto", "dense", "lsh")
INPUT_NORMS = ("l2", "none")
DTYPES = ("float32", "float64")
ADAM_DTYPES = ("float32", "float64", "bfloat16")
PARALLEL = ("model", "data")
OUTPUT_SPLITS = ("auto", "columns", "rows")
#: lsh.family: where an LSH layer's candidates come from. The names live here, where they are
#: validated; dslide.model.candidates.SOURCES holds one source for each and checks that it does
FAMILIES = ("anchor", "dwta", "srp", "wta")
#: lsh.scope: "batch", the batch's candidates scored by every sample (one shared block);
#: "sample", each sample scores only its own, by gathers beside the shared block
SCOPES = ("batch", "sample")
LR_SCHEDULES = ("linear", "constant")
LOSSES = ("softmax", "bce", "softmax+bce", "label-softmax", "label-softmax+bce")
BIAS_INITS = ("log_prior", "zero")
SYNC_MODES = ("allreduce", "partial")
#: propensity presets, (A, B) of the label propensities behind PSP@k (Jain et al. 2016):
#: the constants the Extreme Classification Repository uses for Amazon and Wikipedia
#: data sets, and for everything else napkinXC's default (pyxclib has none)
PROPENSITY_PRESETS = {"default": (0.55, 1.5), "amazon": (0.6, 2.6), "wikipedia": (0.5, 0.4)}

# -- the constants of the data rules ----------------------------------------------------

#: lsh.max_active left at None: this many candidates per sample in a layer of at least
#: CANDIDATES_MIN_WIDTH neurons, none in a narrower one (`active_count`)
MAX_ACTIVE = 512
CANDIDATES_MIN_WIDTH = 250_000  # between a width where candidates lose and one where they win: docs/lsh.md
NARROW_OUTPUT = 4096  # labels: at most this many take the "narrow output" defaults
#: loss: "softmax" over the labels (sampled in an LSH output), "bce": one binary classifier
#: per label, against the block's other neurons as negatives, or the sum of both; "label-"
#: softmaxes give each of a point's labels its own softmax, the point's other labels left out
#: of the normaliser. Left at None: NARROW_LOSS in outputs of at most NARROW_OUTPUT labels
#: (every label a negative of every point), else WIDE_LOSS (docs/accuracy.md: on the wide
#: real members sampled negatives alone train poor binary classifiers, and a point's labels
#: competing in one softmax cost the many-label debian_depends 1.5 points of P@1)
NARROW_LOSS = "label-softmax+bce"
WIDE_LOSS = "label-softmax"
#: prior_shift left at None: at the end of training the output biases are lowered by this
#: times the log of each label's training frequency (logit adjustment: the network's bias
#: towards frequent labels undone in part). Narrow outputs, which have no validation split,
#: take FEW_LABELS_PRIOR_SHIFT where their training points carry fewer than FEW_LABELS labels
#: on average (the slots of P@5 a point's own labels cannot fill go to rarer labels instead of
#: wrong frequent ones), else NARROW_PRIOR_SHIFT (many labels a point: the frequent ones are
#: mostly right); wide ones choose from PRIOR_SHIFTS on their split (0, the no-op, unless
#: another gains; 0 without a split). docs/accuracy.md has the measurements.
NARROW_PRIOR_SHIFT = 0.2
FEW_LABELS_PRIOR_SHIFT = 0.4
FEW_LABELS = 5.0
PRIOR_SHIFTS = (0.0, 0.1, 0.2, 0.3)
#: knn left at None: this many neighbours' labels fused at inference in outputs wider than
#: NARROW_OUTPUT whose training data has fewer than KNN_MAX_POINTS_PER_LABEL points per label
#: (none elsewhere: the network alone learns such labels well); `knn_default` states the
#: rule, docs/accuracy.md the measurements behind it
KNN = 10
KNN_MAX_POINTS_PER_LABEL = 20.0
#: the leave-one-out choices of dslide.fusion (`choose_k`, `choose_share`), kept for the
#: benchmarks that compare them with the validation split; training itself chooses the count,
#: the prototypes' share and the weight on held-out points (dslide.train.validation)
KNN_CHOICES = (KNN, 5, 20)
#: lsh.max_active left at None where the neighbours' labels are fused (knn on): no candidates
FUSED_MAX_ACTIVE = 0
KNN_WEIGHT = 0.6  # the weight of a store saved without a chosen one and knn_weight left at None
PROTO_CHOICES = (0.0, 0.25, 0.5, 0.75)
PROTO_P1_TOLERANCE = 0.005
#: the share of a store saved without a chosen one and proto_weight left at None
PROTO_WEIGHT = 0.5
WIDE_EPOCHS = 1.5  # epochs left at None, outputs wider than NARROW_OUTPUT
#: hidden, epochs and batch_size left at None in outputs of at most NARROW_OUTPUT labels:
#: batches of NARROW_BATCH (fewer where the data would give fewer than NARROW_MIN_STEPS steps
#: per epoch: `narrow_batch`) through a NARROW_HIDDEN-wide layer reach in a few epochs what 30
#: epochs of 64 at 1e-3 through a 1,024-wide one reached (docs/accuracy.md); batches of 256
#: gained over 512 on all three narrow real members (docs/benchmarks.md, `(narrow-levers)`)
#: lr left at None, outputs wider than NARROW_OUTPUT: on both wide real members it beat 1e-2 on
#: P@1 and P@5 (docs/benchmarks.md, `bench.py --suite real (levers)`); narrow ones lost with it
WIDE_LR = 5e-3
#: weight_decay left at None, outputs wider than NARROW_OUTPUT trained by one replica: the
#: network alone memorises both wide real members (P@1 0.95 and 0.89 on training points against
#: 0.35 and 0.71 on test points) and decoupled decay of its weights gained P@1 on both
#: (docs/accuracy.md, docs/benchmarks.md `bench.py --suite real (decay)`)
WIDE_WEIGHT_DECAY = 0.05
#: ... but only where the output's uniform negatives are at least this share of its labels (a row
#: is then refreshed by Adam every few steps): a row that a step leaves out is decayed all the
#: same, and at 670,091 labels (8,192 negatives, 1.2 %) the network alone lost 8.7 points of P@1
#: on the synthetic a670k-tail-300k-full member (docs/benchmarks.md `(decay-scale)`)
DECAY_MIN_SAMPLED = 0.1
#: the weights decay once every DECAY_EVERY global steps, by the factor of that many steps
#: (`Network.decay_weights`): a pass over every weight each step would cost a fifth of a step
DECAY_EVERY = 50
#: beta2 left at None: Adam's second-moment decay. A narrow output trains about a thousand steps
#: (12 epochs of 256 points), as long as 0.999's memory of a thousand steps: the moments
#: still weigh the first steps' large gradients at the end. 0.99 gained on all three narrow
#: real members and lost on both wide ones, which train about three thousand steps
#: (docs/accuracy.md, item 19)
NARROW_BETA2 = 0.99
WIDE_BETA2 = 0.999
NARROW_HIDDEN = 512
NARROW_EPOCHS = 12.0
NARROW_BATCH = 256
NARROW_MIN_STEPS = 8
#: the held-out validation split (`validation_size`): VALIDATION_SHARE of the points, at least
#: VALIDATION_MIN, at most VALIDATION_MAX_SHARE of them and at most VALIDATION_MAX (they measure
#: a P@k to about half a point, and finding their neighbours grows with the training points:
#: 83 s of 300,000 points' training at 15,000 of them); none under VALIDATION_MIN_POINTS points
VALIDATION_SHARE = 0.05
VALIDATION_MIN = 1000
VALIDATION_MAX = 5000
VALIDATION_MAX_SHARE = 0.25
VALIDATION_MIN_POINTS = 2000
#: epochs left at None where early stopping is on: the most it trains
EARLY_STOP_MAX_EPOCHS = 10.0
#: middle_negatives left at None where early stopping is on: the share of the output's uniform
#: negatives a step draws from the second epoch until early stopping lowers the learning rate.
#: The first epoch and the epochs after the decay draw every one (docs/accuracy.md, item 14)
MIDDLE_NEGATIVES = 0.25
#: the neighbours' search under --lsh (dslide.infer.approx): training points kept per feature,
#: the query's largest features read, candidates re-ranked by their exact cosine; recall and
#: speed against the exact search: scripts/bench_lsh.py --fused (docs/benchmarks.md)
APPROX_POSTINGS = 256
APPROX_FEATURES = 16
APPROX_CANDIDATES = 64
#: under --lsh the hidden neighbours' store is searched in cells (k-means of its vectors, about
#: sqrt(N) of them): a query reads the points of its this many nearest cells, about
#: this many times sqrt(N) points (dslide.infer.hidden_knn)
APPROX_HIDDEN_PROBES = 32
#: the hidden neighbours are left to the validation split only while their store (every training
#: point's last hidden vector, float32, whole on every rank) would hold at most this many bytes
#: (`hidden_store_fits`)
HIDDEN_STORE_MAX_BYTES = 2 << 30
#: the validation probe (dslide.train.validation.FusionProbe) finds its points' neighbours and
#: prototypes by the exact search while that reads at most this many posting entries, else by
#: the bounded one above: the exact search grows with the training points, the bounded one
#: does not, but it first prunes and transposes every posting list, and its neighbours are not
#: all the exact ones. At 300,000 synthetic points (8.1e9 reads) the bounded probe recalled
#: 0.90 of the exact top 10 and its fusion choice lost a point of PSP@5 to save 8.6 s of 41
#: (docs/benchmarks.md, `(fast-protos)`, `(probe-exact)`); the real members read at most 4e8
PROBE_EXACT_READS = 20_000_000_000


# -- the rules ------------------------------------------------------------------------


def narrow_batch(n_points: int | None) -> int:
    """The batch_size of a narrow output left at None: NARROW_BATCH, or for data of fewer than
    NARROW_BATCH * NARROW_MIN_STEPS points n_points // NARROW_MIN_STEPS (at least 1), so that an
    epoch still has NARROW_MIN_STEPS steps."""
    if n_points is None:
        return NARROW_BATCH
    return max(1, min(NARROW_BATCH, int(n_points) // NARROW_MIN_STEPS))


def knn_default(n_labels: int, points_per_label: float | None = None) -> int:
    """The `knn` a run takes when it is left at None: KNN for outputs wider than NARROW_OUTPUT
    whose training data has fewer than KNN_MAX_POINTS_PER_LABEL points per (occurring) label
    (or whose figure is not given), else 0. Narrow outputs train a wide hidden layer, which
    learns their labels better than the neighbours' votes."""
    if n_labels <= NARROW_OUTPUT:
        return 0
    if points_per_label is not None and points_per_label >= KNN_MAX_POINTS_PER_LABEL:
        return 0
    return KNN


def label_points(label_counts) -> float:
    """Training points per label over the labels that occur: sum(counts) / #(counts > 0)
    (a point with 3 labels counts for each; 0.0 for no labels)."""
    import numpy as np

    counts = np.asarray(label_counts)
    seen = int(np.count_nonzero(counts))
    return float(counts.sum()) / seen if seen else 0.0


def points_per_label(Y) -> float:
    """`label_points` of a label matrix Y (csr [n, L]): training points per label, over the
    labels that occur (Config.resolve's data shape)."""
    import numpy as np
    import scipy.sparse as sp

    Y = sp.csr_matrix(Y)
    # the counts of the labels that occur only: no array of n_labels before the memory check
    return label_points(np.unique(Y.indices, return_counts=True)[1])


def labels_per_point(Y) -> float:
    """A label matrix Y's (csr [n, L]) labels per point, on average (0.0 for no points)."""
    import scipy.sparse as sp

    Y = sp.csr_matrix(Y)
    return float(Y.nnz) / Y.shape[0] if Y.shape[0] else 0.0


def narrow_prior_shift(labels_per_point: float) -> float:
    """The prior_shift of a narrow output left at None: FEW_LABELS_PRIOR_SHIFT where its training
    points carry fewer than FEW_LABELS labels on average, else NARROW_PRIOR_SHIFT."""
    return FEW_LABELS_PRIOR_SHIFT if labels_per_point < FEW_LABELS else NARROW_PRIOR_SHIFT


def resolve_shape(data) -> tuple:
    """What `Config.resolve` reads of a training set (XMCData): (n_labels, points_per_label,
    n_points, labels_per_point), so that every caller resolves a configuration as `fit` does."""
    return data.n_labels, points_per_label(data.Y), data.n_points, labels_per_point(data.Y)


def validation_size(n_points: int) -> int:
    """The points the validation split of n_points training points holds (0: no split)."""
    n = int(n_points)
    if n < VALIDATION_MIN_POINTS:
        return 0
    return int(min(max(round(VALIDATION_SHARE * n), VALIDATION_MIN), int(VALIDATION_MAX_SHARE * n), VALIDATION_MAX))


def from_data(config, n_labels: int, points_per_label: float | None = None, n_points: int | None = None,
              labels_per_point: float | None = None) -> dict:
    """The settings `config` left at None, taken from the data (`Config.resolve`): {name: value}.

    Narrow outputs (at most NARROW_OUTPUT labels) train a wide, dropout-regularised hidden
    layer in large batches for a few epochs; wide ones a narrow hidden layer at a larger
    learning rate, stopped early on the validation split where the data has one. `knn` is 0
    where the data has too many points per label (`knn_default`) or no validation split,
    else left at None for training to choose on that split; where the neighbours' labels are
    fused, the LSH layers take no candidates (FUSED_MAX_ACTIVE)."""
    narrow = n_labels <= NARROW_OUTPUT
    narrow_shift = None if labels_per_point is None else narrow_prior_shift(labels_per_point)
    auto = {"hidden": (NARROW_HIDDEN,) if narrow else (128,), "dropout": 0.6 if narrow else 0.0,
            "lr": 1e-2 if narrow else WIDE_LR, "beta2": NARROW_BETA2 if narrow else WIDE_BETA2,
            "loss": NARROW_LOSS if narrow else WIDE_LOSS,
            "batch_size": narrow_batch(n_points) if narrow else 128,
            "epochs": NARROW_EPOCHS if narrow else WIDE_EPOCHS, "init_input_scale": 0.1 if narrow else 0.3,
            "knn": knn_default(n_labels, points_per_label), "prior_shift": narrow_shift if narrow else 0.0,
            "weight_decay": WIDE_WEIGHT_DECAY if not narrow and config.replicas == 1
            and config.lsh.random_count(n_labels) >= DECAY_MIN_SAMPLED * n_labels else 0.0}
    has_split = n_points is not None and validation_size(n_points) > 0
    if config.early_stop is None:
        auto["early_stop"] = bool(not narrow and has_split and config.epochs is None and config.replicas == 1)
    if auto.get("early_stop") and config.epochs is None:
        auto["epochs"] = EARLY_STOP_MAX_EPOCHS
    stopping = config.early_stop if config.early_stop is not None else auto["early_stop"]
    # without early stopping no decay ends the middle epochs: every negative throughout
    auto["middle_negatives"] = MIDDLE_NEGATIVES if stopping and has_split and config.replicas == 1 else 1.0
    if (not narrow and (n_points is None or has_split)) or auto["prior_shift"] is None:
        del auto["prior_shift"]  # chosen on the validation split where training draws one, or undecided
    if n_points is not None and not has_split:
        auto["knn"] = 0  # no held-out points to check the neighbours' labels on: the no-op
    elif points_per_label is None or auto["knn"]:
        del auto["knn"]  # on (or undecided): chosen on the validation split
    changes = {k: v for k, v in auto.items() if getattr(config, k) is None}
    knn = changes.get("knn", config.knn)
    fused = knn if knn is not None else knn_default(n_labels, points_per_label)
    if fused and config.lsh.max_active is None:
        # the neighbours' labels carry the tail that the candidates' hard negatives would
        # teach the network: uniform negatives alone, at a fraction of the upkeep
        changes["lsh"] = dataclasses.replace(config.lsh, max_active=FUSED_MAX_ACTIVE)
    return changes


def lsh_tables(family: str) -> tuple[int, int]:
    """(K, L) of an LSH layer that leaves them at None: one table of anchors (K unused), or
    SLIDE's 50 tables of 6 hashes for item hashing."""
    return 6, (1 if family == "anchor" else 50)


def active_count(max_active: int | None, width: int) -> int:
    """Candidates per sample in a layer of `width` neurons: max_active, or when it is None
    MAX_ACTIVE if width >= CANDIDATES_MIN_WIDTH else 0. In a very wide layer candidates
    and uniform negatives give more P@1 than uniform negatives alone; in a narrower one
    the batch's candidates cover much of the layer and cost more time per step than they
    gain (docs/lsh.md, bench.py --parts schedule and lsh)."""
    if max_active is not None:
        return max_active
    return MAX_ACTIVE if width >= CANDIDATES_MIN_WIDTH else 0


def layer_kind(config, index: int, width: int) -> str:
    """'dense' or 'lsh' for layer `index` (0-based; the output is last) of `width` neurons:
    `kinds`, where "auto" (and the output when kinds is empty) is LSH when the layer is at
    least `auto_lsh_ratio` times wider than the neurons an LSH layer computes and at least
    `auto_lsh_min_width` wide; the first layer and `exact` runs are dense."""
    kind = config.kinds[index] if config.kinds else ("auto" if index == len(config.hidden) else "dense")
    if config.exact or index == 0:
        return "dense"
    if kind == "auto":
        lc = config.layer_lsh(index)
        cheaper = width >= config.auto_lsh_ratio * (lc.random_count(width) + lc.active_count(width))
        return "lsh" if cheaper and width >= config.auto_lsh_min_width else "dense"
    return kind


def output_rows(config, n_labels: int) -> bool:
    """Whether the output layer of `n_labels` is split by rows (`output_split`): a dense
    output over a dense last hidden layer (in data parallelism, where every rank holds the
    whole model, the split is the same arithmetic over one rank). "auto" takes rows where
    n_labels < hidden[-1]; "rows" where the layers allow it (a ValueError otherwise)."""
    if config.output_split == "columns":
        return False
    hidden = config.hidden or ()
    why = None
    if not hidden:
        why = "the network has no hidden layer"
    elif "dense" != layer_kind(config, len(hidden), n_labels) or "dense" != layer_kind(config, len(hidden) - 1,
                                                                                        hidden[-1]):
        why = "the output layer and the last hidden layer must both be dense"
    if config.output_split == "rows":
        if why:
            raise ValueError(f"output_split = 'rows' cannot apply: {why}; use 'auto' or 'columns'")
        return True
    return why is None and n_labels < hidden[-1]


def hidden_store_fits(n_points: int, width: int) -> bool:
    """Whether the hidden neighbours' vectors of n_points training points (float32 [n_points,
    width], every rank's whole) stay within HIDDEN_STORE_MAX_BYTES: else they are not left to
    the validation split."""
    return 4 * int(n_points) * int(width) <= HIDDEN_STORE_MAX_BYTES
