"""Replicas on uneven machines: 4 ranks as R x P = 1x4 (model-only), 2x2 and 4x1 (allreduce
and partial synchronisation), with no slow rank and with one rank slowed for real.

The slow rank (world rank 3: the last shard of the last replica) is put in a cgroup
v1 cpu controller group whose CFS quota (cpu.cfs_quota_us over cpu.cfs_period_us)
allows it `--slow` times its fair share of the machine's cores (4 ranks on C cores:
C / 4 each), so the kernel, not dslide, slows it. Every case trains for the same
wall time (`--budget` seconds after the kernels are compiled), then P@1/P@5 are
measured on the test set (exact scoring, outside the budget). Reported per case:
global steps trained in the budget by all replicas together, samples/s, P@1, P@5,
the mean replica group size (partial: 1 + partners averaged with) and bytes received
per synchronisation (replicas), partial's versions skipped (too stale, torn copies) or
used with more than DEPTH intervals unseen, the largest peak resident memory of a
rank, and the CPU seconds of the slow rank against the others' mean (what the quota did).

    python -m scripts.bench_hetero --quick                 (tiny data, seconds per case)
    flock /tmp/dslide-bench.lock python -m scripts.bench_hetero --record
                                                           (the table of docs/benchmarks.md)
    python -m scripts.bench_hetero child case.json         (one case; what the parent runs)

Needs root and a cgroup v1 cpu controller at /sys/fs/cgroup/cpu (else --slow-by taskset:
a busy co-runner pinned to the slow rank's core, all ranks pinned round-robin).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import _bench as B
from . import measure as M

CGROUP = Path("/sys/fs/cgroup/cpu/dslide-hetero-slow")
RANKS = 4
SLOW_RANK = 3
LAYOUTS = [(1, "model"), (2, "allreduce"), (2, "partial"), (4, "allreduce"), (4, "partial")]


# ---------------------------------------------------------------------------------------------
# one case (all ranks)
# ---------------------------------------------------------------------------------------------


def child(case_path: str) -> None:
    case = json.loads(Path(case_path).read_text())
    import dslide  # noqa: F401
    import numpy as np
    import scipy.sparse as sp

    from dslide import train as T
    from dslide.infer.predict import predict_topk_scores
    from dslide.comm import Comm
    from dslide.config import Config
    from dslide.io.data import XMCData
    from dslide.metrics import evaluate

    comm = Comm.world()
    if case.get("slow") == "cgroup" and comm.rank == SLOW_RANK:
        (Path(case["cgroup"]) / "cgroup.procs").write_text(str(os.getpid()))  # the kernel throttles us
    if case.get("cpu") is not None:  # taskset mode: every rank on its own core, round-robin
        os.sched_setaffinity(0, {comm.rank % os.cpu_count()})
    train, test = B.load_data(case["data"])
    config = Config.from_dict({**case["config"], "threads": 1}).resolve(train.n_labels)
    R = config.replicas
    # compile (or load) the kernels on a few batches, replicas included, outside the budget
    m = min(train.n_points, 2 * R * config.batch_size)
    T.fit(XMCData(train.X[:m], train.Y[:m]), config.replace(epochs=1.0), comm=comm, index=False)
    gc.collect()  # that model is garbage in reference cycles: 1.45 GB per rank at 4x1 until collected
    budget = float(case["budget"])
    steps: list[int] = []
    comm.barrier()
    t0, cpu0 = time.perf_counter(), time.process_time()

    def callback(event, model, info):
        if event != "step":
            return None
        steps.append(info)
        over = time.perf_counter() - t0 > budget
        if R == 1:  # one model-parallel group: its ranks stop at the same step (replicas agree in fit)
            over = comm.allreduce_max(float(over)) > 0
        return "stop" if over else None

    model, history = T.fit(train, config, comm=comm, callback=callback, index=False)
    train_s, cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
    comm.barrier()
    rep = model.replicas
    stats = rep.stats() if rep is not None else {}
    g, p = (rep.replica, rep.shard) if rep is not None else (0, comm.rank)
    rows = comm.allgather_object({"g": g, "p": p, "steps": len(steps), "train_s": train_s, "cpu_s": cpu_s,
                                  "syncs": stats.get("syncs", 0), "sync_bytes": stats.get("sync_bytes", 0),
                                  "mean_group": stats.get("mean_group", 0.0),
                                  "skipped": [stats.get(k, 0) for k in ("stale_skips", "torn", "missed")],
                                  "peak_mb": M.peak_rss_mb() or 0.0,
                                  "step_bytes": history[-1]["bytes_per_step"] if history else 0.0})
    # scored 128 points at a time: the default 1,024 holds [1,000, 670,091] logits (2.7 GB) on every
    # rank at 4x1, which with four whole models went past this machine's memory
    pred = predict_topk_scores(model, test.X, 5, exact=True, batch_size=128)[0]
    final = evaluate(sp.csr_matrix(test.Y), pred, k=5)
    if comm.rank != 0:
        return
    leaders = [r for r in rows if r["p"] == 0]
    trained = sum(r["steps"] for r in leaders)  # every global step is trained by exactly one replica
    wall = max(r["train_s"] for r in rows)
    others = [r["cpu_s"] for i, r in enumerate(rows) if i != SLOW_RANK]
    syncs = [r["syncs"] for r in leaders]
    result = {
        "name": case["name"], "layout": f"{R}x{comm.size // R}", "sync": case["sync"], "slow": case.get("slow") or "-",
        "steps": trained, "train_s": wall, "samples_per_s": trained * config.batch_size / wall,
        "p@1": final["p@1"], "p@5": final["p@5"],
        "steps_per_replica": [r["steps"] for r in leaders],
        "syncs": float(np.mean(syncs)) if R > 1 else 0,
        "mean_group": float(np.mean([r["mean_group"] for r in leaders])) if R > 1 else 0.0,
        "bytes_per_sync": (sum(r["sync_bytes"] for r in rows) / max(1, sum(r["syncs"] for r in rows))) if R > 1 else 0,
        "bytes_per_step": float(np.mean([r["step_bytes"] for r in rows])),
        "skipped": [int(sum(r["skipped"][i] for r in leaders)) for i in range(3)],
        "peak_mb": max(r["peak_mb"] for r in rows),
        "cpu_slow": rows[SLOW_RANK]["cpu_s"], "cpu_others": float(np.mean(others)),
        "data": {"n_train": train.n_points, "n_test": test.n_points, "n_features": train.n_features,
                 "n_labels": train.n_labels},
        "kinds": [l.kind for l in model.network.layers],
    }
    print("RESULT " + json.dumps(result), flush=True)


# ---------------------------------------------------------------------------------------------
# the parent
# ---------------------------------------------------------------------------------------------


class Slowdown:
    """One rank at `share` of its fair share of the cores, for real (context manager)."""

    def __init__(self, how: str, share: float):
        self.how, self.share = how, share
        self.proc = None

    def __enter__(self):
        if self.how == "cgroup":
            if not Path("/sys/fs/cgroup/cpu").is_dir():
                raise SystemExit("no cgroup v1 cpu controller at /sys/fs/cgroup/cpu: use --slow-by taskset")
            CGROUP.mkdir(exist_ok=True)
            period = 20_000  # us: short, so the throttled rank runs in slices of a few ms
            fair = (os.cpu_count() or 1) / RANKS  # cores per rank when all ranks compute
            (CGROUP / "cpu.cfs_period_us").write_text(str(period))
            (CGROUP / "cpu.cfs_quota_us").write_text(str(max(1000, int(period * fair * self.share))))
        elif self.how == "taskset":
            # a busy loop on the slow rank's core: it gets about half of that core
            core = SLOW_RANK % os.cpu_count()
            self.proc = subprocess.Popen(["taskset", "-c", str(core), sys.executable, "-c", "while True: pass"])
        return self

    def case(self) -> dict:
        if self.how == "cgroup":
            return {"slow": "cgroup", "cgroup": str(CGROUP)}
        return {"slow": "taskset", "cpu": True}

    def __exit__(self, *exc):
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait()
        if self.how == "cgroup" and CGROUP.is_dir():
            # the case's processes have ended: nothing is left in the group
            try:
                CGROUP.rmdir()
            except OSError:
                pass


def run(case: dict) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="dslide-hetero-") as f:
        json.dump(case, f)
        f.flush()
        p, _ = M.run(M.module_cmd("bench_hetero", "child", f.name, ranks=RANKS), env=M.thread_env(1),
                     timeout=case["budget"] * 4 + 600)
    lines = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
    if p.returncode != 0 or not lines:
        return {"error": (p.stderr.strip().splitlines() or ["no output"])[-5:], "case": case["name"]}
    return json.loads(lines[-1][len("RESULT "):])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny data and a few seconds per case")
    ap.add_argument("--preset", default="amazon-like")
    ap.add_argument("--n-train", type=int, default=50_000)
    ap.add_argument("--n-test", type=int, default=2_000)
    ap.add_argument("--budget", type=float, default=90.0, help="training seconds per case")
    ap.add_argument("--slow", type=float, default=0.5, help="the slow rank's share of its fair CPU share")
    ap.add_argument("--slow-by", choices=("cgroup", "taskset"), default="cgroup")
    ap.add_argument("--sync-every", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--only", default="", help="comma-separated case names (e.g. 2x2-partial-slow)")
    ap.add_argument("--out")
    ap.add_argument("--record", action="store_true", help="write the table into docs/benchmarks.md")
    a = ap.parse_args(argv)
    if a.quick:
        a.preset, a.n_train, a.n_test, a.budget, a.hidden, a.batch_size = "tiny", 2000, 500, 8.0, 64, 64
    # the data once, as files: the ranks of every case map the same cached arrays
    from dslide.datasets.synthetic import generate_split, write
    from dslide.io.data import read_xmc

    data_dir = Path(tempfile.gettempdir()) / f"dslide-hetero-{a.preset}-{a.n_train}-{a.n_test}"
    prefix = data_dir / "data"
    if not Path(f"{prefix}_test.txt").exists():
        train, test = generate_split(a.preset, n_train=a.n_train, n_test=a.n_test, seed=0)
        tmp = write(str(data_dir / "tmp"), train, test)
        for src, dst in zip(tmp, (f"{prefix}_train.txt", f"{prefix}_test.txt")):
            os.replace(src, dst)
    for path in (f"{prefix}_train.txt", f"{prefix}_test.txt"):
        read_xmc(path)  # builds the cache before four ranks read it at once
    data = {"train": f"{prefix}_train.txt", "test": f"{prefix}_test.txt"}

    rows, failures = [], []
    for slow in (False, True):
        for R, sync in LAYOUTS:
            name = f"{R}x{RANKS // R}-{sync}" + ("-slow" if slow else "")
            if a.only and name not in a.only.split(","):
                continue
            config = {"hidden": [a.hidden], "batch_size": a.batch_size, "epochs": 10_000, "seed": 0,
                      "replicas": R, "sync": "allreduce" if sync == "model" else sync, "sync_every": a.sync_every,
                      "log_every": 10**9}
            case = {"name": name, "sync": sync, "data": data, "config": config, "budget": a.budget}
            print(f"running: {name} ...", file=sys.stderr, flush=True)
            if slow:
                with Slowdown(a.slow_by, a.slow) as s:
                    r = run({**case, **s.case()})
            else:
                r = run(case)
            if "error" in r:
                print(f"  failed: {r['error']}", file=sys.stderr, flush=True)
                failures.append(f"{name}: {r['error']}")
                continue
            print(f"  {r['samples_per_s']:,.0f} samples/s, P@1 {r['p@1']:.4f}, steps {r['steps_per_replica']}",
                  file=sys.stderr, flush=True)
            rows.append(r)
    base = {(r["layout"], r["sync"]): r for r in rows if r["slow"] == "-"}
    ar = {r["layout"]: r for r in rows if r["slow"] != "-" and r["sync"] == "allreduce"}
    cols = [
        ("case", "name"), ("R x P", "layout"), ("sync", "sync"), ("slow rank", lambda r: r["slow"]),
        ("steps", "steps"), ("steps per replica", lambda r: "/".join(map(str, r["steps_per_replica"]))),
        ("samples/s", lambda r: f"{r['samples_per_s']:,.0f}"),
        ("vs no slow rank", lambda r: f"{r['samples_per_s'] / base[(r['layout'], r['sync'])]['samples_per_s']:.2f}x"
         if r["slow"] != "-" and (r["layout"], r["sync"]) in base else ""),
        ("vs allreduce (slow)", lambda r: f"{r['samples_per_s'] / ar[r['layout']]['samples_per_s']:.2f}x"
         if r["slow"] != "-" and r["sync"] == "partial" and r["layout"] in ar else ""),
        ("P@1", lambda r: f"{r['p@1']:.4f}"), ("P@5", lambda r: f"{r['p@5']:.4f}"),
        ("syncs/replica", lambda r: f"{r['syncs']:.0f}" if r["syncs"] else ""),
        ("mean group", lambda r: f"{r['mean_group']:.2f}" if r["mean_group"] else ""),
        ("bytes/sync/rank", lambda r: f"{r['bytes_per_sync']:,.0f}" if r["bytes_per_sync"] else ""),
        ("bytes/step/rank", lambda r: f"{r['bytes_per_step']:,.0f}"),
        ("versions stale / torn / missed", lambda r: "/".join(map(str, r["skipped"])) if r["sync"] == "partial" else ""),
        ("peak RSS/rank MB", lambda r: f"{r['peak_mb']:,.0f}"),
        ("CPU s slow rank / others", lambda r: f"{r['cpu_slow']:.1f} / {r['cpu_others']:.1f}"),
    ]
    d = rows[0]["data"] if rows else {}
    head = (f"data: {a.preset} ({d.get('n_train', 0):,} train / {d.get('n_test', 0):,} test points, "
            f"{d.get('n_features', 0):,} features, {d.get('n_labels', 0):,} labels); layers "
            f"{rows[0]['kinds'] if rows else '?'}, hidden {a.hidden}, batch {a.batch_size}, sync_every {a.sync_every}; "
            f"{RANKS} ranks x 1 thread; {a.budget:g} s of training per case; slow rank: world rank {SLOW_RANK} at "
            f"{a.slow:g} of its fair CPU share ({a.slow_by})\n\n")
    argv_shown = [x for x in (argv if argv is not None else sys.argv[1:]) if x != "--record"]
    print(head, end="")
    text = M.report("bench_hetero", argv_shown, rows, cols, a.out, False)
    if failures:
        print("FAILED cases:\n" + "\n".join(failures), file=sys.stderr)
    if a.record:
        M.record("bench_hetero.py" + (" --quick" if a.quick else ""), head + text)
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "child":
        child(sys.argv[2])
    else:
        sys.exit(main())
