"""scripts/demo.sh, the first command of the README, ends well and says what it measured."""

import json
import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_demo_trains_two_ranks_prints_what_metrics_json_holds_and_exits_zero(tmp_path):
    env = {**os.environ, "DEMO_EPOCHS": "1", "DEMO_DATA": str(tmp_path / "data" / "small"),
           "DEMO_RUN": str(tmp_path / "run")}
    p = subprocess.run(["bash", str(ROOT / "scripts" / "demo.sh"), "--quiet"], capture_output=True, text=True,
                       env=env, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    printed = re.search(r"^P@1 ([0-9.]+)\s+P@3 ([0-9.]+)\s+P@5 ([0-9.]+)", p.stdout, re.M)
    assert printed, p.stdout[-2000:]
    for k, v in zip(("p@1", "p@3", "p@5"), printed.groups()):
        assert abs(float(v) - metrics[k]) < 1e-4
    # one epoch of `small` (20,000 labels): 0.46 measured; the most frequent label alone scores 0.07
    assert metrics["p@1"] > 0.3, metrics
    assert re.search(r"samples/s over \d+ steps \(2 rank\(s\) x 1 thread\(s\)\)", p.stdout)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert (tmp_path / "run" / "progress.png").stat().st_size > 10_000
