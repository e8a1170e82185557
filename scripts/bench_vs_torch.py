"""dslide's network trained by PyTorch: the dense full-softmax reference on the CPU.

    .venv/bin/python -m scripts.bench_vs_torch --data small --threads 1,2 --lr 1e-2 \\
        --epochs 10 --time-budget 120 --eval-every 20 --target-p1 0.75
    .venv/bin/python -m scripts.bench_vs_torch --data amazon-like --points 20000 \\
        --test-points 1000 --eval-points 1000 --threads 1,2 --time-budget 120

PyTorch never enters the project's venv. On first use this script makes the
baselines' venv, `.venv-baselines/` beside `.venv/` (scripts/_baselines.py),
and installs exactly `torch==2.13.0 numpy` into it (a CPU wheel of that version
is on this machine's disk; an unpinned `torch` would fetch a multi-GB CUDA
build). Later runs reuse it when torch imports there. When torch cannot be had, one
line says why and the result is `{"available": false, "reason": ...}`; the
script then exits 0, so a benchmark suite goes on without PyTorch.

The training itself runs in a child process, `python -m scripts._torch_train`
under the torch venv's python in the repository root (its docstring defines
the network, loss, optimiser and sample order, all dslide's), with the thread
variables (measure.thread_env) set to the thread count and OMP_WAIT_POLICY=PASSIVE (`--omp-wait-policy`; see
`run_torch`: without it a busy core elsewhere made 2-thread runs 2-5x slower). The data go to it as one `.npz` per split (`export_npz`),
so the trainer needs neither scipy, numba nor dslide.

Presets come from `dslide.datasets.synthetic.generate_split` (`small`: 50,000
features, 20,000 labels; `amazon-like`: 135,909 features, 670,091 labels;
`tiny`); any other `--data` is a path prefix of `PREFIX_train.txt` and
`PREFIX_test.txt` in the XMC text format. The printed markdown table has one
row per (thread count, repeat): the trainer's options, data shape, threads,
samples/s (first 3 steps excluded as warm-up), P@1/P@3/P@5 at the end, the
training time to the first evaluation reaching `--target-p1` (measure.time_to),
and peak RSS.

`run_torch` is the function the benchmark suites import; importing this
module needs no torch.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from dslide.io.data import XMCData

from . import _baselines as BL
from . import measure as M

TORCH_VENV = BL.VENV
TORCH_REQUIREMENTS = BL.REQUIREMENTS["torch"]
PRESETS = ("tiny", "small", "amazon-like", "amazon-tail")


# --------------------------------------------------------------------------- data exchange


def export_npz(data: XMCData, path) -> None:
    """Write `data` as the trainer's input: indptr, indices, data, y_indptr, y_indices, shape.

    indptr/y_indptr int64 [n+1], indices/y_indices int32, data float32 (X's
    values bit for bit), shape int64 (n_points, n_features, n_labels). Labels are
    a pattern: every stored value of Y must be 1 (as `read_xmc` and the
    synthetic generator produce), otherwise the file could not round-trip.
    """
    X = sp.csr_matrix(data.X)
    Y = sp.csr_matrix(data.Y)
    if X.shape[0] != Y.shape[0]:
        raise ValueError(f"X has {X.shape[0]} rows but Y has {Y.shape[0]}; they must match")
    if Y.nnz and not np.all(Y.data == 1):
        bad = Y.data[Y.data != 1][0]
        raise ValueError(f"Y holds the value {bad!r}; only 1 (a label is present) can be exported")
    np.savez(
        path,
        indptr=X.indptr.astype(np.int64), indices=X.indices.astype(np.int32),
        data=X.data.astype(np.float32),
        y_indptr=Y.indptr.astype(np.int64), y_indices=Y.indices.astype(np.int32),
        shape=np.array([X.shape[0], X.shape[1], Y.shape[1]], dtype=np.int64),
    )


def import_npz(path) -> XMCData:
    """Read a file written by `export_npz` back into XMCData (X, Y csr float32)."""
    with np.load(path) as f:
        n, n_features, n_labels = (int(v) for v in f["shape"])
        X = sp.csr_matrix((f["data"], f["indices"], f["indptr"]), shape=(n, n_features), dtype=np.float32)
        yi = f["y_indices"]
        Y = sp.csr_matrix((np.ones(yi.shape[0], dtype=np.float32), yi, f["y_indptr"]),
                          shape=(n, n_labels), dtype=np.float32)
    return XMCData(X, Y)


# --------------------------------------------------------------------------- the torch venv (scripts/_baselines.py)


def _policy(omp_wait_policy: str | None) -> dict:
    return {} if omp_wait_policy is None else {"OMP_WAIT_POLICY": omp_wait_policy}


def _child_env(threads: int | None = None, omp_wait_policy: str | None = None) -> dict:
    """The environment the trainer runs under with `threads` threads (see run_torch)."""
    return BL.child_env(threads, **_policy(omp_wait_policy))


def trainer_cmd(python, *args) -> list[str]:
    """The trainer (`python -m scripts._torch_train ARGS`) under `python`: run it with cwd=measure.ROOT
    and env=_child_env(...)."""
    return BL.trainer_cmd(python, "_torch_train", *args)


def probe_torch(python) -> tuple[bool, str]:
    """(True, torch version) when `python` imports torch and numpy, else (False, why not)."""
    return BL.probe(python, "torch")


def torch_python(venv=None, *, install: bool = True, quiet: bool = False) -> tuple[str | None, str]:
    """The python of the baselines' venv with torch, made on demand: (path, torch version) or (None, reason).

    Reuses `venv` (default TORCH_VENV, i.e. .venv-baselines) when torch imports
    there; otherwise (if `install`) creates it and pip-installs TORCH_REQUIREMENTS.
    """
    return BL.python_with("torch", TORCH_VENV if venv is None else venv, requirements=TORCH_REQUIREMENTS,
                          install=install, quiet=quiet)


# --------------------------------------------------------------------------- running


def _check(name, value, ok, valid):
    if not ok:
        raise ValueError(f"{name} ({value!r}) must be {valid}")


def run_torch(train: XMCData, test: XMCData | None, *, hidden: int = 128, lr: float = 1e-3,
              batch_size: int = 256, epochs: float = 1.0, time_budget: float | None = None,
              threads: int = 1, seed: int = 0, dropout: float = 0.0, init_input_scale: float = 0.1,
              eval_every: int = 0, eval_points: int = 2000, workdir, python=None,
              omp_wait_policy: str | None = "PASSIVE", extra_args=(), timeout: float | None = None) -> dict:
    """Train dslide's network with PyTorch (`scripts._torch_train`) on `train`; evaluate on `test`.

    Returns a dict. Always `available` (bool); when False, `reason` (torch could
    not be installed or, with `python` given, that python cannot import it).
    When True: samples_per_s (training samples / training time, the first 3
    steps excluded as warm-up), p@1, p@3, p@5 (final, on the first `eval_points`
    test points; None without `test`), log (list of the JSONL records: step,
    epoch, samples, wall_s, loss, p@k at evaluation points), peak_rss_mb,
    torch_version, threads, steps, samples, train_s, stopped_by ("steps" or
    "time_budget"), command (the child's command line with its thread
    variables), omp_wait_policy.

    python: the interpreter to run the trainer with (no install is tried);
    default: `.venv-baselines`'s, created on demand. extra_args: more trainer
    options (e.g. ("--first-layer", "sparse_mm")). workdir: where the .npz
    inputs and the log go (one run at a time per workdir). The trainer runs in
    the repository root: relative paths in extra_args are read from there. Raises RuntimeError
    when the trainer itself fails, subprocess.TimeoutExpired after `timeout` s.

    The child runs with the thread variables (measure.thread_env) set to `threads`, and with OMP_WAIT_POLICY = omp_wait_policy ("PASSIVE",
    "ACTIVE", or None: whatever the environment says). PASSIVE by default:
    measured here, whenever another process was busy on one of the 2 cores,
    2 threads ran 2-5x slower without it (idle OpenMP threads spinning for a
    core that is not theirs), while on a quiet machine it cost nothing
    measurable; so the PyTorch figure stays the same on a shared machine.
    """
    _check("hidden", hidden, isinstance(hidden, int) and hidden >= 1, "an integer >= 1")
    _check("lr", lr, lr > 0, "> 0")
    _check("batch_size", batch_size, isinstance(batch_size, int) and batch_size >= 1, "an integer >= 1")
    _check("epochs", epochs, epochs > 0, "> 0")
    _check("time_budget", time_budget, time_budget is None or time_budget > 0, "None or > 0")
    _check("threads", threads, isinstance(threads, int) and threads >= 1, "an integer >= 1")
    _check("dropout", dropout, 0 <= dropout < 1, "in [0, 1)")
    _check("init_input_scale", init_input_scale, init_input_scale > 0, "> 0")
    _check("eval_every", eval_every, eval_every >= 0, ">= 0")
    _check("eval_points", eval_points, eval_points >= 0, ">= 0")
    _check("omp_wait_policy", omp_wait_policy, omp_wait_policy in (None, "ACTIVE", "PASSIVE"),
           "None, 'ACTIVE' or 'PASSIVE'")
    if test is not None and (test.n_features, test.n_labels) != (train.n_features, train.n_labels):
        raise ValueError(f"test has (features, labels) = {(test.n_features, test.n_labels)}, train "
                         f"{(train.n_features, train.n_labels)}; they must match")

    if python is None:
        py, info = torch_python()
    else:
        ok, info = probe_torch(python)
        py = str(python) if ok else None
    if py is None:
        return {"available": False, "reason": info, "command": None}

    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    train_path, test_path, log_path = workdir / "train.npz", workdir / "test.npz", workdir / "torch_log.jsonl"
    export_npz(train, train_path)
    cmd = trainer_cmd(py, "--train", train_path)
    if test is not None:
        export_npz(test, test_path)
        cmd += ["--test", str(test_path)]
    cmd += ["--hidden", str(hidden), "--lr", repr(float(lr)), "--batch-size", str(batch_size),
            "--epochs", repr(float(epochs)), "--threads", str(threads), "--seed", str(seed),
            "--dropout", repr(float(dropout)), "--init-input-scale", repr(float(init_input_scale)),
            "--eval-every", str(eval_every), "--eval-points", str(eval_points), "--log", str(log_path)]
    if time_budget is not None:
        cmd += ["--time-budget", repr(float(time_budget))]
    cmd += [str(a) for a in extra_args]
    policy = omp_wait_policy or os.environ.get("OMP_WAIT_POLICY") or None
    env_vars = M.thread_env(threads, {}, **_policy(policy))
    r = subprocess.run(cmd, capture_output=True, text=True, env=_child_env(threads, policy), cwd=M.ROOT,
                       timeout=timeout)
    if r.returncode != 0:
        tail = "\n".join(r.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"the PyTorch trainer failed (exit {r.returncode}): {shlex.join(cmd)}\n{tail}")
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    with open(log_path) as f:
        log = [json.loads(line) for line in f if line.strip()]
    shown = " ".join(f"{k}={v}" for k, v in env_vars.items())
    return {"available": True, **summary, "log": log, "command": f"{shown} {shlex.join(cmd)}",
            "omp_wait_policy": policy}


# --------------------------------------------------------------------------- command line


def load_data(spec: str, points: int | None, test_points: int | None, seed: int) -> tuple[XMCData, XMCData]:
    """(train, test): a synthetic preset, or `spec`_train.txt / `spec`_test.txt cut to the first N points."""
    if spec in PRESETS:
        from dslide.datasets.synthetic import generate_split  # noqa: PLC0415  (numba compiles on import of use)

        return generate_split(spec, points, test_points, seed)
    from dslide.io.data import read_xmc  # noqa: PLC0415

    paths = [Path(f"{spec}_{s}.txt") for s in ("train", "test")]
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise ValueError(f"--data {spec!r} is neither a preset ({', '.join(PRESETS)}) nor a path prefix "
                         f"with {' and '.join(missing)}")
    train, test = (read_xmc(p) for p in paths)

    def head(d, m):
        return d if m is None else XMCData(d.X[:m], d.Y[:m])

    return head(train, points), head(test, test_points)


def _short_command(cmd: str) -> str:
    """The trainer's options without the interpreter, the file paths and the thread variables."""
    parts = shlex.split(cmd)
    while parts and "=" in parts[0] and not parts[0].startswith("-"):
        parts.pop(0)
    out, skip = [], False
    for a in parts[3:]:  # after python -m scripts._torch_train
        if skip:
            skip = False
            continue
        if a in ("--train", "--test", "--log"):
            skip = True
            continue
        out.append(a)
    return "_torch_train.py " + " ".join(out)


