#!/usr/bin/env python
"""dslide against what a user would run otherwise, on the same data and machine, in one run.

    python scripts/bench.py --suite shapes                     (every data shape against the trees; scripts/bench_suite.py)
    python scripts/bench.py --suite quick                      (both parts, about 10 minutes)
    python scripts/bench.py --suite full --parts main          (about 25 minutes on 2 cores)
    python scripts/bench.py --suite full --parts peers         (about 15 minutes)
    python scripts/bench.py --suite full --parts peers --preset amazon-tail
    python scripts/bench.py --suite full --parts lsh           (what LSH buys; about 25 minutes)
    python scripts/bench.py --suite full --parts schedule      (the same with the default schedule; 15 minutes)

On a shared machine run each under the bench lock (flock /tmp/dslide-bench.lock ...);
the full suite's two parts are two commands so that neither holds it past ~30 minutes.
`--preset amazon-tail` takes the longer-tailed variant of the synthetic data
(datasets/synthetic.py) instead of amazon-like.

Part "main", the same network by different trainers, each with the same
training-time budget, one after the other:
- dslide, 1 rank x 1 thread and 2 ranks x 1 thread (mpiexec): the defaults
  for this data (an LSH output layer at 670,091 labels);
- dense: the same network with every output neuron (exact mode: BLAS
  products, full softmax), 1 rank x 2 threads;
- data-parallel: the dense network on 2 ranks x 1 thread, each rank a slice of
  every batch, every gradient all-reduced every step (what Horovod and
  PyTorch DDP do), `parallel = "data"`;
- PyTorch: the same network in PyTorch (EmbeddingBag input, full softmax,
  Adam) on the CPU, 2 threads, from scripts/bench_vs_torch.py (installed on
  demand into .venv-baselines; left out with a note when it cannot be installed).
All share hidden 128, batch 128, Adam with lr 1e-2 held constant (a time
budget, not an epoch count, ends each run), the same first-layer init and
input normalisation. The target P@1 is the dense system's final P@1 minus
one point; "time to target" is the training time (evaluations excluded) at
the first evaluation that reaches it. The full suite adds BibTeX
(../shared/data) when present: dslide's defaults against PyTorch with the
same settings.

Part "peers", what extreme-classification users run today (see peer_rows):
dslide with its defaults (2 ranks x 1 thread, its default epochs) against
omikuji (Parabel; 1 and 3 trees) and napkinXC (PLT) with theirs, and PyTorch
as a careful user writes a sampled softmax with dslide's settings, 2 cores
each, on the same files and scored by the same code, with P@k and PSP@k; on
the synthetic data and on BibTeX when present.

Part "lsh", what the hash tables buy (see lsh_systems): the default
output layer (anchor candidates + uniform negatives) against uniform
negatives only (sampled softmax: as many as the old default, as many as the
defaults draw, and about as many active neurons as the defaults compute),
candidates only, SLIDE's DWTA hashing in place of the anchor tables, and each
sample's own candidates (lsh.scope "sample"), 1 rank x 2 threads, the same
training-time budget and constant learning rate for all: samples/s, active
neurons per step, P@1 half-way and at the end, P@5 and PSP@5 at the end,
seconds to the old default's final P@1. With --labels N (a narrower
layer; the issue's "20,000 labels" case) the comparison is the defaults
(uniform negatives only at that width: the target), the same uniform
negatives with the batch's candidates and with each sample's own, and the
full softmax. Then inference on the defaults'
model (670,091 labels only), at 1 rank and at 2 ranks: exact scoring against `--lsh` (the index
built from the final weights) and against a static shortlist of the
highest-bias labels of the same size: share scored, seconds, recall of the
exact top-10, P@1, P@5, PSP@5.

Each part prints a markdown table, writes a PNG of P@1 against training time
(docs/bench_<suite>[_peers][_<preset>].png), and records both, with the
command and the machine, in docs/benchmarks.md (scripts/_bench.py record).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench as B  # noqa: E402

PRESETS = ("amazon-like", "amazon-tail")
SUITES = {
    "quick": {"data": {"preset": "amazon-like", "n_train": 20000, "n_test": 1000, "seed": 0},
              "budget": 25, "eval_points": 1000, "eval_every": (60, 10)},
    "full": {"data": {"preset": "amazon-like", "n_train": 50000, "n_test": 5000, "seed": 0},
             "budget": 180, "eval_points": 2000, "eval_every": (250, 20)},
}
COMMON = {"hidden": [128], "batch_size": 128, "lr": 1e-2, "lr_schedule": "constant", "epochs": 1000.0,
          "dropout": 0.0, "init_input_scale": 0.3}


def systems(suite: dict) -> list[dict]:
    # evaluation steps (fast systems, slow ones): a few dozen points per curve; evaluations are
    # left out of the training time but not of the suite's wall time
    ev = suite["eval_points"]
    fast = {**COMMON, "eval_every": suite["eval_every"][0], "eval_points": ev}
    slow = {**COMMON, "eval_every": suite["eval_every"][1], "eval_points": ev}
    return [
        {"name": "dslide", "ranks": 1, "threads": 1, "config": fast},
        {"name": "dslide", "ranks": 2, "threads": 1, "config": fast},
        {"name": "dense (exact)", "ranks": 1, "threads": 2, "config": {**slow, "exact": True}},
        {"name": "data-parallel (dense)", "ranks": 2, "threads": 1,
         "config": {**slow, "exact": True, "parallel": "data"}},
    ]


def run_torch_case(data_spec: dict, budget: float, eval_points: int, threads: int = 2, **kw) -> dict:
    import bench_vs_torch as BT

    train, test = B.load_data(data_spec)
    opts = dict(hidden=COMMON["hidden"][0], lr=COMMON["lr"], batch_size=COMMON["batch_size"], epochs=1000.0,
                time_budget=budget, threads=threads, init_input_scale=COMMON["init_input_scale"],
                eval_every=10, eval_points=eval_points)
    opts.update(kw)
    try:
        r = BT.run_torch(train, test, workdir=B.ROOT / "runs" / "bench_torch", omp_wait_policy="PASSIVE", **opts)
    except Exception as e:  # the suite goes on without PyTorch
        return {"available": False, "reason": f"{type(e).__name__}: {e}"}
    if not r.get("available"):
        return r
    curve = [{"wall_s": x["wall_s"], "p@1": x["p@1"], "step": x["step"]} for x in r["log"] if "p@1" in x]
    return {"name": "PyTorch", "ranks": 1, "threads": threads, "samples_per_s": r["samples_per_s"],
            "p@1": r["p@1"], "p@3": r.get("p@3", float("nan")), "p@5": r["p@5"], "curve": curve,
            "bytes_per_step": 0.0, "peak_rss_mb": r.get("peak_rss_mb", float("nan")),
            "train_s": curve[-1]["wall_s"] if curve else float("nan"), "available": True,
            "torch": r.get("torch_version", "")}


PARTS = ("main", "peers", "lsh", "schedule")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", choices=sorted(SUITES) + ["shapes"], default="quick",
                   help="quick, full, or shapes: the data-shape suite (scripts/bench_suite.py), "
                        "dslide against the tree libraries on every member")
    p.add_argument("--parts", default="main,peers",
                   help="comma-separated: main (the same network by dslide, dense, data-parallel, PyTorch), "
                        "peers (dslide's defaults against omikuji, napkinXC, PyTorch sampled softmax), "
                        "lsh (what the hash tables buy: candidates against uniform negatives, --lsh inference), "
                        "schedule (the same with the default schedule: epochs and a decaying lr)")
    p.add_argument("--preset", choices=PRESETS, default="amazon-like", help="the synthetic data set")
    p.add_argument("--labels", type=int, default=0,
                   help="parts lsh and schedule only: generate the preset with this many labels "
                        "(default: the preset's)")
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--no-trees", action="store_true", help="leave omikuji and napkinXC out")
    p.add_argument("--no-record", action="store_true", help="do not update docs/benchmarks.md")
    import bench_suite

    bench_suite.add_arguments(p)
    a = p.parse_args(argv)
    if a.suite == "shapes":
        return bench_suite.run(a)
    parts = [x.strip() for x in a.parts.split(",") if x.strip()]
    bad = sorted(set(parts) - set(PARTS))
    if bad or not parts:
        p.error(f"--parts {a.parts!r}: choose from {', '.join(PARTS)} (comma-separated)")
    if a.labels and (a.labels < 1000 or not set(parts) <= {"lsh", "schedule"}):
        p.error(f"--labels {a.labels}: must be >= 1000 and goes with --parts lsh and schedule alone")
    suite = {**SUITES[a.suite], "data": {**SUITES[a.suite]["data"], "preset": a.preset}}
    if a.labels:
        suite["data"]["n_labels"] = a.labels
    if "main" in parts:
        main_part(a, suite)
    if "peers" in parts:
        peers_part(a, suite)
    if "lsh" in parts:
        lsh_part(a, suite)
    if "schedule" in parts:
        schedule_part(a, suite)
    return 0


def main_part(a, suite: dict) -> None:
    t0 = time.time()
    notes = []
    cases = [{**case, "label": f"{case['name']}, {case['ranks']} x {case['threads']}", "data": suite["data"],
              "time_budget": suite["budget"]} for case in systems(suite)]
    rows = B.run_cases(cases, notes)
    if not a.no_torch:
        print("running: PyTorch ...", file=sys.stderr, flush=True)
        r = run_torch_case(suite["data"], suite["budget"], suite["eval_points"])
        if r.get("available"):
            rows.append(r)
        else:
            notes.append(f"PyTorch left out: {r.get('reason')}")
    dense = next((r for r in rows if r["name"].startswith("dense")), None)
    target = (dense["curve"][-1]["p@1"] - 0.01) if dense and dense["curve"] else None
    for r in rows:
        t = B.time_to(r["curve"], target) if target is not None else None
        r["t_target"] = "not reached" if t is None else f"{t:.1f}"
    cols = [
        ("system", "name"),
        ("ranks x threads", lambda r: f"{r['ranks']} x {r['threads']}"),
        ("samples/s", lambda r: f"{r['samples_per_s']:,.0f}"),
        (f"s to P@1 {target:.4f}" if target is not None else "s to target", "t_target"),
        ("P@1", lambda r: f"{r['p@1']:.4f}"),
        ("P@5", lambda r: f"{r['p@5']:.4f}"),
        ("bytes/step/rank", lambda r: f"{r['bytes_per_step']:,.0f}" if r["ranks"] > 1 else "-"),
        ("peak MB/rank", lambda r: f"{r['peak_rss_mb']:,.0f}"),
    ]
    d = suite["data"]
    shape = f"{d['preset']} synthetic, {d['n_train']:,} train / {d['n_test']:,} test points, 135,909 features, 670,091 labels"
    cmd = f"python scripts/bench.py --suite {a.suite} --parts main" + _preset_flag(a) + (" --no-torch" if a.no_torch else "")
    text = (f"command: `{cmd}` ({time.time() - t0:.0f} s)\n\nmachine: {B.machine()}\n\n"
            f"data: {shape}; each system {suite['budget']} s of training; P@1 curves on the first "
            f"{suite['eval_points']:,} test points, final P@1/P@5 on all of them\n\n" + B.table(rows, cols) + "\n")
    if notes:
        text += "\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    if a.suite == "full":
        text += "\n" + bibtex_section(a.no_torch)
    _publish(a, "", text, rows, f"P@1 against training time ({shape})", rows)


def _publish(a, part: str, text: str, rows: list, title: str, payload) -> None:
    """Print a part's text, draw its P@1 curves (docs/bench_<suite>[_<part>][_<preset>].png),
    record the section in docs/benchmarks.md unless --no-record, and keep `payload` as json in runs/."""
    print(text)
    name = (f"bench_{a.suite}" + (f"_{part}" if part else "") + (f"_{a.preset}" if a.preset != "amazon-like" else "")
            + (f"_{a.labels}labels" if a.labels else ""))
    png = B.ROOT / "docs" / f"{name}.png"
    drew = plot(rows, png, title)
    if not a.no_record:
        B.record(f"bench.py --suite {a.suite}" + (f" --parts {part}" if part else "") + _preset_flag(a),
                 text + "\n" + (f"![P@1 against training time]({png.name})\n" if drew else ""))
    (B.ROOT / "runs").mkdir(exist_ok=True)
    (B.ROOT / "runs" / f"{name}.json").write_text(json.dumps(payload, indent=1, default=float))


def _preset_flag(a) -> str:
    return (f" --preset {a.preset}" if a.preset != "amazon-like" else "") + (
        f" --labels {a.labels}" if a.labels else "")


def bibtex_section(no_torch: bool) -> str:
    shared = B.ROOT.parent / "shared" / "data"
    if not (shared / "bibtex_train.txt").exists():
        return "BibTeX: ../shared/data/bibtex_*.txt not present, skipped.\n"
    data = {"train": str(shared / "bibtex_train.txt"), "test": str(shared / "bibtex_test.txt")}
    rows = []
    r = B.run_case({"name": "dslide defaults", "data": data, "threads": 2, "config": {"eval_every": 0}})
    if "error" not in r:
        r["name"] = "dslide (defaults: hidden 1024, dropout 0.6, lr 1e-3 decayed, batch 64, 30 epochs)"
        rows.append(r)
    if not no_torch:
        import bench_vs_torch as BT

        train, test = B.load_data(data)
        try:
            t = BT.run_torch(train, test, hidden=1024, dropout=0.6, lr=1e-3, batch_size=64, epochs=30.0, threads=2,
                             init_input_scale=0.1, workdir=B.ROOT / "runs" / "bench_torch_bibtex",
                             omp_wait_policy="PASSIVE")
            if t.get("available"):
                rows.append({"name": "PyTorch (same settings, constant lr, zero output bias)", "threads": 2,
                             "samples_per_s": t["samples_per_s"], "p@1": t["p@1"], "p@3": t.get("p@3", float("nan")),
                             "p@5": t["p@5"]})
        except Exception as e:
            rows.append({"name": f"PyTorch failed: {e}", "threads": 2, "samples_per_s": 0.0, "p@1": 0.0,
                         "p@3": 0.0, "p@5": 0.0})
    cols = [("system", "name"), ("threads", "threads"), ("samples/s", lambda r: f"{r['samples_per_s']:,.0f}"),
            ("P@1", lambda r: f"{r['p@1']:.4f}"), ("P@3", lambda r: f"{r['p@3']:.4f}"),
            ("P@5", lambda r: f"{r['p@5']:.4f}")]
    return ("BibTeX (4,880 train / 2,515 test, 1,836 features, 159 labels; published P@1: Parabel 64.53, "
            "SLEEC 65.08):\n\n" + B.table(rows, cols) + "\n")


def plot(rows, png: Path, title: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(no plot: matplotlib is not installed; pip install -e '.[plot]')", file=sys.stderr)
        return False
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in rows:
        c = r.get("curve") or []
        if c:
            ax.plot([x["wall_s"] for x in c], [x["p@1"] for x in c], marker="o", ms=3,
                    label=f"{r['name']} ({r['ranks']} x {r['threads']})")
    ax.set_xlabel("training time (s)")
    ax.set_ylabel("P@1")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    png.parent.mkdir(exist_ok=True)
    fig.savefig(png, dpi=110)
    return True




# --------------------------------------------------------------------------- peers: what users run instead
#
# dslide with its defaults for the data (no settings given) against what
# extreme-classification users run today: the tree libraries omikuji (Parabel)
# and napkinXC (PLT), with their defaults, and a PyTorch sampled softmax as a
# careful user writes it (scripts/_torch_train.py --output sampled: the same
# network, negatives, input normalisation, initialisation and learning-rate
# schedule as dslide's defaults, sparse gradients with SparseAdam, denormals
# flushed). Every system reads the same files and is scored by the same code
# (dslide.metrics.evaluate, propensities from the training labels with
# pyxclib's A = 0.55, B = 1.5); training seconds leave out reading the data,
# compiling and evaluating.

PEERS_EVAL_EVERY = {"quick": 50, "full": 100}  # steps between dslide's / PyTorch's P@1 points
PEERS_TREES = (1, 3)                           # omikuji tree counts (its default is 3)
PEERS_THREADS = 2
SAMPLED_NEGATIVES = 16384                      # PyTorch sampled softmax: shared uniform negatives per step


def peer_files(spec: dict) -> tuple[Path, Path]:
    """XMC text files of a synthetic data set (written once under runs/bench_data/), or the given paths."""
    if "preset" not in spec:
        return Path(spec["train"]), Path(spec["test"])
    from dslide.data import write_xmc

    d = B.ROOT / "runs" / "bench_data"
    stem = f"{spec['preset']}-{spec['n_train']}-{spec['n_test']}-s{spec.get('seed', 0)}"
    paths = d / f"{stem}_train.txt", d / f"{stem}_test.txt"
    if not all(p.exists() for p in paths):
        d.mkdir(parents=True, exist_ok=True)
        for path, data in zip(paths, B.load_data(spec)):
            write_xmc(path, data.X, data.Y)  # written under a temporary name, then renamed
    return paths


def peer_rows(train_path: Path, test_path: Path, suite_name: str, suite: dict, notes: list, *,
              no_torch: bool, no_trees: bool, workdir: Path) -> tuple[list[dict], str]:
    """(rows, shape): one row per system on these files (name, kind "curve" or "tree", ranks, threads,
    train_s, predict_s, samples_per_s, curve, p@k and psp@k for k = 1, 3, 5, peak_rss_mb), and the
    data's shape in words."""
    import bench_trees as TR
    import bench_vs_torch as BT
    from dslide.config import Config
    from dslide.data import read_xmc
    from dslide.metrics import inverse_propensity

    train, test = read_xmc(train_path), read_xmc(test_path)
    shape = (f"{train.n_points:,} train / {test.n_points:,} test points, {train.n_features:,} features, "
             f"{train.n_labels:,} labels")
    inv = inverse_propensity(train.Y)
    cfg = Config().resolve(train.n_labels)
    every = PEERS_EVAL_EVERY[suite_name]
    rows = []
    case = {"name": "dslide (defaults)", "label": "dslide (defaults), 2 x 1", "ranks": 2, "threads": 1,
            "data": {"train": str(train_path), "test": str(test_path)},
            "config": {"eval_every": every, "eval_points": suite["eval_points"]}}
    if cfg.layer_kind(len(cfg.hidden), train.n_labels) == "lsh":
        # inference through the index after default training (built after training, outside its
        # time), and the model kept for scripts/bench_lsh.py --model
        case.update({"inference": True, "save": str(workdir / "dslide_model")})
    for r in B.run_cases([case], notes):  # a shared machine: say how busy it was as each system ended
        rows.append({**r, "kind": "curve", "load": os.getloadavg()[0]})
    if not no_trees:
        for system, trees in [("omikuji", t) for t in PEERS_TREES] + [("napkinxc", 1)]:
            label = f"omikuji {trees} tree{'s' if trees > 1 else ''}" if system == "omikuji" else "napkinXC PLT"
            print(f"running: {label} ...", file=sys.stderr, flush=True)
            try:
                r = TR.run_tree(system, train_path, test_path, n_test=test.n_points, n_labels=test.n_labels,
                                threads=PEERS_THREADS, trees=trees, workdir=workdir / "trees")
            except (RuntimeError, ValueError, OSError) as e:
                notes.append(f"{label} failed: {str(e).splitlines()[0]}")
                continue
            if not r["available"]:
                notes.append(f"{label} left out: {r['reason']}")
                continue
            m = TR.score(r["topk"], test.Y, inv)
            rows.append({"name": f"{label} ({system} {r['version']})", "kind": "tree", "family": system,
                         "short": f"{trees} tree{'s' if trees > 1 else ''}" if system == "omikuji" else "", "ranks": 1,
                         "threads": PEERS_THREADS, "train_s": r["train_s"], "predict_s": r["predict_s"],
                         "samples_per_s": float("nan"), "peak_rss_mb": r["peak_rss_mb"], "curve": [], "load": os.getloadavg()[0],
                         "params": r["params"], **m})
    if not no_torch:
        r = torch_peer(BT, train, test, cfg, suite, every, workdir / "torch", notes)
        if r is not None:
            top = r.pop("topk")
            rows.append({**r, **TR.score(top, test.Y, inv), "load": os.getloadavg()[0]})
    return rows, shape


