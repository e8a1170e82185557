"""The configuration: one frozen, validated `Config` (and its `[lsh]` table, `LSHConfig`).

    fields.py   the table of settings: name, type, default, valid values, doc, TOML table, data rule
    core.py     the two dataclasses, made from the table and validated on construction
    rules.py    every rule that takes a setting from the data, and every choice constant
    checks.py   the checks of single values (a ValueError naming the setting and what is valid)
    tomlio.py   the nested config.toml (and the flat one of older runs) to and from a Config

`from dslide.config import Config, ...` gives every name the rest of dslide uses.
"""

from dslide.config.core import Config, LSHConfig
from dslide.config.rules import (ADAM_DTYPES, BIAS_INITS, CANDIDATES_MIN_WIDTH, DECAY_EVERY, DTYPES, EARLY_STOP_MAX_EPOCHS,
                                 FAMILIES, FUSED_MAX_ACTIVE, INPUT_NORMS, KNN,
                                 KNN_CHOICES, KNN_MAX_POINTS_PER_LABEL, KNN_WEIGHT, LAYER_KINDS, LOSSES, LR_SCHEDULES,
                                 MAX_ACTIVE, MIDDLE_NEGATIVES, NARROW_BATCH, NARROW_EPOCHS, NARROW_HIDDEN, NARROW_LOSS, WIDE_LOSS,
                                 NARROW_PRIOR_SHIFT, PRIOR_SHIFTS, FEW_LABELS, FEW_LABELS_PRIOR_SHIFT,
                                 NARROW_MIN_STEPS, NARROW_OUTPUT, OUTPUT_SPLITS, PARALLEL, POLICIES,
                                 PROPENSITY_PRESETS, PROTO_CHOICES, PROTO_P1_TOLERANCE, PROTO_WEIGHT, SCOPES,
                                 SELECT_MODES, SYNC_MODES, WIDE_EPOCHS, WIDE_LR, WIDE_WEIGHT_DECAY, knn_default, label_points,
                                 labels_per_point, narrow_batch, narrow_prior_shift, points_per_label,
                                 resolve_shape, validation_size)

__all__ = ["Config", "LSHConfig", "ADAM_DTYPES", "BIAS_INITS", "CANDIDATES_MIN_WIDTH", "DECAY_EVERY", "DTYPES",
           "EARLY_STOP_MAX_EPOCHS", "FAMILIES", "FUSED_MAX_ACTIVE", "INPUT_NORMS", "KNN",
           "KNN_CHOICES", "KNN_MAX_POINTS_PER_LABEL", "KNN_WEIGHT", "LAYER_KINDS", "LOSSES",
           "LR_SCHEDULES", "MAX_ACTIVE", "MIDDLE_NEGATIVES", "NARROW_BATCH", "NARROW_EPOCHS", "NARROW_HIDDEN", "NARROW_LOSS", "WIDE_LOSS",
           "NARROW_PRIOR_SHIFT", "PRIOR_SHIFTS", "FEW_LABELS", "FEW_LABELS_PRIOR_SHIFT",
           "NARROW_MIN_STEPS", "NARROW_OUTPUT", "OUTPUT_SPLITS", "PARALLEL", "POLICIES", "PROPENSITY_PRESETS",
           "PROTO_CHOICES", "PROTO_P1_TOLERANCE", "PROTO_WEIGHT", "SCOPES", "SELECT_MODES", "SYNC_MODES",
           "WIDE_EPOCHS", "WIDE_LR", "WIDE_WEIGHT_DECAY", "knn_default", "label_points", "narrow_batch", "points_per_label",
           "labels_per_point", "narrow_prior_shift", "resolve_shape", "validation_size"]
