"""Shared test helpers: the optional real data sets beside the project, and a tiny trained run."""

from pathlib import Path

import pytest
from hypothesis import settings

# property tests draw their examples from a fixed seed: a run's result depends on the code alone
# (a test's own @settings keeps this unless it says otherwise)
settings.register_profile("dslide", derandomize=True, database=None)
settings.load_profile("dslide")

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"


@pytest.fixture
def shared_data():
    """`shared_data(name)` -> Path of ../shared/data/name; skips the test when it is absent."""

    def get(name: str) -> Path:
        path = SHARED_DATA / name
        if not path.exists():
            pytest.skip(f"{path} not present (real data sets live beside the project, in ../shared/data)")
        return path

    return get


#: the settings of a small, fast run (the command line's --set form)
TINY = ["--set", "hidden=16", "--set", "epochs=1", "--set", "batch_size=32", "--quiet"]


def tiny_run(tmp_path_factory, name: str) -> Path:
    """A folder holding `t_train.txt` / `t_test.txt` (the tiny preset, 300 / 60 points) and `run`,
    a run trained on them with TINY: each module that asks gets its own copy to change."""
    from dslide import cli

    d = tmp_path_factory.mktemp(name)
    assert cli.main(["data", "gen", "--preset", "tiny", "--points", "300", "--test-points", "60",
                     "--out", str(d / "t")]) == 0
    assert cli.main(["train", "--train", str(d / "t_train.txt"), "--out", str(d / "run"), *TINY]) == 0
    return d


def run_cli(argv, capsys) -> tuple[int, str, str]:
    """`dslide ARGV` in this process: (exit code, stdout, stderr), a SystemExit's code included."""
    from dslide import cli

    capsys.readouterr()
    try:
        code = cli.main(argv)
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err
