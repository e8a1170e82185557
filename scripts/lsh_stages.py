"""Seconds of each stage of a prediction, exact and `--lsh`, and what `--lsh` loses against exact.

    mpiexec -n 2 python -m mpi4py -m scripts.lsh_stages RUN_DIR TEST_DATA [--json]
    NUMBA_CACHE_DIR=$(mktemp -d) python -m scripts.lsh_stages RUN_DIR TEST_DATA   (an empty cache)

Both modes run the pipeline (dslide.infer.predict.predict_topk_scores) on
every test point, after a call on a few points that compiles what numba's
cache lacks; its stages report their seconds (dslide.timings: the hidden
layers, the output's top k, the merge over ranks, the neighbour store's two
searches and the fusion kernel), the slowest rank's are printed. Then:
recall of the exact top 10 in the `--lsh` top 10, P@1 and P@5 of both, and,
where the model fuses a neighbour store, the recall of the exact search's
neighbours in the approximate search's (dslide.infer.approx). A model whose
output layer is dense has no index: `--lsh` is refused there (dslide.session)
and its row is the exact path; an LSH output narrower than lsh.index_min_width
has none either, and its `--lsh` row scores every label with the bounded
search. scripts/bench_lsh.py --fused gathers these over members, with
`dslide predict`'s seconds end to end.
"""

import argparse
import json
import time

import numpy as np
import scipy.sparse as sp

import dslide
from dslide.session import load_model
from dslide.comm import Comm
from dslide.infer.predict import Fusion, predict_topk_scores
from dslide.metrics import evaluate

STAGES = ("predict_hidden", "predict_output", "predict_merge", "fusion_neighbours", "fusion_prototypes",
          "fusion_fuse")


def recall(pred, exact, k: int = 10) -> float:
    """Mean over points of the share of exact's top k (ids >= 0) found in pred's top k."""
    hits = [np.isin(e[e >= 0], p).mean() for e, p in zip(exact[:, :k], pred[:, :k]) if (e >= 0).any()]
    return float(np.mean(hits)) if hits else 1.0


def measure(run_dir: str, data_path: str, k: int = 10) -> dict:
    comm = Comm.world()
    model = load_model(run_dir, comm)
    data = dslide.read_data(data_path)
    X, Y = sp.csr_matrix(data.X), sp.csr_matrix(data.Y)
    out = model.network.layers[-1]
    # an LSH output too narrow for an index (lsh.index_min_width) takes --lsh too: its labels scored
    # exactly, the neighbours' search bounded
    lsh_ok = out.kind == "lsh" and (model.index is not None or out.too_narrow_for_index())
    result = {"points": data.n_points, "labels": model.n_labels, "output": out.kind,
              "fused": Fusion.of(model) is not None, "ranks": comm.size}
    preds = {}
    for mode in ("exact", "lsh"):
        exact = mode == "exact" or not lsh_ok
        predict_topk_scores(model, X[:64], k, exact=exact)  # compiles outside the timings
        before = {s: model.timings[s] for s in STAGES}
        comm.barrier()
        t0 = time.perf_counter()
        ids, _ = predict_topk_scores(model, X, k, exact=exact)
        secs = time.perf_counter() - t0
        stages = {s: max(comm.allgather_object(model.timings[s] - before[s])) for s in STAGES}
        m = evaluate(Y, ids, k=5)
        preds[mode] = ids
        result[mode] = {"seconds": max(comm.allgather_object(secs)), **stages, "p@1": m["p@1"], "p@5": m["p@5"]}
    result["recall@10"] = recall(preds["lsh"], preds["exact"], k)
    fusion = Fusion.of(model)
    if fusion is not None:  # the approximate neighbours against the exact ones
        e_ids, _ = fusion.store.neighbours(X, fusion.neighbours, comm)
        a_ids, _ = fusion.store.neighbours(X, fusion.neighbours, comm, approx=fusion.bound)
        result["neighbours"] = fusion.neighbours
        result["neighbour_recall"] = recall(a_ids, e_ids, fusion.neighbours)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", help="a run directory")
    ap.add_argument("test_data", help="the points to score (with their labels)")
    ap.add_argument("--json", action="store_true", help="one line 'RESULT <json>' (scripts/bench_lsh.py --fused)")
    a = ap.parse_args()
    r = measure(a.run_dir, a.test_data)
    if Comm.world().rank != 0:
        return
    if a.json:
        print("RESULT " + json.dumps(r), flush=True)
        return
    for mode in ("exact", "lsh"):
        print(f"{mode}: " + ", ".join(f"{s} {r[mode][s]:.2f} s" for s in STAGES)
              + f"; in all {r[mode]['seconds']:.2f} s; P@1 {r[mode]['p@1']:.4f} P@5 {r[mode]['p@5']:.4f}")
    print(f"recall@10 of exact in --lsh: {r['recall@10']:.4f}"
          + (f"; neighbour recall@{r['neighbours']}: {r['neighbour_recall']:.4f}" if "neighbours" in r else ""))


if __name__ == "__main__":
    main()
