#!/usr/bin/env python
"""dslide against what a user would run otherwise, on the same data and machine, in one run.

    python scripts/bench.py --suite quick     (about 5 minutes; what a newcomer runs)
    python scripts/bench.py --suite full      (about 30 minutes on 2 cores)

Systems, one after the other, each with the same training-time budget:
- dslide, 1 rank x 1 thread and 2 ranks x 1 thread (mpiexec): the defaults
  for this data (an LSH output layer at 670,091 labels);
- dense: the same network with every output neuron (exact mode: BLAS
  products, full softmax), 1 rank x 2 threads;
- data-parallel: the dense network on 2 ranks x 1 thread, each rank a slice of
  every batch, every gradient all-reduced every step (what Horovod and
  PyTorch DDP do), `parallel = "data"`;
- PyTorch: the same network in PyTorch (EmbeddingBag input, full softmax,
  Adam) on the CPU, 2 threads, from scripts/bench_vs_torch.py (installed on
  demand into .venv-torch; left out with a note when it cannot be installed).
All share hidden 128, batch 128, Adam with lr 1e-2 held constant (a time
budget, not an epoch count, ends each run), the same first-layer init and
input normalisation. The target P@1 is the dense system's final P@1 minus
one point; "time to target" is the training time (evaluations excluded) at
the first evaluation that reaches it.

Prints one markdown table, writes a PNG of P@1 against training time, and
records both, with the command and the machine, in docs/benchmarks.md.
The full suite adds BibTeX (../shared/data) when present: dslide's defaults
against PyTorch with the same settings.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench as B  # noqa: E402

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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", choices=sorted(SUITES), default="quick")
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--no-record", action="store_true", help="do not update docs/benchmarks.md")
    a = p.parse_args(argv)
    suite = SUITES[a.suite]
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
    shape = f"amazon-like synthetic, {d['n_train']:,} train / {d['n_test']:,} test points, 135,909 features, 670,091 labels"
    cmd = f"python scripts/bench.py --suite {a.suite}" + (" --no-torch" if a.no_torch else "")
    text = (f"command: `{cmd}` ({time.time() - t0:.0f} s)\n\nmachine: {B.machine()}\n\n"
            f"data: {shape}; each system {suite['budget']} s of training; P@1 curves on the first "
            f"{suite['eval_points']:,} test points, final P@1/P@5 on all of them\n\n" + B.table(rows, cols) + "\n")
    if notes:
        text += "\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    if a.suite == "full":
        text += "\n" + bibtex_section(a.no_torch)
    print(text)
    png = B.ROOT / "docs" / f"bench_{a.suite}.png"
    drew = plot(rows, png, f"P@1 against training time ({shape})")
    if not a.no_record:
        record(a.suite, text, png if drew else None)
    (B.ROOT / "runs").mkdir(exist_ok=True)
    (B.ROOT / "runs" / f"bench_{a.suite}.json").write_text(json.dumps(rows, indent=1))
    return 0


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


def record(suite: str, text: str, png: Path | None) -> None:
    img = f"![P@1 against training time](bench_{suite}.png)\n" if png is not None else ""
    B.record(f"bench.py --suite {suite}", text + "\n" + img)


if __name__ == "__main__":
    sys.exit(main())
