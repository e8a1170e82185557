"""A tree-based extreme classifier trained as a new user would: omikuji (Parabel), napkinXC (PLT) or PECOS (XR-Linear).

Runs inside `.venv-baselines` (scripts/_baselines.py) and imports only the
library, numpy, the standard library (napkinXC brings scipy) and
scripts/measure.py (the standard library only); from the repository root:

    .venv-baselines/bin/python -m scripts._tree_train --system omikuji --trees 3 --train T.txt \\
        --test S.txt --threads 2 --topk top.npy --result r.json

Both read the Extreme Classification Repository text files dslide reads.
Their defaults are kept except the thread count, the seed and, for omikuji,
the number of trees (its default is 3):

* omikuji: `Model.default_hyper_param()` (Parabel: balanced 2-means label
  tree, linear hinge-loss classifiers, beam 10 at prediction). The file is
  loaded with omikuji's own reader and trained on in two timed calls (the
  library's `train_on_data` does both; its `lib.load_omikuji_data_set` and
  `lib.train_omikuji_model` are the same two steps), then each test point
  (parsed here from the same file) goes through `Model.predict`.
* napkinXC: `napkinxc.models.PLT` with its defaults (hierarchical 2-means tree,
  liblinear logistic nodes, exact search) and `seed`; data from
  `napkinxc.datasets.load_libsvm_file`.

* PECOS: `XLinearModel.train` on L2-normalised rows (as PECOS asks), PIFA
  label embedding, hierarchical k-means indexer (`Indexer.gen`), its default
  training parameters, beam 10 at prediction. The files are parsed here
  (scipy CSR), so its load time is this module's parser.

Output: --topk, int64 [n_test, 5], each test point's 5 best labels (-1 where
fewer came back); --result, JSON: system, version, params, load_s (reading
the files), train_s (training only), predict_s (the predictions only),
n_train, n_test, peak_rss_mb. The library's own log goes to stdout/stderr.
"""

import argparse
import json
import sys
import time

import numpy as np

from .measure import peak_rss_mb  # the standard library only

K = 5


def read_test(path):
    """(feature-value pairs per point) of an XMC text file, for omikuji's per-point predict."""
    points = []
    with open(path) as f:
        next(f)  # the header: n_points n_features n_labels
        for line in f:
            line = line.rstrip("\n")
            if not line.strip():
                continue
            parts = line.split(" ")
            feats = []
            for tok in parts[1:]:  # parts[0]: the labels (may be empty)
                if tok:
                    i, v = tok.split(":")
                    feats.append((int(i), float(v)))
            points.append(feats)
    return points


def run_omikuji(args):
    import omikuji
    from omikuji._libomikuji import ffi, lib

    hp = omikuji.Model.default_hyper_param()
    hp.n_trees = args.trees
    pool = omikuji._ThreadPoolHandle(args.threads)
    t0 = time.perf_counter()
    data = lib.load_omikuji_data_set(ffi.new("char[]", args.train.encode()), pool.ptr)
    if data == ffi.NULL:
        raise RuntimeError(f"omikuji could not load {args.train}")
    data = ffi.gc(data, lib.free_omikuji_data_set)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    ptr = lib.train_omikuji_model(data, hp, pool.ptr)
    if ptr == ffi.NULL:
        raise RuntimeError("omikuji failed to train")
    model = omikuji.Model(ptr, pool)
    train_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    test = read_test(args.test)
    load_s += time.perf_counter() - t0
    top = np.full((len(test), K), -1, dtype=np.int64)
    t0 = time.perf_counter()
    for i, feats in enumerate(test):
        got = [label for label, _ in model.predict(feats, top_k=K)]
        top[i, :len(got)] = got
    predict_s = time.perf_counter() - t0
    params = {"n_trees": hp.n_trees, "max_depth": hp.max_depth, "cluster_k": hp.cluster_k,
              "loss": "hinge" if hp.linear_loss_type == lib.Hinge else "log", "c": hp.linear_c, "beam_size": 10}
    return omikuji.__version__, params, load_s, train_s, predict_s, top


def run_napkinxc(args):
    from napkinxc.datasets import load_libsvm_file
    from napkinxc.models import PLT

    t0 = time.perf_counter()
    X, Y = load_libsvm_file(args.train, labels_format="list")
    Xt, _ = load_libsvm_file(args.test, labels_format="list")
    load_s = time.perf_counter() - t0
    model = PLT(args.model_dir, threads=args.threads, seed=args.seed)
    t0 = time.perf_counter()
    model.fit(X, Y)
    train_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    pred = model.predict(Xt, top_k=K)
    predict_s = time.perf_counter() - t0
    top = np.full((len(pred), K), -1, dtype=np.int64)
    for i, labels in enumerate(pred):
        top[i, :len(labels)] = labels[:K]
    keep = ("tree_type", "arity", "max_leaves", "optimizer", "loss", "liblinear_c", "tree_search_type", "ensemble")
    params = {k: v for k, v in model.get_params().items() if k in keep}
    from importlib.metadata import version

    return version("napkinxc"), params, load_s, train_s, predict_s, top


