"""scripts/demo.sh, the first command of the README, ends well and says what it measured."""

import json
import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from scripts.first_run_check import longest_gap, timed_output

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """One run of demo.sh (1 epoch, 2 ranks) in a temporary directory: (process, run directory)."""
    tmp = tmp_path_factory.mktemp("demo")
    env = {**os.environ, "DEMO_EPOCHS": "1", "DEMO_DATA": str(tmp / "data" / "small"), "DEMO_RUN": str(tmp / "run")}
    # its output as a terminal would show it (stdout and stderr, in order), each line timed
    code, lines = timed_output(["bash", str(ROOT / "scripts" / "demo.sh")], env)
    p = SimpleNamespace(returncode=code, stdout="\n".join(text for _, text in lines), stderr="",
                        wall_s=lines[-1][0], gap=longest_gap(lines))
    return p, tmp / "run"


def test_demo_trains_two_ranks_prints_what_metrics_json_holds_and_exits_zero(demo):
    p, run = demo
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    metrics = json.loads((run / "metrics.json").read_text())
    printed = re.search(r"^P@1 ([0-9.]+)\s+P@3 ([0-9.]+)\s+P@5 ([0-9.]+)", p.stdout, re.M)
    assert printed, p.stdout[-2000:]
    for k, v in zip(("p@1", "p@3", "p@5"), printed.groups()):
        assert abs(float(v) - metrics[k]) < 1e-4
    # one epoch of `small` (20,000 labels): 0.46 measured; the most frequent label alone scores 0.07
    assert metrics["p@1"] > 0.3, metrics
    assert re.search(r"samples/s over \d+ steps \(2 rank\(s\) x 1 thread\(s\)\)", p.stdout)
    # start-up: from the process's start to the end of its first step, which it contains
    assert metrics["warmup_s"] < metrics["startup_s"] < p.wall_s
    assert f"start-up {metrics['startup_s']:.1f}s" in p.stdout


def test_demo_draws_the_runs_progress(demo):
    """demo.sh installs the plot extra (matplotlib) itself; only where that install fails
    (no package index reachable) does it go without the plot, and says so."""
    p, run = demo
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    if "matplotlib could not be installed" in p.stdout + p.stderr:
        pytest.skip("demo.sh could not install matplotlib (no package index?), so it drew no plot")
    assert f"plot of P@1 and loss against time: {run / 'progress.png'}" in p.stdout
    assert (run / "progress.png").stat().st_size > 10_000


def test_demo_is_never_silent_for_more_than_10_seconds(demo):
    """Here with numba's cache as it is (warm after the first run; scripts/test.sh checks a
    command on an empty cache with scripts/first_run_check.py). The long stages without a
    progress of their own (dslide warm's compiling, the inference index's two stages, the
    scoring of the neighbours' choice) print a heartbeat every 6 s."""
    p, _ = demo
    assert p.returncode == 0, p.stdout[-2000:]
    gap, after = p.gap
    assert gap <= 10.0, f"{gap:.1f}s without output, before {after!r}"
