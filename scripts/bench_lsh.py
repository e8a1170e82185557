"""Benchmark dslide.lsh.HashTables on an Amazon-670K-shaped output layer against brute force.

Data (synthetic, structured): W float32 [670091, 128], neuron-major. Items
belong to `--clusters` clusters with power-law sizes (a few big, many small,
like extreme-classification labels); item = norm_i * (centre_c + noise) with
unit-norm Gaussian centres, per-coordinate noise `--noise`, and a log-normal
norm_i (sigma 0.3). Queries Q [256, 128] are ReLU-like and correlated with
some items: q = relu(centre_c + noise) for clusters drawn like the items.

Per setting: build s (hash all items + insert), query ms per batch (hash the
batch + look up + select; best of --repeat), brute ms per batch (Q @ W.T with
BLAS plus argpartition for the top 100, once), their ratio, the mean active
set size, recall@10 / recall@100 of each query's true top inner-product items
within its active set, and the tables' memory.

    NUMBA_NUM_THREADS=2 python -m scripts.bench_lsh
    python -m scripts.bench_lsh --items 100000 --setting dwta,K=6,L=50,rp=15,C=32,mode=union

Trained layer (`--model RUN_DIR --data TEST --train TRAIN`): the output layer of
a real run, queried with the hidden vectors of test points. Truth is the
model's own exact ranking (w.h + b, biases included). Each retrieval method
scores exactly what it retrieves and keeps the best: recall of the exact
top-1/10/100, the share of labels scored per query, ms per query against
brute force (every label through BLAS), build seconds. Methods: the run's
own inference index; anchor tables of other sizes (anchors from the hidden
vectors of training points); a static shortlist of the highest-bias labels
of the same size; SimHash over [w, b] with the asymmetric MIPS transform
(Neyshabur & Srebro 2015) and SLIDE's DWTA over w, in union mode.

    NUMBA_NUM_THREADS=2 python -m scripts.bench_lsh --model runs/amz --data data/amz_test.txt --train data/amz_train.txt

End to end (`--model RUN_DIR --data TEST --eval`): `dslide eval` on every test
point three ways, at 1 rank x 2 threads and at 2 ranks x 1 thread (mpiexec),
one after the other: exact scoring, `--lsh` (the run's index) and a static
shortlist of the highest-bias labels as large as what --lsh scored, and with
--shares the index refilled at other bucket sizes; when the index has its
nearest-training-point graph, also its buckets alone (no neighbours) at the
same share. Columns: share of labels scored, seconds, speed-up, recall of
the exact top-10, P@1, P@5, PSP@5 (propensities saved with the run).
--rebuild TRAIN first rebuilds the index with this code's settings.
scripts/_lsh_eval.py does the work.

    python -m scripts.bench_lsh --model runs/amz --data data/amz_test.txt --eval

Trained members (`--fused NAME=RUN_DIR,TRAIN,TEST`, repeatable): `dslide predict`
exact and --lsh end to end at 2 ranks, each prediction's stages (hidden layers,
output top k, the neighbour store's searches, fusion: scripts/lsh_stages.py),
the recall of the exact top 10 in --lsh's, the P@1 / P@5 --lsh loses, and the
recall of the exact neighbour search in the approximate one. Members whose
training file is not in ../shared/data are labelled synthetic.

    python -m scripts.bench_lsh --fused debian_depends=runs/dd,data/dd_train.txt,data/dd_test.txt
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time

from . import measure as M

# BLAS gets as many threads as numba, so brute force and LSH use the same cores.
for _var, _n in M.thread_env(int(os.environ.get("NUMBA_NUM_THREADS") or os.cpu_count() or 1), {}).items():
    os.environ.setdefault(_var, _n)

import numba  # noqa: E402
import numpy as np  # noqa: E402

from dslide import lsh  # noqa: E402

# family,K,L,rp (range_pow),C (capacity)[,policy][,mode][,m|t][,family params]
DEFAULT_SETTINGS = [
    "dwta,K=6,L=50,rp=18,C=8,mode=union",                   # SLIDE's Amazon-670K hashing
    "dwta,K=6,L=50,rp=18,C=8,policy=reservoir,mode=union",
    "dwta,K=5,L=50,rp=15,C=64,mode=union",
    "dwta,K=4,L=100,rp=12,C=256,mode=union",
    "dwta,K=4,L=100,rp=12,C=256,mode=topk,m=2000",
    "dwta,K=4,L=100,rp=12,C=256,mode=threshold,t=2",
    "dwta,K=3,L=100,rp=9,C=1024,mode=topk,m=3000",
    "wta,K=4,L=100,rp=12,C=256,mode=union",
    "srp,K=10,L=50,rp=10,C=512,mode=union",
]


def parse_setting(text: str) -> dict:
    """'dwta,K=6,L=50,rp=18,C=8,mode=union[,policy=..][,m=..][,t=..][,<family param>=..]'."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or "=" in parts[0]:
        raise ValueError(f"setting {text!r} must start with a family name ({', '.join(lsh.FAMILIES)})")
    s = {"family": parts[0], "policy": "fifo", "mode": "union", "m": None, "t": None, "params": {}}
    for p in parts[1:]:
        key, _, val = p.partition("=")
        if key in ("K", "L", "rp", "C", "m", "t"):
            s[key] = int(val)
        elif key in ("mode", "policy"):
            s[key] = val
        else:
            s["params"][key] = float(val) if "." in val else int(val)
    missing = [k for k in ("K", "L", "rp", "C") if k not in s]
    if missing:
        raise ValueError(f"setting {text!r} lacks {', '.join(missing)}")
    return s


