"""Single kernels of the training step and of exact scoring, timed alone on one thread.

    python -m scripts.bench_kernels [--repo DIR=LABEL ...] [--reps N] [--no-record]

- `scores_topk`: the exact top k (k = 5, as `predict` keeps, and 100, as the validation
  checks keep for the fusion) of a block of 1,024 rows x 20,472 labels (wordnet_hypernyms'
  width) of scores x . w_j + b_j, x and w_j Gaussian and b_j the log of a Zipf prior, so that
  a few labels score high in every row, as trained biases make them.
- `flush_sum_rows`: the softmax's row sums with the flush of tiny values, on blocks of 128
  samples x 2,175 and x 640 columns (a wide output's step with every uniform negative, and
  with a quarter of them), values exp(-|N(0, 9)|).
- `blocked_topk`: a whole exact scoring as the validation checks run it, the products
  included: the top 100 of 3,813 points (wordnet_hypernyms' validation split) against
  10,236 labels (one of two ranks' slices), x ReLU of a Gaussian and the weights as above.
- the prior shifts' scorings: `blocked_topk`'s scoring under three bias vectors, b - tau x a
  log prior for tau 0.1, 0.2, 0.3 (the shifts a prior-shift choice scores beside 0), from one
  pass of products where the checkout has `blocked_topk_biases`, else three scorings.
- `softmax_stats (float32)`: a step's softmax statistics on FLUSH_SHAPES' blocks of logits
  N(0, 9), each sample's label column left out of the sums (the label softmax's): the max,
  the exponentials (numpy's before `kernels.exp_flush_sum_rows`, its own since), the flush and
  the sums.
- `shared_sample`: a training step's uniform negatives, 2,047 of a rank's 10,236 labels (a wide
  output's step with every one of them, wordnet_hypernyms at 2 ranks) and 512 (a quarter).
- `group_by_row`: a step's grouping of a batch's feature entries by feature (the first layer's
  sparse update): 12,000 entries over 29,225 features (a debian_tags batch of 256 points) and
  1,642 over 49,604 (wordnet_hypernyms, 128 points), drawn from a power law of the features.
- `adam_rows`: a wide output's lazy Adam over a step's block of rows, 2,111 and 576 of a rank's
  10,236 rows of 128 (wordnet_hypernyms at 2 ranks, every uniform negative and a quarter of them),
  drawn afresh for each call, after a 16 MiB read that leaves them out of the core's own caches
  (in a step, the rest of its work evicts them likewise; a larger read, past the shared cache, makes
  every call wait for memory, which a training step does not).
- `rows_grad_adam`: the first layer's sparse update, 1,642 entries over 49,604 features of 64
  (a wordnet_hypernyms batch of 128 points at 2 ranks), after the same read.
- `fuse_grid_hits`: the fusion choice's kernel over 45 (share, weight) cells for 3,813 points
  with 100 model candidates (Gaussian logits over the Zipf prior above), 10 neighbours among
  72,000 training points of one or two labels each and 20 label prototypes.

Each figure is the fastest of --reps calls after one warm call, in a fresh process per
checkout (1 thread). --repo DIR=LABEL measures another checkout of dslide with this venv
(DIR first on PYTHONPATH), say the code before a change; every checkout scores the same
arrays (a fixed seed), and the table says whether its results equal this checkout's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROWS, LABELS, DIM = 1024, 20_472, 128
FLUSH_SHAPES = ((128, 2175), (128, 640))
SCORING = (3813, 10_236)  # blocked_topk's points and labels
SAMPLES = ((10_236, 2047), (10_236, 512))  # shared_sample's (labels, draws)
GROUPS = ((12_000, 29_225), (1_642, 49_604))  # group_by_row's (entries, rows)
ADAM_ROWS = (10_236, 128, (2_111, 576))  # adam_rows' slice (rows, width) and its blocks
FIRST_LAYER = (1_642, 49_604, 64)  # rows_grad_adam's (entries, features, width)
COLD_BYTES = 16 << 20  # read before each call of the two above: their rows out of the core's caches
GRID = (3813, 100, 10, 20, 72_000)  # fuse_grid_hits' points, candidates, neighbours, prototypes, store
PRIOR_SHIFT_TAUS = (0.1, 0.2, 0.3)  # the shifts but 0 a prior-shift choice scores (rules.PRIOR_SHIFTS)


def _weights(n_labels: int, rng) -> tuple[np.ndarray, np.ndarray]:
    W = (rng.standard_normal((n_labels, DIM)) * 0.3).astype(np.float32)
    prior = 1.0 / np.arange(1, n_labels + 1) ** 1.1
    return W, np.log(prior / prior.sum()).astype(np.float32)[rng.permutation(n_labels)]


def _scores() -> np.ndarray:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((ROWS, DIM)).astype(np.float32)
    W, b = _weights(LABELS, rng)
    return x @ W.T + b


def _digest(*arrays) -> str:
    """Which results a kernel gave: a short hash of its output arrays' bytes."""
    return hashlib.sha1(b"".join(a.tobytes() for a in arrays)).hexdigest()[:12]


