"""`dslide eval`: P@k, nDCG@k and PSP@k of a trained model on a data file.

PSP@k weighs labels by the training labels' propensities saved with the run
(dslide.propensity), never by the evaluated file's. The figures are printed,
then saved in --out or in the model's metrics.json (one evaluation per data
file, keyed by its path, each naming its files and their sha256).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from dslide.cli import common
from dslide.session import UsageError

EXAMPLES = """examples:
  dslide eval --model runs/small --data data/small_test.txt
  dslide eval --model runs/amz --data tst_X_Xf.txt --lsh --k 5 --propensity amazon
  dslide eval --model deploy/small --data data/small_test.txt --out small_eval.json"""


def add_parser(command) -> None:
    from dslide.config import PROPENSITY_PRESETS

    e = command("eval", "evaluate a trained model: P@k, nDCG@k, PSP@k", EXAMPLES)
    common.add_model_options(e, exact_flag=True)
    e.add_argument("--propensity", choices=tuple(PROPENSITY_PRESETS),
                   help="PSP@k with this preset's A, B, recomputed from the training labels' counts saved with "
                        "the run (default: the constants the run was trained with)")
    e.add_argument("--propensity-a", type=float, metavar="A", help="PSP@k with this A (with --propensity-b)")
    e.add_argument("--propensity-b", type=float, metavar="B", help="PSP@k with this B")
    e.add_argument("--out", metavar="METRICS.json",
                   help="write the metrics here (default: the model's metrics.json, where it can be written)")


def run(args, comm) -> int:
    import scipy.sparse as sp

    import dslide
    from dslide import propensity
    from dslide import train as T
    from dslide.infer.predict import predict_topk_scores
    from dslide.metrics import evaluate

    common.check_out(args)
    t_load = time.perf_counter()
    model = common.load_model(args.model, comm, args.k)
    load_s = time.perf_counter() - t_load
    common.check_scoring(model, args)
    data = common.read_accepted(args.data, "--data", lambda d: _check_shape(d, model, args.data), args.format,
                                model.n_features, model.n_labels, comm=comm, quiet=getattr(args, "quiet", False))
    # the training labels' propensities, saved with the run: never the evaluated file's
    props = propensity.load(args.model, model.n_labels)
    if props is not None and (args.propensity or args.propensity_a is not None or args.propensity_b is not None):
        from dslide.config import PROPENSITY_PRESETS

        a, b = PROPENSITY_PRESETS[args.propensity or "default"] if args.propensity else (props["A"], props["B"])
        a = a if args.propensity_a is None else args.propensity_a
        b = b if args.propensity_b is None else args.propensity_b
        props = propensity.with_constants(props, a, b)  # from the saved training counts
    t0 = time.perf_counter()
    stats = {}
    bar = common.points_bar(comm, data.n_points, args, "scoring")
    pred = predict_topk_scores(model, data.X, args.k, exact=not args.lsh, stats=stats,
                                 progress=bar.update if bar else None)[0]
    if bar:
        bar.close()
    dt = time.perf_counter() - t0
    m = evaluate(sp.csr_matrix(data.Y), pred, k=args.k, inv_prop=None if props is None else props["inv_prop"])
    m.update({"propensity": None if props is None else propensity.describe(props),
              "mode": "lsh" if args.lsh else "exact", "points": data.n_points, "predict_s": dt,
              "scored_share": stats["scored_share"],
              "samples_per_s": data.n_points / max(dt, 1e-9), "world_size": comm.size,
              # seconds from the process's start until scoring began, and of it loading the model
              "startup_s": max(comm.allgather_object(t0 - dslide.IMPORTED_AT)),
              "load_model_s": max(comm.allgather_object(load_s)),
              "peak_rss_mb": comm.allgather_object(round(T.peak_rss_mb(), 1))})
    if comm.rank == 0:  # the figures first: writing them down may fail
        ks = range(1, args.k + 1)
        print("  ".join(f"P@{k} {m[f'p@{k}']:.4f}" for k in ks))
        print("  ".join(f"nDCG@{k} {m[f'ndcg@{k}']:.4f}" for k in ks))
        if "psp@1" in m:
            print("  ".join(f"PSP@{k} {m[f'psp@{k}']:.4f}" for k in ks) + f"  ({m['propensity']})")
        else:
            print(f"PSP@k left out: {propensity.path_in(args.model)} is missing (the run was trained on "
                  f"fewer than 3 points, or before runs saved their training labels' propensities)")
        print(f"{data.n_points:,} points in {dt:.2f}s ({m['mode']} scoring: "
              f"{100 * m['scored_share']:.2f}% of the labels scored per point), after {m['startup_s']:.1f}s of "
              f"start-up ({m['load_model_s']:.1f}s loading the model)", flush=True)
        _save_eval(args, m)
    return 0


def _save_eval(args, m: dict) -> None:
    """The evaluation into --out, or into the model's metrics.json where that can be written
    (the directory writable, no run holding its lock); otherwise a note on stderr.

    metrics.json keeps one evaluation per data file under "evals" (keyed by its absolute path,
    "FEATURES,LABELS" for a pair), and the latest under "eval": an eval of another file never
    replaces the figures of the test file. Each names its file(s) and their sha256."""
    from dslide.io import rundir

    m = {**common.data_files(args.data), **m}
    if args.out:
        rundir.write_atomic(args.out, rundir.dumps({"model": str(args.model), "eval": m}, indent=1) + "\n")
        return
    target = Path(args.model, "metrics.json")
    why = None
    if not os.access(args.model, os.W_OK):
        why = f"{args.model} is not writable"
    else:
        try:
            with rundir.RunLock.acquire(args.model, "dslide eval"):
                old = _old_metrics(args.model)
                evals = old.get("evals") if isinstance(old.get("evals"), dict) else {}
                key = ",".join(f["path"] for f in m["files"])
                new = {**old, "eval": m, "evals": {**evals, key: m}}
                rundir.write_atomic(target, rundir.dumps(new, indent=1) + "\n")
        except (ValueError, OSError) as e:
            why = str(e)
    if why is not None:
        print(f"dslide: the metrics above are not saved in {target} ({why}); --out FILE saves them elsewhere",
              file=sys.stderr, flush=True)


def _old_metrics(run_dir) -> dict:
    p = Path(run_dir, "metrics.json")
    try:
        old = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return {k: v for k, v in old.items() if k != "eval"} if isinstance(old, dict) else {}


def _check_shape(data, model, path):
    if data.n_features != model.n_features:
        raise UsageError(f"{path} has {data.n_features} features; the model was trained on {model.n_features}")
    if data.n_labels != model.n_labels:
        raise UsageError(f"{path} has {data.n_labels} labels; the model was trained on {model.n_labels}")