def make_data(n_items, dim, n_queries, n_clusters, noise, seed):
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((n_clusters, dim)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    # Power-law cluster sizes: p_c ~ (c + 10) ** -0.9.
    p = (np.arange(n_clusters) + 10.0) ** -0.9
    p /= p.sum()
    labels = rng.choice(n_clusters, size=n_items, p=p)
    W = np.empty((n_items, dim), np.float32)
    step = 65536
    for lo in range(0, n_items, step):
        hi = min(n_items, lo + step)
        block = centres[labels[lo:hi]] + noise * rng.standard_normal((hi - lo, dim)).astype(np.float32)
        block *= np.exp(0.3 * rng.standard_normal((hi - lo, 1))).astype(np.float32)
        W[lo:hi] = block
    q_labels = rng.choice(n_clusters, size=n_queries, p=p)
    Q = np.maximum(centres[q_labels] + noise * rng.standard_normal((n_queries, dim)), 0).astype(np.float32)
    return W, Q


def brute_force(W, Q, k, chunk=64):
    """Top-k inner-product ids per query (unsorted) and the time of the product + selection."""
    t0 = time.perf_counter()
    top = np.empty((Q.shape[0], k), np.int64)
    for lo in range(0, Q.shape[0], chunk):
        S = Q[lo:lo + chunk] @ W.T
        top[lo:lo + chunk] = np.argpartition(S, -k, axis=1)[:, -k:]
    return top, time.perf_counter() - t0


def exact_top(W, Q, k, chunk=64):
    """Top-k ids per query sorted by score (descending), for recall@10 and @100."""
    out = np.empty((Q.shape[0], k), np.int64)
    for lo in range(0, Q.shape[0], chunk):
        S = Q[lo:lo + chunk] @ W.T
        part = np.argpartition(S, -k, axis=1)[:, -k:]
        sc = np.take_along_axis(S, part, axis=1)
        out[lo:lo + chunk] = np.take_along_axis(part, np.argsort(-sc, axis=1), axis=1)
    return out


def recall(indptr, ids, truth):
    r = np.empty(truth.shape[0])
    for q in range(truth.shape[0]):
        act = ids[indptr[q]:indptr[q + 1]]
        r[q] = np.isin(truth[q], act).mean()
    return float(r.mean())


def run_setting(s, W, Q, truth, repeat):
    fam = lsh.make_family(s["family"], W.shape[1], s["K"], s["L"], seed=1, **s["params"])
    # C=0: buckets sized to what they hold (lsh.CompactTables)
    T = lsh.HashTables(fam, s["rp"], s["C"], policy=s["policy"], seed=1) if s["C"] else lsh.CompactTables(fam, s["rp"])
    # Compile outside the timings (numba parallel kernels are compiled per process).
    T.build(W[:512])
    T.query(Q[:4], mode=s["mode"], m=s["m"], t=s["t"])
    t0 = time.perf_counter()
    T.build(W)
    build_s = time.perf_counter() - t0
    best = np.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        indptr, ids, _counts = T.query(Q, mode=s["mode"], m=s["m"], t=s["t"])
        best = min(best, time.perf_counter() - t0)
    sizes = np.diff(indptr)
    return {"build_s": build_s, "query_ms": 1e3 * best, "active": float(sizes.mean()),
            "r10": recall(indptr, ids, truth[:, :10]), "r100": recall(indptr, ids, truth[:, :100]),
            "mem_mb": T.memory_bytes / 2**20, "fill": T.bucket_sizes()}


def describe(s):
    extra = "".join(f", {k}={v}" for k, v in s["params"].items())
    sel = {"topk": f" m={s['m']}", "threshold": f" t={s['t']}"}.get(s["mode"], "")
    table = f"C={s['C']} {s['policy']}" if s["C"] else "compact"
    return f"{s['family']} K={s['K']} L={s['L']}{extra} rp={s['rp']} {table} {s['mode']}{sel}"


def trained_layer(args) -> None:
    """The --model mode (see the module docstring)."""
    from dslide import train as T
    from dslide.comm import Comm
    from dslide.io import checkpoint as ck
    from dslide.io.data import read_xmc
    from dslide.model import inputs as I

    path = ck.latest(args.model)
    manifest = ck.read_manifest(path)
    model = T.build_network((manifest["n_features"], manifest["n_labels"]), ck.config_of(path), Comm())
    ck.load_into(model.network, path, Comm(), weights_only=True)
    net = model.network
    out = net.layers[-1]
    W, b = np.ascontiguousarray(out.neuron_major()), out.b
    n = W.shape[0]

    def hidden(X):
        Xn = I.normalise_inputs(X, model.config.input_norm, net.dtype)
        parts = I.csr_parts(Xn)
        H = [net.hidden(I.make_batch(parts, None, np.arange(s, min(Xn.shape[0], s + 4096)), net.step)).dense()
             for s in range(0, Xn.shape[0], 4096)]
        return np.ascontiguousarray(np.concatenate(H), dtype=np.float32)

    test = read_xmc(args.data)
    Q = hidden(test.X[:args.queries])
    t0 = time.perf_counter()
    truth = np.empty((Q.shape[0], 100), np.int64)
    for lo in range(0, Q.shape[0], 64):
        S = Q[lo:lo + 64] @ W.T
        S += b
        part = np.argpartition(-S, 100, axis=1)[:, :100]
        sc = np.take_along_axis(S, part, axis=1)
        truth[lo:lo + 64] = np.take_along_axis(part, np.lexsort((part, -sc), axis=1), axis=1)
    brute_ms = 1e3 * (time.perf_counter() - t0) / Q.shape[0]
    H_train = hidden(read_xmc(args.train).X) if args.train else None

    rows = []

    def add(name, ids_per_query, scored, ms, build_s):
        r = [np.mean([np.isin(truth[q, :k], ids_per_query[q]).mean() for q in range(Q.shape[0])])
             for k in (1, 10, 100)]
        rows.append((name, scored / n, ms, build_s, *r))

    def anchors(name, tables, probes, build_s):
        tables.topk(Q[:8], W, b, 100, probes)
        t0 = time.perf_counter()
        _, ids, n_scored = tables.topk(Q, W, b, 100, probes)
        ms = 1e3 * (time.perf_counter() - t0) / Q.shape[0]
        add(name, ids, float(n_scored.mean()), ms, build_s)

    if model.index is not None:
        tables = model.index.tables
        anchors(f"the run's index ({tables.A} anchors, {out.lc.index_share:.1%} buckets, "
                f"{out.lc.index_probes} probe)", tables, out.lc.index_probes, float("nan"))
    budgets = [float(x) for x in args.budgets.split(",")]
    if H_train is not None:
        for A, share, probes in [(1024, budgets[0], 1), (2048, budgets[0], 1), (4096, budgets[0], 1),
                                 (2048, budgets[0] / 2, 2), (2048, budgets[-1], 1)]:
            T_ = int(share * n)
            t0 = time.perf_counter()
            tables = lsh.AnchorTables(W.shape[1], 1, min(A, H_train.shape[0]), T_, seed=0)
            tables.fit_anchors(H_train[:args.index_points])
            tables.fill(W, b)
            tables.set_buckets(np.sort(tables.buckets, axis=2), tables.fill_count)
            anchors(f"anchors {A}, buckets {share:.2%}, {probes} probe(s)", tables, probes, time.perf_counter() - t0)
    order = np.argsort(-b, kind="stable")
    for share in budgets:
        m = int(share * n)
        head = order[:m]
        add(f"static shortlist: the {share:.1%} highest-bias labels", [head] * Q.shape[0], m, float("nan"), 0.0)
    # item hashing with exact re-ranking of the union of the buckets
    M = np.sqrt((W.astype(np.float64) ** 2).sum(1) + b.astype(np.float64) ** 2).max()
    items = np.hstack([W / M, (b / M)[:, None]]).astype(np.float32)
    items = np.hstack([items, np.sqrt(np.maximum(0, 1 - (items ** 2).sum(1)))[:, None]]).astype(np.float32)
    queries = np.hstack([Q, np.ones((Q.shape[0], 1), np.float32), np.zeros((Q.shape[0], 1), np.float32)])
    for fam_name, K, L, rp, C, X_items, X_q in [("srp", 12, 32, 12, 512, items, queries),
                                                ("srp", 10, 64, 10, 1024, items, queries),
                                                ("dwta", 6, 50, 16, 64, W, Q)]:
        fam = lsh.make_family(fam_name, X_items.shape[1], K, L, seed=1)
        tab = lsh.HashTables(fam, rp, C, seed=1)
        tab.build(X_items[:512])  # compile outside the timings
        tab.query(X_q[:4], mode="union")
        t0 = time.perf_counter()
        tab.build(X_items)
        build_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        ptr, ids, _ = tab.query(X_q, mode="union")
        ms = 1e3 * (time.perf_counter() - t0) / Q.shape[0]
        per = [ids[ptr[q]:ptr[q + 1]] for q in range(Q.shape[0])]
        what = "SimHash of [w, b] (MIPS transform)" if fam_name == "srp" else "DWTA of w (SLIDE)"
        add(f"{what}, K={K} L={L}, union", per, float(np.diff(ptr).mean()), ms, build_s)

    print(f"command: {M.command('bench_lsh', map(shlex.quote, sys.argv[1:]))}")
    print(f"layer: {n:,} labels x {W.shape[1]} (run {args.model}, step {net.step}); {Q.shape[0]:,} test queries "
          f"from {args.data}; threads {numba.get_num_threads()}; brute force (every label through BLAS, top 100): "
          f"{brute_ms:.2f} ms per query")
    print()
    print("| method | share scored | ms/query | speed-up vs brute | build s | recall@1 | recall@10 | recall@100 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, share, ms, build_s, r1, r10, r100 in rows:
        speed = f"{brute_ms / ms:.1f}x" if np.isfinite(ms) else "-"
        ms_s = f"{ms:.3f}" if np.isfinite(ms) else "-"
        bs = f"{build_s:.1f}" if np.isfinite(build_s) else "-"
        print(f"| {name} | {share:.2%} | {ms_s} | {speed} | {bs} | {r1:.3f} | {r10:.3f} | {r100:.3f} |", flush=True)


def end_to_end(args) -> None:
    """The --eval mode: the comparison at 1 x 2 and 2 x 1, each in a fresh process."""
    import json

    rows, builds = [], []
    for ranks, threads in ((1, 2), (2, 1)):
        if args.skip_compare:
            break
        # paths made absolute: the child runs in the repository root
        cmd = M.module_cmd("bench_lsh", "--model", os.path.abspath(args.model), "--data", os.path.abspath(args.data),
                           "--eval-child", "--shares", args.shares,
                           *(["--rebuild", os.path.abspath(args.rebuild)] if args.rebuild else []),
                           ranks=ranks, mpi=True)
        p, _ = M.run(cmd, env=M.thread_env(threads))
        got = [line[len("RESULT "):] for line in p.stdout.splitlines() if line.startswith("RESULT ")]
        if p.returncode != 0 or not got:
            raise SystemExit(f"{' '.join(cmd)} failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
        result = json.loads(got[0])
        rows += [(ranks, threads, r) for r in result["rows"]]
        builds.append(f"{ranks} x {threads}: " + ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}"
                                                          for k, v in result["index"].items()))
    if args.skip_compare:
        return wall_table(args)
    rebuilt = (f"; the index rebuilt from {args.rebuild} with this code's settings (seconds and sizes: "
               + "; ".join(builds) + ")") if args.rebuild else ""
    lines = [f"command: `{M.command('bench_lsh', map(shlex.quote, sys.argv[1:]))}`", "",
             f"machine: {M.machine()}", "", f"model: {args.model}; test points: {args.data}{rebuilt}", "",
             "| ranks x threads | method | labels scored | seconds | speed-up | recall of exact top-10 | P@1 | P@5 "
             "| PSP@5 |", "|---|---|---|---|---|---|---|---|---|"]
    for ranks, threads, r in rows:
        exact = next(x for q, t, x in rows if (q, t) == (ranks, threads) and x["method"] == "exact")
        lines.append(f"| {ranks} x {threads} | {r['method']} | {r['share']:.2%} | {r['seconds']:.2f} | "
                     f"{exact['seconds'] / r['seconds']:.1f}x | {r['recall@10']:.4f} | {r['p@1']:.4f} | "
                     f"{r['p@5']:.4f} | {r['psp@5']:.4f} |")
    print("\n".join(lines), flush=True)
    if not args.no_record:
        M.record(f"bench_lsh.py --model ... --eval ({os.path.basename(args.data)})", "\n".join(lines))
    wall_table(args)


def _predict_once(args, ranks: int, threads: int, lsh: bool, cache_dir: str | None) -> dict:
    """One `dslide predict` in a fresh process: its wall seconds from the process's start to the
    predictions written (it exits right after writing them), and the seconds it printed."""
    return predict_wall(args.model, args.data, ranks, threads, lsh, cache_dir)


def predict_wall(model: str, data: str, ranks: int, threads: int, lsh: bool, cache_dir: str | None = None) -> dict:
    """`_predict_once` of a run directory and test file."""
    import re
    import subprocess

    env = M.thread_env(threads)
    if cache_dir:
        env["NUMBA_CACHE_DIR"] = cache_dir
    out = os.path.join(M.ROOT, "runs", "bench_lsh_wall", f"pred-{ranks}x{threads}-{int(lsh)}.txt")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    cmd = [sys.executable, "-m", "dslide", "predict", "--model", model, "--data", data, "--k", "5",
           "--out", out, "--quiet"] + (["--lsh"] if lsh else [])
    if ranks > 1:
        cmd = [M.mpiexec(), "-n", str(ranks), *cmd]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
    m = re.search(r"points in ([\d.]+)s .*after ([\d.]+)s of start-up \(([\d.]+)s loading", p.stdout)
    return {"wall": wall, "scoring": float(m.group(1)), "startup": float(m.group(2)), "load": float(m.group(3))}


def _corunner():
    """Start a 2-rank MPI training job that keeps both cores busy (its own process group);
    returns the Popen, ended by `_stop`."""
    import subprocess

    work = os.path.join(M.ROOT, "runs", "bench_lsh_wall")
    os.makedirs(work, exist_ok=True)
    prefix = os.path.join(work, "corun")
    if not os.path.exists(prefix + "_train.txt"):
        subprocess.run([sys.executable, "-m", "dslide", "data", "gen", "--preset", "small", "--points", "5000",
                        "--test-points", "100", "--out", prefix], check=True, capture_output=True)
    cmd = [M.mpiexec(), "-n", "2", sys.executable, "-m", "dslide", "train", "--train", prefix + "_train.txt",
           "--out", os.path.join(work, "corun_run"), "--quiet", "--set", "epochs=100000", "--set", "threads=1",
           "--set", "eval_every=0"]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                         env=M.thread_env(1))
    time.sleep(15)  # past its start-up: training steps and their collectives
    return p