def torch_peer(BT, train, test, cfg, suite: dict, every: int, workdir: Path, notes: list) -> dict | None:
    """PyTorch with dslide's defaults: a sampled softmax for an LSH-sized output, the full one otherwise.

    The sampled softmax draws SAMPLED_NEGATIVES shared uniform negatives per step (at most 20% of the
    labels, as dslide's lsh.min_active_share): it has no candidates from hash tables, so it keeps the
    uniform sample dslide used before it had them (issue 13's setting), not dslide's smaller one."""
    wide = cfg.layer_kind(len(cfg.hidden), train.n_labels) == "lsh"
    negatives = min(SAMPLED_NEGATIVES, int(cfg.lsh.min_active_share * train.n_labels)) if wide else 0
    name = (f"PyTorch sampled softmax ({negatives:,} negatives)" if wide
            else "PyTorch (full softmax)")
    print(f"running: {name} ...", file=sys.stderr, flush=True)
    top = workdir / "top.npy"
    extra = ["--lr-schedule", cfg.lr_schedule, "--output-bias", cfg.output_bias_init, "--save-topk", str(top)]
    if wide:
        extra += ["--output", "sampled", "--negatives", str(negatives)]
    try:
        t = BT.run_torch(train, test, hidden=cfg.hidden[0], lr=cfg.lr, batch_size=cfg.batch_size,
                         epochs=cfg.epochs, threads=PEERS_THREADS, dropout=cfg.dropout,
                         init_input_scale=cfg.init_input_scale, eval_every=every,
                         eval_points=suite["eval_points"], workdir=workdir, extra_args=extra)
    except Exception as e:  # noqa: BLE001  (the suite goes on without PyTorch, saying why)
        notes.append(f"{name} failed: {str(e).splitlines()[0]}")
        return None
    if not t.get("available"):
        notes.append(f"{name} left out: {t.get('reason')}")
        return None
    curve = [{"wall_s": x["wall_s"], "p@1": x["p@1"], "step": x["step"]} for x in t["log"] if "p@1" in x]
    import numpy as np

    return {"name": f"{name}, torch {t.get('torch_version', '')}", "kind": "curve", "ranks": 1,
            "threads": PEERS_THREADS, "train_s": t["train_s"], "predict_s": t.get("predict_s") or float("nan"),
            "samples_per_s": t["samples_per_s"], "peak_rss_mb": t.get("peak_rss_mb") or float("nan"),
            "curve": curve, "topk": np.load(top)}


