"""The dslide command: configuration, error paths, end to end, checkpoint faults."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dslide import cli, session
from dslide.cli import common
from dslide.io import formats
from dslide.config import (BIAS_INITS, DTYPES, INPUT_NORMS, LAYER_KINDS, LR_SCHEDULES, PARALLEL, POLICIES, SELECT_MODES,
                           SYNC_MODES, Config, LSHConfig)
from dslide.model.candidates import SOURCES
from tests import faults

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]


def run(argv, capsys):
    """main(argv) in this process -> (exit code, stdout, stderr)."""
    try:
        code = cli.main(argv)
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    cli.main(["data", "gen", "--preset", "tiny", "--out", str(d / "tiny")])
    return d / "tiny_train.txt", d / "tiny_test.txt"


@pytest.fixture(scope="module")
def trained(tiny, tmp_path_factory):
    """A small run directory shared by the eval/predict/error tests."""
    run_dir = tmp_path_factory.mktemp("run") / "r"
    code = cli.main(["train", "--train", str(tiny[0]), "--test", str(tiny[1]), "--out", str(run_dir), "--quiet",
                     "--set", "epochs=4", "--set", "hidden=32", "--set", "lr=1e-2", "--set", "batch_size=64",
                     "--set", "dropout=0"])
    assert code == 0
    return run_dir


# -- configuration ---------------------------------------------------------------------


def test_set_overrides_parse_toml_values_lists_and_tables(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('lr = 0.5\nhidden = [64]\n[lsh]\nK = 3\n')
    c = common.make_config(str(f), ["lr=1e-3", "hidden=256,128", "lsh.L=20", "input_norm=none", "exact=true"])
    assert c.lr == 1e-3 and c.hidden == (256, 128) and c.lsh.K == 3 and c.lsh.L == 20
    assert c.input_norm == "none" and c.exact is True
    # the saved TOML reads back to the same configuration
    g = tmp_path / "saved.toml"
    g.write_text(session.config_toml(c))
    assert common.make_config(str(g), []) == c


# Any valid Config, lsh_layers included, for the round-trip property below.
_floats01 = st.floats(0.0, 1.0, allow_nan=False)


@st.composite
def _lsh_configs(draw):
    family = draw(st.sampled_from(tuple(SOURCES)))
    L = draw(st.none() | st.integers(1, 1024))  # None: the family's default
    max_threshold = 10**6 if family == "anchor" else (L or 50)
    return LSHConfig(
        family=family, K=draw(st.none() | st.integers(1, 32)), L=L,
        anchors=draw(st.integers(1, 1 << 20)), bin_size=2 ** draw(st.integers(1, 16)),
        range_pow=draw(st.integers(0, 24)), capacity=draw(st.integers(1, 1 << 16)),
        policy=draw(st.sampled_from(POLICIES)), select=draw(st.sampled_from(SELECT_MODES)),
        threshold=draw(st.integers(1, max_threshold)),
        min_active=draw(st.integers(0, 10**9)), min_active_share=draw(_floats01),
        max_active=draw(st.none() | st.integers(0, 10**9)), rehash_every=draw(st.integers(1, 10**9)),
        rebuild_every=draw(st.integers(1, 10**9)), growth=draw(st.floats(1.0, 10.0)),
        index_anchors=draw(st.integers(0, 1 << 20)), index_share=draw(st.floats(0.0, 1.0, exclude_min=True)),
        index_probes=draw(st.integers(1, 1024)), index_points=draw(st.integers(1, 10**9)),
        index_shrink=draw(_floats01), index_spread=draw(st.floats(0.0, 100.0)),
        index_neighbors=(k := draw(st.integers(0, 1024))), index_degree=draw(st.integers(1, 1024)),
        index_search=draw(st.integers(max(1, k), 1 << 16)))


@st.composite
def _configs(draw):
    hidden = draw(st.none() | st.lists(st.integers(1, 10**6), min_size=1, max_size=3).map(tuple))
    n_layers = None if hidden is None else len(hidden) + 1
    kinds, lsh_layers = (), ()
    if n_layers is not None:
        if draw(st.booleans()):
            kinds = (draw(st.sampled_from(("dense", "auto"))),
                     *draw(st.lists(st.sampled_from(LAYER_KINDS), min_size=n_layers - 1, max_size=n_layers - 1)))
        if draw(st.booleans()):
            lsh_layers = tuple(draw(st.lists(st.none() | _lsh_configs(), min_size=n_layers, max_size=n_layers)))
    maybe = lambda s: st.none() | s  # noqa: E731
    parallel = draw(st.sampled_from(PARALLEL))
    layout = {}
    if parallel == "model":  # replicas and shard weights split the model
        layout = dict(replicas=draw(st.integers(1, 60)), sync=draw(st.sampled_from(SYNC_MODES)),
                      sync_every=draw(st.integers(1, 10**6)),
                      shard_weights=draw(st.just("auto") | st.lists(st.floats(1e-3, 1e3), max_size=4).map(tuple)))
    return Config(**layout,
        hidden=hidden, kinds=kinds, lsh=draw(_lsh_configs()), lsh_layers=lsh_layers,
        auto_lsh_ratio=draw(st.floats(1.0, 1e6)), auto_lsh_min_width=draw(st.integers(0, 10**9)),
        exact=draw(st.booleans()), epochs=draw(maybe(st.floats(0.0, 1e6, exclude_min=True) | st.integers(1, 10**6))),
        batch_size=draw(maybe(st.integers(1, 10**6))), lr=draw(maybe(st.floats(0.0, 10.0, exclude_min=True))),
        lr_schedule=draw(st.sampled_from(LR_SCHEDULES)), beta1=draw(st.floats(0.0, 1.0, exclude_max=True)),
        beta2=draw(st.floats(0.0, 1.0, exclude_max=True)), eps=draw(st.floats(0.0, 1.0, exclude_min=True)),
        dropout=draw(maybe(st.floats(0.0, 1.0, exclude_max=True))), input_norm=draw(st.sampled_from(INPUT_NORMS)),
        init_input_scale=draw(maybe(st.floats(0.0, 100.0, exclude_min=True))),
        output_bias_init=draw(st.sampled_from(BIAS_INITS)), seed=draw(st.integers(0, 2**63 - 1)),
        threads=draw(st.integers(0, 1024)), dtype=draw(st.sampled_from(DTYPES)),
        parallel=parallel, eval_every=draw(st.integers(0, 10**9)),
        eval_points=draw(st.integers(1, 10**9)), log_every=draw(st.integers(1, 10**9)),
        checkpoint_every=draw(st.integers(0, 10**9)))


@settings(max_examples=300, deadline=None)
@given(config=_configs())
def test_every_config_round_trips_through_config_toml(config, tmp_path_factory):
    f = tmp_path_factory.mktemp("rt") / "config.toml"
    f.write_text(session.config_toml(config))
    back = common.make_config(str(f), [])
    assert back == config
    # and through the checkpoint manifest's JSON (config_of)
    assert Config.from_dict(json.loads(json.dumps(config.to_dict()))) == config


def test_lsh_layers_are_written_as_toml_not_as_a_comment(tmp_path):
    c = Config(hidden=(16, 8), kinds=("dense", "lsh", "lsh"), lsh_layers=(None, LSHConfig(K=4, L=9), None))
    text = session.config_toml(c)
    assert "#" not in text
    layers = tomllib.loads(text)["model"]["lsh_layers"]
    assert layers[0] == "lsh" and layers[1]["L"] == 9
    f = tmp_path / "c.toml"
    f.write_text(text)
    assert common.make_config(str(f), []).lsh_layers == (None, LSHConfig(K=4, L=9), None)


@settings(max_examples=300, deadline=None)
@given(v=st.text() | st.floats() | st.integers(-2**63, 2**63 - 1) | st.booleans()
       | st.lists(st.integers(-5, 5)) | st.dictionaries(st.text(min_size=1), st.integers(0, 3), max_size=3))
def test_toml_values_read_back_as_written(v):
    back = tomllib.loads(f"v = {session._toml_value(v)}")["v"]
    if isinstance(v, float):
        assert np.float64(back).tobytes() == np.float64(v).tobytes() or (np.isnan(v) and np.isnan(back))
    else:
        assert back == v and type(back) is type(v)


@pytest.mark.parametrize("entry, message", [
    (3, "lsh_layers[1] = 3 must be a table of LSH settings or 'lsh'"),
    ({"KK": 3}, "unknown configuration key 'lsh_layers[1].KK'; did you mean 'lsh_layers[1].K'?"),
])
def test_bad_lsh_layers_entries_are_clear_errors(entry, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        Config.from_dict({"hidden": [8], "lsh_layers": [None, entry]})


@pytest.mark.parametrize("sets, message", [
    (["lrr=1e-3"], "unknown configuration key 'lrr'; did you mean 'lr'?"),
    (["lsh.KK=3"], "unknown configuration key 'lsh.KK'; did you mean 'lsh.K'?"),
    (["lr=-1"], "lr = -1 must be in (0.0, 10.0]"),
    (["dropout=1.5"], "dropout = 1.5 must be in [0.0, 1.0)"),
    (["lsh.family=foo"], "lsh.family = 'foo' is not valid; choose one of 'anchor', 'dwta', 'srp', 'wta'"),
    (["hidden=0"], "hidden[0] = 0 must be >= 1"),
    (["batch_size=abc"], "batch_size = 'abc' must be an integer"),
    (["lr"], "expected key=value"),
])
def test_bad_settings_are_one_clear_line(sets, message, tiny, capsys, tmp_path):
    argv = ["train", "--train", str(tiny[0]), "--out", str(tmp_path / "r")]
    for s in sets:
        argv += ["--set", s]
    code, out, err = run(argv, capsys)
    assert code == 2
    assert message in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_config_validation_names_field_value_and_range():
    with pytest.raises(ValueError, match=r"lsh\.min_active = -1 must be >= 0"):
        Config(lsh={"min_active": -1})
    with pytest.raises(ValueError, match="kinds has 1 entries but the network has 2 layers"):
        Config(hidden=(8,), kinds=("dense",))
    with pytest.raises(ValueError, match=r"lsh\.min_active_share = 1.5 must be in \[0.0, 1.0\]"):
        Config(lsh={"min_active_share": 1.5})
    with pytest.raises(ValueError, match=r"lsh\.index_search = 4 must be >= lsh\.index_neighbors = 5"):
        Config(lsh={"index_search": 4})


@pytest.mark.parametrize("width, n_random, kind", [
    (670_091, 8_192, "lsh"),   # capped by min_active
    (12_000, 2_400, "lsh"),    # the minimum width: 4 * (2,400 + 512) = 11,648 <= 12,000
    (11_999, 2_399, "dense"),
    (5_000, 1_000, "dense"),   # 20% of the layer
    (159, 31, "dense"),
])
def test_random_negatives_scale_with_width_and_set_the_automatic_layer_kind(width, n_random, kind):
    cfg = Config(hidden=(16,))
    assert cfg.lsh.random_count(width) == n_random == min(8_192, int(0.2 * width))
    assert cfg.layer_kind(1, width) == kind
    assert cfg.layer_kind(0, width) == "dense"          # the input layer is always dense
    assert Config(hidden=(16,), exact=True).layer_kind(1, width) == "dense"
    no_min = Config(hidden=(16,), auto_lsh_min_width=0, lsh={"max_active": 512})
    # without the minimum width, the ratio alone: 4 * (2,047 + 512) = 10,236 is LSH, 10,235 is not
    assert [no_min.layer_kind(1, w) for w in (10_235, 10_236)] == ["dense", "lsh"]
    # with max_active unset a layer this narrow has no candidates: 4 * 20% of it always fits
    assert Config(hidden=(16,), auto_lsh_min_width=0).layer_kind(1, 1_000) == "lsh"
    no_random = Config(hidden=(16,), auto_lsh_min_width=0, lsh={"min_active_share": 0.0, "max_active": 512})
    assert no_random.lsh.random_count(width) == 0
    assert no_random.layer_kind(1, width) == ("lsh" if width >= 4 * 512 else "dense")


# -- error paths -------------------------------------------------------------------------


def test_missing_and_malformed_files(tiny, capsys, tmp_path):
    code, _, err = run(["train", "--train", str(tmp_path / "nope.txt")], capsys)
    assert code == 2 and "--train" in err and "nope.txt does not exist" in err
    bad = tmp_path / "bad.txt"
    bad.write_text("2 5 3\n0 1:0.5\n1 7:1.0\n")
    code, _, err = run(["train", "--train", str(bad)], capsys)
    assert code == 2 and "bad.txt:3" in err and "7" in err and "Traceback" not in err
    code, _, err = run(["train", "--train", str(tiny[0]), "--config", str(tmp_path / "none.toml")], capsys)
    assert code == 2 and "none.toml does not exist" in err


def test_debug_shows_the_traceback(tiny, capsys, tmp_path):
    code, _, err = run(["--debug", "train", "--train", str(tmp_path / "nope.txt")], capsys)
    assert code == 2 and "Traceback" in err


def test_resume_and_model_errors(trained, tiny, capsys, tmp_path):
    code, _, err = run(["train", "--train", str(tiny[0]), "--resume", str(tmp_path / "missing")], capsys)
    assert code == 2 and "does not exist" in err
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = run(["eval", "--model", str(empty), "--data", str(tiny[1])], capsys)
    assert code == 2 and "holds no checkpoint" in err
    code, _, err = run(["train", "--train", str(tiny[0]), "--resume", str(trained), "--set", "hidden=32"], capsys)
    assert code == 2 and "only" in err and "hidden" in err
    other = tmp_path / "other.txt"
    other.write_text("1 3 2\n0 0:1\n")
    code, _, err = run(["eval", "--model", str(trained), "--data", str(other)], capsys)
    assert code == 2 and "3 features" in err and "1000" in err


def test_incompatible_checkpoint_is_a_clear_error(trained, tmp_path):
    from dslide.comm import Comm
    from dslide.io import checkpoint as ck
    from dslide.model.network import Network

    path = ck.latest(trained)
    net = Network(Config(hidden=(17,)), 1000, 500, Comm())  # the run has 32
    with pytest.raises(ck.CheckpointError, match="network of shape 32.*this run.s is 17"):
        ck.load_into(net, path, Comm())
    # a manifest that does not match its files
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["ranks"][0]["arrays"]["layer1/W"]["sha256"] = "0" * 64
    broken = tmp_path / "broken"
    shutil.copytree(path, broken / "checkpoints" / path.name)
    (broken / "checkpoints" / path.name / "manifest.json").write_text(json.dumps(manifest))
    (broken / "checkpoints" / "LATEST").write_text(path.name)
    net = Network(ck.config_of(path), 1000, 500, Comm())
    with pytest.raises(ck.CheckpointError, match="does not match the checksum"):
        ck.load_into(net, ck.latest(broken), Comm())
    ck.load_into(net, ck.latest(broken), Comm(), verify=False)  # unless not asked to verify
    # a file damaged inside an array
    (broken / "checkpoints" / path.name / "manifest.json").write_text((path / "manifest.json").read_text())
    entry = manifest["ranks"][0]
    w_file = broken / "checkpoints" / path.name / entry["dir"] / entry["arrays"]["layer1/W"]["file"]
    raw = bytearray(w_file.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    w_file.write_bytes(bytes(raw))
    with pytest.raises(ck.CheckpointError, match=f"{w_file.name}.*does not match the checksum"):
        ck.load_into(Network(ck.config_of(path), 1000, 500, Comm()), ck.latest(broken), Comm())


# -- end to end ----------------------------------------------------------------------------


def test_train_eval_predict_end_to_end(trained, tiny, capsys, tmp_path):
    m = json.loads((trained / "metrics.json").read_text())
    for key in ("p@1", "p@3", "p@5", "ndcg@5", "psp@5", "samples_per_s", "bytes_per_step", "peak_rss_mb",
                "wall_s", "world_size", "threads"):
        assert key in m, key
    assert m["world_size"] == 1 and m["steps"] == 128 and len(m["peak_rss_mb"]) == 1
    # learning: far above the most frequent label of the test set
    from dslide.io.data import read_xmc

    Y = read_xmc(tiny[1]).Y
    prior = np.asarray(Y.sum(axis=0)).ravel().max() / Y.shape[0]
    assert m["p@1"] > prior + 0.1
    log = [json.loads(l) for l in (trained / "log.jsonl").read_text().splitlines()]
    assert log[-1]["step"] == 128 and "loss" in log[-1] and "bytes_per_step" in log[-1]

    code, out, _ = run(["eval", "--model", str(trained), "--data", str(tiny[1])], capsys)
    assert code == 0 and f"P@1 {m['p@1']:.4f}" in out and "PSP@5" in out
    ev = json.loads((trained / "metrics.json").read_text())["eval"]
    assert 0 < ev["load_model_s"] < ev["startup_s"]  # (in this process start-up began with the test session)
    assert f"after {ev['startup_s']:.1f}s of start-up ({ev['load_model_s']:.1f}s loading the model)" in out
    pred = tmp_path / "pred.txt"
    code, out, _ = run(["predict", "--model", str(trained), "--data", str(tiny[1]), "--k", "3", "--out", str(pred)],
                       capsys)
    header, *lines = pred.read_text().splitlines()
    assert header == "500 500"  # pyxclib's read_sparse_file reads it: points, labels
    assert code == 0 and len(lines) == 500 and all(len(l.split()) == 3 for l in lines)
    top1 = formats.read_predictions(str(pred))[0][:, 0]  # pairs in label order: ranked by score again
    hits = np.mean([Y[i, top1[i]] > 0 for i in range(500)])
    assert hits == pytest.approx(m["p@1"])


def test_data_gen_makes_the_directory_of_its_prefix(capsys, tmp_path, monkeypatch):
    # the README's `dslide data gen ... --out data/amz` on a fresh clone, where data/ does not exist yet
    monkeypatch.chdir(tmp_path)
    code, out, err = run(["data", "gen", "--preset", "tiny", "--points", "50", "--test-points", "10",
                          "--out", "data/sub/t"], capsys)
    assert code == 0, err
    assert sorted(os.listdir(tmp_path / "data" / "sub")) == ["t_test.txt", "t_train.txt"]
    assert (tmp_path / "data" / "sub" / "t_train.txt").read_text().startswith("50 ")


def test_data_stats_and_convert(tiny, capsys, tmp_path):
    code, out, _ = run(["data", "stats", str(tiny[1])], capsys)
    assert code == 0 and "500" in out
    arff = tmp_path / "x.arff"
    arff.write_text("@relation t\n@attribute f0 numeric\n@attribute f1 numeric\n@attribute l0 {0,1}\n"
                    "@attribute l1 {0,1}\n@data\n{0 0.5,3 1}\n{1 2}\n")
    code, out, _ = run(["data", "convert", str(arff), str(tmp_path / "x.txt"), "--labels", "2"], capsys)
    assert code == 0
    assert (tmp_path / "x.txt").read_text().splitlines() == ["2 2 2", "1 0:0.5", " 1:2"]


# -- checkpoint written while the process dies ----------------------------------------------


def test_a_checkpoint_write_killed_midway_leaves_the_previous_one(trained, tiny, tmp_path):
    import shutil

    run_dir = tmp_path / "r"
    shutil.copytree(trained, run_dir)
    before = (run_dir / "checkpoints" / "LATEST").read_text()
    for point in ("checkpoint-rank-file", "checkpoint-before-latest"):
        env = dict(os.environ, **faults.env(point))
        p = subprocess.run([sys.executable, "-m", "dslide", "train", "--train", str(tiny[0]), "--resume", str(run_dir),
                            "--set", "epochs=5", "--quiet"], env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 75, p.stderr
        assert (run_dir / "checkpoints" / "LATEST").read_text() == before
        from dslide.comm import Comm
        from dslide.io import checkpoint as ck
        from dslide.model.network import Network

        path = ck.latest(run_dir)
        net = Network(ck.config_of(path), 1000, 500, Comm())
        assert ck.load_into(net, path, Comm())["step"] == 128


def test_lsh_family_choices_are_the_candidate_sources_and_minhash_is_refused_with_why():
    from dslide import lsh

    assert set(SOURCES) == {"anchor"} | (set(lsh.FAMILIES) - {"minhash"})
    for family in SOURCES:
        assert Config(lsh={"family": family}).lsh.family == family
    with pytest.raises(ValueError, match="lsh.family = 'minhash' hashes sets.*one of: anchor, dwta, srp, wta"):
        Config(lsh={"family": "minhash"})
    with pytest.raises(ValueError, match="lsh.family"):
        Config(lsh={"family": "simhash"})


def test_lsh_scope_is_batch_or_sample_and_sample_needs_anchor_tables():
    assert Config().lsh.scope == "batch"
    assert Config(lsh={"scope": "sample"}).lsh.scope == "sample"
    with pytest.raises(ValueError, match="lsh.scope = 'each' is not valid; choose one of 'batch', 'sample'"):
        Config(lsh={"scope": "each"})
    with pytest.raises(ValueError, match="lsh.scope = 'sample'.*needs lsh.family = 'anchor' \\(got 'dwta'\\)"):
        Config(lsh={"scope": "sample", "family": "dwta"})


def test_eval_uses_this_process_threads_not_the_training_runs(tiny, tmp_path):
    """A model trained at 1 thread (say 2 ranks x 1) is evaluated with every thread the
    evaluating process has: the layout of training is not the model's."""
    import numba

    from dslide.comm import Comm

    run_dir = tmp_path / "one_thread"
    assert cli.main(["train", "--train", str(tiny[0]), "--out", str(run_dir), "--quiet", "--set", "epochs=1",
                     "--set", "hidden=16", "--set", "threads=1"]) == 0
    assert numba.get_num_threads() == 1
    session.load_model(str(run_dir), Comm())
    assert numba.get_num_threads() == numba.config.NUMBA_NUM_THREADS
