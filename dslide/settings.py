"""Every setting of the configuration with its default, its valid range, and what data resolves it to.

`dslide config show [--data F]` prints :func:`table`. The ranges are not kept
in a second list that could drift from config.py: each is read from the
message the configuration's own validation gives for a value out of range
(`Config(lr=-1e300)` -> "lr = -1e+300 must be in (0.0, 10.0]").
"""

from __future__ import annotations

import dataclasses
import re

from dslide.config import Config, LSHConfig

#: settings whose valid values a probe cannot find (tuples, cross-field rules): described here
_DESCRIBED = {
    "hidden": "widths >= 1 of the hidden layers, e.g. 256,128",
    "kinds": "one per layer (hidden ones, then the output) of 'auto', 'dense', 'lsh'; first not 'lsh'",
    "lsh": "the [lsh] table (the lsh.* keys)",
    "lsh_layers": "one [lsh] table per layer, or 'lsh' (keep [lsh])",
    "shard_weights": "'auto', 'even' or one number > 0 per rank of a replica",
    "exact": "true or false",
    "checkpoint_moments": "true or false",
}


def valid_range(cls, name: str) -> str:
    """The valid values of field `name` of `cls` (Config or LSHConfig), from its validation."""
    if cls is Config and name in _DESCRIBED:
        return _DESCRIBED[name]
    for probe in ("\x00", -10**30, -1e300):
        try:
            cls(**{name: probe})
        except (ValueError, TypeError) as e:
            msg = str(e)
            m = re.search(r"choose one of (.*)$", msg)
            if m:
                return "one of " + m.group(1)
            m = re.search(r"must be (in [\[(][^\])]*[\])]|>= [-\d.e+]+)", msg)
            if m:
                return ("an integer " if "must be an integer" in _message(cls, name, "\x00") else "") + m.group(1)
            continue
    return "any"


def _message(cls, name, value) -> str:
    try:
        cls(**{name: value})
    except (ValueError, TypeError) as e:
        return str(e)
    return ""


def table(config: Config, n_features: int | None = None, n_labels: int | None = None,
          points_per_label: float | None = None, n_points: int | None = None) -> list[tuple]:
    """Rows (key, default, valid range, value): value is what `config` holds, resolved for
    data of n_features features, n_labels labels and n_points points when given ("-" for from-the-data
    settings without data)."""
    base = Config()
    resolved = config.resolve(n_labels, points_per_label, n_points) if n_labels is not None else config
    rows = []
    for f in dataclasses.fields(Config):
        if f.name == "lsh":
            continue
        default = getattr(base, f.name)
        value = getattr(resolved, f.name)
        if f.name in ("propensity_a", "propensity_b") and value is None:
            value = resolved.propensity_constants[f.name == "propensity_b"]
        if f.name == "output_split" and value == "auto" and n_labels is not None:
            value = f"auto ({'rows' if resolved.output_rows(n_labels) else 'columns'})"
        rows.append((f.name, _show(default, f.name), valid_range(Config, f.name), _show(value, f.name, resolved)))
    out_lc = resolved.layer_lsh(len(resolved.hidden)) if resolved.hidden is not None else resolved.lsh
    for f in dataclasses.fields(LSHConfig):
        default = getattr(base.lsh, f.name)
        value = getattr(out_lc, f.name)
        if f.name == "max_active" and value is None and n_labels is not None:
            value = f"{out_lc.active_count(n_labels)} (output layer of {n_labels:,})"
        rows.append((f"lsh.{f.name}", _show(default, f.name), valid_range(LSHConfig, f.name), _show(value, f.name)))
    if n_labels is not None and resolved.hidden is not None:
        widths = list(resolved.hidden) + [n_labels]
        kinds = ",".join(resolved.layer_kind(i, w) for i, w in enumerate(widths))
        rows.append(("(layer kinds)", "", "from kinds and the widths", kinds))
    return rows


def _show(v, name: str, config: Config | None = None) -> str:
    if v is None:
        return {"adam_dtype": "like dtype", "propensity_a": "the preset's", "propensity_b": "the preset's",
                "max_active": "from the width"}.get(name, "from the data" if name in Config.FROM_DATA else "None")
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, tuple):
        return ",".join(map(str, v)) if v else "()"
    if name == "threads" and v == 0:
        return "0 (the node's cores / its ranks)"
    return str(v)


def format_table(rows: list[tuple], with_value: bool) -> str:
    head = ("setting", "default", "valid", "value") if with_value else ("setting", "default", "valid")
    rows = [r if with_value else r[:3] for r in rows]
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head) - 1)]
    lines = []
    for r in [head, *rows]:
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(r, widths)) + "  " + str(r[-1]))
    return "\n".join(lines)
