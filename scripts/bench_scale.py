"""Scale benchmark: amazon-like models from 100M to 2B parameters on one machine.

    python -m scripts.bench_scale [--part scale|data|precision] [--hidden 128,512,1024,1536,2560]
                                  [--adam float32,bfloat16] [--samples 12800] [--no-run] [--record]
                                  [--plot docs/bench_scale.png]

Part "scale" (the default): amazon-like data (670,091 labels, 135,909
features; 50,000 training points, the first --eval-points of 5,000 test
points scored exactly), hidden widths 128 to 2560, float32 and bfloat16 Adam
moments, 2 ranks x 1 thread (hidden 128 also 1 rank x 2 threads). Each case
runs in its own processes, one after the other, and only when the memory
account (dslide.memory) says it fits in the memory available now. Per case:
parameters; the account and the measured peak resident memory per rank
(VmHWM, everything: interpreter, data, model, step buffers, checkpoint
reads); bytes per parameter (the ranks' peaks summed over the parameters);
samples/s over --samples training samples (the first step, which may
compile kernels, left out); bytes sent per step and rank; P@1 after those
samples; the inference index build (seconds, resident memory after it);
checkpoints full and weights-only: size, write and load seconds (loads
right after the save, so partly from the page cache).

Part "data": a 490,449-point amazon-like training file (Amazon-670K's row
count; generated once into runs/bench_scale_data/): parse and cache, load
from the cache, resident memory after loading, then training at hidden 128
on 2 ranks for --samples samples (one CSR per rank, mapped from the cache).

Part "precision": P@1 after the default 5 epochs on amazon-like (50,000
training points, 5,000 test points, hidden 128, 2 ranks x 1 thread) with
float32 and bfloat16 moments, and the memory per parameter of each.

Results go to runs/bench_scale_<part>.json (merged across invocations: a
case run again replaces its row; the table names each row's command) and,
with --record, to docs/benchmarks.md (--no-run: only that, from the stored rows); --plot draws memory and samples/s
against parameters from the recorded scale results.
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
from pathlib import Path

from . import measure as M

RUNS = M.ROOT / "runs"
DATA_DIR = RUNS / "bench_scale_data"
AMAZON_ROWS = 490_449


# ----------------------------------------------------------------------------
# the child: one case under mpiexec
# ----------------------------------------------------------------------------


def child(case_path: str) -> None:
    case = json.loads(Path(case_path).read_text())
    import dslide  # noqa: F401  (first: thread settings for OpenBLAS)
    import numpy as np

    from dslide import memory
    from dslide import train as T
    from dslide.infer.predict import evaluate
    from dslide.train.infer_build import build_index
    from dslide.comm import Comm
    from dslide.config import Config
    from dslide.io import checkpoint as ck
    from dslide.io.data import XMCData, read_xmc

    comm = Comm.world()
    me = {"rss_start": M.status_bytes("VmRSS:")}
    t0 = time.perf_counter()
    train = read_xmc(case["train"])
    test = read_xmc(case["test"])
    me["load_s"] = time.perf_counter() - t0
    me["rss_data"] = M.status_bytes("VmRSS:")
    cfg = Config.from_dict({**case["config"], "threads": case["threads"]}).resolve(train.n_labels)
    t0 = time.perf_counter()
    model = T.build_network((train.n_features, train.n_labels), cfg, comm)
    T.init_from_data(model, train)
    me["build_s"] = time.perf_counter() - t0
    me["rss_built"] = M.status_bytes("VmRSS:")
    net = model.network
    acc = memory.account(cfg, train.n_features, train.n_labels, comm.size, comm.rank, case["threads"])
    steps = max(2, case["samples"] // cfg.batch_size)
    t0 = time.perf_counter()
    model, history = T.fit(train, cfg, comm=comm, model=model, stop_at=steps, index=False)
    me["fit_s"] = time.perf_counter() - t0
    me["hwm_train"] = M.status_bytes("VmHWM:")
    result = {"params": net.n_params, "steps": history[-1]["step"], "ranks": comm.size,
              "threads": case["threads"], "account": acc,
              "samples_per_s": T.throughput(history, cfg.batch_size),
              "bytes_per_step": float(np.mean([r["bytes_per_step"] for r in history]))}
    if case.get("index"):
        t0 = time.perf_counter()
        info = build_index(model, train)
        me["index_s"] = time.perf_counter() - t0
        me["hwm_index"] = M.status_bytes("VmHWM:")
        result["index"] = {k: v for k, v in info.items() if isinstance(v, (int, float))}
    if case.get("eval_points"):
        m = min(case["eval_points"], test.n_points)
        t0 = time.perf_counter()
        ev = evaluate(model, XMCData(test.X[:m], test.Y[:m]), k=5, exact=True)
        me["eval_s"] = time.perf_counter() - t0
        result.update({"p@1": ev["p@1"], "p@5": ev["p@5"], "eval_points": m})
    if case.get("checkpoint"):
        base = Path(case["checkpoint"])
        for kind, weights_only in (("full", False), ("weights", True)):
            run = base / kind
            comm.barrier()
            t0 = time.perf_counter()
            path = ck.save(net, run, comm, weights_only=weights_only)
            me[f"ckpt_{kind}_write_s"] = time.perf_counter() - t0
            comm.barrier()
            t0 = time.perf_counter()
            ck.load_into(net, path, comm, weights_only=weights_only)
            me[f"ckpt_{kind}_load_s"] = time.perf_counter() - t0
            if comm.rank == 0:
                result[f"ckpt_{kind}_bytes"] = ck.size_bytes(path)
            comm.barrier()
            if comm.rank == 0:
                shutil.rmtree(run, ignore_errors=True)
    me["hwm"] = M.status_bytes("VmHWM:")
    per_rank = comm.allgather_object(me)
    if comm.rank == 0:
        result["per_rank"] = per_rank
        print("RESULT " + json.dumps(result), flush=True)


# ----------------------------------------------------------------------------
# the parent
# ----------------------------------------------------------------------------


def run(case: dict) -> dict:
    ranks, threads = case["ranks"], case["threads"]
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="dslide-scale-") as f:
        json.dump(case, f)
        f.flush()
        cmd = M.module_cmd("bench_scale", "child", f.name, ranks=ranks, mpi=True)  # under mpiexec at 1 rank too
        t0 = time.perf_counter()
        p, _ = M.run(cmd, env=M.thread_env(threads))
        wall = time.perf_counter() - t0
    lines = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
    if p.returncode != 0 or not lines:
        return {"error": (p.stderr.strip().splitlines() or ["no output"])[-1]}
    out = json.loads(lines[-1][len("RESULT "):])
    out["wall_s"] = wall
    return out


def available_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def fits(case: dict, n_features: int, n_labels: int) -> tuple[bool, float]:
    """Whether the case's accounted memory (all ranks, + 0.45 GB per process for the
    interpreter and data) fits in 95% of the memory available now; and that need in GB."""
    from dslide import memory
    from dslide.config import Config

    cfg = Config.from_dict(case["config"]).resolve(n_labels)
    need = sum(memory.account(cfg, n_features, n_labels, case["ranks"], r, case["threads"])["peak"] + 0.45e9
               for r in range(case["ranks"]))
    return need < 0.95 * available_bytes(), need / 1e9


def amazon_files(n_train: int, n_test: int) -> tuple[str, str]:
    """amazon-like data files (generated once, cached beside them)."""
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    prefix = DATA_DIR / f"amz{n_train}"
    tr, te = Path(f"{prefix}_train.txt"), Path(f"{prefix}_test.txt")
    if not (tr.exists() and te.exists()):
        from dslide.datasets.synthetic import generate_split, write

        train, test = generate_split("amazon-like", n_train=n_train, n_test=n_test, seed=0)
        write(str(prefix), train, test)
    return str(tr), str(te)


def scale_cases(args) -> list[dict]:
    tr, te = amazon_files(50_000, 5_000)
    out = []
    for h in args.hidden:
        for adam in args.adam:
            layouts = [(2, 1)] + ([(1, 2)] if h == 128 else [])
            for ranks, threads in layouts:
                out.append({"name": f"hidden {h}, {adam} moments, {ranks}x{threads}", "part": "scale",
                            "hidden": h, "adam": adam, "ranks": ranks, "threads": threads,
                            "train": tr, "test": te, "samples": args.samples, "eval_points": args.eval_points,
                            "index": True, "checkpoint": str(RUNS / "bench_scale_ckpt"),
                            "config": {"hidden": [h], "adam_dtype": adam, "eval_every": 0}})
    return out


def data_cases(args) -> list[dict]:
    tr, te = amazon_files(AMAZON_ROWS, 5_000)
    return [{"name": f"{AMAZON_ROWS:,} training points, hidden 128, 2x1", "part": "data", "hidden": 128,
             "adam": "float32", "ranks": 2, "threads": 1, "train": tr, "test": te, "samples": args.samples,
             "eval_points": args.eval_points, "config": {"hidden": [128], "eval_every": 0}}]


def precision_cases(args) -> list[dict]:
    tr, te = amazon_files(50_000, 5_000)
    return [{"name": f"5 epochs, {adam} moments", "part": "precision", "hidden": 128, "adam": adam,
             "ranks": 2, "threads": 1, "train": tr, "test": te, "samples": 5 * 50_000, "eval_points": 5_000,
             "config": {"hidden": [128], "adam_dtype": adam, "eval_every": 0}} for adam in args.adam]


def prepare_data_case(case: dict) -> dict:
    """Parse the text file in a fresh process (writing the cache), then time a cached load."""
    from dslide.io.data import cache_path

    path = case["train"]
    if os.path.exists(cache_path(path)):
        shutil.rmtree(cache_path(path)) if os.path.isdir(cache_path(path)) else os.remove(cache_path(path))
    # the child's own peak (VmHWM, measure.status_bytes), from the repository root
    code = ("import time, sys; t=time.perf_counter(); from dslide.io.data import read_xmc; "
            "from scripts.measure import status_bytes; "
            "d=read_xmc(sys.argv[1]); print(time.perf_counter()-t, d.X.nnz, d.Y.nnz, d.n_points, "
            "status_bytes('VmHWM:'))")
    out = {}
    for what in ("parse_and_cache", "cached"):
        r = subprocess.run([sys.executable, "-c", code, os.path.abspath(path)], capture_output=True, text=True,
                           check=True, cwd=M.ROOT)
        s, nnz_x, nnz_y, n, peak = r.stdout.split()
        out[what] = {"s": float(s), "peak_rss": int(peak)}
    out.update({"nnz_x": int(nnz_x), "nnz_y": int(nnz_y), "points": int(n),
                "file_bytes": os.path.getsize(path)})
    return out


def gb(x) -> str:
    return f"{x / 1e9:.2f}"


def rows_table(results: list[dict], commands: list[str] | None = None) -> str:
    def peak(r):
        return max(p["hwm"] for p in r["per_rank"])

    def bpp(r):
        return sum(p["hwm"] for p in r["per_rank"]) / r["params"]

    def ck(r, kind, what):
        if f"ckpt_{kind}_bytes" not in r:
            return "-"
        if what == "bytes":
            return gb(r[f"ckpt_{kind}_bytes"])
        return f"{max(p[f'ckpt_{kind}_{what}_s'] for p in r['per_rank']):.1f}"

    cols = [("model", lambda r: f"hidden {r['case']['hidden']}"),
            ("moments", lambda r: r["case"]["adam"]),
            ("ranks x threads", lambda r: f"{r['ranks']}x{r['threads']}"),
            ("parameters", lambda r: f"{r['params'] / 1e9:.3f}B" if r["params"] >= 1e9 else f"{r['params'] / 1e6:.0f}M"),
            ("account peak GB/rank", lambda r: gb(r["account"]["peak"])),
            ("peak RSS GB/rank", lambda r: gb(peak(r))),
            ("bytes/param", lambda r: f"{bpp(r):.1f}"),
            ("samples/s", lambda r: f"{r['samples_per_s']:,.0f}"),
            ("bytes/step/rank", lambda r: f"{r['bytes_per_step']:,.0f}"),
            ("P@1", lambda r: f"{r['p@1']:.4f}" if "p@1" in r else "-"),
            ("index s", lambda r: f"{max(p.get('index_s', 0) for p in r['per_rank']):.0f}" if "index" in r else "-"),
            ("ckpt GB full / weights", lambda r: f"{ck(r, 'full', 'bytes')} / {ck(r, 'weights', 'bytes')}"),
            ("write s full / weights", lambda r: f"{ck(r, 'full', 'write')} / {ck(r, 'weights', 'write')}"),
            ("load s full / weights", lambda r: f"{ck(r, 'full', 'load')} / {ck(r, 'weights', 'load')}")]
    if commands:
        cols.append(("command", lambda r: str(commands.index(r["case"].get("command", "(not recorded)")) + 1)))
    return M.table(results, cols)


def targets(done: list[dict], precision: list[dict]) -> str:
    """Issue 14's targets checked against the rows: bytes per parameter at 2.06B (bfloat16
    moments, <= 10) and at 104M (float32 moments, <= 16) with where a rank's peak goes,
    what bfloat16 moments save (>= 30% per parameter asked; P@1 within 0.5 point), and
    samples/s against the hidden width (falling no faster than linearly)."""
    def bpp(r):
        return sum(p["hwm"] for p in r["per_rank"]) / r["params"]

    def find(h, adam, ranks=2):
        return next((r for r in done if r["case"]["hidden"] == h and r["case"]["adam"] == adam
                     and r["ranks"] == ranks), None)

    out = ["Targets (issue 14), from the rows above:", ""]
    big = max((r for r in done if r["case"]["adam"] == "bfloat16"), key=lambda r: r["params"], default=None)
    if big:
        out.append(f"- {big['params'] / 1e9:.3f}B parameters (hidden {big['case']['hidden']}, bfloat16 moments, "
                   f"{big['ranks']}x{big['threads']}): {bpp(big):.1f} bytes per parameter (target <= 10: "
                   f"{'met' if bpp(big) <= 10 else 'not met'}), peak "
                   f"{max(p['hwm'] for p in big['per_rank']) / 1e9:.2f} GB per rank.")
    for ranks in (2, 1):
        r = find(128, "float32", ranks)
        if not r:
            continue
        n, a, q = r["params"], r["account"], r["per_rank"][0]
        interp = sum(p["rss_start"] for p in r["per_rank"]) / n
        data = sum(p["rss_data"] - p["rss_start"] for p in r["per_rank"]) / n
        # every rank's account is alike (even shards): rank 0's times the ranks
        wm = r["ranks"] * (a["weights"] + a["moments"]) / n
        idx = r["ranks"] * (a["index"] + a["tables"] + a["scratch"]) / n
        rest = bpp(r) - interp - data - wm - idx
        out.append(f"- 104M parameters (hidden 128, float32 moments, {r['ranks']}x{r['threads']}): {bpp(r):.1f} "
                   f"bytes per parameter (target <= 16: {'met' if bpp(r) <= 16 else 'not met'}): "
                   f"weights and moments {wm:.1f}, interpreter and libraries before the model "
                   f"({q['rss_start'] / 1e6:.0f} MB a process) {interp:.1f}, data {data:.2f}, tables, inference "
                   f"index and scratch {idx:.2f}, the peak's transients (step or index build) and allocator "
                   f"{rest:.2f}.")
    for h in sorted({r["case"]["hidden"] for r in done}):
        f32, b16 = find(h, "float32"), find(h, "bfloat16")
        if f32 and b16:
            saved = 1 - bpp(b16) / bpp(f32)
            out.append(f"- hidden {h}, 2x1: bfloat16 moments {bpp(b16):.1f} against float32 {bpp(f32):.1f} bytes per "
                       f"parameter, {100 * saved:.1f}% less (moments 8 -> 4 bytes: "
                       f"{100 * 4 / bpp(f32):.1f}% of the float32 total; target >= 30%: "
                       f"{'met' if saved >= 0.30 else 'not met'}).")
    pre = {r["case"]["adam"]: r for r in precision if "p@1" in r}
    if "float32" in pre and "bfloat16" in pre:
        d = 100 * (pre["bfloat16"]["p@1"] - pre["float32"]["p@1"])
        out.append(f"- P@1 after 5 epochs (bench_scale.py --part precision): float32 {pre['float32']['p@1']:.4f}, "
                   f"bfloat16 {pre['bfloat16']['p@1']:.4f}, {d:+.2f} points (target within 0.5: "
                   f"{'met' if abs(d) <= 0.5 else 'not met'}).")
    for adam in ("float32", "bfloat16"):
        rs = sorted((r for r in done if r["case"]["adam"] == adam and r["ranks"] == 2),
                    key=lambda r: r["case"]["hidden"])
        if len(rs) < 2:
            continue
        h0, s0 = rs[0]["case"]["hidden"], rs[0]["samples_per_s"]
        # linear fall: samples/s x width constant; above 1 = slower than linear
        kept = [r["samples_per_s"] * r["case"]["hidden"] / (s0 * h0) for r in rs[1:]]
        out.append(f"- samples/s against the hidden width, {adam} moments, 2x1: samples/s x width relative to "
                   f"hidden {h0}: " + ", ".join(f"{r['case']['hidden']}: {k:.2f}" for r, k in zip(rs[1:], kept))
                   + f" (falls no faster than linearly where >= 1: "
                   f"{'met' if min(kept) >= 1 else 'not met'} at every width).")
    return "\n".join(out)


def plot(results: list[dict], out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for adam, marker in (("float32", "o"), ("bfloat16", "s")):
        rs = sorted((r for r in results if r["case"]["adam"] == adam and r["ranks"] == 2), key=lambda r: r["params"])
        if not rs:
            continue
        x = [r["params"] / 1e9 for r in rs]
        a.plot(x, [sum(p["hwm"] for p in r["per_rank"]) / 1e9 for r in rs], marker=marker, label=f"{adam} moments")
        b.plot(x, [r["samples_per_s"] for r in rs], marker=marker, label=f"{adam} moments")
    a.axhline(24 * 2**30 / 1e9, color="grey", ls=":", label="machine (24 GiB)")
    a.set(xlabel="parameters (billions)", ylabel="peak RSS, both ranks (GB)", title="memory")
    b.set(xlabel="parameters (billions)", ylabel="samples/s", title="training speed (2 ranks x 1 thread)",
          yscale="log")
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", default="scale", choices=["scale", "data", "precision"])
    p.add_argument("--hidden", default="128,512,1024,1536,2560")
    p.add_argument("--adam", default="float32,bfloat16")
    p.add_argument("--samples", type=int, default=12_800, help="training samples per case (scale, data)")
    p.add_argument("--eval-points", type=int, default=1000, help="test points scored exactly for P@1")
    p.add_argument("--no-run", action="store_true", help="run nothing: print (and record) the stored results")
    p.add_argument("--record", action="store_true", help="write the section into docs/benchmarks.md")
    p.add_argument("--plot", help="draw the recorded scale results to this PNG")
    args = p.parse_args(argv)
    args.hidden = [int(x) for x in args.hidden.split(",")]
    args.adam = args.adam.split(",")
    store = RUNS / f"bench_scale_{args.part}.json"
    results = json.loads(store.read_text()) if store.exists() else []
    cases = {"scale": scale_cases, "data": data_cases, "precision": precision_cases}[args.part](args)
    command = M.command("bench_scale", argv if argv is not None else sys.argv[1:])
    for case in [] if args.no_run else cases:
        case["command"] = command
        from dslide.io.data import read_xmc

        head = read_xmc(case["test"])
        ok, need = fits(case, head.n_features, head.n_labels)
        if not ok:
            print(f"skipped: {case['name']} (needs about {need:.1f} GB, {available_bytes() / 1e9:.1f} GB available)",
                  file=sys.stderr, flush=True)
            results = [r for r in results if r["case"]["name"] != case["name"]]
            results.append({"case": case, "skipped": f"needs about {need:.1f} GB, "
                                                     f"{available_bytes() / 1e9:.1f} GB available"})
            store.parent.mkdir(exist_ok=True)
            store.write_text(json.dumps(results, indent=1))
            continue
        extra = prepare_data_case(case) if case["part"] == "data" else None
        print(f"running: {case['name']} (about {need:.1f} GB) ...", file=sys.stderr, flush=True)
        r = run(case)
        r["case"] = case
        if extra:
            r["data"] = extra
        if "error" in r:
            print(f"  failed: {r['error']}", file=sys.stderr, flush=True)
        else:
            print(f"  {r['samples_per_s']:,.0f} samples/s, peak {max(q['hwm'] for q in r['per_rank']) / 1e9:.2f} "
                  f"GB/rank, {r['wall_s']:.0f} s", file=sys.stderr, flush=True)
        results = [x for x in results if x["case"]["name"] != case["name"]] + [r]
        store.parent.mkdir(exist_ok=True)
        store.write_text(json.dumps(results, indent=1))
    done = [r for r in results if "per_rank" in r]
    done.sort(key=lambda r: (r["params"], r["case"]["adam"], -r["ranks"]))
    # rows are merged across invocations (runs/bench_scale_<part>.json): name each one's command
    commands = list(dict.fromkeys(r["case"].get("command", "(not recorded)") for r in results))
    text = "".join(f"command{'' if len(commands) == 1 else f' {i + 1}'}: {c}\n" for i, c in enumerate(commands))
    text += f"machine: {M.machine()}\n\n" + rows_table(done, commands if len(commands) > 1 else None) + "\n"
    skipped = [r for r in results if "skipped" in r or "error" in r]
    for r in skipped:
        text += f"\n- {r['case']['name']}: {r.get('skipped') or 'failed: ' + r['error']}"
    if args.part == "scale":
        pre = RUNS / "bench_scale_precision.json"
        text += "\n\n" + targets(done, json.loads(pre.read_text()) if pre.exists() else [])
    if args.part == "data":
        for r in done:
            d = r["data"]
            text += (f"\n\ndata: {d['points']:,} points, {d['nnz_x']:,} feature and {d['nnz_y']:,} label "
                     f"non-zeros, text {d['file_bytes'] / 1e9:.2f} GB; parse + cache {d['parse_and_cache']['s']:.1f} s "
                     f"(peak RSS {gb(d['parse_and_cache']['peak_rss'])} GB), load from the cache "
                     f"{d['cached']['s']:.2f} s; in training: RSS after loading "
                     + " / ".join(gb(q["rss_data"] - q["rss_start"]) for q in r["per_rank"])
                     + " GB per rank over the interpreter's")
    print(text)
    if args.record:
        M.record(f"bench_scale.py --part {args.part}", text)
    if args.plot:
        plot([r for r in json.loads((RUNS / "bench_scale_scale.json").read_text()) if "per_rank" in r], args.plot)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "child":
        child(sys.argv[2])
    else:
        sys.exit(main())
