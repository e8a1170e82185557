"""The configuration: one frozen dataclass, validated on construction.

Every field has a default that trains well on ordinary extreme-classification
data; a user changes only what differs. Layer sizes default from the data:
the input width is the number of features and the output width the number
of labels, so `hidden` lists only the hidden layers.

Kernels never read the configuration: they get plain values as arguments
(numba freezes globals at compile time).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass, field, fields
from typing import Any

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
#: lsh.max_active left at None: this many candidates per sample in a layer of at least
#: CANDIDATES_MIN_WIDTH neurons, none in a narrower one (LSHConfig.active_count)
MAX_ACTIVE = 512
CANDIDATES_MIN_WIDTH = 250_000  # between a width where candidates lose and one where they win: docs/lsh.md
#: lsh.scope: "batch", the batch's candidates scored by every sample (one shared block);
#: "sample", each sample scores only its own, by gathers beside the shared block
SCOPES = ("batch", "sample")
NARROW_OUTPUT = 4096  # labels: at most this many take the "narrow output" defaults
LR_SCHEDULES = ("linear", "constant")
#: loss: "softmax" over the labels (sampled in an LSH output), "bce": one binary classifier
#: per label, against the block's other neurons as negatives, or the sum of both. Left at None:
#: NARROW_LOSS in outputs of at most NARROW_OUTPUT labels (every label a negative of every
#: point), else "softmax" (docs/accuracy.md: on the wide real members sampled negatives alone
#: train poor binary classifiers)
NARROW_LOSS = "softmax+bce"
LOSSES = ("softmax", "bce", "softmax+bce")
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
KNN_CHOICE_POINTS = 5000
KNN_CHOICE_MARGIN = 0.0025
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
NARROW_HIDDEN = 512
NARROW_EPOCHS = 12.0
NARROW_BATCH = 256
NARROW_MIN_STEPS = 8


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


BIAS_INITS = ("log_prior", "zero")
SYNC_MODES = ("allreduce", "partial")
#: propensity presets, (A, B) of the label propensities behind PSP@k (Jain et al. 2016):
#: the constants the Extreme Classification Repository uses for Amazon and Wikipedia
#: data sets, and for everything else napkinXC's default (pyxclib has none)
PROPENSITY_PRESETS = {"default": (0.55, 1.5), "amazon": (0.6, 2.6), "wikipedia": (0.5, 0.4)}


def _choice(name: str, value: Any, valid: tuple) -> None:
    if value not in valid:
        raise ValueError(f"{name} = {value!r} is not valid; choose one of {', '.join(map(repr, valid))}")


def _int_range(name: str, value: Any, lo: int, hi: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} = {value!r} must be an integer")
    if value < lo or (hi is not None and value > hi):
        bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{name} = {value} must be {bound}")


def _float_range(name: str, value: Any, lo: float, hi: float, lo_open=False, hi_open=False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} = {value!r} must be a number")
    lb = "(" if lo_open else "["
    hb = ")" if hi_open else "]"
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an int too large for a float
        finite = False
    if not finite:  # NaN passes every comparison below
        raise ValueError(f"{name} = {value} must be a finite number in {lb}{lo}, {hi}{hb}")
    bad = value < lo or value > hi or (lo_open and value == lo) or (hi_open and value == hi)
    if bad:
        raise ValueError(f"{name} = {value} must be in {lb}{lo}, {hi}{hb}")


def _bool(name: str, value: Any) -> bool:
    """true/false (a bool, or text in any case) or 1/0 (a number or its text); nothing else:
    a bare string such as "False" or "yes" would otherwise count as true."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0"):
        return value.strip().lower() in ("true", "1")
    raise ValueError(f"{name} = {value!r} must be true or false (or 1 / 0)")


def _sequence(name: str, value: Any, what: str) -> tuple:
    """A list or tuple setting as a tuple; anything else (a number, a string) is an error."""
    if isinstance(value, (list, tuple)):
        return tuple(value)
    raise ValueError(f"{name} = {value!r} must be a list of {what}")


