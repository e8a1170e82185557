"""The bound of `--lsh`'s neighbour search (approx_postings, approx_features, approx_candidates).

    python -m scripts.bench_approx NAME=RUN_DIR,TEST [NAME=RUN_DIR,TEST ...] [--no-record]

For each trained run (a model that fuses its neighbours' labels) and its test file, in one
process with this machine's threads: the exact search of the neighbour store, then the pruned
search (dslide.infer.approx) under the defaults and under each setting halved and doubled in
turn. Per bound: the search's seconds over every test point (its pruned lists built first,
outside the timing), its recall of the exact search's neighbours, and the P@1 / P@5 of the
whole `--lsh` prediction (inference index and pruned search) against the exact prediction's.
The table is recorded in docs/benchmarks.md (section `bench_approx.py`).
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np
import scipy.sparse as sp

from . import measure as M

#: (postings, features, candidates) tried: the defaults, then each halved and doubled in turn
FACTORS = ((1, 1, 1), (0.5, 1, 1), (2, 1, 1), (1, 0.5, 1), (1, 2, 1), (1, 1, 0.5), (1, 1, 2))


def rows(name: str, run_dir: str, test_path: str) -> list[dict]:
    from dslide.comm import Comm
    from dslide.infer.approx import Bound
    from dslide.infer.predict import Fusion, predict_topk_scores
    from dslide.io.data import read_xmc
    from dslide.metrics import evaluate
    from dslide.session import load_model

    model = load_model(run_dir, Comm())
    test = read_xmc(test_path)
    Y = sp.csr_matrix(test.Y)
    fusion = Fusion.of(model)
    if fusion is None:
        raise SystemExit(f"{run_dir}: the model fuses no neighbours' labels; nothing to search")
    t = time.perf_counter()
    exact_ids, _ = fusion.store.neighbours(test.X, fusion.neighbours)
    exact_s = time.perf_counter() - t
    exact = evaluate(Y, predict_topk_scores(model, test.X, 5, exact=True)[0], k=5)
    out = [{"member": name, "bound": "exact search", "search s": f"{exact_s:.2f}", "recall": "1.0000",
            "P@1": f"{exact['p@1']:.4f}", "P@5": f"{exact['p@5']:.4f}"}]
    base = Bound.of(model.config)
    for fp, ff, fc in FACTORS:
        b = Bound(int(base.postings * fp), int(base.query_features * ff), int(base.candidates * fc))
        fusion.store.drop_derived()
        fusion.store.neighbours(test.X[:1], fusion.neighbours, approx=b)  # the pruned lists, untimed
        t = time.perf_counter()
        ids, _ = fusion.store.neighbours(test.X, fusion.neighbours, approx=b)
        secs = time.perf_counter() - t
        recall = float(np.mean([np.isin(exact_ids[q], ids[q]).mean() for q in range(ids.shape[0])]))
        model.config = dataclasses.replace(model.config, approx_postings=b.postings,
                                           approx_features=b.query_features, approx_candidates=b.candidates)
        m = evaluate(Y, predict_topk_scores(model, test.X, 5, exact=False)[0], k=5)
        label = f"{b.postings} / {b.query_features} / {b.candidates}" + (" (defaults)" if b == base else "")
        out.append({"member": name, "bound": label, "search s": f"{secs:.2f}", "recall": f"{recall:.4f}",
                    "P@1": f"{m['p@1']:.4f}", "P@5": f"{m['p@5']:.4f}"})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", metavar="NAME=RUN_DIR,TEST")
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args()
    table = []
    for spec in args.runs:
        name, _, rest = spec.partition("=")
        run_dir, _, test = rest.partition(",")
        if not (name and run_dir and test):
            raise SystemExit(f"bench_approx: {spec!r} must be NAME=RUN_DIR,TEST")
        table += rows(name, run_dir, test)
        print(f"{name} done", flush=True)
    cols = ["member", "bound", "search s", "recall", "P@1", "P@5"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(r[c] for c in cols) + " |" for r in table]
    text = (f"command: `python -m scripts.bench_approx {' '.join(args.runs)}`\n\nmachine: {M.machine()}; code: {M.code_version()}\n\n"
            "bound: approx_postings / approx_features / approx_candidates; search s: the neighbour search over "
            "every test point, one process; recall: of the exact search's neighbours; P@1 / P@5: of the whole "
            "prediction, exact in the first row, --lsh in the others\n\n" + "\n".join(lines) + "\n")
    print(text)
    if not args.no_record:
        M.record("bench_approx.py", text)


if __name__ == "__main__":
    main()
