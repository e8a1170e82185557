"""The table of settings: for each, its name, type, default, valid values, one line of doc,
its TOML table, and (where it has one) what a None means and the rule that resolves it.

`Config` and `LSHConfig` (dslide.config.core) are made from this table: their fields, their
defaults and the check of every single value. `dslide config show`, `dslide config table`
and the settings table of docs/configuration.md are generated from it
(tests/unit/test_config_table.py checks that the docs' table is the generated one).
Checks across settings (a threshold at most the tables, a layer kind per layer) stay in
core.py; the rules themselves are dslide.config.rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dslide.config.checks import Bool, Choice, Float, Int, Rule, _sequence, _shard_weights
from dslide.config.rules import (ADAM_DTYPES, APPROX_CANDIDATES, APPROX_HIDDEN_PROBES, APPROX_FEATURES, APPROX_POSTINGS, BIAS_INITS, CANDIDATES_MIN_WIDTH, DECAY_EVERY, DECAY_MIN_SAMPLED, DTYPES,
                                 EARLY_STOP_MAX_EPOCHS, MIDDLE_NEGATIVES,
                                 FAMILIES, FUSED_MAX_ACTIVE, INPUT_NORMS, KNN_MAX_POINTS_PER_LABEL, LAYER_KINDS,
                                 LOSSES, LR_SCHEDULES, MAX_ACTIVE, NARROW_BATCH, NARROW_BETA2, NARROW_EPOCHS, NARROW_HIDDEN,
                                 NARROW_LOSS, NARROW_MIN_STEPS, NARROW_OUTPUT, NARROW_PRIOR_SHIFT, FEW_LABELS,
                                 FEW_LABELS_PRIOR_SHIFT, OUTPUT_SPLITS, PARALLEL,
                                 POLICIES, PRIOR_SHIFTS,
                                 PROPENSITY_PRESETS, SCOPES, SELECT_MODES, SYNC_MODES, WIDE_BETA2, WIDE_EPOCHS, WIDE_LR,
                                 WIDE_LOSS, WIDE_WEIGHT_DECAY)

#: "from the data": the settings Config.resolve takes from the data when left at None
DATA = "from the data"


@dataclass(frozen=True)
class Field:
    """One setting. none: what None means where None is allowed (else None is refused);
    rule: where the data decides it, the rule in words (dslide.config.rules has it in code);
    table: its TOML table ("lsh" for LSHConfig's)."""

    name: str
    type: str
    default: Any
    check: Any
    doc: str
    table: str
    none: str | None = None
    rule: str | None = None


def _hidden(name, value):
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value,)
    value = _sequence(name, value, "layer widths (integers >= 1), e.g. [256, 128]")
    for i, h in enumerate(value):
        Int(1)(f"{name}[{i}]", h)
    return value


def _kinds(name, value):
    value = _sequence(name, value, f"layer kinds ({', '.join(LAYER_KINDS)})")
    for i, k in enumerate(value):
        Choice(LAYER_KINDS)(f"{name}[{i}]", k)
    return value


M, T, N, R, U, L = "model", "train", "neighbours", "replicas", "run", "lsh"
NARROW = f"at most {NARROW_OUTPUT:,} labels"