def p1_at(r: dict, t: float):
    """P@1 of a row after `t` training seconds: its last evaluation by then (curves), its final
    P@1 if it had finished training by then (trees); None if nothing was measured by then."""
    if r["kind"] == "tree":
        return r["p@1"] if r["train_s"] <= t * 1.0001 else None
    seen = [c["p@1"] for c in r["curve"] if c["wall_s"] <= t]
    return seen[-1] if seen else None


def peers_table(rows: list[dict], ref: dict | None) -> str:
    """The peers' markdown table; `ref` (omikuji's default) sets the 'P@1 at its time' columns."""
    def fmt(v, spec=".4f"):
        return "-" if v is None or v != v else format(v, spec)

    cols = [("system", "name"), ("ranks x threads", lambda r: f"{r['ranks']} x {r['threads']}"),
            ("train s", lambda r: fmt(r["train_s"], ".1f")), ("predict s", lambda r: fmt(r["predict_s"], ".1f")),
            ("samples/s", lambda r: fmt(r["samples_per_s"], ",.0f"))]
    if ref is not None:
        T, P = ref["train_s"], ref["p@1"]

        def s_to(r):
            t = (r["train_s"] if r["p@1"] >= P else None) if r["kind"] == "tree" else B.time_to(r["curve"], P)
            return "not reached" if t is None else f"{t:.1f}"

        cols += [(f"P@1 at {T:.1f} s", lambda r: fmt(p1_at(r, T))), (f"s to P@1 {P:.4f}", s_to)]
    cols += [(f"{m.upper()}@{k}", (lambda r, key=f"{m}@{k}": fmt(r.get(key)))) for m in ("p", "psp") for k in (1, 3, 5)]
    cols.append(("peak MB/rank", lambda r: fmt(r["peak_rss_mb"], ",.0f")))
    return B.table(rows, cols)


