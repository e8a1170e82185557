"""Benchmark the XMC text reader/writer of dslide.io.data on Amazon-like data.

    .venv/bin/python -m scripts.bench_io [--points 200000] [--keep DIR]

Generates `--points` Amazon-670K-like points (135,909 features, 670,091 labels,
~64 non-zeros per point with a heavy tail, ~5 labels per point, positive
tf-idf-like values), with `dslide.datasets.synthetic.generate('amazon-like')` when that
module is importable, else with the vectorised generator below (`--generator`
chooses). Then it times, each command in a fresh process of 1 thread
(measure.thread_env) so that its peak resident memory (VmHWM,
measure.peak_rss_mb) is that command's alone:

* write_xmc                      the text file
* read_xmc(cache=False)          the first parse
* read_xmc (cold cache)          parse + writing the cache <file>.dslcache/ (one .npy per array)
* read_xmc (cache hit)           loading the cache (every array memory-mapped)
* ... + touch every page         the same, then one pass over X.data, X.indices and
                                 Y.indices, so that every mapped page is faulted in

Each process first writes and reads a tiny file, so numba compilation (or
loading compiled kernels from numba's cache) is excluded from every time.
Times are the best of `--repeat` runs; the machine may be shared, so repeat
if a figure looks off. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import scipy.sparse as sp

from . import measure as M

N_FEATURES = 135_909
N_LABELS = 670_091


def _zipf_ranks(rng, n_items: int, size: int, a: float) -> np.ndarray:
    """Ranks in [0, n_items) with density ~ (r + 2)^-a (inverse CDF of the continuous law)."""
    u = rng.random(size)
    lo, hi = 2.0 ** (1 - a), (n_items + 2.0) ** (1 - a)
    r = (lo + u * (hi - lo)) ** (1.0 / (1 - a)) - 2.0
    return np.minimum(r.astype(np.int64), n_items - 1)


def _unique_rows(rng, counts: np.ndarray, n_cols: int, draw) -> tuple[np.ndarray, np.ndarray]:
    """(row, col) pairs, sorted, `counts[i]` distinct columns in row i.

    Columns come from `draw(size)`; repeats within a row are replaced by uniform
    columns (rare ones), twice, after which a row may keep a few fewer.
    """
    def sorted_unique(a):
        # np.unique hashes first in numpy 2.x, ~6x slower than this on 10^7 int64 keys
        a = np.sort(a)
        return a[np.concatenate(([True], a[1:] != a[:-1]))] if a.size else a

    n = counts.size
    rows = np.repeat(np.arange(n, dtype=np.int64), counts)
    keys = sorted_unique(rows * n_cols + draw(rows.size))
    for _ in range(2):
        deficit = counts - np.bincount(keys // n_cols, minlength=n)
        if not deficit.any():
            break
        more = np.repeat(np.arange(n, dtype=np.int64), deficit)
        extra = more * n_cols + rng.integers(0, n_cols, more.size)
        keys = sorted_unique(np.concatenate([keys, extra]))
    return np.divmod(keys, n_cols)


def amazon_like(n_points: int, seed: int = 0):
    """Vectorised Amazon-670K-like data: (X csr float32, Y csr float32).

    Non-zeros per point: LogNormal with median 42 and mean 64 (as the 512 real
    points), clipped to [1, 1000]; features by a Zipf-like popularity
    (p(rank r) ~ (r + 2)^-1.05), distinct within a row. Values tf * idf with
    idf = 0.6 log2(2 + rank) and tf ~ Geometric(0.7) (median value about 7.5).
    Labels per point: min(1 + Poisson(4.2), 8), by Zipf-like popularity.
    """
    rng = np.random.default_rng(seed)
    k = np.clip(np.rint(rng.lognormal(np.log(42.0), 0.918, n_points)), 1, 1000).astype(np.int64)
    feat_of_rank = rng.permutation(N_FEATURES)
    x_rows, x_cols = _unique_rows(
        rng, k, N_FEATURES, lambda size: feat_of_rank[_zipf_ranks(rng, N_FEATURES, size, 1.05)])
    rank_of_feat = np.argsort(feat_of_rank)
    x_data = (rng.geometric(0.7, x_cols.size) * 0.6 * np.log2(2.0 + rank_of_feat[x_cols]))
    x_indptr = np.concatenate([[0], np.cumsum(np.bincount(x_rows, minlength=n_points))])
    X = sp.csr_matrix((x_data.astype(np.float32), x_cols.astype(np.int32), x_indptr),
                      shape=(n_points, N_FEATURES))

    m = np.minimum(1 + rng.poisson(4.2, n_points), 8)
    label_of_rank = rng.permutation(N_LABELS)
    y_rows, y_cols = _unique_rows(
        rng, m, N_LABELS, lambda size: label_of_rank[_zipf_ranks(rng, N_LABELS, size, 1.1)])
    y_indptr = np.concatenate([[0], np.cumsum(np.bincount(y_rows, minlength=n_points))])
    Y = sp.csr_matrix((np.ones(y_cols.size, np.float32), y_cols.astype(np.int32), y_indptr),
                      shape=(n_points, N_LABELS))
    return X, Y


def generate(n_points: int, which: str):
    """(X, Y, description) from dslide.datasets.synthetic (if available and wanted) or amazon_like."""
    if which in ("auto", "synthetic"):
        try:
            from dslide.datasets.synthetic import generate as synth  # noqa: PLC0415
        except ImportError:
            if which == "synthetic":
                raise
        else:
            d = synth("amazon-like", n_points=n_points)
            return d.X, d.Y, "dslide.datasets.synthetic.generate('amazon-like')"
    X, Y = amazon_like(n_points)
    return X, Y, "bench_io.amazon_like (vectorised, in this script)"


def _warm_up(tmpdir: str) -> None:
    from dslide.io.data import cache_path, read_xmc, write_xmc  # noqa: PLC0415

    X = sp.csr_matrix(np.array([[0, 1.5, 0], [2.25, 0, 1e-3]], dtype=np.float32))
    Y = sp.csr_matrix(np.array([[1, 0], [1, 1]], dtype=np.float32))
    path = os.path.join(tmpdir, "warmup.txt")
    write_xmc(path, X, Y)
    read_xmc(path, cache=False)
    read_xmc(path)  # parse + write cache
    read_xmc(path)  # cache hit
    os.unlink(path)
    shutil.rmtree(cache_path(path))


def _generate_child(args) -> dict:
    t = time.perf_counter()
    X, Y, source = generate(args.points, args.generator)
    gen_s = time.perf_counter() - t
    np.savez(args.path, x_data=X.data, x_indices=X.indices, x_indptr=X.indptr, x_shape=X.shape,
             y_data=Y.data, y_indices=Y.indices, y_indptr=Y.indptr, y_shape=Y.shape)
    k = np.diff(X.indptr)
    return {"describe": (
        f"data: {source}, generated in {gen_s:.1f} s; {X.shape[0]:,} points, "
        f"{X.shape[1]:,} features, {Y.shape[1]:,} labels; non-zeros/point mean {k.mean():.1f}, "
        f"median {np.median(k):.0f}, max {k.max()}; labels/point {Y.nnz / Y.shape[0]:.2f}; "
        f"values {X.data.min():.3g}..{X.data.max():.3g}, median {np.median(X.data):.3g}")}


def _measure_child(args) -> dict:
    from dslide.io.data import cache_path, read_xmc, write_xmc  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as tmp:
        _warm_up(tmp)
    times = []
    if args.child == "write":
        z = np.load(args.src)
        X = sp.csr_matrix((z["x_data"], z["x_indices"], z["x_indptr"]), shape=tuple(z["x_shape"]))
        Y = sp.csr_matrix((z["y_data"], z["y_indices"], z["y_indptr"]), shape=tuple(z["y_shape"]))
        base = M.peak_rss_mb() or 0.0
        for _ in range(args.repeat):
            t = time.perf_counter()
            write_xmc(args.path, X, Y)
            times.append(time.perf_counter() - t)
        nnz, shape = X.nnz, [X.shape[0], X.shape[1], Y.shape[1]]
    else:
        base = M.peak_rss_mb() or 0.0
        cpath = cache_path(args.path)
        for _ in range(args.repeat):
            if args.child in ("parse", "parse+cache") and os.path.exists(cpath):
                shutil.rmtree(cpath)
            t = time.perf_counter()
            d = read_xmc(args.path, strict=True, cache=args.child != "parse")
            if args.child == "cached+touch":
                d.X.data.sum(), d.X.indices.max(), d.Y.indices.max()
            times.append(time.perf_counter() - t)
            nnz, shape = d.X.nnz, [d.n_points, d.n_features, d.n_labels]
            del d
    return {"seconds": min(times), "all": times, "peak_mb": M.peak_rss_mb() or 0.0, "base_mb": base,
            "nnz": nnz, "shape": shape}


def run_child(kind: str, path: str, repeat: int = 1, *extra: str) -> dict:
    # A fresh process per command: its VmHWM is then that command's peak. Paths made
    # absolute: the child runs in the repository root.
    extra = [os.path.abspath(x) if i and extra[i - 1] == "--src" else x for i, x in enumerate(extra)]
    cmd = M.module_cmd("bench_io", "--child", kind, "--path", os.path.abspath(path), "--repeat", repeat, *extra)
    out = subprocess.run(cmd, capture_output=True, text=True, env=M.thread_env(1), cwd=M.ROOT)
    if out.returncode:
        sys.stderr.write(out.stderr)
        raise SystemExit(f"{kind} failed (exit {out.returncode})")
    return json.loads(out.stdout.strip().splitlines()[-1])


COMMANDS = {
    "write": "write_xmc",
    "parse": "read_xmc(cache=False)",
    "parse+cache": "read_xmc (cold cache: parse + write cache)",
    "cached": "read_xmc (cache hit)",
    "cached+touch": "read_xmc (cache hit) + touch every page",
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", type=int, default=200_000, help="points to generate (200000)")
    ap.add_argument("--keep", metavar="DIR", help="write the files into DIR and keep them")
    ap.add_argument("--repeat", type=int, default=3, help="runs per command, best time kept (3)")
    ap.add_argument("--generator", choices=("auto", "synthetic", "own"), default="auto",
                    help="auto: dslide.datasets.synthetic if importable, else this script's own")
    ap.add_argument("--child", choices=("generate", *COMMANDS), help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    ap.add_argument("--src", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.points < 1:
        ap.error(f"--points ({args.points}) must be >= 1")
    if args.repeat < 1:
        ap.error(f"--repeat ({args.repeat}) must be >= 1")
    if args.child:
        result = _generate_child(args) if args.child == "generate" else _measure_child(args)
        print(json.dumps(result))
        return 0

    tmp = None
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
        workdir = args.keep
    else:
        tmp = tempfile.TemporaryDirectory(prefix="bench_io.")
        workdir = tmp.name
    try:
        src = os.path.join(workdir, "amazon_like.npz")
        print(run_child("generate", src, 1, "--points", str(args.points),
                        "--generator", args.generator)["describe"])
        path = os.path.join(workdir, "amazon_like.txt")
        r = {}
        for kind, label in COMMANDS.items():
            extra = ("--src", src) if kind == "write" else ()
            r[label] = run_child(kind, path, args.repeat, *extra)
        size_mb = os.path.getsize(path) / 1e6
        cpath = path + ".dslcache"
        cache_mb = sum(os.path.getsize(os.path.join(cpath, f)) for f in os.listdir(cpath)) / 1e6
    finally:
        if tmp is not None:
            tmp.cleanup()

    print(f"text file {size_mb:.1f} MB, cache file {cache_mb:.1f} MB. 1 thread (measure.thread_env). "
          f"Numba compile time excluded (each measuring process first writes and reads a tiny "
          f"file). Best of {args.repeat} runs. Peak MB = VmHWM of the measuring process "
          f"(in brackets: its peak after imports and warm-up, before the command).\n")
    print("| command | data shape | nnz | seconds | M nnz/s | peak MB |")
    print("|---|---|---|---:|---:|---:|")
    for name, m in r.items():
        n, f, l = m["shape"]
        print(f"| `{name}` | {n:,} x {f:,}, {l:,} labels | {m['nnz']:,} | {m['seconds']:.3f} | "
              f"{m['nnz'] / m['seconds'] / 1e6:.1f} | {m['peak_mb']:.0f} ({m['base_mb']:.0f}) |")
    parse = r[COMMANDS["parse"]]
    hit = r[COMMANDS["cached"]]["seconds"]
    touched = r[COMMANDS["cached+touch"]]["seconds"]
    print(f"\nfirst parse: {parse['nnz'] / parse['seconds'] / 1e6:.1f} M nnz/s (target >= 10); "
          f"cache hit {parse['seconds'] / hit:.0f}x faster than the parse (target >= 20x), "
          f"{parse['seconds'] / touched:.0f}x with every page touched")
    if args.keep:
        print(f"files kept in {args.keep}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
