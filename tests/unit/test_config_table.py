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