def peers_part(a, suite: dict) -> None:
    t0 = time.time()
    notes: list[str] = []
    spec = suite["data"]
    train_path, test_path = peer_files(spec)
    work = B.ROOT / "runs" / f"bench_peers_{a.suite}"
    rows, shape = peer_rows(train_path, test_path, a.suite, suite, notes, no_torch=a.no_torch,
                            no_trees=a.no_trees, workdir=work / spec["preset"])
    ref = next((r for r in rows if r["kind"] == "tree" and "omikuji 3" in r["name"]), None)
    shape = f"{spec['preset']} synthetic, {shape}"
    cmd = (f"python scripts/bench.py --suite {a.suite} --parts peers" + _preset_flag(a)
           + (" --no-torch" if a.no_torch else "") + (" --no-trees" if a.no_trees else ""))
    text = (f"command: `{cmd}`\n\nmachine: {B.machine()}\n\ncode: {_code_version()}\n\n"
            f"data: {shape}; every system {PEERS_THREADS} cores (dslide: 2 ranks x 1 thread), with its own "
            f"defaults; dslide and PyTorch train their default {_epochs(rows)} epochs. P@k and PSP@k on all test "
            f"points by dslide.metrics (propensities from the training labels, A = 0.55, B = 1.5); the 'P@1 at' "
            f"and 's to' columns read the P@1 curves (first {suite['eval_points']:,} test points, every "
            f"{PEERS_EVAL_EVERY[a.suite]} steps) at omikuji's (3 trees) training time and P@1\n\n"
            + peers_table(rows, ref) + "\n")
    for r in rows:
        if r.get("inference"):
            text += "\n" + inference_table(r, f"dslide's inference after its default training ({r['ranks']} ranks x "
                                               f"{r['threads']} thread; model kept in {r['saved']})",
                                            r["data"]["n_test"])
    panels = [(shape, rows)]
    shared = B.ROOT.parent / "shared" / "data"
    if (shared / "bibtex_train.txt").exists():
        bib, _ = peer_rows(shared / "bibtex_train.txt", shared / "bibtex_test.txt", a.suite,
                           {**suite, "eval_points": 2515}, notes, no_torch=a.no_torch, no_trees=a.no_trees,
                           workdir=work / "bibtex")
        bref = next((r for r in bib if r["kind"] == "tree" and "omikuji 3" in r["name"]), None)
        text += ("\nBibTeX (../shared/data: 4,880 train / 2,515 test, 1,836 features, 159 labels; published "
                 "P@1: Parabel 64.53, SLEEC 65.08), the same systems and columns:\n\n"
                 + peers_table(bib, bref) + "\n")
        panels.append(("BibTeX, 4,880 / 2,515 points, 159 labels", bib))
        rows = rows + [{**r, "data": "bibtex"} for r in bib]
    else:
        notes.append("BibTeX: ../shared/data/bibtex_*.txt not present, skipped")
    notes.append("1-minute load average of the machine as each system ended (2 cores; a system's own 2 "
                 "threads make about 2, more means other processes competed for the cores): " + ", ".join(f"{r['name'].split(' (')[0]}"
                                                           + (" [BibTeX]" if r.get("data") == "bibtex" else "")
                                                           + f" {r['load']:.1f}" for r in rows if "load" in r))
    text += "\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    text += f"\n({time.time() - t0:.0f} s in all)\n"
    print(text)
    name = f"bench_{a.suite}_peers" + (f"_{a.preset}" if a.preset != "amazon-like" else "")
    png = B.ROOT / "docs" / f"{name}.png"
    drew = plot_peers(panels, png)
    if not a.no_record:
        B.record(f"bench.py --suite {a.suite} --parts peers" + _preset_flag(a),
                 text + "\n" + (f"![P@1 against training seconds]({png.name})\n" if drew else ""))
    (B.ROOT / "runs").mkdir(exist_ok=True)
    (B.ROOT / "runs" / f"{name}.json").write_text(json.dumps(rows, indent=1, default=float))


