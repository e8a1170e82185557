"""Part "peers": what extreme-classification users run today, on the same files and scored by the same code.

dslide with its defaults for the data (no settings given) against the tree
libraries omikuji (Parabel; 1 and 3 trees) and napkinXC (PLT), with their
defaults, and a PyTorch sampled softmax as a careful user writes it
(scripts/_torch_train.py --output sampled: the same network, negatives,
input normalisation, initialisation and learning-rate schedule as dslide's
defaults, sparse gradients with SparseAdam, denormals flushed), 2 cores each,
with P@k and PSP@k; on the synthetic data and on BibTeX when present. Every
system reads the same files and is scored by the same code
(dslide.metrics.evaluate, propensities from the training labels with
pyxclib's A = 0.55, B = 1.5); training seconds leave out reading the data,
compiling and evaluating.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from .. import _bench as B
from .. import measure as M
from . import common as C

PEERS_EVAL_EVERY = {"quick": 50, "full": 100}  # steps between dslide's / PyTorch's P@1 points
PEERS_TREES = (1, 3)                           # omikuji tree counts (its default is 3)
PEERS_THREADS = 2
SAMPLED_NEGATIVES = 16384                      # PyTorch sampled softmax: shared uniform negatives per step


def peer_files(spec: dict) -> tuple[Path, Path]:
    """XMC text files of a synthetic data set (written once under runs/bench_data/), or the given paths."""
    if "preset" not in spec:
        return Path(spec["train"]), Path(spec["test"])
    from dslide.io.data import write_xmc

    d = M.ROOT / "runs" / "bench_data"
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
    from .. import bench_trees as TR
    from .. import bench_vs_torch as BT
    from dslide.config import Config
    from dslide.io.data import read_xmc
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
            t = (r["train_s"] if r["p@1"] >= P else None) if r["kind"] == "tree" else M.time_to(r["curve"], P)
            return "not reached" if t is None else f"{t:.1f}"

        cols += [(f"P@1 at {T:.1f} s", lambda r: fmt(p1_at(r, T))), (f"s to P@1 {P:.4f}", s_to)]
    cols += [(f"{m.upper()}@{k}", (lambda r, key=f"{m}@{k}": fmt(r.get(key)))) for m in ("p", "psp") for k in (1, 3, 5)]
    cols.append(("peak MB/rank", lambda r: fmt(r["peak_rss_mb"], ",.0f")))
    return M.table(rows, cols)


def run(a, suite: dict) -> None:
    t0 = time.time()
    notes: list[str] = []
    spec = suite["data"]
    train_path, test_path = peer_files(spec)
    work = M.ROOT / "runs" / f"bench_peers_{a.suite}"
    rows, shape = peer_rows(train_path, test_path, a.suite, suite, notes, no_torch=a.no_torch,
                            no_trees=a.no_trees, workdir=work / spec["preset"])
    ref = next((r for r in rows if r["kind"] == "tree" and "omikuji 3" in r["name"]), None)
    shape = f"{spec['preset']} synthetic, {shape}"
    cmd = M.command("bench", [f"--suite {a.suite} --parts peers" + C.preset_flag(a)
                              + (" --no-torch" if a.no_torch else "") + (" --no-trees" if a.no_trees else "")])
    text = (f"command: `{cmd}`\n\nmachine: {M.machine()}\n\ncode: {M.code_version()}\n\n"
            f"data: {shape}; every system {PEERS_THREADS} cores (dslide: 2 ranks x 1 thread), with its own "
            f"defaults; dslide and PyTorch train their default {epochs_of(rows)} epochs. P@k and PSP@k on all test "
            f"points by dslide.metrics (propensities from the training labels, A = 0.55, B = 1.5); the 'P@1 at' "
            f"and 's to' columns read the P@1 curves (first {suite['eval_points']:,} test points, every "
            f"{PEERS_EVAL_EVERY[a.suite]} steps) at omikuji's (3 trees) training time and P@1\n\n"
            + peers_table(rows, ref) + "\n")
    for r in rows:
        if r.get("inference"):
            text += "\n" + C.inference_table(r, f"dslide's inference after its default training ({r['ranks']} ranks x "
                                               f"{r['threads']} thread; model kept in {r['saved']})",
                                            r["data"]["n_test"])
    panels = [(shape, rows)]
    bibtex = C.bibtex_files()
    if bibtex is not None:
        bib, _ = peer_rows(*bibtex, a.suite,
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
    png = M.ROOT / "docs" / f"{name}.png"
    drew = plot_peers(panels, png)
    if not a.no_record:
        M.record(f"bench.py --suite {a.suite} --parts peers" + C.preset_flag(a),
                 text + "\n" + (f"![P@1 against training seconds]({png.name})\n" if drew else ""))
    C.keep(name, rows)


def epochs_of(rows) -> str:
    ep = {r["config"]["epochs"] for r in rows if isinstance(r.get("config"), dict) and "epochs" in r["config"]}
    return ", ".join(f"{e:g}" for e in sorted(ep)) or "default"


def plot_peers(panels, png: Path) -> bool:
    """P@1 against training seconds, one panel per data set: curves for the trainers, points for the trees."""
    plt = C.pyplot()
    if plt is None:
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
