"""config.toml in tables ([model], [train], [neighbours], [replicas], [run], [lsh]), and the
flat config.toml files written before the tables still load to the same configuration."""

import re

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from pathlib import Path

from dslide.cli import common
from dslide.config import Config, LSHConfig
from dslide.config.fields import TABLES
from dslide.session import config_toml

DATA = Path(__file__).resolve().parents[1] / "data"


def test_a_flat_config_toml_of_before_the_tables_loads_to_an_equal_config():
    # written when beta2 had one default (0.999), the file states it: a run it configures keeps it
    # rather than taking the value from the data
    assert common.make_config(str(DATA / "config_2026-12-03.toml"), []) == Config(beta2=0.999)


def test_a_run_directorys_flat_config_toml_loads_and_round_trips_in_tables(tmp_path):
    old = common.make_config(str(DATA / "config_2026-12-03_run.toml"), [])
    assert old.hidden == (128,) and old.epochs == 10.0 and old.early_stop is True and old.lsh.max_active == 0
    flat = tomllib.loads((DATA / "config_2026-12-03_run.toml").read_text())
    assert Config.from_dict(flat) == old
    new = tmp_path / "config.toml"
    new.write_text(config_toml(old))
    assert list(tomllib.loads(new.read_text())) == [*TABLES, "lsh"]
    assert common.make_config(str(new), []) == old


def test_to_dict_nests_and_from_dict_takes_both_forms():
    c = Config(hidden=(16, 8), lr=0.25, replicas=2, knn=3, lsh=LSHConfig(K=4), threads=1)
    nested = c.to_dict()
    assert nested["train"]["lr"] == 0.25 and nested["model"]["hidden"] == (16, 8)
    assert nested["replicas"]["replicas"] == 2 and nested["neighbours"]["knn"] == 3 and nested["run"]["threads"] == 1
    assert Config.from_dict(nested) == c == Config.from_dict(c.to_dict(flat=True))
    mixed = {"train": {"lr": 0.25}, "hidden": [16, 8], "replicas": 2, "knn": 3, "lsh": {"K": 4}, "threads": 1}
    assert Config.from_dict(mixed) == c


@pytest.mark.parametrize("values, message", [
    ({"train": {"lr": 0.1}, "lr": 0.2}, "lr is given twice, as 'train.lr' and as 'lr'"),
    ({"train": {"hidden": [8]}}, "unknown configuration key 'train.hidden'"),
    ({"train": {"lrr": 0.1}}, "did you mean 'train.lr'?"),
    ({"replicas": {"replicas": 2, "sync_evry": 3}}, "did you mean 'replicas.sync_every'?"),
])
def test_a_table_refuses_what_it_does_not_hold_and_a_setting_given_twice(values, message):
    with pytest.raises(ValueError, match=message.replace("?", r"\?").replace("(", r"\(")):
        Config.from_dict(values)


def test_set_takes_a_setting_by_its_plain_or_its_table_name_over_a_file_in_tables(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text(config_toml(Config(lr=0.5, hidden=(64,))))
    c = common.make_config(str(f), ["lr=1e-3", "model.hidden=32", "lsh.K=3"])
    assert c.lr == 1e-3 and c.hidden == (32,) and c.lsh.K == 3


@pytest.mark.parametrize("values, key", [({"choice_points": 100}, "choice_points"),
                                         ({"lsh": {"max_candidates": 64}}, "lsh.max_candidates"),
                                         ({"lsh_layers": [None, {"max_candidates": 8}]}, "lsh_layers[1].max_candidates")])
def test_a_retired_setting_loads_at_its_old_value_and_is_refused_at_another(values, key):
    with pytest.raises(ValueError, match=re.escape(key) + ".*no longer has this setting"):
        Config.from_dict(values)
    old = {"choice_points": 5000, "lsh": {"max_candidates": 0, "K": 3}}
    assert Config.from_dict(old) == Config(lsh=LSHConfig(K=3))