# -- what LSH buys --------------------------------------------------------------------------------

UNIFORM_OLD = 16384  # the uniform negatives of dslide's defaults before anchor candidates
UNIFORM_EQUAL = 12288  # about the active neurons the defaults compute per step at 670,091 labels
UNIFORM_DEFAULT = 8192  # the uniform negatives the defaults draw at 670,091 labels (LSHConfig.min_active)
OWN_PER_SAMPLE = 64  # lsh.scope "sample": each sample's own candidates
MAX_ACTIVE_WIDE = 512  # candidates per sample that dslide's defaults give layers of >= 250,000 neurons


def lsh_systems(suite: dict) -> list[dict]:
    """The output layers compared (1 rank x 2 threads, constant lr, the same budget)."""
    cfg = {**COMMON, "eval_every": suite["eval_every"][0], "eval_points": suite["eval_points"]}
    rows = [
        ("uniform negatives only, as many as the old default", {"max_active": 0, "min_active": UNIFORM_OLD}),
        ("uniform negatives only, about the defaults' active neurons", {"max_active": 0, "min_active": UNIFORM_EQUAL}),
        ("anchor candidates only (no uniform negatives)", {"min_active": 0}),
        ("SLIDE's DWTA candidates + the default uniform negatives", {"family": "dwta"}),
        ("the defaults: anchor candidates + uniform negatives", {}),
        ("uniform negatives only, as many as the defaults draw", {"max_active": 0, "min_active": UNIFORM_DEFAULT}),
        ("each sample's own 64 anchor candidates (scope 'sample') + the default uniform negatives",
         {"scope": "sample", "max_active": OWN_PER_SAMPLE}),
    ]
    return [{"name": name, "ranks": 1, "threads": 2, "config": {**cfg, "lsh": lc}} for name, lc in rows]


