"""Start-up of a run: the seconds before training (or scoring) gets going.

    python -m scripts.bench_startup [--workdir DIR] [--repo DIR=LABEL ...] [--no-record]

Each command runs in a fresh process, twice: first right after the numba cache files of
the measured code were deleted (the first run after installing or changing it), then
again (every later run), with 2 threads (measure.thread_env).

- `dslide train` on the `small` preset (20,000 training points, 50,000 features, 20,000
  labels: an LSH output), hidden 128 and hidden 1024, 16 steps, no test set. Columns: the
  process's wall time; startup_s from metrics.json (process start to the end of the first
  step) and warmup_s (the first step alone).
- `dslide eval` of an amazon-like model (670,091 labels, hidden 128, trained 20 steps
  here) on 5,000 test points, exact scoring. Columns: wall time; startup_s (process start
  to the start of scoring), load_model_s (network construction and checkpoint),
  predict_s (the scoring, its first batch's compilation included).

--repo DIR=LABEL measures another checkout of dslide (say, the code before a change) with
this venv: DIR goes first on PYTHONPATH. Figures that a checkout does not report are '-'.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import measure as M

STEPS = 16


def _clear_numba_cache(repo: Path) -> int:
    n = 0
    for pkg in ("dslide", "lsh", "datasets"):
        for f in (repo / pkg).glob("__pycache__/*.nb[ic]"):
            f.unlink()
            n += 1
    return n


def _dslide(repo: Path, args: list[str]) -> float:
    """Run `python -m dslide ARGS` with `repo` first on the path; its wall seconds."""
    env = M.thread_env(2, PYTHONPATH=str(repo))
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "dslide", *args], capture_output=True, text=True, env=env, cwd=repo)
    wall = time.perf_counter() - t
    if p.returncode:
        raise SystemExit(f"dslide {' '.join(args)} failed in {repo}:\n{p.stderr[-3000:]}")
    return wall


def _prepare(work: Path) -> dict:
    files = {"small": work / "small", "amz": work / "amz", "model": work / "amz-model"}
    if not (work / "small_train.txt").exists():
        _dslide(M.ROOT, ["data", "gen", "--preset", "small", "--out", str(files["small"])])
    if not (work / "amz_train.txt").exists():
        _dslide(M.ROOT, ["data", "gen", "--preset", "amazon-like", "--points", "50000", "--out", str(files["amz"])])
    if not (files["model"] / "checkpoints" / "LATEST").exists():
        _dslide(M.ROOT, ["train", "--train", f"{files['amz']}_train.txt", "--out", str(files["model"]), "--quiet",
                         "--set", f"epochs={20 * 128 / 50000}"])
    return files


def measure(repo: Path, label: str, files: dict, work: Path) -> list[dict]:
    rows = []
    for hidden in (128, 1024):
        for run in ("first (numba cache cleared)", "again"):
            if run.startswith("first"):
                _clear_numba_cache(repo)
            out = work / f"run-{label}-{hidden}".replace(" ", "_")
            shutil.rmtree(out, ignore_errors=True)  # a fresh run directory: train refuses one holding a run
            wall = _dslide(repo, ["train", "--train", f"{files['small']}_train.txt", "--out", str(out), "--quiet",
                                  "--set", f"hidden={hidden}", "--set", f"epochs={STEPS * 128 / 20000}"])
            m = json.loads((out / "metrics.json").read_text())
            rows.append({"code": label, "command": f"train small, hidden {hidden}, {m['steps']} steps", "run": run,
                         "wall_s": wall, "startup_s": m.get("startup_s"), "warmup_s": m.get("warmup_s")})
    for run in ("first (numba cache cleared)", "again"):
        if run.startswith("first"):
            _clear_numba_cache(repo)
        wall = _dslide(repo, ["eval", "--model", str(files["model"]), "--data", f"{files['amz']}_test.txt"])
        m = json.loads((files["model"] / "metrics.json").read_text())["eval"]
        rows.append({"code": label, "command": f"eval amazon-like model (670,091 labels), {m['points']:,} points",
                     "run": run, "wall_s": wall, "startup_s": m.get("startup_s"),
                     "load_model_s": m.get("load_model_s"), "predict_s": m.get("predict_s")})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", help="keep data, model and runs here (default: a temporary directory)")
    p.add_argument("--repo", action="append", default=[], metavar="DIR=LABEL",
                   help="measure this checkout too (in the order given, this one last)")
    p.add_argument("--no-record", action="store_true", help="do not update docs/benchmarks.md")
    a = p.parse_args(argv)
    repos = [(Path(r.split("=", 1)[0]).resolve(), r.split("=", 1)[1] if "=" in r else r) for r in a.repo]
    repos.append((M.ROOT, "this checkout"))
    tmp = None if a.workdir else tempfile.TemporaryDirectory(prefix="bench_startup.")
    work = Path(a.workdir or tmp.name)
    work.mkdir(parents=True, exist_ok=True)
    try:
        files = _prepare(work)
        rows = [r for repo, label in repos for r in measure(repo, label, files, work)]
    finally:
        if tmp is not None:
            tmp.cleanup()

    def s(key):
        return lambda r: "-" if r.get(key) is None else f"{r[key]:.1f}"

    cols = [("code", "code"), ("command", "command"), ("run", "run"), ("wall s", s("wall_s")),
            ("startup_s", s("startup_s")), ("warmup_s (first step)", s("warmup_s")),
            ("load_model_s", s("load_model_s")), ("predict_s", s("predict_s"))]
    M.report("bench_startup", argv if argv is not None else sys.argv[1:], rows, cols, None, not a.no_record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
