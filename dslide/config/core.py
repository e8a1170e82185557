"""The configuration's two frozen dataclasses, `Config` and `LSHConfig`, validated on construction.

Every field has a default that trains well on ordinary extreme-classification
data; a user changes only what differs. Layer sizes default from the data:
the input width is the number of features and the output width the number
of labels, so `hidden` lists only the hidden layers. The rules that resolve
settings left at None are dslide.config.rules.

Kernels never read the configuration: they get plain values as arguments
(numba freezes globals at compile time).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields

from dslide.config import rules, tomlio
from dslide.config.checks import _sequence, _unknown
from dslide.config.fields import CONFIG_FIELDS, FROM_DATA, LSH_FIELDS
from dslide.config.rules import FAMILIES, KNN, KNN_WEIGHT, PROPENSITY_PRESETS, PROTO_WEIGHT


def _from_table(table):
    """A frozen dataclass whose fields are the table's (dslide.config.fields), in its order."""

    def make(cls):
        cls.__annotations__ = {f.name: f.type for f in table}
        for f in table:
            setattr(cls, f.name, field(default_factory=LSHConfig) if f.name == "lsh" else f.default)
        return dataclass(frozen=True)(cls)

    return make


def _check(obj, table, prefix: str, owner=None) -> None:
    """Each setting of `table` in `obj` checked (None where the table allows it), and kept in its
    type: the table's checks name the setting and what is valid (dslide.config.checks)."""
    for f in table:
        value = getattr(obj, f.name)
        if value is None and f.none is not None:
            continue
        check = f.check
        fn = getattr(owner, check.fn) if isinstance(getattr(check, "fn", None), str) else check
        new = fn(prefix + f.name, value)
        if new is not value:
            object.__setattr__(obj, f.name, new)


@_from_table(LSH_FIELDS)
class LSHConfig:
    """How an LSH-sparse layer picks its neurons, and its inference index.

    Each training step a layer computes one block of neurons for the whole
    batch: in the output layer the batch's labels; the union of the samples'
    candidates from the layer's tables, at most `max_active` per sample (0:
    none, plain sampled softmax; None, the default: 512 in a layer of at least
    CANDIDATES_MIN_WIDTH neurons and 0 in a narrower one, see `active_count`); and `min_active` neurons drawn uniformly
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
    `index_degree` nearest (found among the points of `index_graph_cells`
    nearby cells, or all of them at 0) and as many reverse links;
    lsh.neighbors). The
    buckets give up the room those labels take on average, so a query scores
    about `index_share` of the labels in all, and at least `index_min_labels`
    (all of them in a narrower layer): in a layer of tens of thousands of labels
    `index_share` alone scores a few hundred, too few for the network's top
    100 that the neighbours' labels are fused with (docs/accuracy.md, item 15).
    index_anchors = 0: no index. An output narrower than `index_min_width` labels
    gets none either: there, scoring every label (a dense product) takes less
    than the index's gathered scoring, and the index's build, seconds at the
    end of training, buys nothing; `--lsh` scores its labels exactly and
    still bounds the neighbours' search (docs/lsh.md).
    index_neighbors = 0: buckets alone. The neighbours' labels recover much
    of what the buckets miss of the exact top-10, and of P@5 (docs/lsh.md,
    bench_lsh.py --eval --rebuild on the saved amazon-like model).
    """

    def __post_init__(self):
        if self.family == "minhash":
            # lsh.FAMILIES has it for sparse sets; a weight row's non-zero set is every input
            raise ValueError("lsh.family = 'minhash' hashes sets (the non-zero features of sparse inputs) and "
                             "cannot tell dense weight rows apart; an LSH layer takes one of: "
                             + ", ".join(FAMILIES))
        _check(self, LSH_FIELDS[:1], "lsh.")
        K, L = rules.lsh_tables(self.family)
        if self.K is None:
            object.__setattr__(self, "K", K)
        if self.L is None:
            object.__setattr__(self, "L", L)
        _check(self, LSH_FIELDS[1:], "lsh.")
        # across settings
        if self.family != "anchor" and self.threshold > self.L:
            raise ValueError(f"lsh.threshold = {self.threshold} must be in [1, {self.L}]")
        if self.scope == "sample" and self.family != "anchor":
            raise ValueError(f"lsh.scope = 'sample' takes each sample's own anchor bucket and needs "
                             f"lsh.family = 'anchor' (got {self.family!r}); item hashing takes scope 'batch'")
        if self.index_search < self.index_neighbors:
            raise ValueError(f"lsh.index_search = {self.index_search} must be >= lsh.index_neighbors = "
                             f"{self.index_neighbors}: the search's beam holds the neighbours it returns")

    def active_count(self, width: int) -> int:
        """Candidates per sample in a layer of `width` neurons (`rules.active_count`)."""
        return rules.active_count(self.max_active, width)

    def random_count(self, width: int) -> int:
        """Shared random neurons per step in a layer of `width` neurons (all ranks together)."""
        return min(self.min_active, int(self.min_active_share * width))

    def builds_index(self, width: int) -> bool:
        """Whether an output of `width` labels gets an inference index: index_anchors > 0 and at
        least index_min_width labels."""
        return bool(self.index_anchors) and int(width) >= self.index_min_width