def inference_table(r: dict, title: str, n_test: int) -> str:
    """The benchmark child's inference comparison (exact, --lsh, static shortlist) as a titled table."""
    info = r.get("index", {})
    exact_s = r["inference"][0]["seconds"]
    icols = [("method", "method"), ("labels scored per point", lambda x: f"{x['share']:.2%}"),
             ("seconds", lambda x: f"{x['seconds']:.2f}"),
             ("speed-up", lambda x: f"{exact_s / x['seconds']:.1f}x"),
             ("recall of the exact top-10", lambda x: f"{x['recall@10']:.4f}"),
             ("P@1", lambda x: f"{x['p@1']:.4f}"), ("P@5", lambda x: f"{x['p@5']:.4f}"),
             ("PSP@5", lambda x: f"{x['psp@5']:.4f}")]
    return (f"{title} ({n_test:,} test points; index: {info.get('anchors', '?')} anchors from "
            f"{info.get('points', 0):,} training points, buckets of {info.get('bucket', 0):,} labels, built in "
            f"{info.get('index_s', float('nan')):.1f} s after training):\n\n" + B.table(r["inference"], icols) + "\n")


def narrow_lsh_rows(suite: dict, notes: list) -> list[dict]:
    """--labels: the defaults (at this width uniform negatives only: the target), then the same
    uniform negatives with the batch's anchor candidates (the wide layers' defaults), with each
    sample's own candidates (scope "sample", 64 and 256), and the full softmax."""
    cfg = {**COMMON, "eval_every": suite["eval_every"][0], "eval_points": suite["eval_points"]}

    def case(name, lc, kind="lsh"):  # the kind forced: "auto" turns a wide uniform block dense
        return {"name": name, "label": name, "ranks": 1, "threads": 2, "data": suite["data"],
                "time_budget": suite["budget"], "config": {**cfg, "lsh": lc, "kinds": ["dense", kind]}}

    rows = B.run_cases([case("the defaults (here: uniform negatives only): the target", {})], notes)
    if not rows or not rows[0].get("block"):
        return rows
    u = {"min_active": int(round(rows[0]["block"]["random"])), "min_active_share": 1.0}
    rows += B.run_cases([
        case("the wide layers' defaults: the batch's anchor candidates (512 per sample) + the same uniform",
             {**u, "max_active": 512}),
        case(f"each sample's own {OWN_PER_SAMPLE} anchor candidates (scope 'sample') + the same uniform",
             {**u, "scope": "sample", "max_active": OWN_PER_SAMPLE}),
        case("each sample's own 256 anchor candidates (scope 'sample') + the same uniform",
             {**u, "scope": "sample", "max_active": 256}),
        case("every label (dense output layer, full softmax)", {}, kind="dense"),
    ], notes)
    return rows


