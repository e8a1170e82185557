#!/usr/bin/env python
"""Benchmark the XMC text reader/writer of dslide.data on Amazon-like data.

    NUMBA_NUM_THREADS=1 .venv/bin/python scripts/bench_io.py [--points 200000] [--keep DIR]

Generates `--points` Amazon-670K-like points (135,909 features, 670,091 labels,
~64 non-zeros per point with a heavy tail, ~5 labels per point, positive
tf-idf-like values), with `datasets.synthetic.generate('amazon-like')` when that
module is importable, else with the vectorised generator below. Then it times,
each in its own process so that ru_maxrss is the peak of that command alone:

* write_xmc                  the text file
* read_xmc(cache=False)      the first parse
* read_xmc (cold cache)      parse + writing <file>.dslcache.npz
* read_xmc (cache hit)       loading the cache

Each process first writes and reads a tiny file, so numba compilation (or
loading compiled kernels from numba's cache) is excluded from every time.
Times are the best of `--repeat` runs; the machine may be shared, so repeat
if a figure looks off. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402

N_FEATURES = 135_909
N_LABELS = 670_091


def _peak_mb() -> float:
    # ru_maxrss is in KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def amazon_like(n_points: int, seed: int = 0):
    """Vectorised Amazon-670K-like data: (X csr float32, Y csr float32).

    Non-zeros per point: LogNormal with median 42 and mean 64 (as the 512 real
    points), clipped to [1, 702]; features drawn by a Zipf-like popularity
    (p(rank r) ~ (r + 2)^-1.05) and de-duplicated within a row. Values
    tf * idf with idf = log2(2 + rank) and tf = 1 + Geometric(0.7) - 1.
    Labels per point: min(1 + Poisson(4.2), 7), by Zipf-like popularity.
    """
    rng = np.random.default_rng(seed)
    k = np.clip(np.rint(rng.lognormal(np.log(42.0), 0.918, n_points)), 1, 702).astype(np.int64)
    total = int(k.sum())
    rows = np.repeat(np.arange(n_points, dtype=np.int64), k)

    def zipf_ranks(n_items, size, a):
        # Inverse CDF of the continuous density (x + 2)^-a on [0, n_items).
        u = rng.random(size)
        lo, hi = 2.0 ** (1 - a), (n_items + 2.0) ** (1 - a)
        r = (lo + u * (hi - lo)) ** (1.0 / (1 - a)) - 2.0
        return np.minimum(r.astype(np.int64), n_items - 1)

    f_rank = zipf_ranks(N_FEATURES, total, 1.05)
    feat_of_rank = rng.permutation(N_FEATURES)
    keys = np.unique(rows * N_FEATURES + feat_of_rank[f_rank])  # sorted, no duplicates
    x_rows, x_cols = np.divmod(keys, N_FEATURES)
    rank_of_feat = np.argsort(feat_of_rank)
    idf = np.log2(2.0 + rank_of_feat[x_cols])
    tf = rng.geometric(0.7, keys.size)
    x_data = (tf * idf).astype(np.float32)
    x_indptr = np.concatenate([[0], np.cumsum(np.bincount(x_rows, minlength=n_points))])
    X = sp.csr_matrix((x_data, x_cols.astype(np.int32), x_indptr), shape=(n_points, N_FEATURES))

    m = np.minimum(1 + rng.poisson(4.2, n_points), 7)
    l_rows = np.repeat(np.arange(n_points, dtype=np.int64), m)
    label_of_rank = rng.permutation(N_LABELS)
    lkeys = np.unique(l_rows * N_LABELS + label_of_rank[zipf_ranks(N_LABELS, l_rows.size, 1.1)])
    y_rows, y_cols = np.divmod(lkeys, N_LABELS)
    y_indptr = np.concatenate([[0], np.cumsum(np.bincount(y_rows, minlength=n_points))])
    Y = sp.csr_matrix((np.ones(y_cols.size, np.float32), y_cols.astype(np.int32), y_indptr),
                      shape=(n_points, N_LABELS))
    return X, Y


def generate(n_points: int, which: str):
    """(X, Y, description) from datasets.synthetic (if available and wanted) or amazon_like."""
    if which in ("auto", "synthetic"):
        try:
            from datasets.synthetic import generate as synth  # noqa: PLC0415
        except ImportError:
            if which == "synthetic":
                raise
        else:
            d = synth("amazon-like", n_points=n_points)
            return d.X, d.Y, "datasets.synthetic.generate('amazon-like')"
    X, Y = amazon_like(n_points)
    return X, Y, "bench_io.amazon_like (vectorised, in this script)"


def _warm_up(tmpdir: str) -> None:
    from dslide.data import read_xmc, write_xmc  # noqa: PLC0415

    X = sp.csr_matrix(np.array([[0, 1.5, 0], [2.25, 0, 1e-3]], dtype=np.float32))
    Y = sp.csr_matrix(np.array([[1, 0], [1, 1]], dtype=np.float32))
    path = os.path.join(tmpdir, "warmup.txt")
    write_xmc(path, X, Y)
    read_xmc(path, cache=False)
    read_xmc(path)  # parse + write cache
    read_xmc(path)  # cache hit
    os.unlink(path)
    os.unlink(path + ".dslcache.npz")


def child(args) -> int:
    """Run one measured command in this process; print a JSON line."""
    from dslide.data import cache_path, read_xmc, write_xmc  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as tmp:
        _warm_up(tmp)
    base = _peak_mb()
    times = []
    if args.child == "write":
        z = np.load(args.src)
        X = sp.csr_matrix((z["x_data"], z["x_indices"], z["x_indptr"]), shape=tuple(z["x_shape"]))
        Y = sp.csr_matrix((z["y_data"], z["y_indices"], z["y_indptr"]), shape=tuple(z["y_shape"]))
        base = _peak_mb()
        for _ in range(args.repeat):
            t = time.perf_counter()
            write_xmc(args.path, X, Y)
            times.append(time.perf_counter() - t)
        nnz, shape = X.nnz, [X.shape[0], X.shape[1], Y.shape[1]]
    else:
        cpath = cache_path(args.path)
        for _ in range(args.repeat):
            if args.child in ("parse", "parse+cache") and os.path.exists(cpath):
                os.unlink(cpath)
            t = time.perf_counter()
            d = read_xmc(args.path, strict=True, cache=args.child != "parse")
            times.append(time.perf_counter() - t)
            nnz, shape = d.X.nnz, [d.n_points, d.n_features, d.n_labels]
            del d
    print(json.dumps({"seconds": min(times), "all": times, "peak_mb": _peak_mb(),
                      "base_mb": base, "nnz": nnz, "shape": shape}))
    return 0


def run_child(kind: str, path: str, repeat: int, src: str | None = None) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", kind, "--path", path,
           "--repeat", str(repeat)]
    if src:
        cmd += ["--src", src]
    env = dict(os.environ, NUMBA_NUM_THREADS="1")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", type=int, default=200_000, help="points to generate (200000)")
    ap.add_argument("--keep", metavar="DIR", help="write the files into DIR and keep them")
    ap.add_argument("--repeat", type=int, default=3, help="runs per command, best time kept (3)")
    ap.add_argument("--generator", choices=("auto", "synthetic", "own"), default="auto")
    ap.add_argument("--child", choices=("write", "parse", "parse+cache", "cached"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    ap.add_argument("--src", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.points < 1:
        ap.error(f"--points ({args.points}) must be >= 1")
    if args.repeat < 1:
        ap.error(f"--repeat ({args.repeat}) must be >= 1")
    if args.child:
        return child(args)

    tmp = None
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
        workdir = args.keep
    else:
        tmp = tempfile.TemporaryDirectory(prefix="bench_io.")
        workdir = tmp.name
    try:
        t = time.perf_counter()
        X, Y, source = generate(args.points, args.generator)
        gen_s = time.perf_counter() - t
        src = os.path.join(workdir, "amazon_like.npz")
        np.savez(src, x_data=X.data, x_indices=X.indices, x_indptr=X.indptr, x_shape=X.shape,
                 y_data=Y.data, y_indices=Y.indices, y_indptr=Y.indptr, y_shape=Y.shape)
        nnz_per_point = np.diff(X.indptr)
        print(f"data: {source}, generated in {gen_s:.1f} s; {X.shape[0]:,} points, "
              f"{X.shape[1]:,} features, {Y.shape[1]:,} labels; non-zeros/point mean "
              f"{nnz_per_point.mean():.1f}, median {np.median(nnz_per_point):.0f}, max "
              f"{nnz_per_point.max()}; labels/point {Y.nnz / Y.shape[0]:.2f}; values "
              f"{X.data.min():.3g}..{X.data.max():.3g}, median {np.median(X.data):.3g}")
        del X, Y
        path = os.path.join(workdir, "amazon_like.txt")
        r = {}
        r["write_xmc"] = run_child("write", path, args.repeat, src)
        r["read_xmc(cache=False)"] = run_child("parse", path, args.repeat)
        r["read_xmc (cold cache: parse + write cache)"] = run_child("parse+cache", path, args.repeat)
        r["read_xmc (cache hit)"] = run_child("cached", path, args.repeat)
        size_mb = os.path.getsize(path) / 1e6
        cache_mb = os.path.getsize(path + ".dslcache.npz") / 1e6
    finally:
        if tmp is not None:
            tmp.cleanup()

    print(f"text file {size_mb:.1f} MB, cache file {cache_mb:.1f} MB; "
          f"NUMBA_NUM_THREADS=1; numba compile time excluded (each measuring process warms up "
          f"on a tiny file first); best of {args.repeat} runs; peak MB = ru_maxrss of that "
          f"process (baseline after imports and warm-up in brackets).\n")
    print("| command | data shape | nnz | seconds | M nnz/s | peak MB |")
    print("|---|---|---|---:|---:|---:|")
    for name, m in r.items():
        n, f, l = m["shape"]
        print(f"| `{name}` | {n:,} x {f:,} / {l:,} labels | {m['nnz']:,} | {m['seconds']:.3f} | "
              f"{m['nnz'] / m['seconds'] / 1e6:.1f} | {m['peak_mb']:.0f} ({m['base_mb']:.0f}) |")
    parse = r["read_xmc(cache=False)"]["seconds"]
    hit = r["read_xmc (cache hit)"]["seconds"]
    parse_rate = r["read_xmc(cache=False)"]["nnz"] / parse / 1e6
    print(f"\nfirst parse: {parse_rate:.1f} M nnz/s (target >= 10); cached load is "
          f"{parse / hit:.1f}x faster than the parse (target >= 20x)")
    if args.keep:
        print(f"files kept in {args.keep}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