@_from_table(CONFIG_FIELDS)
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
        beta2               0.99            0.999
        batch_size          256 (at least   128
                            8 steps/epoch)
        epochs              12              up to 10, stopped early on the validation
                                            split (1.5 without one: dslide.train.validation)
        early_stop          off             on where the data has a validation split
        middle_negatives    1               0.25 with early stopping: a quarter of the
                                            uniform negatives from the second epoch to
                                            early stopping's decay
        init_input_scale    0.1             0.3
        knn                 0               chosen on the validation split from 10, 5,
                                            20 (0 from 20 points per label, or without
                                            a split; knn_default)
        knn_weight          -               chosen on the validation split from 0 (the
                                            network alone), 0.1, 0.2, ..., 0.9 (and
                                            0.01 to 0.3 at a temperature above 1)
        knn_temperature     -               chosen with it from 1, 2, 4
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
        log-Q correction). "label-softmax": one softmax per label of the point, over
        that label and the point's negatives (its other labels left out of the
        normaliser), the labels' terms averaged; with one label a point it is
        "softmax". "label-softmax+bce": it and the binary part. Left at None:
        "label-softmax+bce" in narrow outputs, "label-softmax" in wide ones.
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
    knn_temperature: the fused score's softmax is taken over the network's logits
        divided by this: p = softmax(logits / knn_temperature). A softmax trained to
        put its mass on one label leaves the rest of a point's labels with a small
        share each, which the smallest vote outweighs; a higher temperature keeps
        the network's order below the top against the votes. None: chosen on the
        validation split with the weight (FUSION_TEMPERATURES, 1 among them; another
        only where its best cell beats the best at 1 by CHOICE_MARGIN).
    early_stop: score the model on the validation split after every epoch (the
        network alone, or where the neighbours' labels are fused the best of a
        small fusion grid) and stop once it no longer gains, keeping the best
        epoch's weights
        (dslide.train.validation.EarlyStop); `epochs` is then the most it trains.
        None: on for wide outputs whose data has a validation split when
        `epochs` is left to the data (up to EARLY_STOP_MAX_EPOCHS), else off.
    middle_negatives: the share of the output layer's uniform negatives
        (lsh.min_active, within lsh.min_active_share) a training step draws from
        the end of the first epoch until early stopping first lowers the learning
        rate; the first epoch and the epochs after that decay draw every one
        (without early stopping the share holds to the end). The middle epochs
        explore at a fraction of a step's cost (a step is mostly the products
        with its negatives); the first sets the model every later epoch starts
        from, and the epoch after the decay, with every negative, settles the
        normaliser the test points see. None: MIDDLE_NEGATIVES where early
        stopping is on, else 1 (every negative throughout).
    proto_weight: where the neighbours' labels are fused, the share of their
        term given to the label prototypes (normalised sums of each label's
        training rows): v = (1 - proto_weight) v_points + proto_weight v_protos,
        each query's `proto_candidates` prototypes of largest cosine voting
        with their cosine to the power `proto_power`. 0: the points alone (and
        no prototypes built). None: chosen with the count and the weight on
        the validation split (dslide.train.validation), kept with the store.
    hidden_knn: the training points nearest to a query in the network's last
        hidden layer (cosine of the hidden vectors) whose labels vote beside the
        fused score (dslide.infer.hidden_knn): score = (1 - hidden_knn_weight) b
        + hidden_knn_weight v, b the fused score (or the network's softmax where
        nothing is fused), each neighbour's vote weighed by its cosine to the
        power `hidden_knn_power`. 0: none. None: the count, the power and the
        weight are chosen at the end of training on the validation split (weight
        0, none, always a candidate: dslide.train.validation.choose_hidden);
        without a validation split or a hidden layer, none.
    hidden_knn_weight, hidden_knn_power: as given, else chosen with hidden_knn.
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

    def __post_init__(self):
        _check(self, CONFIG_FIELDS, "", self)
        # across settings
        n_layers = len(self.hidden) + 1 if self.hidden is not None else None
        if self.kinds and n_layers is not None and len(self.kinds) != n_layers:
            raise ValueError(
                f"kinds has {len(self.kinds)} entries but the network has {n_layers} layers "
                f"({len(self.hidden)} hidden + output); give one per layer or none"
            )
        if self.kinds and self.kinds[0] == "lsh":
            raise ValueError("kinds[0] = 'lsh' is not supported: the first layer reads the raw sparse "
                             "features and is always dense; valid: 'dense', 'auto'")
        if self.lsh_layers and n_layers is not None and len(self.lsh_layers) != n_layers:
            raise ValueError(f"lsh_layers has {len(self.lsh_layers)} entries; give one per layer ({n_layers}) or none")
        if self.adam_dtype == "bfloat16" and self.dtype != "float32":
            raise ValueError(f"adam_dtype = 'bfloat16' needs dtype = 'float32' (got {self.dtype!r}): "
                             f"the update is computed in float32")
        if self.replicas > 1 and self.parallel == "data":
            raise ValueError(f"replicas = {self.replicas} needs parallel = 'model': replicas already "
                             f"split the data, and their groups split the model")
        if self.shard_weights and self.parallel == "data":
            raise ValueError(f"shard_weights = {self.shard_weights!r} splits layers over ranks, which "
                             f"parallel = 'data' does not; use parallel = 'model' or no shard_weights")

    @staticmethod
    def _lsh_table(name, value):
        if isinstance(value, dict):
            return LSHConfig(**_lsh_keys("lsh", value))
        if not isinstance(value, LSHConfig):
            raise ValueError(f"lsh = {value!r} must be a table of LSH settings ([lsh] in TOML, "
                             f"--set lsh.K=8 on the command line)")
        return value

    @staticmethod
    def _lsh_layers(name, value):
        value = _sequence(name, value, "tables of LSH settings or 'lsh', one per layer")
        return tuple(_layer_lsh(i, x) for i, x in enumerate(value))

    # -- defaults from the data ---------------------------------------------------------

    #: the settings that `resolve` takes from the data when left at None (`dslide config show`)
    FROM_DATA = FROM_DATA

    def resolve(self, n_labels: int, points_per_label: float | None = None,
                n_points: int | None = None, labels_per_point: float | None = None) -> "Config":
        """This configuration with every setting left at None taken from the data
        (`rules.from_data`, the class docstring's table); settings given explicitly are kept.

        points_per_label: the training points per label, over the labels that occur
        (`label_points`); it decides whether `knn` is 0 (`knn_default`). Otherwise `knn`
        stays None: training chooses the count from its data (KNN_CHOICES), and a model
        whose store has no count uses KNN.
        n_points: the training points; a narrow output's batch_size takes them into account
        (`narrow_batch`), and whether they leave a validation split decides early stopping.
        labels_per_point: the training points' labels on average (`labels_per_point`); a
        narrow output's prior_shift follows it (`narrow_prior_shift`), and stays None without it.
        `rules.resolve_shape(train)` gives all four as `fit` reads them."""
        changes = rules.from_data(self, n_labels, points_per_label, n_points, labels_per_point)
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

    def fusion_temperature(self, chosen: float | None = None) -> float:
        """The temperature of the network's softmax in the fused score: knn_temperature, else
        the one training chose (`chosen`, kept with the store), else 1 (stores saved before it)."""
        if self.knn_temperature is not None:
            return float(self.knn_temperature)
        return 1.0 if chosen is None else float(chosen)

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
        """'dense' or 'lsh' for layer `index` (0-based; the output is last) of `width` neurons
        (`rules.layer_kind`)."""
        return rules.layer_kind(self, index, width)

    def output_rows(self, n_labels: int) -> bool:
        """Whether the output layer of `n_labels` is split by rows (`rules.output_rows`)."""
        return rules.output_rows(self, n_labels)

    def layer_lsh(self, index: int) -> LSHConfig:
        if self.lsh_layers and self.lsh_layers[index] is not None:
            return self.lsh_layers[index]
        return self.lsh

    # -- construction from flat dictionaries (TOML files, --set) -------------------

    def replace(self, **changes) -> "Config":
        return dataclasses.replace(self, **changes)

    #: settings in the nested form, the flat one or a mix, as the flat dict Config takes
    flatten = staticmethod(tomlio.flatten)

    def to_dict(self, flat: bool = False) -> dict:
        """The settings as config.toml nests them ({table: {setting: value}}), or flat."""
        d = dataclasses.asdict(self)
        return d if flat else tomlio.nest(d)

    @classmethod
    def from_dict(cls, values: dict) -> "Config":
        """A Config from a dict such as a parsed TOML file, nested or flat (`tomlio.flatten`);
        unknown keys are errors with a suggestion."""
        values = tomlio.flatten(values)
        known = {f.name for f in fields(cls)}
        for k, v in values.items():
            if k not in known:
                raise ValueError(_unknown(k, known))
            if k == "lsh" and isinstance(v, dict):
                _lsh_keys("lsh", v)
        return cls(**values)


def _lsh_keys(where: str, values: dict) -> dict:
    """A table of LSH settings without its retired keys (`tomlio.retire`); an unknown key is a
    ValueError with a suggestion."""
    values = tomlio.retire(values, "lsh.", where + ".")
    lsh_known = {f.name for f in fields(LSHConfig)}
    for k in values:
        if k not in lsh_known:
            raise ValueError(_unknown(f"{where}.{k}", {f"{where}.{x}" for x in lsh_known}))
    return values


def _layer_lsh(i: int, x):
    """An entry of lsh_layers: an LSHConfig, a dict of its fields, or None / "lsh" (keep `lsh`)."""
    if x is None or x == "lsh":
        return None
    if isinstance(x, LSHConfig):
        return x
    if isinstance(x, dict):
        return LSHConfig(**_lsh_keys(f"lsh_layers[{i}]", x))
    raise ValueError(f"lsh_layers[{i}] = {x!r} must be a table of LSH settings or 'lsh' "
                     f"(the layer keeps the [lsh] settings)")