def lsh_part(a, suite: dict) -> None:
    t0 = time.time()
    notes: list[str] = []
    if a.labels:
        rows = narrow_lsh_rows(suite, notes)
    else:
        cases = [{**case, "label": case["name"], "data": suite["data"], "time_budget": suite["budget"]}
                 for case in lsh_systems(suite)]
        rows = B.run_cases(cases, notes)
    # inference on the defaults' model, at 1 rank and at 2 ranks (index built after training)
    inf = []
    for ranks, threads in ((1, 2), (2, 1)) if not a.labels else ():
        case = {"name": "the defaults", "label": f"inference, {ranks} x {threads}", "ranks": ranks,
                "threads": threads, "data": suite["data"], "time_budget": suite["budget"], "inference": True,
                "config": {**COMMON, "eval_every": 0, "eval_points": suite["eval_points"]}}
        r = B.run_cases([case], notes)
        if r:
            inf.append((ranks, threads, r[0]))
    old = next((r for r in rows if r["config"]["lsh"].get("min_active") == UNIFORM_OLD
                or "the target" in r["name"]), None)
    target = old["curve"][-1]["p@1"] if old and old["curve"] else None
    half = suite["budget"] / 2

    def block(r):
        b = r.get("block")
        return f"{b['labels']:,.0f} + {b['candidates']:,.0f} + {b['random']:,.0f}" if b else "-"

    def t_to(r):
        t = B.time_to(r["curve"], target) if target is not None else None
        return "not reached" if t is None else f"{t:.1f}"

    cols = [("output layer", "name"), ("active per step: labels + candidates + uniform", block),
            ("samples/s", lambda r: f"{r['samples_per_s']:,.0f}"),
            (f"P@1 at {half:g} s", lambda r: _fmt(p1_at_curve(r, half))),
            ("P@1", lambda r: f"{r['p@1']:.4f}"), ("P@5", lambda r: f"{r['p@5']:.4f}"),
            ("PSP@5", lambda r: f"{r.get('psp@5', float('nan')):.4f}"),
            (f"s to P@1 {target:.4f}" if target is not None else "s to target", t_to),
            ("upkeep s", lambda r: f"{r.get('lsh_upkeep_s', 0.0):.1f}")]
    d = suite["data"]
    shape = (f"{d['preset']} synthetic, {d['n_train']:,} train / {d['n_test']:,} test points, 135,909 features, "
             f"{d.get('n_labels', 670091):,} labels")
    cmd = f"python scripts/bench.py --suite {a.suite} --parts lsh" + _preset_flag(a)
    text = (f"command: `{cmd}`\n\nmachine: {B.machine()}\n\ncode: {_code_version()}\n\n"
            f"data: {shape}; every output layer 1 rank x 2 threads, hidden 128, batch 128, lr 1e-2 held constant, "
            f"{suite['budget']} s of training; P@1 curves on the first {suite['eval_points']:,} test points, the rest "
            f"on all of them (PSP@5: propensities from the training labels); 'upkeep s': refilling or re-hashing "
            f"the tables, inside the training time\n\n" + B.table(rows, cols) + "\n")
    for ranks, threads, r in inf:
        text += "\n" + inference_table(r, f"Inference, {ranks} rank(s) x {threads} thread(s), the defaults' model "
                                           f"after {r['train_s']:.0f} s of training", d["n_test"])
    if notes:
        text += "\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    text += f"\n({time.time() - t0:.0f} s in all)\n"
    _publish(a, "lsh", text, rows, f"P@1 against training time by output layer ({shape})",
             {"train": rows, "inference": [r for *_, r in inf]})