def _stop(p) -> None:
    import signal

    try:
        os.killpg(p.pid, signal.SIGTERM)  # the group of the job this script started
    except ProcessLookupError:
        pass
    p.wait()


def wall_table(args) -> None:
    """End to end: `dslide predict` (exact and --lsh) from the process's start to the written
    predictions, beside the scoring ("kernel") seconds it printed, at 2 ranks x 1 thread, on the
    machine as it is and beside a co-running 2-rank MPI training; with --cold also with an
    empty numba cache (every kernel compiled in the run)."""
    import shutil
    import tempfile

    conditions = [("as is", False), ("beside a 2-rank MPI job", True)]
    caches = [("warm", None)] + ([("cold", "fresh")] if args.cold else [])
    rows = []
    for cond, corun in conditions:
        job = _corunner() if corun else None
        try:
            for cache, how in caches:
                for lsh in (False, True):
                    tmp = tempfile.mkdtemp(prefix="dslide-numba-") if how else None
                    try:
                        _predict_once(args, 2, 1, lsh, None) if not how else None  # warm: one run first
                        r = _predict_once(args, 2, 1, lsh, tmp)
                    finally:
                        if tmp:
                            shutil.rmtree(tmp, ignore_errors=True)
                    rows.append((cond, cache, "--lsh" if lsh else "exact", r))
                    print(f"  {cond}, {cache} cache, {'--lsh' if lsh else 'exact'}: {r}", file=sys.stderr, flush=True)
        finally:
            if job is not None:
                _stop(job)
    lines = [f"command: `{M.command('bench_lsh', map(shlex.quote, sys.argv[1:]))}`", "",
             f"machine: {M.machine()}; load average before: {os.getloadavg()[0]:.1f}", "",
             f"`mpiexec -n 2 dslide predict --model {args.model} --data {args.data} --k 5` (1 thread per rank); "
             "end to end: from the process's start to the predictions written; scoring: the seconds it printed "
             "(dslide.infer.predict.predict_topk_scores); warm: numba's cache filled by a run just before; cold: an empty cache", "",
             "| machine | numba cache | method | end to end s | scoring s | start-up s | of it loading s |",
             "|---|---|---|---|---|---|---|"]
    for cond, cache, method, r in rows:
        lines.append(f"| {cond} | {cache} | {method} | {r['wall']:.1f} | {r['scoring']:.2f} | {r['startup']:.1f} | "
                     f"{r['load']:.1f} |")
    print("\n".join(lines), flush=True)
    if not args.no_record:
        M.record(f"bench_lsh.py --model ... --eval, end to end ({os.path.basename(args.data)})", "\n".join(lines))