@dataclass(frozen=True)
class LSHConfig:
    """How an LSH-sparse layer picks its neurons, and its inference index.

    Each training step a layer computes one block of neurons for the whole
    batch: in the output layer the batch's labels; the union of the samples'
    candidates from the layer's tables, at most `max_active` per sample (0:
    none, plain sampled softmax; None, the default: 512 in a layer of at least
    CANDIDATES_MIN_WIDTH neurons and 0 in a narrower one, see `active_count`) and `max_candidates` per step (0: no cap;
    taken rank by rank across the samples); and `min_active` neurons drawn uniformly
    afresh each step (never more than `min_active_share` of the layer:
    `random_count`), which stand for all the others (log-Q correction). Counts
    are for the whole layer; each rank takes its share of them.

    scope: "batch" (default): the candidates join the shared block above, one
    BLAS product for the whole batch; "sample" (output layer, family "anchor"):
    each sample scores only its own first `max_active` bucket entries (numba
    gathers) beside the shared block of labels and uniform negatives, and its
    uniform correction counts only the neurons it did not score: more P@1 per
    epoch for fewer samples/s (docs/lsh.md "Per-sample candidates" has the
    measurements).

    family: where candidates come from (one of FAMILIES, a source each in dslide.model.candidates):
      "anchor" (default): `anchors` k-means centres of the layer's inputs,
        learnt online from the batches; a sample's candidates are the
        `max_active` neurons scoring highest (w.x + b, biases included) at its
        nearest anchor, refilled from the current weights every
        `rehash_every` steps (the period growing by `growth` after each use);
      "dwta", "srp", "wta": SLIDE's item hashing: neurons hashed with K hashes
        per table into L tables of 2**range_pow buckets (0: from the rank's
        neurons, 8 to 16 a bucket); capacity 0 (default): buckets hold exactly
        their neurons (lsh.CompactTables: 4 bytes per neuron and table, plus
        its code); capacity > 0: fixed-capacity buckets, `policy` for a full
        one (lsh.HashTables), a sample's candidates chosen
        by `select` ("topk": most tables first; "threshold": found by >=
        `threshold` tables, at most L; "union"); changed neurons re-hashed every
        `rehash_every` steps and the tables rebuilt every `rebuild_every`.
      K and L left at None take the family's defaults (anchor: L = 1;
      item hashing: K = 6, L = 50). lsh.FAMILIES also has "minhash", for
      sparse sets (the non-zero features of an input): a layer's weight rows
      are dense, their non-zero set is every input, so it is no layer family.

    Inference (`dslide eval --lsh`, `predict --lsh`): at the end of training
    the output layer gets an index built from its final weights:
    `index_anchors` k-means anchors of the hidden vectors of at most
    `index_points` training points, each bucket the `index_share` of the
    labels ranked highest for its anchor c by

        index_shrink * w_j . c + b_j + index_spread * |w_j|

    (the queries of an anchor's cell are h = c + e: their scores w.c + b + w.e
    scatter around a mean the cell's centre overstates, by about |w| e's
    spread); a query scores exactly what the buckets of its `index_probes`
    nearest anchors hold, and the labels of its `index_neighbors` nearest
    training points among those index_points (cosine of the hidden vectors,
    found by a beam of width `index_search` on a graph of each point's
    `index_degree` nearest and as many reverse links; lsh.neighbors). The
    buckets give up the room those labels take on average, so a query scores
    about `index_share` of the labels in all. index_anchors = 0: no index;
    index_neighbors = 0: buckets alone. The neighbours' labels recover much
    of what the buckets miss of the exact top-10, and of P@5 (docs/lsh.md,
    bench_lsh.py --eval --rebuild on the saved amazon-like model).
    """

    family: str = "anchor"
    K: int | None = None
    L: int | None = None
    anchors: int = 256
    bin_size: int = 8
    range_pow: int = 0
    capacity: int = 0
    policy: str = "fifo"
    select: str = "topk"
    threshold: int = 2
    min_active: int = 8192
    min_active_share: float = 0.2
    max_active: int | None = None
    max_candidates: int = 0
    scope: str = "batch"
    rehash_every: int = 50
    rebuild_every: int = 1000
    growth: float = 1.3
    index_anchors: int = 2048
    index_share: float = 0.02
    index_probes: int = 1
    index_shrink: float = 0.6
    index_spread: float = 0.5
    index_points: int = 50000
    index_neighbors: int = 5
    index_degree: int = 16
    index_search: int = 96

    def __post_init__(self):
        if self.family == "minhash":
            # lsh.FAMILIES has it for sparse sets; a weight row's non-zero set is every input
            raise ValueError("lsh.family = 'minhash' hashes sets (the non-zero features of sparse inputs) and "
                             "cannot tell dense weight rows apart; an LSH layer takes one of: "
                             + ", ".join(FAMILIES))
        _choice("lsh.family", self.family, FAMILIES)
        if self.K is None:
            object.__setattr__(self, "K", 6)
        if self.L is None:
            object.__setattr__(self, "L", 1 if self.family == "anchor" else 50)
        _int_range("lsh.K", self.K, 1, 32)
        _int_range("lsh.L", self.L, 1, 1024)
        _int_range("lsh.anchors", self.anchors, 1, 1 << 20)
        _int_range("lsh.bin_size", self.bin_size, 2, 1 << 16)
        if self.bin_size & (self.bin_size - 1):
            raise ValueError(f"lsh.bin_size = {self.bin_size} must be a power of two (it is packed into code bits)")
        _int_range("lsh.range_pow", self.range_pow, 0, 24)
        _int_range("lsh.capacity", self.capacity, 0, 1 << 16)
        _choice("lsh.policy", self.policy, POLICIES)
        _choice("lsh.select", self.select, SELECT_MODES)
        _int_range("lsh.threshold", self.threshold, 1, None if self.family == "anchor" else self.L)
        _int_range("lsh.min_active", self.min_active, 0)
        _float_range("lsh.min_active_share", self.min_active_share, 0.0, 1.0)
        if self.max_active is not None:
            _int_range("lsh.max_active", self.max_active, 0)
        _int_range("lsh.max_candidates", self.max_candidates, 0)
        _choice("lsh.scope", self.scope, SCOPES)
        if self.scope == "sample" and self.family != "anchor":
            raise ValueError(f"lsh.scope = 'sample' takes each sample's own anchor bucket and needs "
                             f"lsh.family = 'anchor' (got {self.family!r}); item hashing takes scope 'batch'")
        _int_range("lsh.rehash_every", self.rehash_every, 1)
        _int_range("lsh.rebuild_every", self.rebuild_every, 1)
        _float_range("lsh.growth", self.growth, 1.0, 10.0)
        _int_range("lsh.index_anchors", self.index_anchors, 0, 1 << 20)
        _float_range("lsh.index_share", self.index_share, 0.0, 1.0, lo_open=True)
        _int_range("lsh.index_probes", self.index_probes, 1, 1024)
        _float_range("lsh.index_shrink", self.index_shrink, 0.0, 1.0)
        _float_range("lsh.index_spread", self.index_spread, 0.0, 100.0)
        _int_range("lsh.index_points", self.index_points, 1)
        _int_range("lsh.index_neighbors", self.index_neighbors, 0, 1024)
        _int_range("lsh.index_degree", self.index_degree, 1, 1024)
        _int_range("lsh.index_search", self.index_search, 1, 1 << 16)
        if self.index_search < self.index_neighbors:
            raise ValueError(f"lsh.index_search = {self.index_search} must be >= lsh.index_neighbors = "
                             f"{self.index_neighbors}: the search's beam holds the neighbours it returns")

    def active_count(self, width: int) -> int:
        """Candidates per sample in a layer of `width` neurons: max_active, or when it is None
        MAX_ACTIVE if width >= CANDIDATES_MIN_WIDTH else 0. In a very wide layer candidates
        and uniform negatives give more P@1 than uniform negatives alone; in a narrower one
        the batch's candidates cover much of the layer and cost more time per step than they
        gain (docs/lsh.md, bench.py --parts schedule and lsh)."""
        if self.max_active is not None:
            return self.max_active
        return MAX_ACTIVE if width >= CANDIDATES_MIN_WIDTH else 0

    def random_count(self, width: int) -> int:
        """Shared random neurons per step in a layer of `width` neurons (all ranks together)."""
        return min(self.min_active, int(self.min_active_share * width))