def schedule_part(a, suite: dict) -> None:
    """What the candidates buy with the default schedule (its epochs, lr decaying to zero): the
    wide layers' defaults, fewer refills, and uniform negatives alone for the same epochs and for
    as many epochs as fit in the defaults' training time (measured in their run) and 1.5x that."""
    t0 = time.time()
    notes: list[str] = []

    def case(name, lc, **cfg):
        return {"name": name, "ranks": 1, "threads": 2, "data": suite["data"], "config": {"lsh": lc, **cfg}}

    rows = B.run_cases([case(f"{MAX_ACTIVE_WIDE} candidates per sample + uniform (the wide layers' defaults)",
                             {"max_active": MAX_ACTIVE_WIDE}),
                        case("the same, refill period x2.0", {"max_active": MAX_ACTIVE_WIDE, "growth": 2.0}),
                        case("uniform negatives only, the same epochs", {"max_active": 0})], notes)
    if len(rows) == 3:
        ratio = rows[0]["train_s"] / rows[2]["train_s"]
        rows += B.run_cases([case(f"uniform negatives only, {e:.1f} epochs", {"max_active": 0}, epochs=e)
                             for e in (round(rows[2]["epochs"] * ratio, 1), round(rows[2]["epochs"] * ratio * 1.5, 1))],
                            notes)
    cols = [("output layer", "name"), ("epochs", lambda r: f"{r['epochs']:.1f}"),
            ("training s", lambda r: f"{r['train_s']:.1f}"), ("upkeep s", lambda r: f"{r.get('lsh_upkeep_s', 0.0):.1f}"),
            ("samples/s", lambda r: f"{r['samples_per_s']:,.0f}"), ("P@1", lambda r: f"{r['p@1']:.4f}"),
            ("P@3", lambda r: f"{r.get('p@3', float('nan')):.4f}"), ("P@5", lambda r: f"{r['p@5']:.4f}"),
            ("PSP@5", lambda r: f"{r.get('psp@5', float('nan')):.4f}"),
            ("peak MB", lambda r: f"{r.get('peak_rss_mb', float('nan')):,.0f}")]
    d = suite["data"]
    shape = (f"{d['preset']} synthetic, {d['n_train']:,} train / {d['n_test']:,} test points, 135,909 features, "
             f"{d.get('n_labels', 670091):,} labels")
    text = (f"command: `python scripts/bench.py --suite {a.suite} --parts schedule{_preset_flag(a)}`\n\n"
            f"machine: {B.machine()}\n\ncode: {_code_version()}\n\n"
            f"data: {shape}; 1 rank x 2 threads, dslide's default settings otherwise (hidden layer, batch, lr "
            f"decaying linearly to zero over the run's epochs); P@k and PSP@5 on all test points after training; "
            f"'upkeep s': refilling the anchor buckets, inside the training time\n\n" + B.table(rows, cols) + "\n")
    if notes:
        text += "\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    text += f"\n({time.time() - t0:.0f} s in all)\n"
    print(text)
    if not a.no_record:
        B.record(f"bench.py --suite {a.suite} --parts schedule" + _preset_flag(a), text)
    (B.ROOT / "runs").mkdir(exist_ok=True)
    (B.ROOT / "runs" / f"bench_{a.suite}_schedule{_preset_flag(a).replace(' --', '_').replace(' ', '')}.json"
     ).write_text(json.dumps(rows, indent=1, default=float))


def p1_at_curve(r: dict, t: float):
    """P@1 of the last evaluation at or before training time t (None if none)."""
    pts = [c for c in r.get("curve", []) if c["wall_s"] <= t + 1e-9]
    return pts[-1]["p@1"] if pts else None


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.4f}"


def _code_version() -> str:
    """The checkout's commit (and whether files differ from it): dslide's defaults change over time."""
    import subprocess

    try:
        head = subprocess.run(["git", "-C", str(B.ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(B.ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown (no git)"
    return (head or "unknown") + (" with uncommitted changes" if dirty else "")


def _epochs(rows) -> str:
    ep = {r["config"]["epochs"] for r in rows if isinstance(r.get("config"), dict) and "epochs" in r["config"]}
    return ", ".join(f"{e:g}" for e in sorted(ep)) or "default"


def plot_peers(panels, png: Path) -> bool:
    """P@1 against training seconds, one panel per data set: curves for the trainers, points for the trees."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(no plot: matplotlib is not installed; pip install -e '.[plot]')", file=sys.stderr)
        return False
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 5.5), squeeze=False)
    for ax, (title, rows) in zip(axes[0], panels):
        trees = {}
        for r in rows:
            if r["kind"] == "curve" and r["curve"]:
                ax.plot([c["wall_s"] for c in r["curve"]], [c["p@1"] for c in r["curve"]], marker="o", ms=3,
                        label=f"{r['name']} ({r['ranks']} x {r['threads']})")
            elif r["kind"] == "tree":
                trees.setdefault(r["family"], []).append(r)
        for rs in trees.values():
            rs.sort(key=lambda r: r["train_s"])
            ax.plot([r["train_s"] for r in rs], [r["p@1"] for r in rs], marker="s", ms=7, ls=":",
                    label=rs[0]["name"].split(" (")[1].rstrip(")") + " " + ", ".join(r["short"] for r in rs))
            for r in rs:
                ax.annotate(r["short"], (r["train_s"], r["p@1"]), fontsize=7, xytext=(4, -10),
                            textcoords="offset points")
        ax.set_xlabel("training seconds (reading data, compiling and evaluating left out)")
        ax.set_ylabel("P@1")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2)
    fig.suptitle("P@1 against training seconds, 2 cores each: dslide and PyTorch as they train "
                 "(curves on the first test points), tree libraries when done (all test points)", fontsize=8)
    fig.tight_layout()
    png.parent.mkdir(exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return True


if __name__ == "__main__":
    sys.exit(main())