def _fmt(v, spec):
    return "-" if v is None else format(v, spec)


def format_table(rows, target_p1=None) -> str:
    """Markdown table of `run_torch` results (each with an added "data" entry)."""
    head = ["command", "data (n, features, labels)", "threads", "samples/s", "steps", "train s",
            "P@1", "P@3", "P@5"]
    if target_p1 is not None:
        head.append(f"train s to P@1 >= {target_p1:g}")
    head.append("peak MB")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        policy = f"OMP_WAIT_POLICY={r['omp_wait_policy']} " if r.get("omp_wait_policy") else ""
        cells = [f"`{policy}{_short_command(r['command'])}`", r["data"], str(r["threads"]),
                 _fmt(r["samples_per_s"], ",.0f"), str(r["steps"]), _fmt(r["train_s"], ".1f"),
                 _fmt(r["p@1"], ".4f"), _fmt(r["p@3"], ".4f"), _fmt(r["p@5"], ".4f")]
        if target_p1 is not None:
            t = M.time_to(r["log"], target_p1)
            ep = next((rec["epoch"] for rec in r["log"] if rec.get("wall_s") == t), None)
            cells.append("not reached" if t is None else f"{t:.1f} (epoch {ep:.1f})")
        cells.append(_fmt(r["peak_rss_mb"], ",.0f"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="small", help=f"a preset ({', '.join(PRESETS)}) or PATH_PREFIX")
    ap.add_argument("--points", type=int, default=None, help="train points (default: the preset's / all)")
    ap.add_argument("--test-points", type=int, default=None, help="test points (default: the preset's / all)")
    ap.add_argument("--data-seed", type=int, default=0, help="seed of the synthetic data")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--time-budget", type=float, default=None, help="seconds of training time at most")
    ap.add_argument("--threads", default="1", help="thread counts, comma-separated (one run each)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--init-input-scale", type=float, default=0.1)
    ap.add_argument("--eval-every", type=int, default=0)
    ap.add_argument("--eval-points", type=int, default=2000)
    ap.add_argument("--target-p1", type=float, default=None, help="report the training time to this P@1")
    ap.add_argument("--repeat", type=int, default=1, help="runs per thread count (the machine may be shared)")
    ap.add_argument("--omp-wait-policy", default="PASSIVE", choices=("ACTIVE", "PASSIVE", "env"),
                    help="OMP_WAIT_POLICY of the trainer (default PASSIVE, see run_torch; env: leave it)")
    ap.add_argument("--python", default=None, help="python with torch to use (default: .venv-baselines')")
    ap.add_argument("--workdir", default=str(M.ROOT / "runs" / "bench_vs_torch"))
    ap.add_argument("--json", default=None, help="also write the results (list of dicts) to this file")
    ap.add_argument("trainer_args", nargs="*", help="after --: more _torch_train.py options")
    args = ap.parse_args(argv)
    try:
        thread_counts = [int(t) for t in args.threads.split(",")]
    except ValueError:
        ap.error(f"--threads ({args.threads!r}) must be comma-separated integers, e.g. 1,2")

    def finish(results):
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)

    if args.python is None:
        py, info = torch_python()
    else:
        ok, info = probe_torch(args.python)
        py = args.python if ok else None
    if py is None:
        print(f"[bench_vs_torch] PyTorch is not available, skipping the PyTorch reference: {info}")
        result = {"available": False, "reason": info}
        print(json.dumps(result))
        finish([result])
        return 0

    t0 = time.perf_counter()
    train, test = load_data(args.data, args.points, args.test_points, args.data_seed)
    shape = f"{train.n_points:,} / {test.n_points:,}, {train.n_features:,}, {train.n_labels:,}"
    print(f"[bench_vs_torch] data {args.data}: train/test {shape} ({time.perf_counter() - t0:.1f} s); "
          f"torch {info}", file=sys.stderr, flush=True)
    results = []
    for threads in thread_counts:
        for rep in range(args.repeat):
            r = run_torch(train, test, hidden=args.hidden, lr=args.lr, batch_size=args.batch_size,
                          epochs=args.epochs, time_budget=args.time_budget, threads=threads, seed=args.seed,
                          dropout=args.dropout, init_input_scale=args.init_input_scale,
                          eval_every=args.eval_every, eval_points=args.eval_points,
                          workdir=args.workdir, python=py,
                          omp_wait_policy=None if args.omp_wait_policy == "env" else args.omp_wait_policy,
                          extra_args=args.trainer_args)
            r["data"] = f"{args.data}: {shape}"
            print(f"[bench_vs_torch] threads {threads} run {rep + 1}: {_fmt(r['samples_per_s'], ',.0f')} "
                  f"samples/s, P@1 {_fmt(r['p@1'], '.4f')}", file=sys.stderr, flush=True)
            results.append(r)
    print(format_table(results, args.target_p1))
    finish(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
