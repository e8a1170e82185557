#!/usr/bin/env python
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

    NUMBA_NUM_THREADS=2 python scripts/bench_lsh.py
    python scripts/bench_lsh.py --items 100000 --setting dwta,K=6,L=50,rp=15,C=32,mode=union
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time

# BLAS gets as many threads as numba, so brute force and LSH use the same cores.
_THREADS = os.environ.get("NUMBA_NUM_THREADS", str(os.cpu_count() or 1))
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, _THREADS)

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
    T = lsh.HashTables(fam, s["rp"], s["C"], policy=s["policy"], seed=1)
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
    return (f"{s['family']} K={s['K']} L={s['L']}{extra} rp={s['rp']} C={s['C']} "
            f"{s['policy']} {s['mode']}{sel}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
    args = ap.parse_args(argv)
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

    print(f"command: {' '.join(shlex.quote(a) for a in [sys.executable, *sys.argv])}")
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