@dataclass(frozen=True)
class Config:
    """Everything a run needs besides its data.

    Settings left at None take their value from the data (`resolve`), by the
    width of the output layer. Narrow outputs (at most NARROW_OUTPUT labels:
    BibTeX, Delicious, EURLex-4K) make a cheap output layer and small data
    sets that overfit: a wide, dropout-regularised hidden layer generalises
    best, trained in large batches for a few epochs. Wide outputs (Amazon-670K,
    WikiLSHTC) make the output layer the cost, which grows with the hidden width, and
    have few points per label: a narrow hidden layer and a large learning
    rate that reaches a good model in a few epochs.

        setting             narrow output   wide output
        hidden              (512,)          (128,)
        dropout             0.6             0.0
        lr                  1e-2            5e-3
        batch_size          256 (at least   128
                            8 steps/epoch)
        epochs              12              up to 10, stopped early on the validation
                                            split (1.5 without one: dslide.train.validation)
        early_stop          off             on where the data has a validation split
        init_input_scale    0.1             0.3
        knn                 0               chosen on the validation split from 10, 5,
                                            20 (0 from 20 points per label, or without
                                            a split; knn_default)
        knn_weight          -               chosen on the validation split from 0 (the
                                            network alone), 0.1, 0.2, ..., 0.9
        proto_weight        -               chosen on the validation split from 0, 0.25,
                                            0.5, 0.75, 1 (where knn is on)
        lsh.max_active      -               0 where knn is on (uniform negatives
                                            only: the neighbours carry the tail)

    (Measured on the real sets of ../shared/data against PECOS and omikuji:
    scripts/bench.py --suite real, docs/benchmarks.md and docs/accuracy.md.)

    hidden: widths of the hidden layers (ReLU); the output layer (softmax) has
        one neuron per label.
    kinds: per layer, hidden ones then the output: "dense" (every neuron, BLAS),
        "lsh" (LSH-selected active neurons) or "auto" (by cost: an LSH layer
        computes about random_count + max_active neurons per sample where a
        dense one computes all of them with faster BLAS products, and pays a
        fixed cost per step for its tables' upkeep; so "auto" is LSH when the layer is at least
        `auto_lsh_ratio` times wider than the neurons it computes and at least
        `auto_lsh_min_width` wide. scripts/bench_auto_lsh.py trains `small`
        with both kinds of output at several label counts and records their
        samples/s and P@1 in docs/benchmarks.md, with where the defaults put
        the crossover.)
        Empty: dense hidden layers and an "auto" output. The first layer reads
        the raw sparse features and is always dense.
    lsh: settings of every LSH layer; `lsh_layers` may give one per layer
        (None, written "lsh" in TOML, keeps `lsh`).
    exact: every neuron of every layer active, no LSH (the reference path).
    lr_schedule: "linear" decays the learning rate from `lr` to 0 over the
        run's `epochs` (the last steps refine rather than jump: on small data
        sets the final model is then about as good as the best epoch's);
        "constant" keeps `lr`.
    loss: "softmax": cross-entropy of the softmax over the labels, each of a point's
        labels taking an equal share of its unit of target mass (in an LSH output the
        softmax runs over the step's block, its random neurons standing for the rest of
        the layer: sampled softmax). "bce": binary cross-entropy of one sigmoid per
        label, every label of the point a positive and every other neuron of the step's
        block a negative (in an LSH output: the batch's other labels, the candidates,
        the random neurons; negative sampling, as per-label classifiers are trained).
        "softmax+bce": the sum of the two (the binary part without the softmax's
        log-Q correction). Left at None: "softmax+bce" in narrow outputs, "softmax"
        in wide ones.
    init_input_scale: the first hidden layer starts from U(-s, s); with
        L2-normalised input rows this is the scale of its pre-activations.
    output_bias_init: "log_prior" starts each label's bias at the log of its
        smoothed training frequency, log((count + 1) / (n + n_labels)): the
        softmax starts from the label prior instead of having to learn it, which
        sampled softmax does slowly because most labels are rarely sampled;
        "zero" starts from 0.
    adam_dtype: how Adam's two moments are stored; None: like the parameters
        (`dtype`). "bfloat16" (with float32 parameters) halves them: 8 bytes per
        parameter in all instead of 12; the update is computed in float32, m
        rounded to nearest and v stochastically (kernels.py says why).
        scripts/bench_scale.py compares its P@1 with float32 moments on
        amazon-like data (docs/benchmarks.md).
    checkpoint_moments: checkpoints hold Adam's moments (needed to resume);
        false writes weights only (half or a third of the bytes; for
        deployment: eval and predict read weights only anyway).
    parallel: "model" splits every layer's neurons over the ranks (dslide);
        "data" gives every rank the whole model and all-reduces gradients
        (the baseline of Horovod and PyTorch DDP).
    output_split: how a dense output layer is split over the ranks. "columns": each rank its labels, the last hidden layer
        all-gathered before it and its gradient reduce-scattered after.
        "rows": each rank the rows of W over its own hidden columns and every
        label; the ranks' partial logits are summed by one all-reduce of
        [batch, labels], and neither the hidden layer nor its gradient moves.
        "auto" (default): "rows" where the output is narrower than the last
        hidden layer (that all-reduce is then the smaller exchange) and both
        are dense, else "columns" (`output_rows`). The choice depends on the
        layer widths, never on the number of ranks; a checkpoint loads only
        into a network with the same split.
    replicas: R replica groups of the model (hybrid data x model parallelism): a
        world of R x P ranks forms R groups of P model shards (ranks g*P ..
        g*P + P - 1 are group g); the groups train on disjoint slices of each
        epoch and average the parameter rows they changed every `sync_every`
        steps (dslide.train.replicas). The world size must be a multiple of R.
    sync: how replicas average: "allreduce" (every group at each
        synchronisation, bulk synchronous) or "partial" (asynchronous gossip:
        at its synchronisation a group publishes the rows it changed and
        averages with the latest versions the others published, copied
        one-sidedly, so no group ever waits for another).
    sync_every: steps of a group between its synchronisations.
    shard_weights: how a group's P ranks share each layer's neurons: empty
        (even shares), one positive weight per rank (shares in proportion),
        or "auto" (shares proportional to each rank's measured speed in the
        first steps, then the layers are re-sharded once).
    knn: at inference, the labels of each query's `knn` nearest training points
        (cosine of the L2-normalised input rows) vote beside the model's softmax
        (dslide.fusion): score = (1 - knn_weight) p + knn_weight v, the softmax
        taken over the model's `knn_candidates` best labels and each neighbour's
        vote weighed by its similarity to the power `knn_power`. 0: the model
        alone. None: from the data (`knn_default`): on for wide outputs whose
        training data has few points per label, where the network's tail is
        weak and the neighbours' labels strong; the count, the prototypes'
        share and knn_weight are then chosen at the end of training on the
        validation split (dslide.train.validation: the network alone, weight 0, is
        always a candidate), kept with the model's neighbour store.
    knn_weight: the neighbours' weight in the fused score; None: chosen on the
        validation split from FUSION_WEIGHTS (0 drops the store).
    early_stop: score the model on the validation split after every epoch (the
        network alone, or where the neighbours' labels are fused the best of a
        small fusion grid) and stop once it no longer gains, keeping the best
        epoch's weights
        (dslide.train.validation.EarlyStop); `epochs` is then the most it trains.
        None: on for wide outputs whose data has a validation split when
        `epochs` is left to the data (up to EARLY_STOP_MAX_EPOCHS), else off.
    proto_weight: where the neighbours' labels are fused, the share of their
        term given to the label prototypes (normalised sums of each label's
        training rows): v = (1 - proto_weight) v_points + proto_weight v_protos,
        each query's `proto_candidates` prototypes of largest cosine voting
        with their cosine to the power `proto_power`. 0: the points alone (and
        no prototypes built). None: chosen with the count and the weight on
        the validation split (dslide.train.validation), kept with the store.
    choice_points: no longer read by training (the choices are made on the
        validation split); kept so that older config.toml files still load,
        and read by scripts/bench_neighbours.py's leave-one-out study.
    propensity: the preset of the constants A, B of the label propensities
        behind PSP@k (Jain et al. 2016; see dslide.metrics.inverse_propensity),
        computed from the training labels and saved with the run
        (dslide.propensity): "amazon" (0.6, 2.6), "wikipedia" (0.5, 0.4), or
        "default" (0.55, 1.5, napkinXC's default; pyxclib has none).
    propensity_a, propensity_b: explicit A, B; None takes the preset's
        (`propensity_constants`).
    stall_timeout: seconds a rank waits in one collective (all-gather, all-reduce,
        barrier, ...) for the others before the run ends, every rank with a message
        naming the rank that stopped answering (dslide.comm, `Comm.stall_timeout`).
        0 (default): wait as long as it takes, with MPI's blocking calls, as
        before. Not on by default because ranks also wait legitimately: for
        rank 0 writing a checkpoint's manifest or a large model's files, for a
        rank compiling numba's kernels on a cold cache, for a rank
        slowed by a shared machine; a timeout must be longer than any of these,
        which only the user knows (e.g. 600 for a large model).
    """

    hidden: tuple[int, ...] | None = None
    kinds: tuple[str, ...] = ()
    lsh: LSHConfig = field(default_factory=LSHConfig)
    lsh_layers: tuple[LSHConfig | None, ...] = ()
    auto_lsh_ratio: float = 4.0
    auto_lsh_min_width: int = 12000
    exact: bool = False

    epochs: float | None = None
    batch_size: int | None = None
    lr: float | None = None
    lr_schedule: str = "linear"
    loss: str | None = None
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    dropout: float | None = None
    input_norm: str = "l2"
    init_input_scale: float | None = None
    output_bias_init: str = "log_prior"
    seed: int = 0
    threads: int = 0
    dtype: str = "float32"
    adam_dtype: str | None = None
    parallel: str = "model"
    output_split: str = "auto"
    propensity: str = "default"
    propensity_a: float | None = None
    propensity_b: float | None = None
    early_stop: bool | None = None
    knn: int | None = None
    knn_weight: float | None = None
    knn_power: float = 4.0
    knn_candidates: int = 100
    proto_weight: float | None = None
    proto_power: float = 16.0
    proto_candidates: int = 20
    choice_points: int = KNN_CHOICE_POINTS
    replicas: int = 1
    sync: str = "allreduce"
    sync_every: int = 8
    shard_weights: tuple[float, ...] | str = ()

    eval_every: int = 0
    eval_points: int = 2000
    log_every: int = 50
    checkpoint_every: int = 0
    checkpoint_moments: bool = True
    stall_timeout: float = 0.0

    def __post_init__(self):
        if self.hidden is not None:
            hidden = (self.hidden,) if isinstance(self.hidden, int) and not isinstance(self.hidden, bool) \
                else _sequence("hidden", self.hidden, "layer widths (integers >= 1), e.g. [256, 128]")
            object.__setattr__(self, "hidden", hidden)
        object.__setattr__(self, "kinds", _sequence("kinds", self.kinds, f"layer kinds ({', '.join(LAYER_KINDS)})"))
        if isinstance(self.lsh, dict):
            _check_lsh_keys("lsh", self.lsh)
            object.__setattr__(self, "lsh", LSHConfig(**self.lsh))
        elif not isinstance(self.lsh, LSHConfig):
            raise ValueError(f"lsh = {self.lsh!r} must be a table of LSH settings ([lsh] in TOML, "
                             f"--set lsh.K=8 on the command line)")
        lsh_layers = _sequence("lsh_layers", self.lsh_layers, "tables of LSH settings or 'lsh', one per layer")
        object.__setattr__(self, "lsh_layers", tuple(_layer_lsh(i, x) for i, x in enumerate(lsh_layers)))
        object.__setattr__(self, "exact", _bool("exact", self.exact))
        object.__setattr__(self, "checkpoint_moments", _bool("checkpoint_moments", self.checkpoint_moments))
        if self.early_stop is not None:
            object.__setattr__(self, "early_stop", _bool("early_stop", self.early_stop))
        for i, h in enumerate(self.hidden or ()):
            _int_range(f"hidden[{i}]", h, 1)
        n_layers = len(self.hidden) + 1 if self.hidden is not None else None
        if self.kinds and n_layers is not None and len(self.kinds) != n_layers:
            raise ValueError(
                f"kinds has {len(self.kinds)} entries but the network has {n_layers} layers "
                f"({len(self.hidden)} hidden + output); give one per layer or none"
            )
        for i, k in enumerate(self.kinds):
            _choice(f"kinds[{i}]", k, LAYER_KINDS)
        if self.kinds and self.kinds[0] == "lsh":
            raise ValueError("kinds[0] = 'lsh' is not supported: the first layer reads the raw sparse "
                             "features and is always dense; valid: 'dense', 'auto'")
        if self.lsh_layers and n_layers is not None and len(self.lsh_layers) != n_layers:
            raise ValueError(f"lsh_layers has {len(self.lsh_layers)} entries; give one per layer ({n_layers}) or none")
        _float_range("auto_lsh_ratio", self.auto_lsh_ratio, 1.0, 1e6)
        _int_range("auto_lsh_min_width", self.auto_lsh_min_width, 0)
        if self.epochs is not None:
            _float_range("epochs", self.epochs, 0.0, 1e6, lo_open=True)
        if self.batch_size is not None:
            _int_range("batch_size", self.batch_size, 1)
        if self.lr is not None:
            _float_range("lr", self.lr, 0.0, 10.0, lo_open=True)
        _choice("lr_schedule", self.lr_schedule, LR_SCHEDULES)
        if self.loss is not None:
            _choice("loss", self.loss, LOSSES)
        _float_range("beta1", self.beta1, 0.0, 1.0, hi_open=True)
        _float_range("beta2", self.beta2, 0.0, 1.0, hi_open=True)
        _float_range("eps", self.eps, 0.0, 1.0, lo_open=True)
        if self.dropout is not None:
            _float_range("dropout", self.dropout, 0.0, 1.0, hi_open=True)
        _choice("input_norm", self.input_norm, INPUT_NORMS)
        if self.init_input_scale is not None:
            _float_range("init_input_scale", self.init_input_scale, 0.0, 100.0, lo_open=True)
        _choice("output_bias_init", self.output_bias_init, BIAS_INITS)
        _int_range("seed", self.seed, 0, 2**63 - 1)
        _int_range("threads", self.threads, 0, 1024)
        _choice("dtype", self.dtype, DTYPES)
        if self.adam_dtype is not None:
            _choice("adam_dtype", self.adam_dtype, ADAM_DTYPES)
            if self.adam_dtype == "bfloat16" and self.dtype != "float32":
                raise ValueError(f"adam_dtype = 'bfloat16' needs dtype = 'float32' (got {self.dtype!r}): "
                                 f"the update is computed in float32")
        _choice("parallel", self.parallel, PARALLEL)
        _choice("output_split", self.output_split, OUTPUT_SPLITS)
        _int_range("replicas", self.replicas, 1, 60)  # one bit each in the board's open mask (dslide.train.replicas)
        _choice("sync", self.sync, SYNC_MODES)
        _int_range("sync_every", self.sync_every, 1)
        if self.replicas > 1 and self.parallel == "data":
            raise ValueError(f"replicas = {self.replicas} needs parallel = 'model': replicas already "
                             f"split the data, and their groups split the model")
        object.__setattr__(self, "shard_weights", _shard_weights(self.shard_weights))
        if self.shard_weights and self.parallel == "data":
            raise ValueError(f"shard_weights = {self.shard_weights!r} splits layers over ranks, which "
                             f"parallel = 'data' does not; use parallel = 'model' or no shard_weights")
        _choice("propensity", self.propensity, tuple(PROPENSITY_PRESETS))
        if self.propensity_a is not None:
            _float_range("propensity_a", self.propensity_a, 0.0, 100.0)
        if self.propensity_b is not None:
            _float_range("propensity_b", self.propensity_b, 0.0, 1e6, lo_open=True)
        if self.knn is not None:
            _int_range("knn", self.knn, 0, 1024)
        if self.knn_weight is not None:
            _float_range("knn_weight", self.knn_weight, 0.0, 1.0)
        _float_range("knn_power", self.knn_power, 0.0, 64.0)
        _int_range("knn_candidates", self.knn_candidates, 1, 1 << 16)
        _int_range("choice_points", self.choice_points, 1, 1 << 30)
        if self.proto_weight is not None:
            _float_range("proto_weight", self.proto_weight, 0.0, 1.0)
        _float_range("proto_power", self.proto_power, 0.0, 64.0)
        _int_range("proto_candidates", self.proto_candidates, 1, 1 << 16)
        _int_range("eval_every", self.eval_every, 0)
        _int_range("eval_points", self.eval_points, 1)
        _int_range("log_every", self.log_every, 1)
        _int_range("checkpoint_every", self.checkpoint_every, 0)
        _float_range("stall_timeout", self.stall_timeout, 0.0, 1e6)

    # -- defaults from the data ---------------------------------------------------------

    #: the settings that `resolve` takes from the data when left at None (`dslide config show`)
    FROM_DATA = ("hidden", "dropout", "lr", "loss", "batch_size", "epochs", "early_stop", "init_input_scale", "knn",
                 "knn_weight", "proto_weight")  # knn_weight, proto_weight: chosen on the validation split

    def resolve(self, n_labels: int, points_per_label: float | None = None,
                n_points: int | None = None) -> "Config":
        """This configuration with every setting left at None taken from the data
        (see the class docstring); settings given explicitly are kept.

        points_per_label: the training points per label, over the labels that occur
        (`label_points`); it decides whether `knn` is 0 (`knn_default`). Otherwise `knn`
        stays None: training chooses the count from its data (KNN_CHOICES), and a model
        whose store has no count uses KNN.
        n_points: the training points; a narrow output's batch_size takes them into account
        (`narrow_batch`)."""
        narrow = n_labels <= NARROW_OUTPUT
        auto = {"hidden": (NARROW_HIDDEN,) if narrow else (128,), "dropout": 0.6 if narrow else 0.0,
                "lr": 1e-2 if narrow else WIDE_LR, "loss": NARROW_LOSS if narrow else "softmax", "batch_size": narrow_batch(n_points) if narrow else 128,
                "epochs": NARROW_EPOCHS if narrow else WIDE_EPOCHS, "init_input_scale": 0.1 if narrow else 0.3,
                "knn": knn_default(n_labels, points_per_label)}
        from dslide.train.validation import EARLY_STOP_MAX_EPOCHS, validation_size

        has_split = n_points is not None and validation_size(n_points) > 0
        if self.early_stop is None:
            auto["early_stop"] = bool(not narrow and has_split and self.epochs is None and self.replicas == 1)
        if auto.get("early_stop") and self.epochs is None:
            auto["epochs"] = EARLY_STOP_MAX_EPOCHS
        if n_points is not None and not has_split:
            auto["knn"] = 0  # no held-out points to check the neighbours' labels on: the no-op
        elif points_per_label is None or auto["knn"]:
            del auto["knn"]  # on (or undecided): chosen on the validation split
        changes = {k: v for k, v in auto.items() if getattr(self, k) is None}
        knn = changes.get("knn", self.knn)
        fused = knn if knn is not None else knn_default(n_labels, points_per_label)
        if fused and self.lsh.max_active is None:
            # the neighbours' labels carry the tail that the candidates' hard negatives would
            # teach the network: uniform negatives alone, at a fraction of the upkeep
            changes["lsh"] = dataclasses.replace(self.lsh, max_active=FUSED_MAX_ACTIVE)
        return dataclasses.replace(self, **changes) if changes else self

    def neighbours(self, chosen: int | None = None) -> int:
        """The neighbours a model with the neighbours' labels fuses: knn, else the count
        training chose (`chosen`, kept with the store), else KNN."""
        if self.knn is not None:
            return self.knn
        return KNN if chosen is None else int(chosen)

    def fusion_weight(self, chosen: float | None = None) -> float:
        """The neighbours' weight a model with them fuses: knn_weight, else the weight training
        chose on the validation split (`chosen`, kept with the store), else KNN_WEIGHT."""
        if self.knn_weight is not None:
            return float(self.knn_weight)
        return KNN_WEIGHT if chosen is None else float(chosen)

    def proto_share(self, chosen: float | None = None) -> float:
        """The prototypes' share a model with them fuses: proto_weight, else the share training
        chose (`chosen`, kept with the store), else PROTO_WEIGHT."""
        if self.proto_weight is not None:
            return float(self.proto_weight)
        return PROTO_WEIGHT if chosen is None else float(chosen)

    @property
    def propensity_constants(self) -> tuple[float, float]:
        """(A, B) of the label propensities: propensity_a / propensity_b where given,
        else the `propensity` preset's."""
        a, b = PROPENSITY_PRESETS[self.propensity]
        return (a if self.propensity_a is None else float(self.propensity_a),
                b if self.propensity_b is None else float(self.propensity_b))

    # -- per-layer views ------------------------------------------------------------

    @property
    def moment_dtype(self) -> str:
        """The storage of Adam's moments: adam_dtype, or dtype when it is None."""
        return self.adam_dtype or self.dtype

    def layer_kind(self, index: int, width: int) -> str:
        """'dense' or 'lsh' for layer `index` (0-based; the output is last) of `width` neurons."""
        kind = self.kinds[index] if self.kinds else ("auto" if index == len(self.hidden) else "dense")
        if self.exact or index == 0:
            return "dense"
        if kind == "auto":
            lc = self.layer_lsh(index)
            cheaper = width >= self.auto_lsh_ratio * (lc.random_count(width) + lc.active_count(width))
            return "lsh" if cheaper and width >= self.auto_lsh_min_width else "dense"
        return kind

    def output_rows(self, n_labels: int) -> bool:
        """Whether the output layer of `n_labels` is split by rows (`output_split`): a dense
        output over a dense last hidden layer (in data parallelism, where every rank holds the
        whole model, the split is the same arithmetic over one rank). "auto" takes rows where
        n_labels < hidden[-1]; "rows" where the layers allow it (a ValueError otherwise)."""
        if self.output_split == "columns":
            return False
        hidden = self.hidden or ()
        why = None
        if not hidden:
            why = "the network has no hidden layer"
        elif "dense" != self.layer_kind(len(hidden), n_labels) or "dense" != self.layer_kind(len(hidden) - 1,
                                                                                             hidden[-1]):
            why = "the output layer and the last hidden layer must both be dense"
        if self.output_split == "rows":
            if why:
                raise ValueError(f"output_split = 'rows' cannot apply: {why}; use 'auto' or 'columns'")
            return True
        return why is None and n_labels < hidden[-1]

    def layer_lsh(self, index: int) -> LSHConfig:
        if self.lsh_layers and self.lsh_layers[index] is not None:
            return self.lsh_layers[index]
        return self.lsh

    # -- construction from flat dictionaries (TOML files, --set) -------------------

    def replace(self, **changes) -> "Config":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "Config":
        """A Config from a dict such as a parsed TOML file; unknown keys are errors with a suggestion."""
        if not isinstance(values, dict):
            raise ValueError(f"a configuration must be a table of settings, got {values!r}")
        known = {f.name for f in fields(cls)}
        for k, v in values.items():
            if k not in known:
                raise ValueError(_unknown(k, known))
            if k == "lsh" and isinstance(v, dict):
                _check_lsh_keys("lsh", v)
        return cls(**values)