def _best(f, reps: int) -> float:
    f()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t)
    return best


def _best_cold(f, reps: int, setup) -> float:
    """`_best` of f() with setup() (untimed: new arguments, a read of other memory) before each call."""
    setup()
    f()
    best = float("inf")
    for _ in range(reps):
        setup()
        t = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t)
    return best


def _adam_rows(reps: int) -> list[dict]:
    """`adam_rows` and `rows_grad_adam` rows (ADAM_ROWS, FIRST_LAYER), COLD_BYTES read before each
    call; the digest is of the weights and moments after the calls of a fixed sequence."""
    from dslide.model import kernels

    out = []
    junk = np.ones(COLD_BYTES // 4, np.float32)
    hp = kernels.adam_params(5e-3, 0.9, 0.999, 1e-8, 10, np.float32)
    R, d, blocks = ADAM_ROWS
    for m in blocks:
        rng = np.random.default_rng(5)
        W = (rng.standard_normal((R, d)) * 0.1).astype(np.float32)
        M, V = np.zeros_like(W), np.zeros_like(W)
        b, bM, bV = np.zeros(R, np.float32), np.zeros(R, np.float32), np.zeros(R, np.float32)
        G = (rng.standard_normal((m, d)) * 1e-3).astype(np.float32)
        gb = (rng.standard_normal(m) * 1e-3).astype(np.float32)
        dirty = np.zeros(R, np.uint8)
        arg = {}

        def setup():
            arg["rows"] = np.sort(rng.choice(R, m, replace=False)).astype(np.int32)
            junk.sum()

        sec = _best_cold(lambda: kernels.adam_rows(arg["rows"], G, gb, W, M, V, b, bM, bV, hp, dirty,
                                                   kernels.NO_ROUNDING, kernels.NO_ROUNDING), reps, setup)
        out.append({"kernel": "adam_rows", "shape": f"{m:,} of {R:,} rows x {d}", "ms": sec * 1e3,
                    "digest": _digest(W, M, V, b, bM, bV)})
    E, F, d = FIRST_LAYER
    rng = np.random.default_rng(6)
    weights = 1.0 / np.arange(1, F + 1) ** 1.1
    W = (rng.standard_normal((F, d)) * 0.1).astype(np.float32)
    M, V = np.zeros_like(W), np.zeros_like(W)
    g = (rng.standard_normal((128, d)) * 1e-3).astype(np.float32)
    empty = np.empty(0, np.float32)
    gbuf = kernels.thread_scratch(d, np.float32)
    dirty = np.zeros(F, np.uint8)
    count = np.zeros(F, np.int32)
    arg = {}

    def setup():
        rows = rng.choice(F, E, p=weights / weights.sum()).astype(np.int32)
        order = np.empty(E, np.int64)
        touched, start = kernels.group_by_row(rows, F, count, order)
        arg["a"] = (touched, start, order, rng.integers(0, 128, E).astype(np.int32),
                    rng.standard_normal(E).astype(np.float32))
        junk.sum()

    sec = _best_cold(lambda: kernels.rows_grad_adam(*arg["a"], g, W, M, V, empty, empty, empty, hp, gbuf, dirty,
                                                    kernels.NO_ROUNDING, kernels.NO_ROUNDING), reps, setup)
    out.append({"kernel": "rows_grad_adam", "shape": f"{E:,} entries of {F:,} rows x {d}", "ms": sec * 1e3,
                "digest": _digest(W, M, V)})
    return out


def worker(reps: int) -> list[dict]:
    """This process's checkout (the first `dslide` on the path): [{kernel, shape, ms, digest}]."""
    from dslide.infer import fusion
    from dslide.model import kernels
    from dslide.model.topk import blocked_topk, scores_topk

    out = []
    S = _scores()
    for k in (5, 100):
        res = {}

        def run():
            res["r"] = scores_topk(S, k, 0)

        sec = _best(run, reps)
        digest = _digest(*res["r"])
        out.append({"kernel": f"scores_topk, k = {k}", "shape": f"{ROWS:,} x {LABELS:,}", "ms": sec * 1e3,
                    "digest": digest})
    rng = np.random.default_rng(1)
    for shape in FLUSH_SHAPES:
        base = np.exp(-np.abs(rng.standard_normal(shape) * 3)).astype(np.float32)
        copies = [base.copy() for _ in range(reps + 1)]
        sums = np.zeros(shape[0])
        it = iter(copies)
        sec = _best(lambda: kernels.flush_sum_rows(next(it), sums), reps)
        e, s = base.copy(), np.zeros(shape[0])
        kernels.flush_sum_rows(e, s)
        out.append({"kernel": "flush_sum_rows", "shape": f"{shape[0]:,} x {shape[1]:,}", "ms": sec * 1e3,
                    "digest": _digest(e, s)})
    rng = np.random.default_rng(2)
    x = np.maximum(rng.standard_normal((SCORING[0], DIM)), 0).astype(np.float32)
    W, b = _weights(SCORING[1], rng)
    res = {}

    def scoring():
        res["r"] = blocked_topk(x, W, b, 100, 0)

    sec = _best(scoring, reps)
    out.append({"kernel": "blocked_topk, k = 100", "shape": f"{SCORING[0]:,} x {SCORING[1]:,}", "ms": sec * 1e3,
                "digest": _digest(*res["r"])})
    out.append(_prior_shifts(x, W, b, reps))
    out += _softmax_stats(reps)
    for n, size in SAMPLES:
        mark = np.zeros(n, np.uint8)
        keys = iter(range(10**9))
        sec = _best(lambda: kernels.shared_sample(np.uint64(next(keys)), n, size, mark), reps)
        drawn = [kernels.shared_sample(np.uint64(t), n, size, mark) for t in range(50)]
        out.append({"kernel": "shared_sample", "shape": f"{size:,} of {n:,}", "ms": sec * 1e3,
                    "digest": _digest(*drawn)})
    rng = np.random.default_rng(4)
    for E, n_rows in GROUPS:
        weights = 1.0 / np.arange(1, n_rows + 1) ** 1.1
        rows = rng.choice(n_rows, E, p=weights / weights.sum()).astype(np.int32)
        count = np.zeros(n_rows, np.int32)
        order = np.empty(E, np.int64)
        res = {}

        def group():
            res["r"] = kernels.group_by_row(rows, n_rows, count, order)

        sec = _best(group, reps)
        out.append({"kernel": "group_by_row", "shape": f"{E:,} entries of {n_rows:,} rows", "ms": sec * 1e3,
                    "digest": _digest(*res["r"], order)})
    out += _adam_rows(reps)
    args, cells, truth, outs = _grid_arrays()
    if "[T, n, K]" in (fusion.fuse_grid_hits.__doc__ or ""):  # the kernel takes temperatures (a checkout since)
        args = (args[0], args[1][None]) + args[2:]
        cells = np.c_[cells, np.zeros(len(cells))]
    sec = _best(lambda: fusion.fuse_grid_hits(*args, cells, *truth, *outs), reps)
    out.append({"kernel": "fuse_grid_hits", "shape": f"{GRID[0]:,} x {len(cells)} cells", "ms": sec * 1e3,
                "digest": _digest(*outs)})
    return out


def _prior_shifts(x, W, b, reps: int) -> dict:
    """The prior shift's scorings: `blocked_topk`'s scoring under the biases of PRIOR_SHIFT_TAUS
    (b - tau x a log prior), all three from one pass of products where the checkout has
    `blocked_topk_biases`, else one scoring each."""
    from dslide.model import topk

    log_prior = np.log(np.linspace(1.0, 1e-4, b.size)).astype(np.float32)
    biases = [b - np.float32(tau) * log_prior for tau in PRIOR_SHIFT_TAUS]
    res = {}

    def run():
        if hasattr(topk, "blocked_topk_biases"):
            res["r"] = topk.blocked_topk_biases(x, W, biases, 100, 0)
        else:
            res["r"] = [topk.blocked_topk(x, W, bb, 100, 0) for bb in biases]

    sec = _best(run, reps)
    return {"kernel": f"the prior shifts' scorings, {len(biases)} x k = 100",
            "shape": f"{SCORING[0]:,} x {SCORING[1]:,}", "ms": sec * 1e3,
            "digest": _digest(*[a for r in res["r"] for a in r])}


def _softmax_stats(reps: int) -> list[dict]:
    """A step's softmax statistics (`dslide.model.loss.softmax_stats`, the label softmax's: each
    sample's label column left out of the sums) on float32 logits N(0, 9), FLUSH_SHAPES."""
    from dslide.model.loss import softmax_stats

    rng = np.random.default_rng(5)
    out = []
    for B, m in FLUSH_SHAPES:
        base = (rng.standard_normal((B, m)) * 3).astype(np.float32)
        rows, cols = np.arange(B), rng.integers(0, min(m, 128), B)
        copies = iter([base.copy() for _ in range(reps + 1)])
        sec = _best(lambda: softmax_stats(next(copies), (rows, cols)), reps)
        z = base.copy()
        mx, se = softmax_stats(z, (rows, cols))
        out.append({"kernel": "softmax_stats (float32)", "shape": f"{B:,} x {m:,}", "ms": sec * 1e3,
                    "digest": _digest(z, mx, se)})
    return out


def _grid_arrays():
    """fuse_grid_hits' arguments (`GRID`) up to its cells, the cells, the true labels (CSR ptr and
    ids) and its outputs (hits uint8, scores float64)."""
    n, K, kn, kp, points = GRID
    rng = np.random.default_rng(3)
    W, b = _weights(LABELS, rng)
    per = rng.integers(1, 3, points)
    y_ptr = np.r_[0, np.cumsum(per)].astype(np.int64)
    y_idx = rng.integers(0, LABELS, int(y_ptr[-1])).astype(np.int32)
    x = rng.standard_normal((n, DIM)).astype(np.float32)
    m_logits = np.sort((x @ W[:4096].T + b[:4096]).astype(np.float64), axis=1)[:, ::-1][:, :K].copy()
    m_ids = np.stack([rng.choice(LABELS, K, replace=False) for _ in range(n)]).astype(np.int64)
    nn_ids = rng.integers(0, points, (n, kn)).astype(np.int32)
    nn_sims = np.sort(rng.uniform(0.2, 0.9, (n, kn)), axis=1)[:, ::-1].astype(np.float32)
    pr_ids = np.stack([rng.choice(LABELS, kp, replace=False) for _ in range(n)]).astype(np.int32)
    pr_sims = np.sort(rng.uniform(0.2, 0.9, (n, kp)), axis=1)[:, ::-1].astype(np.float32)
    t_ptr = np.arange(n + 1, dtype=np.int64)
    t_idx = m_ids[:, 0].astype(np.int32)  # one true label a point: the model's first
    cells = np.array([(a, w) for a in (0.0, 0.25, 0.5, 0.75, 1.0) for w in np.arange(1, 10) / 10])
    args = (m_ids, m_logits / 4.0, nn_ids, nn_sims, y_ptr, y_idx, 4.0, pr_ids, pr_sims, 16.0)
    outs = (np.empty((len(cells), n, 5), np.uint8), np.empty((len(cells), n, 5)))
    return args, cells, (t_ptr, t_idx), outs


def measure(repo: Path, reps: int) -> list[dict]:
    """`worker` in a fresh process that imports dslide from `repo` (this file loaded by its path:
    an older checkout has no copy of it)."""
    from . import measure as M

    here = str(Path(__file__).resolve())
    code = (f"import importlib.util, json, sys; sys.path.insert(0, {str(repo)!r}); "
            f"spec = importlib.util.spec_from_file_location('bench_kernels_worker', {here!r}); "
            f"m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
            f"print(json.dumps(m.worker({reps})))")
    env = M.thread_env(1, PYTHONPATH=str(repo))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=repo)
    if p.returncode:
        raise SystemExit(f"the kernels failed in {repo}:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repo", action="append", default=[], metavar="DIR=LABEL",
                   help="another checkout of dslide to measure with this venv (repeatable)")
    p.add_argument("--reps", type=int, default=5, help="calls timed per figure (the fastest is kept)")
    p.add_argument("--no-record", action="store_true", help="do not update docs/benchmarks.md")
    a = p.parse_args(argv)
    if a.reps < 1:
        raise SystemExit(f"--reps must be at least 1, not {a.reps}")
    from . import measure as M

    repos = [(Path(r.split("=", 1)[0]).resolve(), r.split("=", 1)[1] if "=" in r else r) for r in a.repo]
    repos.append((M.ROOT, "this checkout"))
    results = [(label, measure(repo, a.reps)) for repo, label in repos]
    mine = {(r["kernel"], r["shape"]): r for r in results[-1][1]}
    rows = []
    for label, rs in results:
        for r in rs:
            ref = mine.get((r["kernel"], r["shape"]))
            rows.append({"code": label, "kernel": r["kernel"], "shape": r["shape"], "ms": f"{r['ms']:.3f}",
                         "vs this checkout": f"{r['ms'] / ref['ms']:.2f}x" if ref else "-",
                         "same results": "yes" if ref and ref["digest"] == r["digest"] else "no"})
    cols = [(c, c) for c in ("code", "kernel", "shape", "ms", "vs this checkout", "same results")]
    M.report("bench_kernels", argv if argv is not None else sys.argv[1:], rows, cols, None, not a.no_record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
