"""The table of settings (dslide.config.fields) is the configuration: it makes Config and
LSHConfig, checks each value, and the docs' settings table is generated from it."""

import dataclasses
import re
from pathlib import Path

import pytest

from dslide import settings
from dslide.config import Config, LSHConfig
from dslide.config.fields import CONFIG_FIELDS, LSH_FIELDS

ROOT = Path(__file__).resolve().parents[2]


def test_the_dataclasses_are_the_table():
    for cls, table in ((Config, CONFIG_FIELDS), (LSHConfig, LSH_FIELDS)):
        assert [f.name for f in dataclasses.fields(cls)] == [f.name for f in table]
        for f, row in zip(dataclasses.fields(cls), table):
            if row.name != "lsh":
                assert f.default == row.default, row.name
            assert row.doc and row.check.text, row.name
            assert row.type.endswith("| None") == (row.none is not None), f"{row.name}: None allowed, with a meaning"


def test_the_docs_settings_table_is_the_generated_one():
    """Regenerate it with `dslide config table` between the two markers of docs/configuration.md."""
    text = (ROOT / "docs" / "configuration.md").read_text()
    m = re.search(r"<!-- settings table: dslide config table -->\n(.*?)<!-- end of the settings table -->", text, re.S)
    assert m, "docs/configuration.md has lost the markers of its settings table"
    assert m.group(1) == settings.markdown(), "docs/configuration.md's settings table is stale: " \
                                              "paste in the output of `dslide config table`"


@pytest.mark.parametrize("key", [k for k, _ in settings.rows()])
def test_every_valid_text_names_what_the_check_refuses(key):
    """A value out of the stated range is refused with a message naming the setting."""
    f = dict(settings.rows())[key]
    text = f.check.text
    bad = {"an integer": -(10 ** 30), "a power of two": 3, "in ": -1e300, "one of": "\x00",
           "true or false": "maybe"}
    probe = next((v for prefix, v in bad.items() if text.startswith(prefix)), None)
    if probe is None:
        pytest.skip(f"{key}: a rule ({text})")
    name = key.split(".", 1)[-1]
    with pytest.raises(ValueError, match=re.escape(key)):
        (LSHConfig if key.startswith("lsh.") else Config)(**{name: probe})


def _attributes_read(path: Path, skip_functions=()) -> set:
    """The names of every attribute a module reads (x.name, not x.name = ...), leaving out the
    bodies of functions named in skip_functions."""
    import ast

    names = set()

    def visit(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and child.name in skip_functions:
                continue
            if isinstance(child, ast.Attribute) and isinstance(child.ctx, ast.Load):
                names.add(child.attr)
            visit(child)

    visit(ast.parse(path.read_text()))
    return names


def test_every_setting_in_the_table_is_read_by_the_product_or_retired():
    """A setting no module of dslide reads is dead: retire it (fields.RETIRED) or use it. The
    configuration's own table, checks, TOML i/o and listing do not count, nor the checks of
    core.py's __post_init__; its methods and dslide.config.rules, which the product calls, do."""
    from dslide.config.fields import RETIRED

    package = ROOT / "dslide"
    read = set()
    for path in package.rglob("*.py"):
        rel = path.relative_to(package).as_posix()
        if rel in ("config/fields.py", "config/tomlio.py", "config/checks.py", "settings.py"):
            continue
        skip = ("__post_init__", "_lsh_table", "_lsh_layers") if rel == "config/core.py" else ()
        read |= _attributes_read(path, skip)
    unread = [f.name for f in (*CONFIG_FIELDS, *LSH_FIELDS) if f.name not in read]
    assert not unread, f"no module of dslide reads {unread}: retire them in dslide.config.fields.RETIRED"
    table = {f.name for f in CONFIG_FIELDS} | {f"lsh.{f.name}" for f in LSH_FIELDS}
    assert not table & set(RETIRED), "a retired setting is still in the table"
