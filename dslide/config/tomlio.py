"""A configuration as a dict and as TOML: the nested form config.toml holds, and the flat form it read before.

config.toml groups the settings in tables, `[model]`, `[train]`, `[neighbours]`,
`[replicas]`, `[run]` and `[lsh]` (dslide.config.fields says which setting is in which);
the Python names stay flat (`Config(lr=...)`, `--set lr=...`). `flatten` reads either
form, or a mix of both: a setting given twice, or a key a table does not hold, is a
ValueError naming it.
"""

from __future__ import annotations

import re

from dslide.config.checks import _unknown
from dslide.config.fields import RETIRED, TABLE_OF, TABLES


def nest(flat: dict) -> dict:
    """A flat dict of settings (dataclasses.asdict of a Config) as {table: {setting: value}},
    tables in the order of TABLES, then [lsh]."""
    out = {t: {} for t in TABLES}
    for k, v in flat.items():
        if k != "lsh":
            out[TABLE_OF[k]][k] = v
    out["lsh"] = flat["lsh"]
    return out


def flatten(values: dict) -> dict:
    """Settings in the nested form, the flat one or a mix, as the flat dict Config takes. A
    table's key is `table.setting` in messages; keys that are no setting are left for
    Config.from_dict to refuse. Retired settings at their one value are dropped (`retire`)."""
    if not isinstance(values, dict):
        raise ValueError(f"a configuration must be a table of settings, got {values!r}")
    out, given = {}, {}
    for k, v in values.items():
        if k in TABLES and isinstance(v, dict):
            known = {f"{k}.{name}" for name, t in TABLE_OF.items() if t == k}
            items = [(sub, x, f"{k}.{sub}") for sub, x in v.items()]
            for _, _, where in items:
                if where not in known:
                    raise ValueError(_unknown(where, known))
        else:
            items = [(k, v, k)]
        for name, x, where in items:
            if name in out:
                raise ValueError(f"{name} is given twice, as {given[name]!r} and as {where!r}; give it once")
            out[name], given[name] = x, where
    return retire(out)


def retire(values: dict, prefix: str = "", where: str = "") -> dict:
    """`values` without the settings dslide no longer has (fields.RETIRED, keys prefix + name),
    each of which must hold the value every older config.toml holds: a file that set another
    is refused with a ValueError saying why the setting went. where: the table, for messages."""
    out = dict(values)
    for name in values:
        if prefix + name in RETIRED:
            kept, why = RETIRED[prefix + name]
            if out.pop(name) != kept:
                raise ValueError(f"{where or prefix}{name} = {values[name]!r}: dslide no longer has this setting "
                                 f"({why}); only {kept!r}, what it always was, is still read")
    return out


def config_toml(config) -> str:
    """The configuration as TOML (what the run directory keeps and --config reads back): one
    table per group of settings.

    Settings that are None ("from the data") are left out and read back as
    None; an entry of lsh_layers that keeps the [lsh] settings (None) is
    written "lsh", the others as inline tables. make_config(file) of the
    text gives back an equal Config (tests/unit/test_cli.py checks it for
    any valid Config).
    """
    lines = []
    for name, table in config.to_dict().items():
        lines.append(f"[{name}]")
        for k, v in table.items():
            if v is None:
                continue
            if k == "lsh_layers":
                if v:
                    lines.append(f"{k} = {toml_value(['lsh' if x is None else x for x in v])}")
            else:
                lines.append(f"{toml_key(k)} = {toml_value(v)}")
        lines.append("")
    return "\n".join(lines)


def toml_value(v) -> str:
    """One TOML value (TOML 1.0) of a bool, int, float, str, list/tuple or dict (an inline table)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        # repr: the shortest text that reads back as the same double, in a form
        # TOML takes as it is (1e-05, 0.001, inf, -inf, nan)
        return repr(v)
    if isinstance(v, str):
        return '"' + "".join(_TOML_ESCAPES.get(c) or (f"\\u{ord(c):04x}" if ord(c) < 0x20 or c == "\x7f" else c)
                             for c in v) + '"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{toml_key(k)} = {toml_value(x)}" for k, x in v.items() if x is not None) + "}"
    raise TypeError(f"cannot write {v!r} as TOML")


def toml_key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else toml_value(k)


_TOML_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}
