"""omikuji (Parabel) and napkinXC (PLT) on dslide's data files, scored by dslide's metrics code.

    .venv/bin/python -m scripts.bench_trees --train T.txt --test S.txt [--threads 2] [--trees 1,3]

`run_tree` trains one library in a child process under the baselines' venv
(`python -m scripts._tree_train`, installed on demand by scripts/_baselines.py; when
the library cannot be had the result is `{"available": False, "reason": ...}`),
reads back its top 5 per test point and timings, and `score` computes P@k,
nDCG@k and PSP@k with `dslide.metrics.evaluate`, the function dslide's own
rows use, with propensities from the training labels. Importing this module
needs neither library. The suites of scripts/bench.py use it (peers, shapes).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from . import _baselines as BL
from . import measure as M

SYSTEMS = ("omikuji", "napkinxc", "pecos")
K = 5


def read_result(result_path, topk_path, n_test: int, n_labels: int) -> dict:
    """The child's JSON summary and its top-5 array, checked: int [n_test, 5], labels in [-1, n_labels)."""
    try:
        result = json.loads(Path(result_path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{result_path}: no readable result ({e})") from None
    missing = [k for k in ("system", "version", "train_s", "predict_s", "load_s") if k not in result]
    if missing:
        raise ValueError(f"{result_path}: missing {', '.join(missing)}")
    top = np.load(topk_path)
    if top.shape != (n_test, K) or not np.issubdtype(top.dtype, np.integer):
        raise ValueError(f"{topk_path}: expected int [{n_test}, {K}] top labels, got {top.dtype} {top.shape}")
    if top.size and (top.min() < -1 or top.max() >= n_labels):
        raise ValueError(f"{topk_path}: labels must be in [-1, {n_labels}), got {top.min()}..{top.max()}")
    return {**result, "topk": top.astype(np.int64)}


def score(topk: np.ndarray, Y_test, inv_prop=None) -> dict:
    """P@1..5, nDCG@1..5 (and PSP@1..5, PSnDCG@1..5 with inv_prop) of a top-5 array, by dslide.metrics."""
    from dslide.metrics import evaluate

    return evaluate(sp.csr_matrix(Y_test), topk, k=K, inv_prop=inv_prop)


def run_tree(system: str, train_path, test_path, *, n_test: int, n_labels: int, threads: int = 2,
             trees: int = 3, seed: int = 0, workdir, python=None, timeout: float | None = None) -> dict:
    """Train `system` ("omikuji", "napkinxc" or "pecos") on train_path, predict test_path's top 5.

    Returns {"available": False, "reason"} when the library cannot be had, else
    {"available": True, system, version, params, load_s, train_s, predict_s,
    peak_rss_mb, topk int64 [n_test, 5], command}. Raises RuntimeError (with the
    end of the library's log) when the child fails, ValueError on a bad result.
    """
    if system not in SYSTEMS:
        raise ValueError(f"system ({system!r}) must be one of {', '.join(SYSTEMS)}")
    if threads < 1 or trees < 1:
        raise ValueError(f"threads ({threads}) and trees ({trees}) must be >= 1")
    if python is None:
        py, info = BL.python_with(system)
    else:
        ok, info = BL.probe(python, system)
        py = str(python) if ok else None
    if py is None:
        return {"available": False, "reason": info}
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    tag = f"{system}-{trees}" if system == "omikuji" else system
    topk, result, log = work / f"{tag}_top.npy", work / f"{tag}.json", work / f"{tag}.log"
    for f in (topk, result):
        f.unlink(missing_ok=True)
    # paths made absolute: the trainer runs in the repository root
    cmd = BL.trainer_cmd(py, "_tree_train", "--system", system, "--train", Path(train_path).resolve(),
                         "--test", Path(test_path).resolve(), "--threads", threads, "--trees", trees, "--seed", seed,
                         "--model-dir", (work / f"{tag}-model").resolve(), "--topk", topk.resolve(),
                         "--result", result.resolve())
    with open(log, "w") as out:  # omikuji draws a progress bar per example: keep it out of the pipes
        p = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=BL.child_env(threads), cwd=M.ROOT,
                           timeout=timeout)
    if p.returncode != 0:
        tail = log.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"{system} failed (exit {p.returncode}); the end of {log}:\n{tail}")
    r = read_result(result, topk, n_test, n_labels)
    return {"available": True, **r, "command": " ".join(cmd[1:])}


def main(argv=None) -> int:
    from dslide.io.data import read_xmc
    from dslide.metrics import inverse_propensity

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", required=True)
    ap.add_argument("--test", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--trees", default="3", help="omikuji tree counts, comma-separated")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--workdir", default=str(M.ROOT / "runs" / "bench_trees"))
    a = ap.parse_args(argv)
    train, test = read_xmc(a.train), read_xmc(a.test)
    inv = inverse_propensity(train.Y)
    print("| system | train s | predict s | P@1 | P@3 | P@5 | PSP@1 | PSP@3 | PSP@5 |\n|---|---|---|---|---|---|---|---|---|")
    for system in a.systems.split(","):
        for trees in ([int(t) for t in a.trees.split(",")] if system == "omikuji" else [1]):
            r = run_tree(system, a.train, a.test, n_test=test.n_points, n_labels=test.n_labels, threads=a.threads,
                         trees=trees, workdir=a.workdir)
            if not r["available"]:
                print(f"{system} left out: {r['reason']}")
                continue
            m = score(r["topk"], test.Y, inv)
            print(f"| {system} {r['version']}" + (f", {trees} trees" if system == "omikuji" else "")
                  + f" | {r['train_s']:.1f} | {r['predict_s']:.1f} | "
                  + " | ".join(f"{m[f'{p}@{k}']:.4f}" for p in ("p", "psp") for k in (1, 3, 5)) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