#: Config's settings, in the order of its fields
CONFIG_FIELDS = (
    Field("hidden", "tuple[int, ...] | None", None, Rule(_hidden, "widths >= 1 of the hidden layers, e.g. 256,128"),
          "widths of the hidden layers (ReLU); the output has one neuron per label", M, DATA,
          f"{NARROW_HIDDEN} for {NARROW}, else 128"),
    Field("kinds", "tuple[str, ...]", (), Rule(_kinds, "one per layer (hidden ones, then the output) of 'auto', "
                                                      "'dense', 'lsh'; first not 'lsh'"),
          "per layer: 'dense', 'lsh' (LSH-selected neurons) or 'auto'; empty: dense hidden layers, an 'auto' output",
          M, rule="'auto' is LSH where the layer is auto_lsh_ratio times wider than the neurons it computes "
                  "and at least auto_lsh_min_width wide (rules.layer_kind)"),
    Field("lsh", "LSHConfig", None, Rule("_lsh_table", "the [lsh] table (the lsh.* keys)"),
          "the settings of every LSH layer (the lsh.* rows)", L),
    Field("lsh_layers", "tuple[LSHConfig | None, ...]", (), Rule("_lsh_layers", "one [lsh] table per layer, or "
                                                                              "'lsh' (keep [lsh])"),
          "per layer, LSH settings in place of [lsh]", M),
    Field("auto_lsh_ratio", "float", 4.0, Float(1.0, 1e6),
          "an 'auto' layer is LSH when this many times wider than the neurons it computes", M),
    Field("auto_lsh_min_width", "int", 12000, Int(0), "an 'auto' layer is LSH only from this width", M),
    Field("exact", "bool", False, Bool(), "every neuron of every layer active, no LSH (the reference path)", M),
    Field("epochs", "float | None", None, Float(0.0, 1e6, lo_open=True), "passes over the training data", T, DATA,
          f"{NARROW_EPOCHS:g} for {NARROW}; else up to {EARLY_STOP_MAX_EPOCHS:g}, stopped early on the validation "
          f"split ({WIDE_EPOCHS:g} without one)"),
    Field("batch_size", "int | None", None, Int(1), "training points per step", T, DATA,
          f"{NARROW_BATCH} for {NARROW} (fewer where an epoch would have under {NARROW_MIN_STEPS} steps), else 128"),
    Field("lr", "float | None", None, Float(0.0, 10.0, lo_open=True), "Adam's learning rate", T, DATA,
          f"1e-2 for {NARROW}, else {WIDE_LR:g}"),
    Field("lr_schedule", "str", "linear", Choice(LR_SCHEDULES),
          "'linear' decays lr to 0 over the run's epochs; 'constant' keeps it", T),
    Field("loss", "str | None", None, Choice(LOSSES),
          "softmax cross-entropy (label-: one softmax per label, the other labels left out), one binary "
          "cross-entropy per label, or a sum of the two", T, DATA,
          f"{NARROW_LOSS} for {NARROW}, else {WIDE_LOSS}"),
    Field("beta1", "float", 0.9, Float(0.0, 1.0, hi_open=True), "Adam's first-moment decay", T),
    Field("beta2", "float | None", None, Float(0.0, 1.0, hi_open=True), "Adam's second-moment decay", T, DATA,
          f"{NARROW_BETA2:g} for {NARROW}, else {WIDE_BETA2:g}"),
    Field("eps", "float", 1e-8, Float(0.0, 1.0, lo_open=True), "Adam's epsilon", T),
    Field("weight_decay", "float | None", None, Float(0.0, 1.0),
          f"decoupled weight decay: every weight (not the biases) shrinks by lr x weight_decay a step, "
          f"applied every {DECAY_EVERY} steps", T, DATA,
          f"0 for {NARROW}, with replicas or where the output's uniform negatives are under "
          f"{DECAY_MIN_SAMPLED:g} of its labels (with the defaults: over 81,920 labels), else "
          f"{WIDE_WEIGHT_DECAY:g}"),
    Field("dropout", "float | None", None, Float(0.0, 1.0, hi_open=True), "dropout of the hidden layers' outputs",
          T, DATA, f"0.6 for {NARROW}, else 0"),
    Field("input_norm", "str", "l2", Choice(INPUT_NORMS), "the input rows' normalisation", M),
    Field("init_input_scale", "float | None", None, Float(0.0, 100.0, lo_open=True),
          "the first layer's weights start from U(-s, s)", M, DATA, f"0.1 for {NARROW}, else 0.3"),
    Field("output_bias_init", "str", "log_prior", Choice(BIAS_INITS),
          "the output biases start at the log of the labels' smoothed frequency, or at 0", M),
    Field("prior_shift", "float | None", None, Float(0.0, 2.0),
          "at the end of training the output biases are lowered by this x the log of each label's "
          "smoothed training frequency (0: off)", M, DATA,
          f"for {NARROW}: {FEW_LABELS_PRIOR_SHIFT:g} where the training points carry fewer than "
          f"{FEW_LABELS:g} labels on average, else {NARROW_PRIOR_SHIFT:g}; else chosen on the validation split from "
          f"{', '.join(f'{t:g}' for t in PRIOR_SHIFTS)} (0 without one)"),
    Field("seed", "int", 0, Int(0, 2**63 - 1),
          "every random draw derives from it (weights, batches, hashes, the validation split)", T),
    Field("threads", "int", 0, Int(0, 1024), "threads per rank; 0: the node's cores / its ranks", U),
    Field("dtype", "str", "float32", Choice(DTYPES), "the parameters' floating-point type", M),
    Field("adam_dtype", "str | None", None, Choice(ADAM_DTYPES),
          "how Adam's moments are stored; bfloat16 (with float32 parameters) halves them", M, "like dtype"),
    Field("parallel", "str", "model", Choice(PARALLEL),
          "'model' splits every layer over the ranks; 'data' gives each rank the whole model (the baseline)", R),
    Field("output_split", "str", "auto", Choice(OUTPUT_SPLITS),
          "how ranks share a dense output layer: by its labels (columns) or its inputs (rows)", R,
          rule="'auto': rows where the output is narrower than the last hidden layer and both are dense, "
               "else columns (rules.output_rows)"),
    Field("propensity", "str", "default", Choice(tuple(PROPENSITY_PRESETS)),
          "the preset of the constants A, B of the label propensities behind PSP@k", U),
    Field("propensity_a", "float | None", None, Float(0.0, 100.0), "A of the label propensities", U, "the preset's"),
    Field("propensity_b", "float | None", None, Float(0.0, 1e6, lo_open=True), "B of the label propensities", U,
          "the preset's"),
    Field("early_stop", "bool | None", None, Bool(),
          "score the model on the validation split every epoch and keep the best epoch", T, DATA,
          "on for wide outputs whose data has a validation split when epochs is unset, else off"),
    Field("middle_negatives", "float | None", None, Float(0.0, 1.0, lo_open=True),
          "share of the output's uniform negatives (lsh.min_active) a step draws from the second epoch "
          "until early stopping lowers the learning rate (every one in the first epoch and after the decay; "
          "without early stopping, to the end)", T, DATA,
          f"{MIDDLE_NEGATIVES:g} where early stopping is on, else 1"),
    Field("knn", "int | None", None, Int(0, 1024),
          "neighbours whose labels vote at inference beside the network (0: the network alone)", N, DATA,
          f"0 for {NARROW}, from {KNN_MAX_POINTS_PER_LABEL:g} training points per label, or without a validation "
          "split; else chosen on the split from 10, 5, 20 (rules.knn_default)"),
    Field("knn_weight", "float | None", None, Float(0.0, 1.0), "the neighbours' weight in the fused score", N,
          DATA, "chosen on the validation split from 0 (the network alone) to 0.9"),
    Field("knn_temperature", "float | None", None, Float(0.01, 100.0),
          "the network's logits are divided by this before their softmax enters the fused score", N, DATA,
          "chosen on the validation split from 1 (the softmax as trained), 2, 4 (2 or 4 only where it beats "
          "the best at 1 by the choice margin)"),
    Field("knn_power", "float", 4.0, Float(0.0, 64.0), "a neighbour votes with its similarity to this power", N),
    Field("knn_candidates", "int", 100, Int(1, 1 << 16), "the network's best labels that the fusion rescores", N),
    Field("proto_weight", "float | None", None, Float(0.0, 1.0),
          "the label prototypes' share of the neighbours' term (0: no prototypes)", N, DATA,
          "chosen on the validation split from 0 to 1 by 0.25"),
    Field("proto_power", "float", 16.0, Float(0.0, 64.0), "a prototype votes with its cosine to this power", N),
    Field("proto_candidates", "int", 20, Int(1, 1 << 16), "label prototypes that vote per query", N),
    Field("hidden_knn", "int | None", None, Int(0, 1024),
          "training points nearest in the network's last hidden layer whose labels vote beside the fused score "
          "(0: none)", N, DATA,
          "chosen on the validation split from 10, 25 with hidden_knn_weight (its 0: none); 0 without a "
          "validation split or a hidden layer"),
    Field("hidden_knn_weight", "float | None", None, Float(0.0, 1.0),
          "the hidden neighbours' weight in the score", N, DATA,
          "chosen on the validation split from 0 (none), 0.03, 0.06, 0.1, 0.2, 0.3"),
    Field("hidden_knn_power", "float | None", None, Float(0.0, 64.0),
          "a hidden neighbour votes with its cosine to this power", N, DATA,
          "chosen on the validation split from 4, 16"),
    Field("approx_postings", "int", APPROX_POSTINGS, Int(1, 1 << 24),
          "under --lsh: training points (or prototypes) the neighbours' search keeps per feature", N),
    Field("approx_features", "int", APPROX_FEATURES, Int(1, 1 << 16),
          "under --lsh: a query's largest features the neighbours' search reads", N),
    Field("approx_candidates", "int", APPROX_CANDIDATES, Int(1, 1 << 16),
          "under --lsh: candidates of the neighbours' search re-ranked by their exact cosine", N),
    Field("approx_hidden_probes", "int", APPROX_HIDDEN_PROBES, Int(1, 1 << 16),
          "under --lsh: cells of the hidden neighbours (about sqrt(training points) of them) a query searches", N),
    Field("replicas", "int", 1, Int(1, 60), "replica groups of the model (hybrid data x model parallelism)", R),
    Field("sync", "str", "allreduce", Choice(SYNC_MODES),
          "how replicas average: every group at once, or by one-sided gossip", R),
    Field("sync_every", "int", 8, Int(1), "steps of a replica group between its synchronisations", R),
    Field("shard_weights", "tuple[float, ...] | str", (),
          Rule(lambda name, value: _shard_weights(value), "'auto', 'even' or one number > 0 per rank of a replica"),
          "how a group's ranks share each layer's neurons: even, in proportion, or by measured speed", R),
    Field("eval_every", "int", 0, Int(0), "steps between evaluations on the test data (0: at the end only)", U),
    Field("eval_points", "int", 2000, Int(1), "test points of an evaluation during training", U),
    Field("log_every", "int", 50, Int(1), "steps between log lines", U),
    Field("checkpoint_every", "int", 0, Int(0), "steps between checkpoints (0: at the end only)", U),
    Field("checkpoint_moments", "bool", True, Bool(), "checkpoints hold Adam's moments (needed to resume)", U),
    Field("stall_timeout", "float", 0.0, Float(0.0, 1e6),
          "seconds a rank waits in a collective before the run ends (0: as long as it takes)", U),
)