def fused_members(args) -> None:
    """The --fused mode: per member, `dslide predict` exact and --lsh end to end at 2 ranks x 1
    thread (the better of two runs each, after one that fills numba's cache), and the stages,
    recall and precision of scripts/lsh_stages.py at 2 ranks; one table, recorded."""
    import json

    rows = []
    for spec in args.fused:
        name, _, paths = spec.partition("=")
        run, train, test = paths.split(",")
        with open(train) as f:
            n_train = int(f.readline().split()[0])
        synthetic = not os.path.abspath(train).startswith(str(M.SHARED_DATA))
        cmd = M.module_cmd("lsh_stages", os.path.abspath(run), os.path.abspath(test), "--json", ranks=2, mpi=True)
        p, _ = M.run(cmd, env=M.thread_env(1))
        got = [line[len("RESULT "):] for line in p.stdout.splitlines() if line.startswith("RESULT ")]
        if p.returncode != 0 or not got:
            raise SystemExit(f"{' '.join(cmd)} failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
        st = json.loads(got[0])
        indexed = st["output"] == "lsh"
        wall = {}
        for lsh in (False, True):
            if lsh and not indexed:
                wall[lsh] = wall[False]  # --lsh is refused on a dense output: exact is what runs
                continue
            predict_wall(run, test, 2, 1, lsh)
            wall[lsh] = min((predict_wall(run, test, 2, 1, lsh) for _ in range(2)), key=lambda r: r["wall"])
        e, a = st["exact"], st["lsh"]
        rows.append({
            "member": name + (" (synthetic)" if synthetic else ""),
            "points": f"{n_train:,} / {st['points']:,}", "labels": f"{st['labels']:,}",
            "output": ("lsh" if indexed else "dense: --lsh is exact") + (", fused" if st["fused"] else ""),
            "exact s": f"{wall[False]['wall']:.1f}", "--lsh s": f"{wall[True]['wall']:.1f}",
            "speed-up": f"{wall[False]['wall'] / wall[True]['wall']:.2f}x",
            "scoring s exact / --lsh": f"{e['seconds']:.2f} / {a['seconds']:.2f}",
            "hidden s": f"{e['predict_hidden']:.2f} / {a['predict_hidden']:.2f}",
            "output top-k s": f"{e['predict_output']:.2f} / {a['predict_output']:.2f}",
            "neighbour search s": (f"{e['fusion_neighbours'] + e['fusion_prototypes']:.2f} / "
                                   f"{a['fusion_neighbours'] + a['fusion_prototypes']:.2f}" if st["fused"] else "-"),
            "fusion s": f"{e['fusion_fuse']:.2f} / {a['fusion_fuse']:.2f}" if st["fused"] else "-",
            "recall@10": f"{st['recall@10']:.4f}",
            "P@1 / P@5 lost": f"{e['p@1'] - a['p@1']:+.4f} / {e['p@5'] - a['p@5']:+.4f}",
            "neighbour recall": f"{st['neighbour_recall']:.4f}" if "neighbour_recall" in st else "-"})
        print(f"  {rows[-1]}", file=sys.stderr, flush=True)
    lines = [f"command: `{M.command('bench_lsh', map(shlex.quote, sys.argv[1:]))}`", "",
             f"machine: {M.machine()}; code: {M.code_version()}", "",
             "Each member trained once with the defaults (`mpiexec -n 2 dslide train --set threads=1`). exact s and "
             "--lsh s: `mpiexec -n 2 dslide predict --k 5` from the process's start to the predictions written "
             "(the better of two runs, numba's cache warm); the stage columns (exact / --lsh, the slowest rank's "
             "seconds inside the pipeline, scripts/lsh_stages.py at 2 ranks): the hidden layers, the output's top k "
             "(every label, or the inference index), the neighbour store's searches (exact posting lists, or the "
             "pruned ones of dslide.infer.approx) and the fusion kernel. recall@10: the exact top 10 found in "
             "--lsh's; P@1 / P@5 lost: exact's minus --lsh's; neighbour recall: the exact search's neighbours "
             "found by the approximate one.", "", ""]
    text = M.table(rows, [(c, c) for c in rows[0]]) if rows else ""
    print("\n".join(lines) + text, flush=True)
    if not args.no_record:
        M.record("bench_lsh.py --fused" + (f" ({args.tag})" if args.tag else ""), "\n".join(lines) + text)


def eval_child(args) -> None:
    import json

    from ._lsh_eval import compare_inference

    from dslide import propensity
    from dslide.comm import Comm
    from dslide.io.data import read_xmc
    from dslide.session import load_model

    from dslide import train as T
    from dslide.train.infer_build import build_index

    comm = Comm()
    model = load_model(args.model, comm)
    info = {}
    if args.rebuild:
        info = {k: v for k, v in build_index(model, read_xmc(args.rebuild)).items() if k != "share"}
    shares = [float(x) for x in args.shares.split(",") if x.strip()]
    rows = compare_inference(model, read_xmc(args.data), propensity.load(args.model, model.n_labels)["inv_prop"],
                             shares)
    if comm.rank == 0:
        print("RESULT " + json.dumps({"rows": rows, "index": info}), flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a run directory: measure retrieval on its trained output layer")
    ap.add_argument("--data", help="with --model: test data whose hidden vectors are the queries")
    ap.add_argument("--train", help="with --model: training data, for anchors of other sizes")
    ap.add_argument("--eval", action="store_true",
                    help="with --model and --data: exact against --lsh against a static shortlist, end to end, "
                         "at 1 x 2 and 2 x 1")
    ap.add_argument("--eval-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--skip-compare", action="store_true",
                    help="with --eval: only the end-to-end table (dslide predict, as is and beside an MPI job)")
    ap.add_argument("--cold", action="store_true",
                    help="with --eval: the end-to-end table also with an empty numba cache")
    ap.add_argument("--no-record", action="store_true", help="with --eval: do not update docs/benchmarks.md")
    ap.add_argument("--rebuild", metavar="TRAIN",
                    help="with --eval: first rebuild the run's inference index from this training data with "
                         "this code's settings (a run saved before the index had its neighbour graph)")
    ap.add_argument("--shares", default="",
                    help="with --eval: also refill the run's index (same anchors) with buckets of these shares "
                         "of the labels, comma-separated, and score through each")
    ap.add_argument("--budgets", default="0.01,0.02", help="with --model: shares of the labels to score")
    ap.add_argument("--index-points", type=int, default=50000, help="with --model: training points for anchors")
    ap.add_argument("--items", type=int, default=670_091)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--queries", type=int, default=256)
    ap.add_argument("--clusters", type=int, default=4000)
    ap.add_argument("--noise", type=float, default=0.06,
                    help="per-coordinate noise sd around unit-norm centres (0.06: item-centre cosine "
                         "~0.83; 0.09: ~0.7, a harder layer)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=5, help="query timings: best of this many")
    ap.add_argument("--setting", action="append",
                    help="family,K=..,L=..,rp=..,C=..[,policy=..][,mode=..][,m=..][,t=..][,param=..] "
                         "(repeatable; default: a built-in list)")
    ap.add_argument("--fused", action="append", metavar="NAME=RUN_DIR,TRAIN,TEST",
                    help="a trained member (repeatable): exact against --lsh end to end, by stage, with the "
                         "recall and precision --lsh loses (the neighbour store's search included)")
    ap.add_argument("--tag", default="", help="with --fused: a name for its section in docs/benchmarks.md")
    args = ap.parse_args(argv)
    if args.fused:
        return fused_members(args)
    if args.model:
        if not args.data:
            ap.error("--model needs --data (test points whose hidden vectors are the queries)")
        if args.eval_child:
            return eval_child(args)
        if args.eval:
            return end_to_end(args)
        if args.queries == 256:
            args.queries = 2000
        return trained_layer(args)
    settings = [parse_setting(t) for t in (args.setting or DEFAULT_SETTINGS)]

    t0 = time.perf_counter()
    W, Q = make_data(args.items, args.dim, args.queries, args.clusters, args.noise, args.seed)
    gen_s = time.perf_counter() - t0
    brute = []
    for _ in range(args.repeat):
        _top, dt = brute_force(W, Q, 100)
        brute.append(dt)
    brute_ms = 1e3 * min(brute)
    truth = exact_top(W, Q, 100)

    print(f"command: {M.command('bench_lsh', map(shlex.quote, sys.argv[1:]))}")
    print(f"data: W float32 [{args.items}, {args.dim}] ({args.clusters} power-law clusters, noise "
          f"{args.noise}, log-normal norms), Q [{args.queries}, {args.dim}] relu(centre + noise), "
          f"{np.mean(Q == 0):.0%} zeros; generated in {gen_s:.1f} s")
    print(f"threads: NUMBA_NUM_THREADS={numba.get_num_threads()}, "
          f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')}; "
          f"brute force (Q @ W.T + argpartition top-100): {brute_ms:.0f} ms/batch (best of {args.repeat})")
    print()
    print("| setting | build s | query ms/batch | brute ms/batch | cost ratio | mean active "
          "| recall@10 | recall@100 | memory MB | bucket fill mean / max |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for s in settings:
        r = run_setting(s, W, Q, truth, args.repeat)
        print(f"| {describe(s)} | {r['build_s']:.2f} | {r['query_ms']:.1f} | {brute_ms:.0f} | "
              f"{r['query_ms'] / brute_ms:.3f} | {r['active']:.0f} | {r['r10']:.3f} | {r['r100']:.3f} | "
              f"{r['mem_mb']:.0f} | {r['fill']['mean']:.1f} / {r['fill']['max']} |", flush=True)


if __name__ == "__main__":
    main()
