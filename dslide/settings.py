"""Every setting of the configuration with its default, its valid values, and what data resolves it to.

`dslide config show [--data F]` prints :func:`table`; `dslide config table` prints
:func:`markdown`, the settings table of docs/configuration.md. Both are read from the
configuration's table of fields (dslide.config.fields), the one that makes and checks
`Config` and `LSHConfig`.
"""

from __future__ import annotations

from dslide.config import Config
from dslide.config.fields import CONFIG_FIELDS, LSH_FIELDS, TABLES

_FIELDS = {**{f.name: f for f in CONFIG_FIELDS}, **{f"lsh.{f.name}": f for f in LSH_FIELDS}}


def valid_range(key: str) -> str:
    """What setting `key` ("lr", "lsh.K") takes: its check's text (dslide.config.checks)."""
    return _FIELDS[key].check.text


def rows() -> list[tuple[str, object]]:
    """(key, Field) of every setting but the [lsh] table itself, in the order config.toml has them."""
    out = [(f.name, f) for f in CONFIG_FIELDS if f.name != "lsh"]
    return out + [(f"lsh.{f.name}", f) for f in LSH_FIELDS]


def table(config: Config, n_features: int | None = None, n_labels: int | None = None,
          points_per_label: float | None = None, n_points: int | None = None,
          labels_per_point: float | None = None) -> list[tuple]:
    """Rows (key, default, valid range, value): value is what `config` holds, resolved for
    data of n_features features, n_labels labels and n_points points when given ("-" for from-the-data
    settings without data)."""
    base = Config()
    resolved = (config.resolve(n_labels, points_per_label, n_points, labels_per_point) if n_labels is not None
                else config)
    out_lc = resolved.layer_lsh(len(resolved.hidden)) if resolved.hidden is not None else resolved.lsh
    out = []
    for key, f in rows():
        lsh = key.startswith("lsh.")
        default = getattr(base.lsh if lsh else base, f.name)
        value = getattr(out_lc if lsh else resolved, f.name)
        if f.name in ("propensity_a", "propensity_b") and value is None:
            value = resolved.propensity_constants[f.name == "propensity_b"]
        if f.name == "output_split" and value == "auto" and n_labels is not None:
            value = f"auto ({'rows' if resolved.output_rows(n_labels) else 'columns'})"
        if key == "lsh.max_active" and value is None and n_labels is not None:
            value = f"{out_lc.active_count(n_labels)} (output layer of {n_labels:,})"
        out.append((key, _show(default, f), f.check.text, _show(value, f)))
    if n_labels is not None and resolved.hidden is not None:
        widths = list(resolved.hidden) + [n_labels]
        kinds = ",".join(resolved.layer_kind(i, w) for i, w in enumerate(widths))
        out.append(("(layer kinds)", "", "from kinds and the widths", kinds))
    return out


def _show(v, f) -> str:
    if v is None:
        return f.none or "None"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, tuple):
        return ",".join(map(str, v)) if v else "()"
    if f.name == "threads" and v == 0:
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


def markdown() -> str:
    """The settings table of docs/configuration.md: every setting's TOML key, default, valid
    values, what it does, and where the data decides it, the rule."""
    lines = ["| setting | default | valid | what it does | from the data |", "|---|---|---|---|---|"]
    order = {t: i for i, t in enumerate((*TABLES, "lsh"))}
    for key, f in sorted(rows(), key=lambda r: order[r[1].table]):
        where = f"[{f.table}] {f.name}"
        default = _show(f.default, f)
        cells = [f"`{where}`", default, f.check.text, f.doc, f.rule or ""]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"
