"""What the parts of --suite quick and full share: their data, the settings every trainer gets, a part's record."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from .. import measure as M

PRESETS = ("amazon-like", "amazon-tail")
WIDE = 670_091  # the labels of the amazon-like presets
SUITES = {
    "quick": {"data": {"preset": "amazon-like", "n_train": 20000, "n_test": 1000, "seed": 0},
              "budget": 25, "eval_points": 1000, "eval_every": (60, 10)},
    "full": {"data": {"preset": "amazon-like", "n_train": 50000, "n_test": 5000, "seed": 0},
             "budget": 180, "eval_points": 2000, "eval_every": (250, 20)},
}


def wide_defaults():
    """dslide's configuration for an output as wide as the presets' (dslide.config.Config().resolve)."""
    from dslide.config import Config

    return Config().resolve(WIDE)


def common() -> dict:
    """The settings parts main and lsh give every trainer: the network and optimiser of dslide's
    defaults at WIDE labels, with the learning rate held constant (a time budget, not an epoch
    count, ends each run)."""
    c = wide_defaults()
    return {"hidden": list(c.hidden), "batch_size": c.batch_size, "lr": c.lr, "lr_schedule": "constant",
            "epochs": 1000.0, "dropout": c.dropout, "init_input_scale": c.init_input_scale}


def warm_kernels(notes: list[str]) -> None:
    """Compile every kernel before the first timing (`dslide warm`, in a subprocess of this
    checkout): numba caches them beside the source, so a fresh checkout would otherwise time
    the first member that reaches a kernel (the index's, the fusion's) with its compilation."""
    import subprocess

    t = time.time()
    print("running: dslide warm (the kernels compiled before any timing) ...", file=sys.stderr, flush=True)
    r = subprocess.run([sys.executable, "-m", "dslide", "warm"], cwd=M.ROOT, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True)
    if r.returncode:
        raise SystemExit(f"dslide warm failed ({r.returncode}): {r.stderr.strip()[-500:]}")
    notes.append(f"the kernels were compiled before the first timing (dslide warm, {time.time() - t:.0f} s)")


def preset_flag(a) -> str:
    return (f" --preset {a.preset}" if a.preset != "amazon-like" else "") + (
        f" --labels {a.labels}" if a.labels else "")


def notes_text(notes: list[str]) -> str:
    return ("\n" + "\n".join(f"- {n}" for n in notes) + "\n") if notes else ""


def fmt(v, spec=".4f") -> str:
    """`v` formatted by `spec`; "-" for None or NaN (a figure a system did not report)."""
    return "-" if v is None or v != v else format(v, spec)


def keep_row(r: dict, member: str, system: str, shape: str, rows: list, notes: list, out_json: Path) -> bool:
    """One system's row on one member, as the member suites (shapes, real, scale) keep it: tagged
    with the member, its shape and the load, reported on stderr, appended to `rows` and written to
    `out_json` as it goes; a failed one ("error") goes to `notes` instead. Whether it was kept."""
    r.update(member=member, shape=shape, load=os.getloadavg()[0])
    if "error" in r:
        notes.append(f"{member}: {system} failed: {r['error']}")
        print(f"  failed: {r['error']}", file=sys.stderr, flush=True)
        return False
    print(f"  {r['train_s']:.1f} s, P@1 {r['p@1']:.4f} P@5 {r['p@5']:.4f} PSP@5 {fmt(r.get('psp@5'))}",
          file=sys.stderr, flush=True)
    rows.append(r)
    out_json.write_text(json.dumps(rows, indent=1, default=float))
    return True


def finish(a, key: str, text: str, notes: list[str], t0: float) -> int:
    """A member suite's section: `text`, its notes and its seconds in all, printed and recorded as
    `key` (with " (TAG)" when --tag) unless --no-record."""
    text += notes_text(notes) + f"\n({time.time() - t0:.0f} s in all)\n"
    print(text)
    if not a.no_record:
        M.record(key + (f" ({a.tag})" if a.tag else ""), text)
    return 0


def publish(a, part: str, text: str, rows: list, title: str, payload) -> None:
    """Print a part's text, draw its P@1 curves (docs/bench_<suite>[_<part>][_<preset>].png),
    record the section in docs/benchmarks.md unless --no-record, and keep `payload` as json in runs/."""
    print(text)
    name = (f"bench_{a.suite}" + (f"_{part}" if part else "") + (f"_{a.preset}" if a.preset != "amazon-like" else "")
            + (f"_{a.labels}labels" if a.labels else ""))
    png = M.ROOT / "docs" / f"{name}.png"
    drew = plot(rows, png, title)
    if not a.no_record:
        M.record(f"bench.py --suite {a.suite}" + (f" --parts {part}" if part else "") + preset_flag(a),
                 text + "\n" + (f"![P@1 against training time]({png.name})\n" if drew else ""))
    keep(name, payload)


def keep(name: str, payload) -> None:
    """`payload` as runs/NAME.json."""
    (M.ROOT / "runs").mkdir(exist_ok=True)
    (M.ROOT / "runs" / f"{name}.json").write_text(json.dumps(payload, indent=1, default=float))


def pyplot():
    """matplotlib's pyplot (Agg), or None with a note when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(no plot: matplotlib is not installed; pip install -e '.[plot]')", file=sys.stderr)
        return None
    return plt


def plot(rows, png: Path, title: str) -> bool:
    plt = pyplot()
    if plt is None:
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
    plt.close(fig)
    return True


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
    index = (f"index: {info.get('anchors', '?')} anchors from {info.get('points', 0):,} training points, buckets of "
             f"{info.get('bucket', 0):,} labels, built in {info['index_s']:.1f} s after training" if "index_s" in info
             else "no index: an output narrower than lsh.index_min_width, whose labels --lsh scores exactly")
    return f"{title} ({n_test:,} test points; {index}):\n\n" + M.table(r["inference"], icols) + "\n"


def bibtex_files() -> tuple[Path, Path] | None:
    """BibTeX's training and test files in ../shared/data, None when absent."""
    paths = M.SHARED_DATA / "bibtex_train.txt", M.SHARED_DATA / "bibtex_test.txt"
    return paths if all(p.exists() for p in paths) else None


def synthetic_shape(d: dict) -> str:
    return (f"{d['preset']} synthetic, {d['n_train']:,} train / {d['n_test']:,} test points, 135,909 features, "
            f"{d.get('n_labels', WIDE):,} labels")