def _shard_weights(value):
    """() (even shares), "auto", or a tuple of positive floats; "even" and [] mean ()."""
    if isinstance(value, str):
        if value in ("auto", "even", ""):
            return () if value != "auto" else "auto"
        raise ValueError(f"shard_weights = {value!r} is not valid; give 'auto', 'even' or one positive "
                         f"number per rank of a replica (e.g. 2,1,1)")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = (value,)
    try:
        weights = tuple(value)
    except TypeError:
        raise ValueError(f"shard_weights = {value!r} is not valid; give 'auto', 'even' or one positive "
                         f"number per rank of a replica (e.g. 2,1,1)") from None
    for i, w in enumerate(weights):
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not (0 < w < float("inf")):
            raise ValueError(f"shard_weights[{i}] = {w!r} must be a number > 0 (shares are in proportion "
                             f"to the weights)")
    return tuple(float(w) for w in weights)


def _check_lsh_keys(where: str, values: dict) -> None:
    lsh_known = {f.name for f in fields(LSHConfig)}
    for k in values:
        if k not in lsh_known:
            raise ValueError(_unknown(f"{where}.{k}", {f"{where}.{x}" for x in lsh_known}))


def _layer_lsh(i: int, x):
    """An entry of lsh_layers: an LSHConfig, a dict of its fields, or None / "lsh" (keep `lsh`)."""
    if x is None or x == "lsh":
        return None
    if isinstance(x, LSHConfig):
        return x
    if isinstance(x, dict):
        _check_lsh_keys(f"lsh_layers[{i}]", x)
        return LSHConfig(**x)
    raise ValueError(f"lsh_layers[{i}] = {x!r} must be a table of LSH settings or 'lsh' "
                     f"(the layer keeps the [lsh] settings)")


def _unknown(key: str, known: set[str]) -> str:
    close = difflib.get_close_matches(key, sorted(known), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown configuration key {key!r}{hint} (valid keys: {', '.join(sorted(known))})"
