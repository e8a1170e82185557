"""The command line explains itself: help on every option, defaults, examples, --version,
`config show`, checked --k and --lsh, --quiet and --verbose."""

import argparse
import subprocess
import sys

import pytest

import dslide
from dslide import cli
from dslide.cli import common
from dslide.config import Config


def _parsers():
    """Every (name, parser) of the command line, sub-commands included."""
    out, todo = [], [("dslide", cli.parser())]
    while todo:
        name, p = todo.pop()
        out.append((name, p))
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                todo.extend((f"{name} {n}", sp) for n, sp in a.choices.items())
    return out


def test_every_option_has_help_and_every_command_examples():
    parsers = _parsers()
    names = {n for n, _ in parsers}
    assert {"dslide train", "dslide eval", "dslide predict", "dslide data gen", "dslide config show"} <= names
    for name, p in parsers:
        for a in p._actions:
            if a.help == argparse.SUPPRESS or isinstance(a, argparse._SubParsersAction):
                continue
            assert a.help, f"{name} {a.option_strings or a.dest} has no help text"
        if name in ("dslide", "dslide train", "dslide eval", "dslide predict", "dslide config show"):
            assert "example" in (p.epilog or ""), name


def test_help_shows_defaults(capsys):
    for argv, want in ((["eval", "--help"], "(default: 5)"), (["data", "gen", "--help"], "(default: 0)")):
        with pytest.raises(SystemExit):
            cli.main(argv)
        assert want in capsys.readouterr().out


def test_version():
    p = subprocess.run([sys.executable, "-m", "dslide", "--version"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == f"dslide {dslide.__version__}"


def test_config_show_lists_every_setting_with_default_range_and_resolved_value(capsys, tmp_path):
    cli.main(["data", "gen", "--preset", "tiny", "--points", "40", "--test-points", "5", "--out", str(tmp_path / "t")])
    capsys.readouterr()
    assert cli.main(["config", "show", "--data", str(tmp_path / "t_train.txt"), "--set", "lr=0.5"]) == 0
    rows = {l.split()[0]: l for l in capsys.readouterr().out.splitlines()[2:]}
    from dataclasses import fields

    from dslide.config import LSHConfig

    keys = {f.name for f in fields(Config) if f.name != "lsh"} | {f"lsh.{f.name}" for f in fields(LSHConfig)}
    assert keys <= set(rows)
    # 500 labels: a narrow output, so (512,), dropout 0.6 and 12 epochs from the data, a batch
    # of 5 (40 points, 8 steps an epoch); lr as set
    assert rows["hidden"].split()[-1] == "512" and rows["epochs"].split()[-1] == "12.0"
    assert rows["batch_size"].split()[-1] == "5"
    assert rows["lr"].split()[-1] == "0.5" and "in (0.0, 10.0]" in rows["lr"]
    assert "one of 'fifo', 'reservoir'" in rows["lsh.policy"]
    assert "an integer in [1, 60]" in rows["replicas"]
    assert rows["propensity_b"].split()[-1] == "1.5"
    assert rows["output_split"].endswith("auto (rows)")  # 500 labels under 512 hidden units
    # the narrow outputs' prior shift follows the training points' labels a point
    from dslide.config import labels_per_point, narrow_prior_shift
    from dslide.io.data import read_xmc

    lpp = labels_per_point(read_xmc(str(tmp_path / "t_train.txt")).Y)
    assert rows["prior_shift"].split()[-1] == f"{narrow_prior_shift(lpp)}"


def test_k_and_lsh_are_checked_with_a_message(capsys, tmp_path):
    cli.main(["data", "gen", "--preset", "tiny", "--points", "100", "--test-points", "20", "--out", str(tmp_path / "t")])
    run = tmp_path / "r"
    assert cli.main(["train", "--train", str(tmp_path / "t_train.txt"), "--out", str(run), "--quiet",
                     "--set", "epochs=1", "--set", "hidden=8"]) == 0
    out = capsys.readouterr().out
    assert "effective configuration" not in out and "loss" not in out  # --quiet, no --verbose
    assert "samples/s over" in out  # the final figures still
    for extra, message in ((["--k", "0"], "--k 0 must be an integer in [1, 500]"),
                           (["--k", "501"], "--k 501 must be an integer in [1, 500]"),
                           (["--lsh"], "--lsh needs an LSH output layer, and this model's output layer is dense")):
        with pytest.raises(SystemExit) as e:
            cli.main(["eval", "--model", str(run), "--data", str(tmp_path / "t_test.txt"), *extra])
        assert e.value.code == 2 and message in capsys.readouterr().err


def test_verbose_prints_the_configuration(capsys, tmp_path):
    cli.main(["data", "gen", "--preset", "tiny", "--points", "60", "--test-points", "5", "--out", str(tmp_path / "t")])
    assert cli.main(["train", "--train", str(tmp_path / "t_train.txt"), "--out", str(tmp_path / "r"), "--verbose",
                     "--set", "epochs=1", "--set", "hidden=8"]) == 0
    out = capsys.readouterr().out
    assert "effective configuration:\n  [model]\n  hidden = [8]" in out  # config.toml in tables


class _Terminal:
    """stderr as a terminal that keeps what is written to it."""

    def __init__(self):
        self.text = []

    def isatty(self):
        return True

    def write(self, s):
        self.text.append(s)
        return len(s)

    def flush(self):
        pass


@pytest.mark.parametrize("quiet", [False, True])
def test_reading_a_large_file_shows_a_bar_of_its_bytes(tmp_path, monkeypatch, quiet):
    """A large data file moves a bar while it is parsed (on a terminal, unless --quiet); the bar
    counts the file's bytes, block by block."""
    import types

    import numpy as np
    import scipy.sparse as sp

    from dslide.io import xmc_parse
    from dslide.io.data import read_xmc, write_xmc

    rng = np.random.default_rng(0)
    X = sp.random(300, 50, density=0.2, format="csr", dtype=np.float32, random_state=rng)
    Y = sp.csr_matrix((np.ones(300, np.float32), rng.integers(0, 7, 300), np.arange(301)), shape=(300, 7))
    path = tmp_path / "big.txt"
    write_xmc(path, X, Y)
    size = path.stat().st_size
    monkeypatch.setattr(common, "LOUD_READ_BYTES", size)  # "large": this one
    monkeypatch.setattr(xmc_parse, "PARSE_BLOCK_BYTES", size // 5)
    import tqdm

    closed, steps = [], []

    class Bar(tqdm.tqdm):
        def update(self, n=1):
            steps.append(n)
            return super().update(n)

        def close(self):
            closed.append((self.n, self.total, self.desc))
            super().close()

    monkeypatch.setattr(tqdm, "tqdm", Bar)
    term = _Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    data = common.read(str(path), "--train", comm=types.SimpleNamespace(rank=0), quiet=quiet)
    assert (data.X != read_xmc(path, cache=False).X).nnz == 0
    text = "".join(term.text)
    if quiet:
        assert text == "" and closed == []
    else:
        assert closed[0] == (size, size, "reading --train")  # the bar reached the file's size
        assert len(steps) >= 5 and sum(steps) == size  # it moved block by block
        assert f"read --train {path}: 300 points" in text
