"""Part "main": the same network by different trainers, each with the same training-time budget.

One after the other:
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
All share `common.common()`: the hidden layer, batch, Adam learning rate (held
constant: a time budget, not an epoch count, ends each run), first-layer init
and input normalisation of dslide's defaults at 670,091 labels. The target P@1
is the dense system's final P@1 minus one point; "time to target" is the
training time (evaluations excluded) at the first evaluation that reaches it
(`measure.time_to`). The full suite adds BibTeX (../shared/data) when present:
dslide's defaults against PyTorch with the same settings.
"""

from __future__ import annotations

import sys
import time

from .. import _bench as B
from .. import measure as M
from . import common as C


def systems(suite: dict) -> list[dict]:
    # evaluation steps (fast systems, slow ones): a few dozen points per curve; evaluations are
    # left out of the training time but not of the suite's wall time
    ev = suite["eval_points"]
    base = C.common()
    fast = {**base, "eval_every": suite["eval_every"][0], "eval_points": ev}
    slow = {**base, "eval_every": suite["eval_every"][1], "eval_points": ev}
    return [
        {"name": "dslide", "ranks": 1, "threads": 1, "config": fast},
        {"name": "dslide", "ranks": 2, "threads": 1, "config": fast},
        {"name": "dense (exact)", "ranks": 1, "threads": 2, "config": {**slow, "exact": True}},
        {"name": "data-parallel (dense)", "ranks": 2, "threads": 1,
         "config": {**slow, "exact": True, "parallel": "data"}},
    ]


def run_torch_case(data_spec: dict, budget: float, eval_points: int, threads: int = 2, **kw) -> dict:
    from .. import bench_vs_torch as BT

    base = C.common()
    train, test = B.load_data(data_spec)
    opts = dict(hidden=base["hidden"][0], lr=base["lr"], batch_size=base["batch_size"], epochs=base["epochs"],
                time_budget=budget, threads=threads, init_input_scale=base["init_input_scale"],
                eval_every=10, eval_points=eval_points)
    opts.update(kw)
    try:
        r = BT.run_torch(train, test, workdir=M.ROOT / "runs" / "bench_torch", omp_wait_policy="PASSIVE", **opts)
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


def run(a, suite: dict) -> None:
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
        t = M.time_to(r["curve"], target) if target is not None else None
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
    shape = C.synthetic_shape(suite["data"])
    cmd = M.command("bench", [f"--suite {a.suite} --parts main" + C.preset_flag(a) + (" --no-torch" if a.no_torch else "")])
    text = (f"command: `{cmd}` ({time.time() - t0:.0f} s)\n\nmachine: {M.machine()}\n\n"
            f"data: {shape}; each system {suite['budget']} s of training; P@1 curves on the first "
            f"{suite['eval_points']:,} test points, final P@1/P@5 on all of them\n\n" + M.table(rows, cols) + "\n")
    text += C.notes_text(notes)
    if a.suite == "full":
        text += "\n" + bibtex_section(a.no_torch)
    C.publish(a, "", text, rows, f"P@1 against training time ({shape})", rows)


def bibtex_section(no_torch: bool) -> str:
    """dslide's defaults on BibTeX against PyTorch with the same settings (constant lr, zero output bias)."""
    files = C.bibtex_files()
    if files is None:
        return "BibTeX: ../shared/data/bibtex_*.txt not present, skipped.\n"
    data = {"train": str(files[0]), "test": str(files[1])}
    train, test = B.load_data(data)
    from dslide.config import Config

    cfg = Config().resolve(train.n_labels)
    rows = []
    r = B.run_case({"name": "dslide defaults", "data": data, "threads": 2, "config": {"eval_every": 0}})
    if "error" not in r:
        r["name"] = (f"dslide (defaults: hidden {', '.join(map(str, cfg.hidden))}, dropout {cfg.dropout:g}, "
                     f"lr {cfg.lr:g} {'decayed' if cfg.lr_schedule == 'linear' else cfg.lr_schedule}, "
                     f"batch {cfg.batch_size}, {cfg.epochs:g} epochs)")
        rows.append(r)
    if not no_torch:
        from .. import bench_vs_torch as BT

        try:
            t = BT.run_torch(train, test, hidden=cfg.hidden[0], dropout=cfg.dropout, lr=cfg.lr,
                             batch_size=cfg.batch_size, epochs=cfg.epochs, threads=2,
                             init_input_scale=cfg.init_input_scale, workdir=M.ROOT / "runs" / "bench_torch_bibtex",
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
            "SLEEC 65.08):\n\n" + M.table(rows, cols) + "\n")