def read_csr(path):
    """(X float32 CSR [n, F], Y float32 CSR [n, L]) of an XMC text file, for PECOS."""
    import scipy.sparse as sp

    xi, xv, xp, yi, yp = [], [], [0], [], [0]
    with open(path) as f:
        n, F, L = (int(t) for t in next(f).split()[:3])
        for line in f:
            line = line.rstrip("\n")
            if not line.strip():
                continue
            parts = line.split(" ")
            if parts[0] and ":" not in parts[0]:
                yi.extend(int(t) for t in parts[0].split(","))
                feats = parts[1:]
            else:
                feats = parts if ":" in parts[0] else parts[1:]
            for tok in feats:
                if tok:
                    i, v = tok.split(":")
                    xi.append(int(i))
                    xv.append(float(v))
            xp.append(len(xi))
            yp.append(len(yi))
    m = len(xp) - 1
    X = sp.csr_matrix((np.asarray(xv, np.float32), np.asarray(xi, np.int64), np.asarray(xp, np.int64)), shape=(m, F))
    Y = sp.csr_matrix((np.ones(len(yi), np.float32), np.asarray(yi, np.int64), np.asarray(yp, np.int64)),
                      shape=(m, L))
    X.sum_duplicates()
    Y.sum_duplicates()
    Y.data[:] = 1
    return X, Y


def run_pecos(args):
    from importlib.metadata import version

    from pecos.xmc import Indexer, LabelEmbeddingFactory
    from pecos.xmc.xlinear.model import XLinearModel
    from sklearn.preprocessing import normalize

    t0 = time.perf_counter()
    X, Y = read_csr(args.train)
    Xt, _ = read_csr(args.test)
    X, Xt = normalize(X, norm="l2", copy=False), normalize(Xt, norm="l2", copy=False)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    label_feat = LabelEmbeddingFactory.create(Y, X, method="pifa")
    chain = Indexer.gen(label_feat, indexer_type="hierarchicalkmeans", threads=args.threads, seed=args.seed)
    model = XLinearModel.train(X, Y, C=chain, threads=args.threads)
    train_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    P = model.predict(Xt, beam_size=10, only_topk=K, threads=args.threads).tocsr()
    predict_s = time.perf_counter() - t0
    top = np.full((Xt.shape[0], K), -1, dtype=np.int64)
    for i in range(Xt.shape[0]):
        a, b = P.indptr[i], P.indptr[i + 1]
        ids, vals = P.indices[a:b], P.data[a:b]
        order = np.lexsort((ids, -vals))[:K]  # best first, ties to the lower id
        top[i, :len(order)] = ids[order]
    params = {"indexer": "hierarchicalkmeans", "label_embedding": "pifa", "beam_size": 10, "rows": "l2"}
    return version("libpecos"), params, load_s, train_s, predict_s, top


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--system", required=True, choices=("omikuji", "napkinxc", "pecos"))
    ap.add_argument("--train", required=True)
    ap.add_argument("--test", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--trees", type=int, default=3, help="omikuji's number of trees")
    ap.add_argument("--seed", type=int, default=0, help="napkinXC's seed")
    ap.add_argument("--model-dir", default="napkinxc-model", help="where napkinXC keeps its model")
    ap.add_argument("--topk", required=True, help="output: top 5 labels per test point (.npy)")
    ap.add_argument("--result", required=True, help="output: the JSON summary")
    args = ap.parse_args(argv)
    if args.threads < 1 or args.trees < 1:
        ap.error(f"--threads ({args.threads}) and --trees ({args.trees}) must be >= 1")
    run = {"omikuji": run_omikuji, "napkinxc": run_napkinxc, "pecos": run_pecos}[args.system]
    version, params, load_s, train_s, predict_s, top = run(args)
    np.save(args.topk, top)
    result = {"system": args.system, "version": version, "params": params, "threads": args.threads,
              "load_s": load_s, "train_s": train_s, "predict_s": predict_s, "n_test": int(top.shape[0]),
              "peak_rss_mb": peak_rss_mb()}
    with open(args.result, "w") as f:
        json.dump(result, f)
    print(json.dumps(result), file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