#: LSHConfig's settings ([lsh], and each entry of lsh_layers), in the order of its fields
LSH_FIELDS = (
    Field("family", "str", "anchor", Choice(FAMILIES),
          "where candidates come from: k-means anchors, or SLIDE's item hashing (dwta, srp, wta)", L),
    Field("K", "int | None", None, Int(1, 32), "hashes per table (item hashing)", L, "the family's", "6"),
    Field("L", "int | None", None, Int(1, 1024), "tables", L, "the family's", "1 for anchor, 50 for item hashing"),
    Field("anchors", "int", 256, Int(1, 1 << 20), "k-means anchors of the layer's inputs (family anchor)", L),
    Field("bin_size", "int", 8, Int(2, 1 << 16, pow2=True), "dimensions of a DWTA bin", L),
    Field("range_pow", "int", 0, Int(0, 24), "2**range_pow buckets a table (0: from the rank's neurons)", L),
    Field("capacity", "int", 0, Int(0, 1 << 16), "slots a bucket (0: buckets hold exactly their neurons)", L),
    Field("policy", "str", "fifo", Choice(POLICIES), "what a full fixed-capacity bucket keeps", L),
    Field("select", "str", "topk", Choice(SELECT_MODES), "how fixed-capacity tables pick a sample's candidates", L),
    Field("threshold", "int", 2, Int(1), "select 'threshold': the tables (at most L) a candidate is found in", L),
    Field("min_active", "int", 8192, Int(0), "uniform negatives a step (the layer's, all ranks together)", L),
    Field("min_active_share", "float", 0.2, Float(0.0, 1.0), "uniform negatives are at most this share of the layer",
          L),
    Field("max_active", "int | None", None, Int(0), "candidates a sample (0: none, a plain sampled softmax)", L,
          "from the width", f"{MAX_ACTIVE} in layers of at least {CANDIDATES_MIN_WIDTH:,} neurons, else 0; "
                            f"{FUSED_MAX_ACTIVE} where knn is on "
                            "(rules.active_count)"),
    Field("scope", "str", "batch", Choice(SCOPES),
          "the batch's candidates scored by every sample, or each sample's by its own", L),
    Field("rehash_every", "int", 50, Int(1), "steps between refills of the tables", L),
    Field("rebuild_every", "int", 1000, Int(1), "steps between rebuilds of item-hashing tables", L),
    Field("growth", "float", 1.3, Float(1.0, 10.0), "the refill period grows by this after each refill", L),
    Field("index_anchors", "int", 2048, Int(0, 1 << 20), "anchors of the output's inference index (0: no index)", L),
    Field("index_share", "float", 0.02, Float(0.0, 1.0, lo_open=True), "the share of the labels a query scores", L),
    Field("index_min_width", "int", 32768, Int(0, 1 << 31),
          "the narrowest output an index is built for (narrower: --lsh scores every label)", L),
    Field("index_min_labels", "int", 2048, Int(0, 1 << 30),
          "the fewest labels a query scores, where index_share of them is fewer (0: index_share alone)", L),
    Field("index_probes", "int", 1, Int(1, 1024), "nearest anchors whose buckets a query scores", L),
    Field("index_shrink", "float", 0.6, Float(0.0, 1.0), "an anchor's bucket ranks labels by shrink * w.c + b + ...",
          L),
    Field("index_spread", "float", 0.5, Float(0.0, 100.0), "... + spread * |w|", L),
    Field("index_points", "int", 50000, Int(1), "training points whose hidden vectors the index is built from", L),
    Field("index_neighbors", "int", 5, Int(0, 1024), "nearest of those points whose labels a query scores", L),
    Field("index_degree", "int", 16, Int(1, 1024), "links per point of the nearest-neighbour graph", L),
    Field("index_graph_cells", "int", 24, Int(0, 1 << 20),
          "the graph's links: a point's nearest among the points of this many nearest cells (0: exact)", L),
    Field("index_search", "int", 96, Int(1, 1 << 16), "the beam of the graph's search", L),
)

#: the TOML tables, in the order config.toml holds them, and the settings of each
TABLES = (M, T, N, R, U)
TABLE_OF = {f.name: f.table for f in CONFIG_FIELDS if f.name != "lsh"}
FROM_DATA = tuple(f.name for f in CONFIG_FIELDS if f.none == DATA)

#: settings that are no more: {key: (the one value an older config.toml may hold, why it went)}.
#: A file (or checkpoint) with that value loads as before; any other value is refused.
RETIRED = {
    "choice_points": (5000, "training chooses the neighbours' settings on the validation split, and "
                            "nothing read it"),
    "lsh.max_candidates": (0, "the cap of a step's candidates was never set by a run, a benchmark or "
                              "the docs; lsh.max_active bounds them per sample"),
}
